#!/usr/bin/env python3
"""secret-propagation hooks: copy a Secret into every namespace a namespaceSelector chooses.

customize: two related rules. The source Secret, by namespace and name. And the ServiceAccounts in
           the namespaces matching `spec.namespaceSelector` (a `namespaceSelector` rule selects
           namespaced objects by the labels of their namespace): the ServiceAccount controller gives
           every namespace a `default` ServiceAccount, so their namespaces are the selected ones.
           The hub syncs the parent again when the source changes or a namespace's labels change.
sync:      one copy per selected namespace, status, and Events (a metahook extension) when the
           source is missing or a namespace gets its copy.

Uses metahook_hooks (standard library only). Listens on $HOST:$PORT (default 0.0.0.0:8080).
"""
from metahook_hooks import (
    CompositeRequest,
    CompositeResponse,
    CustomizeRequest,
    CustomizeResponse,
    children_of,
    composite_response,
    customize_response,
    event,
    parent_of,
    related,
    related_of,
    related_rule,
    serve,
)

COPIED_FROM = "python.examples.metahook.dev/copied-from"


def customize(request: CustomizeRequest) -> CustomizeResponse:
    spec = parent_of(request)["spec"]
    source = spec["source"]
    return customize_response([
        related_rule("v1", "secrets", namespace=source["namespace"], names=[source["name"]]),
        related_rule("v1", "serviceaccounts", namespace_selector=spec["namespaceSelector"]),
    ])


def sync(request: CompositeRequest) -> CompositeResponse:
    parent = parent_of(request)
    source_ref = parent["spec"]["source"]
    source_id = f'{source_ref["namespace"]}/{source_ref["name"]}'
    source = related(request, "Secret.v1", source_ref["name"], source_ref["namespace"])
    targets = sorted({
        sa["metadata"]["namespace"]
        for sa in related_of(request, "ServiceAccount.v1")
        if sa["metadata"]["name"] == "default" and sa["metadata"]["namespace"] != source_ref["namespace"]
    })
    previous = parent.get("status", {})
    if source is None:
        # No source, no copies: the copies mirror the source, they do not outlive it.
        events = [] if previous.get("sourceFound") is False else [
            event("Warning", "SourceNotFound", f"Secret {source_id} does not exist; removing its copies")
        ]
        status = {"source": source_id, "sourceFound": False, "namespaces": [], "copies": 0}
        return composite_response(children=[], status=status, events=events)

    copies = [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": source_ref["name"], "namespace": ns, "annotations": {COPIED_FROM: source_id}},
            "type": source.get("type", "Opaque"),
            "data": source.get("data", {}),
        }
        for ns in targets
    ]
    observed = children_of(request, "Secret.v1")
    have = {s["metadata"]["namespace"] for s in observed}
    new = [ns for ns in targets if ns not in have]
    events = [event("Normal", "Propagating", f"copying Secret {source_id} to {', '.join(new)}")] if new else []
    current = sum(1 for s in observed if s["metadata"]["namespace"] in targets and s.get("data", {}) == source.get("data", {}))
    status = {"source": source_id, "sourceFound": True, "namespaces": targets, "copies": current}
    return composite_response(children=copies, status=status, events=events)


if __name__ == "__main__":
    serve({"/customize": customize, "/sync": sync})
