#!/usr/bin/env python3
"""namespace-policies map and tombstone hooks: every Namespace a NamespacePolicy selects gets a
NetworkPolicy and a ResourceQuota, made in that Namespace and owned by the policy.

The hub calls `/map` once per selected Namespace with only that Namespace (and what was made for it),
so a relabelled Namespace costs one call, whatever the number of Namespaces. The NetworkPolicy admits
traffic from the Namespace's own team (its `team` label; without one, only from itself). A Namespace
that stops being selected is `/tombstone`d: its NetworkPolicy goes, and with `keepQuotaOnRelease` its
quota stays.

Uses metahook_hooks (standard library only). Listens on $HOST:$PORT (default 0.0.0.0:8080).
"""
from typing import Any

from metahook_hooks import (
    MapRequest,
    MapResponse,
    TombstoneRequest,
    TombstoneResponse,
    input_of,
    map_response,
    outputs_of,
    parent_of,
    request_log,
    serve,
    tombstone_response,
)

QUOTAS = "ResourceQuota.v1"


def output_name(policy_name: str) -> str:
    # Several policies may select one Namespace: each one's outputs are named after it.
    return f"namespace-policy-{policy_name}"


def map_(request: MapRequest) -> MapResponse:
    policy = parent_of(request)
    namespace = input_of(request)
    ns_name = namespace["metadata"]["name"]
    name = output_name(policy["metadata"]["name"])
    team = namespace["metadata"].get("labels", {}).get("team")
    # Ingress from the Namespace's own Pods, and from its team's Namespaces when it names a team.
    peers: list[dict[str, Any]] = [{"podSelector": {}}]
    if team:
        peers.append({"namespaceSelector": {"matchLabels": {"team": team}}})
    else:
        request_log().warning(f"Namespace {ns_name} has no team label: only its own Pods may reach it", reason="NoTeam")
    network_policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": ns_name},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{"from": peers}]},
    }
    outputs = [network_policy]
    hard = policy.get("spec", {}).get("quota") or {}
    if hard:
        outputs.append({
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": name, "namespace": ns_name},
            "spec": {"hard": dict(hard)},
        })
    return map_response(outputs=outputs)


def tombstone(request: TombstoneRequest) -> TombstoneResponse:
    keep_quota = bool(parent_of(request).get("spec", {}).get("keepQuotaOnRelease"))
    return tombstone_response(keep=outputs_of(request, QUOTAS) if keep_quota else [])


if __name__ == "__main__":
    serve({"/map": map_, "/tombstone": tombstone})
