#!/usr/bin/env python3
"""namespace-defaults sync hook: every opted-in Namespace gets a ResourceQuota and a ConfigMap.

The Namespace is the decorated object (cluster-scoped); its attachments are namespaced objects
inside it, owned by it, so they go away with it. The `tier` label picks the quota; an unknown tier
falls back to the default one and is reported as a Warning Event (a metahook extension).

Uses metahook_hooks (standard library only). Listens on $HOST:$PORT (default 0.0.0.0:8080).
"""
from metahook_hooks import DecoratorRequest, DecoratorResponse, decorator_response, event, parent_of, serve

PREFIX = "defaults.examples.metahook.dev"
DEFAULT_TIER = "small"
TIERS = {
    "small": {"pods": "10", "requests.cpu": "2", "requests.memory": "4Gi", "configmaps": "20"},
    "large": {"pods": "50", "requests.cpu": "16", "requests.memory": "64Gi", "configmaps": "100"},
}


def sync(request: DecoratorRequest) -> DecoratorResponse:
    namespace = parent_of(request)
    name = namespace["metadata"]["name"]
    asked = namespace["metadata"].get("labels", {}).get(f"{PREFIX}/tier", DEFAULT_TIER)
    tier = asked if asked in TIERS else DEFAULT_TIER
    events = [] if tier == asked else [
        event("Warning", "UnknownTier", f"tier {asked!r} is not one of {sorted(TIERS)}; using {DEFAULT_TIER!r}")
    ]
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "defaults", "namespace": name},
        "spec": {"hard": TIERS[tier]},
    }
    settings = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "namespace-defaults", "namespace": name},
        "data": {"namespace": name, "tier": tier},
    }
    return decorator_response(
        annotations={f"{PREFIX}/applied-tier": tier},
        attachments=[quota, settings],
        events=events,
    )


if __name__ == "__main__":
    serve({"/sync": sync})
