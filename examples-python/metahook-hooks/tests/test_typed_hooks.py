"""Hooks typed with the request TypedDicts, exactly as the README recommends, are accepted by `serve`,
`start_server` and `run_hook_on_fixtures`. `make test` also runs `mypy --strict` over this file: that
is the real test here (a Handler type that only takes `dict[str, Any]` rejects these functions)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any, TypedDict

from metahook_hooks import (
    CompositeRequest,
    CompositeResponse,
    Condition,
    DecoratorRequest,
    DecoratorResponse,
    KubeObject,
    children_of,
    composite_response,
    decorator_response,
    parent_of,
    run_hook_on_fixtures,
    set_condition,
    start_server,
)

FIXTURES = Path(__file__).parent / "fixtures"


class BackendSpec(TypedDict):
    replicas: int


class BackendStatus(TypedDict, total=False):
    conditions: list[Condition]


class Backend(TypedDict):
    """The fixture parent's type, as a hook author would declare their CRD."""

    apiVersion: str
    kind: str
    metadata: dict[str, Any]
    spec: BackendSpec
    status: BackendStatus


class Pod(TypedDict):
    apiVersion: str
    kind: str
    metadata: dict[str, Any]


def sync(request: CompositeRequest) -> CompositeResponse:
    backend = parent_of(request, as_type=Backend)
    replicas: int = backend["spec"]["replicas"]
    pods = children_of(request, "Pod.v1", as_type=Pod)
    names: list[str] = [pod["metadata"]["name"] for pod in pods]
    conditions = set_condition(backend.get("status", {}).get("conditions"), "Ready", len(pods) == replicas, "Counted")
    return composite_response(children=[], status={"replicas": replicas, "pods": names, "conditions": conditions})


async def finalize(request: CompositeRequest) -> CompositeResponse:
    return composite_response(children=[], finalized=True)


def decorate(request: DecoratorRequest) -> DecoratorResponse:
    target: KubeObject = parent_of(request)
    return decorator_response(labels={"seen": target["metadata"]["name"]})


def test_typed_sync_and_async_finalize_run_on_fixtures() -> None:
    response = run_hook_on_fixtures(
        sync, FIXTURES / "controller.json", FIXTURES / "parent.json", [FIXTURES / "pods.json"], kinds={"caches": "Cache"}
    )
    assert response["status"]["pods"] == ["nginx-backend-0", "nginx-backend-1"]
    assert response["status"]["conditions"][0]["type"] == "Ready"
    done = run_hook_on_fixtures(
        finalize, FIXTURES / "controller.json", FIXTURES / "parent.json", hook="finalize", kinds={"caches": "Cache"}
    )
    assert done["finalized"] is True


def test_typed_hooks_are_served() -> None:
    server = start_server({"/sync": sync, "/finalize": finalize, "/decorate": decorate})
    try:
        request = json.loads((FIXTURES / "decorator.json").read_text())
        body = {"controller": request, "object": {"metadata": {"name": "t"}}, "attachments": {}, "related": {},
                "finalizing": False}
        req = urllib.request.Request(f"http://127.0.0.1:{server.port}/decorate", data=json.dumps(body).encode())
        with urllib.request.urlopen(req, timeout=10) as answer:
            assert json.loads(answer.read()) == {"attachments": [], "labels": {"seen": "t"}}
    finally:
        server.shutdown()
        server.server_close()
