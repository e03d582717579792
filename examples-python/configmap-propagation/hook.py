#!/usr/bin/env python3
"""configmap-propagation hooks: copy a ConfigMap into every namespace matching a label selector.

customize: ask for the source ConfigMap and the selected Namespaces as related objects, so the hub
           sends them with every sync and syncs again when any of them changes.
sync:      one copy per selected namespace; status counts them.

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
        related_rule("v1", "configmaps", namespace=source["namespace"], names=[source["name"]]),
        related_rule("v1", "namespaces", label_selector=spec["namespaceSelector"]),
    ])


def sync(request: CompositeRequest) -> CompositeResponse:
    parent = parent_of(request)
    source_ref = parent["spec"]["source"]
    source_id = f'{source_ref["namespace"]}/{source_ref["name"]}'
    source = related(request, "ConfigMap.v1", source_ref["name"], source_ref["namespace"])
    # Never the source's own namespace: the copy would be the source itself.
    targets = sorted(
        ns["metadata"]["name"]
        for ns in related_of(request, "Namespace.v1")
        if ns["metadata"]["name"] != source_ref["namespace"] and ns.get("status", {}).get("phase") != "Terminating"
    )
    if source is None:
        # No source, no copies: the copies mirror the source, they do not outlive it.
        events = [] if parent.get("status", {}).get("sourceFound") is False else [
            event("Warning", "SourceNotFound", f"ConfigMap {source_id} does not exist; removing its copies")
        ]
        status = {"source": source_id, "sourceFound": False, "namespaces": len(targets), "copies": 0}
        return composite_response(children=[], status=status, events=events)

    content = {key: source[key] for key in ("data", "binaryData") if key in source}
    copies = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": source_ref["name"], "namespace": ns, "annotations": {COPIED_FROM: source_id}},
            **content,
        }
        for ns in targets
    ]
    # Status reports what is really there: observed copies whose content matches the source.
    current = sum(
        1
        for cm in children_of(request, "ConfigMap.v1")
        if cm["metadata"]["namespace"] in targets and all(cm.get(k) == v for k, v in content.items())
    )
    status = {"source": source_id, "sourceFound": True, "namespaces": len(targets), "copies": current}
    return composite_response(children=copies, status=status)


if __name__ == "__main__":
    serve({"/customize": customize, "/sync": sync})
