#!/usr/bin/env python3
"""update-strategies sync hook: the same message in three children with three update strategies.

The hook always answers with the same three children carrying the parent's current message; what
happens to an existing child whose content differs is up to its type's update strategy, which the
controller declares. The status shows, per child, the message it really carries and its UID, so
`kubectl get updatestrategydemos` shows who follows the parent and who does not.

Uses metahook_hooks (standard library only). Listens on $HOST:$PORT (default 0.0.0.0:8080).
"""
import base64
from typing import Any

from metahook_hooks import CompositeRequest, CompositeResponse, KubeObject, child, composite_response, parent_of, serve

MESSAGE_ANNOTATION = "python.examples.metahook.dev/message"


def desired(name: str, message: str) -> dict[str, KubeObject]:
    return {
        "inPlace": {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{name}-inplace"},
            "data": {"message": message},
        },
        "recreate": {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": f"{name}-recreate"},
            "data": {"message": base64.b64encode(message.encode()).decode()},
        },
        "onDelete": {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{name}-ondelete", "annotations": {MESSAGE_ANNOTATION: message}},
            "spec": {
                "containers": [{
                    "name": "say",
                    "image": "busybox",
                    "command": ["sh", "-c", 'echo "$MESSAGE"; sleep 3600'],
                    "env": [{"name": "MESSAGE", "value": message}],
                }],
            },
        },
    }


def message_of(strategy: str, obj: KubeObject) -> str | None:
    """The message an observed child carries."""
    if strategy == "inPlace":
        message: str | None = obj.get("data", {}).get("message")
        return message
    if strategy == "recreate":
        return base64.b64decode(obj.get("data", {}).get("message", "")).decode()
    annotation: str | None = obj["metadata"].get("annotations", {}).get(MESSAGE_ANNOTATION)
    return annotation


def sync(request: CompositeRequest) -> CompositeResponse:
    parent = parent_of(request)
    message = parent["spec"]["message"]
    children = desired(parent["metadata"]["name"], message)
    status: dict[str, Any] = {}
    for strategy, want in children.items():
        have = child(request, f'{want["kind"]}.v1', want["metadata"]["name"])
        if have is None:
            status[strategy] = {"kind": want["kind"], "name": want["metadata"]["name"], "exists": False}
            continue
        said = message_of(strategy, have)
        status[strategy] = {
            "kind": want["kind"],
            "name": want["metadata"]["name"],
            "exists": True,
            "uid": have["metadata"]["uid"],
            "message": said,
            "upToDate": said == message,
        }
    return composite_response(children=list(children.values()), status=status)


if __name__ == "__main__":
    serve({"/sync": sync})
