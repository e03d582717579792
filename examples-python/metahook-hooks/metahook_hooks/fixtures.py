"""Unit-testing a hook without a cluster: build the request the hub would send from fixture files.

Fixtures are Kubernetes objects in `.json` files (one object, a list, or a `kind: List`) or in
`.yaml`/`.yml` files when PyYAML is importable (the standard library has no YAML parser). Objects
may also be passed directly as dicts.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import os
from collections.abc import Awaitable, Iterable, Mapping
from typing import Any

from .objects import object_key, type_key
from .server import Handler, HookResult
from .wire import KubeObject

__all__ = ["fixture_request", "load_objects", "run_hook_on_fixtures"]

Fixture = str | os.PathLike[str] | Mapping[str, Any]
"""A fixture file path, or an object given directly."""

# Kinds of common built-in resources, for declared child types no fixture object shows
# (a plural cannot be turned back into a Kind reliably: "networkpolicies" → "NetworkPolicy").
BUILTIN_KINDS = {
    "pods": "Pod", "services": "Service", "configmaps": "ConfigMap", "secrets": "Secret",
    "serviceaccounts": "ServiceAccount", "persistentvolumeclaims": "PersistentVolumeClaim",
    "persistentvolumes": "PersistentVolume", "namespaces": "Namespace", "nodes": "Node",
    "endpoints": "Endpoints", "events": "Event", "deployments": "Deployment", "replicasets": "ReplicaSet",
    "statefulsets": "StatefulSet", "daemonsets": "DaemonSet", "jobs": "Job", "cronjobs": "CronJob",
    "ingresses": "Ingress", "networkpolicies": "NetworkPolicy", "roles": "Role", "rolebindings": "RoleBinding",
    "clusterroles": "ClusterRole", "clusterrolebindings": "ClusterRoleBinding",
    "poddisruptionbudgets": "PodDisruptionBudget", "horizontalpodautoscalers": "HorizontalPodAutoscaler",
}

HOOKS = ("sync", "finalize", "customize")


def load_objects(fixture: Fixture) -> list[KubeObject]:
    """Every object in a fixture file (or the one dict given)."""
    if isinstance(fixture, Mapping):
        return [copy.deepcopy(dict(fixture))]
    path = os.fspath(fixture)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith(".json"):
        docs = [json.loads(text)]
    elif path.endswith((".yaml", ".yml")):
        try:
            import yaml  # type: ignore[import-untyped]
        except ImportError:
            raise RuntimeError(
                f"{path}: reading YAML fixtures needs PyYAML (pip install pyyaml); or convert the fixture to JSON"
            ) from None
        docs = list(yaml.safe_load_all(text))
    else:
        raise ValueError(f"{path}: fixtures are .json files (or .yaml/.yml with PyYAML installed)")
    objects: list[KubeObject] = []
    for doc in docs:
        if doc is None:  # an empty YAML document, e.g. after a trailing `---`
            continue
        if isinstance(doc, Mapping) and doc.get("kind") == "List":
            doc = doc.get("items") or []
        for obj in doc if isinstance(doc, list) else [doc]:
            if not isinstance(obj, Mapping) or not obj.get("kind") or not obj.get("apiVersion"):
                raise ValueError(f"{path}: every fixture object needs apiVersion and kind")
            objects.append(dict(obj))
    return objects


def fixture_request(
    controller: Fixture,
    parent: Fixture,
    children: Iterable[Fixture] = (),
    *,
    related: Iterable[Fixture] = (),
    hook: str = "sync",
    version: str | None = None,
    kinds: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The request body the hub sends to `hook` ("sync", "finalize" or "customize") of the
    CompositeController or DecoratorController `controller`, for `parent` and the observed
    `children` (attachments, for a decorator) and `related` objects.

    As the hub does, it keys objects for the hook `version` (default: the one the controller
    declares for that hook, else "v1"), drops what a v1 request cannot carry, and gives every
    declared child type an entry even when empty. Fixture objects without a namespace are taken
    to live in the parent's namespace. `kinds` maps a declared resource to its Kind
    (`{"widgets": "Widget"}`) when neither a fixture object nor the built-in table tells it.
    """
    if hook not in HOOKS:
        raise ValueError(f"hook must be one of {HOOKS}, not {hook!r}")
    children, related = tuple(children), tuple(related)
    (ctl,) = _one("controller", controller)
    (obj,) = _one("parent", parent)
    spec = ctl.get("spec") or {}
    if ctl.get("kind") == "CompositeController":
        parent_field, objects_field, rules = "parent", "children", spec.get("childResources") or []
    elif ctl.get("kind") == "DecoratorController":
        parent_field, objects_field, rules = "object", "attachments", spec.get("attachments") or []
    else:
        raise ValueError(f"controller must be a CompositeController or DecoratorController, not {ctl.get('kind')!r}")
    if hook == "customize":
        if children or related:
            raise ValueError("a customize request carries only the controller and the parent")
        return copy.deepcopy({"controller": ctl, "parent": obj})
    version = version or ((spec.get("hooks") or {}).get(hook) or {}).get("version") or "v1"
    if version not in ("v1", "v2"):
        raise ValueError(f"hook version must be 'v1' or 'v2', not {version!r}")
    parent_ns = (obj.get("metadata") or {}).get("namespace")

    observed = [o for f in children for o in load_objects(f)]
    declared = {type_key(r["apiVersion"], _kind(r, observed, kinds)): r for r in rules}
    owned = _object_map(observed, version, parent_ns, declared={key: {} for key in declared}, field=objects_field)
    others = _object_map([o for f in related for o in load_objects(f)], version, parent_ns, declared=None, field="related")
    return copy.deepcopy(
        {
            "controller": ctl,
            parent_field: obj,
            objects_field: owned,
            "related": others,
            "finalizing": hook == "finalize",
        }
    )


