"""Reading the object maps of a request without caring whether the hook is v1 or v2.

A request's `children`, `attachments`, `related` and (MapController) `outputs` are maps `"Kind.group/version"` → key → object,
where the key is `name` or `namespace/name` depending on the hook version and on the parent's scope
(Metacontroller compatibility reference §2.2). Hooks should not depend on that, so the accessors
here return lists of objects and find objects by their metadata, never by their map key.

Every accessor takes an optional `as_type=` (a TypedDict describing your resource) that only tells a
type checker what the objects are; at run time the request's dicts are returned unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, overload

from .wire import KubeObject

T = TypeVar("T", bound=Mapping[str, Any])
"""The type an accessor's result is declared as, e.g. a TypedDict of your CRD (`as_type=Greeting`)."""

__all__ = [
    "attachment",
    "attachments_of",
    "child",
    "children_of",
    "input_of",
    "object_key",
    "output",
    "outputs_of",
    "parent_of",
    "related",
    "related_of",
    "type_key",
]


def type_key(api_version: str, kind: str) -> str:
    """The outer map key of a type: `Pod.v1` for the core group, `Deployment.apps/v1` otherwise."""
    return f"{kind}.{api_version}"


def object_key(version: str, parent_namespace: str | None, namespace: str | None, name: str) -> str | None:
    """The inner map key the hub uses for an object, or None when a v1 request cannot carry it.

    v2 keys are uniform: `namespace/name`, or `name` for cluster-scoped objects. v1 keys are relative
    to the parent: under a namespaced parent only objects of that namespace, and cluster-scoped ones
    (a related Namespace), are sent, keyed by `name`.
    """
    qualified = f"{namespace}/{name}" if namespace else name
    if version == "v2" or parent_namespace is None:
        return qualified
    if version != "v1":
        raise ValueError(f"unknown hook version {version!r}: expected 'v1' or 'v2'")
    return name if namespace in (None, parent_namespace) else None


@overload
def parent_of(request: Mapping[str, Any]) -> KubeObject: ...
@overload
def parent_of(request: Mapping[str, Any], *, as_type: type[T]) -> T: ...
def parent_of(request: Mapping[str, Any], *, as_type: type[Any] | None = None) -> Any:
    """The object the hook is called for: `parent` (composite, customize) or `object` (decorator).

    `as_type=Greeting` (a TypedDict of your parent type) only tells a type checker what it is: no
    conversion or validation happens, the request dict is returned as is.
    """
    return request["parent"] if "parent" in request else request["object"]


@overload
def input_of(request: Mapping[str, Any]) -> KubeObject: ...
@overload
def input_of(request: Mapping[str, Any], *, as_type: type[T]) -> T: ...
def input_of(request: Mapping[str, Any], *, as_type: type[Any] | None = None) -> Any:
    """The input object a MapController `map` call is about (one call per input).

    A tombstone or finalize request has no input: asking for one there is a bug in the hook, so it
    raises a KeyError saying which request it got.
    """
    if "input" not in request:
        raise KeyError("the request has no input: only a MapController map call carries one (tombstone and finalize do not)")
    return request["input"]


@overload
def outputs_of(request: Mapping[str, Any], type_: str) -> list[KubeObject]: ...
@overload
def outputs_of(request: Mapping[str, Any], type_: str, *, as_type: type[T]) -> list[T]: ...
def outputs_of(request: Mapping[str, Any], type_: str, *, as_type: type[Any] | None = None) -> list[Any]:
    """Observed outputs of one type (MapController): in a map call, those made for its input; in a
    tombstone call, the detached ones; in a finalize call, all of the parent's."""
    return _objects(request, "outputs", type_)


@overload
def output(request: Mapping[str, Any], type_: str, name: str, namespace: str | None = None) -> KubeObject | None: ...
@overload
def output(
    request: Mapping[str, Any], type_: str, name: str, namespace: str | None = None, *, as_type: type[T]
) -> T | None: ...
def output(
    request: Mapping[str, Any], type_: str, name: str, namespace: str | None = None, *, as_type: type[Any] | None = None
) -> Any:
    """The output of that type and name (and namespace, if given), or None."""
    return _find(request, "outputs", type_, name, namespace)


