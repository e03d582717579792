#!/usr/bin/env python3
"""greeter-py sync hook: every Greeting gets a ConfigMap with its message, and a Ready condition.

This is the hook as it runs in the cluster (see README.md): its code is a ConfigMap on the stock
python:3.11-slim image, the helper library a second ConfigMap, and `serve()` does what a Pod needs:
listens on $PORT, answers the probes on GET /healthz, logs one JSON line per call when
METAHOOK_LOG_REQUESTS is set, and on SIGTERM lets the calls in flight finish before it exits.
The hook is an `async def`: it runs on the server's event loop (plain `def` hooks run in threads).
"""

from typing import Any, TypedDict

from metahook_hooks import (
    CompositeRequest,
    CompositeResponse,
    Condition,
    KubeObject,
    children_of,
    composite_response,
    parent_of,
    serve,
    set_condition,
)


class GreetingSpec(TypedDict, total=False):
    who: str
    greeting: str


class GreetingStatus(TypedDict, total=False):
    message: str
    conditions: list[Condition]


class Greeting(TypedDict):
    """The parent, as crd.yaml declares it."""

    apiVersion: str
    kind: str
    metadata: dict[str, Any]
    spec: GreetingSpec
    status: GreetingStatus


async def sync(request: CompositeRequest) -> CompositeResponse:
    greeting = parent_of(request, as_type=Greeting)
    name = greeting["metadata"]["name"]
    message = f'{greeting["spec"].get("greeting", "Hello")}, {greeting["spec"]["who"]}!'
    config_map: KubeObject = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-greeting", "labels": {"python.examples.metahook.dev/greeting": name}},
        "data": {"message": message},
    }
    # Ready once the ConfigMap the cluster holds says the current message (the next sync sees it).
    published = any(cm.get("data", {}).get("message") == message for cm in children_of(request, "ConfigMap.v1"))
    conditions = set_condition(
        greeting.get("status", {}).get("conditions"),
        "Ready",
        published,
        "Published" if published else "Publishing",
        f"ConfigMap {name}-greeting holds the message" if published else "",
        observed_generation=greeting["metadata"].get("generation"),
    )
    return composite_response(children=[config_map], status={"message": message, "conditions": conditions})


if __name__ == "__main__":
    serve({"/sync": sync})