def run_hook_on_fixtures(
    fn: Handler,
    controller: Fixture,
    parent: Fixture,
    children: Iterable[Fixture] = (),
    **options: Any,
) -> dict[str, Any]:
    """Calls `fn` with `fixture_request(controller, parent, children, **options)` and returns its
    response as the hub would read it (after a JSON round trip, so what cannot be sent fails here).

    `fn` may be an `async def` function: it is run to completion (in a new event loop; from inside a
    running loop, `await` the function on `fixture_request(...)` yourself)."""
    response = fn(fixture_request(controller, parent, children, **options))
    if inspect.isawaitable(response):
        response = asyncio.run(_awaited(response))
    if response is None:
        raise ValueError("hook returned nothing")
    result: dict[str, Any] = json.loads(json.dumps(response))
    return result


async def _awaited(awaitable: Awaitable[HookResult]) -> HookResult:
    return await awaitable


def _one(what: str, fixture: Fixture) -> list[KubeObject]:
    objects = load_objects(fixture)
    if len(objects) != 1:
        raise ValueError(f"the {what} fixture must hold exactly one object, it holds {len(objects)}")
    return objects


def _kind(rule: Mapping[str, Any], observed: list[KubeObject], kinds: Mapping[str, str] | None) -> str:
    resource = rule["resource"]
    if kinds and resource in kinds:
        return kinds[resource]
    for obj in observed:
        kind = str(obj["kind"])
        lower = kind.lower()
        if obj["apiVersion"] == rule["apiVersion"] and resource in (lower + "s", lower + "es", lower[:-1] + "ies"):
            return kind
    if resource in BUILTIN_KINDS:
        return BUILTIN_KINDS[resource]
    raise ValueError(
        f"cannot tell the Kind of declared resource {rule['apiVersion']}/{resource}: "
        f"pass kinds={{{resource!r}: 'TheKind'}} or add a fixture object of that type"
    )


def _object_map(
    objects: list[KubeObject],
    version: str,
    parent_ns: str | None,
    declared: dict[str, dict[str, KubeObject]] | None,
    field: str,
) -> dict[str, dict[str, KubeObject]]:
    maps: dict[str, dict[str, KubeObject]] = declared if declared is not None else {}
    for obj in objects:
        metadata = obj.setdefault("metadata", {})
        if not metadata.get("name"):
            raise ValueError(f"{field} fixture {obj['kind']} has no metadata.name")
        if parent_ns and not metadata.get("namespace"):
            metadata["namespace"] = parent_ns
        key = type_key(obj["apiVersion"], obj["kind"])
        if declared is not None and key not in maps:
            raise ValueError(f"{field} fixture {key} {metadata['name']!r} is not a type the controller declares ({sorted(maps)})")
        name = object_key(version, parent_ns, metadata.get("namespace"), metadata["name"])
        if name is None:
            continue  # a v1 request under a namespaced parent only carries that namespace's objects
        if name in maps.setdefault(key, {}):
            raise ValueError(f"{field} fixtures hold {key} {name!r} twice")
        maps[key][name] = obj
    return maps