@overload
def children_of(request: Mapping[str, Any], type_: str) -> list[KubeObject]: ...
@overload
def children_of(request: Mapping[str, Any], type_: str, *, as_type: type[T]) -> list[T]: ...
def children_of(request: Mapping[str, Any], type_: str, *, as_type: type[Any] | None = None) -> list[Any]:
    """Observed children of one type, e.g. `children_of(request, "Pod.v1")`."""
    return _objects(request, "children", type_)


@overload
def attachments_of(request: Mapping[str, Any], type_: str) -> list[KubeObject]: ...
@overload
def attachments_of(request: Mapping[str, Any], type_: str, *, as_type: type[T]) -> list[T]: ...
def attachments_of(request: Mapping[str, Any], type_: str, *, as_type: type[Any] | None = None) -> list[Any]:
    """Observed attachments of one type (DecoratorController)."""
    return _objects(request, "attachments", type_)


@overload
def related_of(request: Mapping[str, Any], type_: str) -> list[KubeObject]: ...
@overload
def related_of(request: Mapping[str, Any], type_: str, *, as_type: type[T]) -> list[T]: ...
def related_of(request: Mapping[str, Any], type_: str, *, as_type: type[Any] | None = None) -> list[Any]:
    """Related objects of one type, as selected by the customize hook."""
    return _objects(request, "related", type_)


@overload
def child(request: Mapping[str, Any], type_: str, name: str, namespace: str | None = None) -> KubeObject | None: ...
@overload
def child(
    request: Mapping[str, Any], type_: str, name: str, namespace: str | None = None, *, as_type: type[T]
) -> T | None: ...
def child(
    request: Mapping[str, Any], type_: str, name: str, namespace: str | None = None, *, as_type: type[Any] | None = None
) -> Any:
    """The child of that type and name (and namespace, if given), or None."""
    return _find(request, "children", type_, name, namespace)


@overload
def attachment(
    request: Mapping[str, Any], type_: str, name: str, namespace: str | None = None
) -> KubeObject | None: ...
@overload
def attachment(
    request: Mapping[str, Any], type_: str, name: str, namespace: str | None = None, *, as_type: type[T]
) -> T | None: ...
def attachment(
    request: Mapping[str, Any], type_: str, name: str, namespace: str | None = None, *, as_type: type[Any] | None = None
) -> Any:
    """The attachment of that type and name (and namespace, if given), or None."""
    return _find(request, "attachments", type_, name, namespace)


@overload
def related(request: Mapping[str, Any], type_: str, name: str, namespace: str | None = None) -> KubeObject | None: ...
@overload
def related(
    request: Mapping[str, Any], type_: str, name: str, namespace: str | None = None, *, as_type: type[T]
) -> T | None: ...
def related(
    request: Mapping[str, Any], type_: str, name: str, namespace: str | None = None, *, as_type: type[Any] | None = None
) -> Any:
    """The related object of that type and name (and namespace, if given), or None."""
    return _find(request, "related", type_, name, namespace)


def _objects(request: Mapping[str, Any], field: str, type_: str) -> list[KubeObject]:
    # The hub sends an entry for every declared type, even an empty one, so a missing entry is
    # almost always a typo in the type key: say so instead of quietly returning nothing.
    maps = request.get(field) or {}
    if type_ not in maps:
        present = ", ".join(sorted(maps)) or "none"
        raise KeyError(
            f"the request has no {field} of type {type_!r} (types present: {present}); "
            "type keys look like 'Pod.v1' or 'Deployment.apps/v1'"
        )
    return list((maps[type_] or {}).values())


def _find(request: Mapping[str, Any], field: str, type_: str, name: str, namespace: str | None) -> KubeObject | None:
    found = [
        obj
        for obj in _objects(request, field, type_)
        if obj.get("metadata", {}).get("name") == name
        and (namespace is None or obj["metadata"].get("namespace") == namespace)
    ]
    if len(found) > 1:
        # Only possible under a cluster-scoped parent, whose children may live in several namespaces.
        namespaces = sorted(obj["metadata"].get("namespace") or "" for obj in found)
        raise LookupError(f"{len(found)} {type_} objects are named {name!r} (namespaces {namespaces}): pass namespace=")
    return found[0] if found else None
