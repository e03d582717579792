"""Builders for hook responses, so a hook returns the exact JSON field names the hub expects.

Builders only emit the fields they are given (`events` only when there are some), so a response
built here is also accepted by Metacontroller, whose v2 hooks reject unknown fields.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .wire import (
    CompositeResponse,
    CustomizeResponse,
    DecoratorResponse,
    HookEvent,
    KubeObject,
    LabelSelector,
    MapFinalizeResponse,
    MapResponse,
    RelatedResourceRule,
    TombstoneResponse,
)

__all__ = [
    "composite_response",
    "customize_response",
    "decorator_response",
    "event",
    "map_finalize_response",
    "map_response",
    "related_rule",
    "tombstone_response",
]

EVENT_TYPES = ("Normal", "Warning")


def event(type_: str, reason: str, message: str = "") -> HookEvent:
    """An Event for the hub to record on the parent (metahook extension), e.g.
    `event("Warning", "QuotaLow", "3 of 4 volumes used")`. `reason` is a CamelCase word."""
    if type_ not in EVENT_TYPES:
        raise ValueError(f"event type must be 'Normal' or 'Warning', not {type_!r}")
    if not reason:
        raise ValueError("event reason must not be empty")
    return {"type": type_, "reason": reason, "message": message}  # type: ignore[typeddict-item]


def composite_response(
    *,
    children: Iterable[KubeObject],
    status: Mapping[str, Any] | None = None,
    resync_after_seconds: float | None = None,
    finalized: bool = False,
    events: Iterable[HookEvent] = (),
) -> CompositeResponse:
    """Answer to a CompositeController sync/finalize.

    `children` is required because it is the complete desired set: a child left out is deleted.
    `status` replaces the parent's status (None: only `observedGeneration` is kept).
    """
    response: CompositeResponse = {"children": _objects("children", children)}
    _common(response, status, resync_after_seconds, finalized, events)
    return response


def decorator_response(
    *,
    labels: Mapping[str, str | None] | None = None,
    annotations: Mapping[str, str | None] | None = None,
    status: Mapping[str, Any] | None = None,
    attachments: Iterable[KubeObject] = (),
    resync_after_seconds: float | None = None,
    finalized: bool = False,
    events: Iterable[HookEvent] = (),
) -> DecoratorResponse:
    """Answer to a DecoratorController sync/finalize.

    `labels`/`annotations` merge into the target (a None value deletes the key); `status` None leaves
    the target's status alone; `attachments` is the complete desired set, like composite children.
    """
    response: DecoratorResponse = {"attachments": _objects("attachments", attachments)}
    for field, values in (("labels", labels), ("annotations", annotations)):
        if values is not None:
            bad = [key for key, value in values.items() if value is not None and not isinstance(value, str)]
            if bad:
                raise TypeError(f"{field} values must be strings or None (to delete); not for {bad}")
            response[field] = dict(values)  # type: ignore[literal-required]
    _common(response, status, resync_after_seconds, finalized, events)
    return response


def map_response(
    *,
    outputs: Iterable[KubeObject],
    resync_after_seconds: float | None = None,
    events: Iterable[HookEvent] = (),
) -> MapResponse:
    """Answer to a MapController `map` call: the outputs of this one input.

    `outputs` is required because it is this input's complete desired set: one of its outputs left
    out is deleted (the other inputs' outputs are never touched by this answer).
    """
    response: MapResponse = {"outputs": _objects("outputs", outputs)}
    _common(response, None, resync_after_seconds, False, events)
    return response


def tombstone_response(*, keep: Iterable[KubeObject] = (), resync_after_seconds: float | None = None) -> TombstoneResponse:
    """Answer to a MapController `tombstone` call: which detached outputs to keep (the rest are deleted).

    Pass the objects as the request shows them (`outputs_of(request, ...)`); only their names are
    sent back, because the hub leaves kept outputs exactly as they are. With `resync_after_seconds`
    the hub asks again later, so an output kept for a while can be let go then.
    """
    refs: list[KubeObject] = []
    for obj in _objects("keep", keep):
        metadata: dict[str, Any] = {"name": obj["metadata"]["name"]}
        if obj["metadata"].get("namespace"):
            metadata["namespace"] = obj["metadata"]["namespace"]
        refs.append({"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": metadata})
    response: TombstoneResponse = {"outputs": refs}
    _common(response, None, resync_after_seconds, False, ())
    return response


def map_finalize_response(
    *,
    finalized: bool,
    resync_after_seconds: float | None = None,
    events: Iterable[HookEvent] = (),
) -> MapFinalizeResponse:
    """Answer to a MapController `finalize` call. `finalized=True` lets the parent go (its outputs
    then go with it, by the garbage collector); False keeps it, asked again later."""
    response: MapFinalizeResponse = {}
    _common(response, None, resync_after_seconds, finalized, events)
    return response


def related_rule(
    api_version: str,
    resource: str,
    *,
    label_selector: LabelSelector | None = None,
    namespace_selector: LabelSelector | None = None,
    namespace: str | None = None,
    names: Iterable[str] | None = None,
) -> RelatedResourceRule:
    """One RelatedResourceRule, checked against the combinations the hub refuses (§2.5)."""
    if names is not None and (label_selector is not None or namespace_selector is not None):
        raise ValueError("related rule: names cannot be combined with a label or namespace selector")
    if namespace is not None and namespace_selector is not None:
        raise ValueError("related rule: namespace cannot be combined with namespaceSelector")
    rule: RelatedResourceRule = {"apiVersion": api_version, "resource": resource}
    if label_selector is not None:
        rule["labelSelector"] = label_selector
    if namespace_selector is not None:
        rule["namespaceSelector"] = namespace_selector
    if namespace is not None:
        rule["namespace"] = namespace
    if names is not None:
        rule["names"] = list(names)
    return rule


def customize_response(related_resources: Iterable[RelatedResourceRule] = ()) -> CustomizeResponse:
    """Answer to a customize hook: which related objects the sync hook should receive."""
    return {"relatedResources": list(related_resources)}


def _objects(field: str, objects: Iterable[KubeObject]) -> list[KubeObject]:
    # The hub would refuse these too, but with a message about the whole response; naming the
    # index here points at the bug.
    objects = list(objects)
    for i, obj in enumerate(objects):
        if not isinstance(obj, Mapping):
            raise TypeError(f"{field}[{i}] is a {type(obj).__name__}, not an object")
        missing = [f for f in ("apiVersion", "kind") if not obj.get(f)]
        if not obj.get("metadata", {}).get("name"):
            missing.append("metadata.name")
        if missing:
            raise ValueError(f"{field}[{i}] has no {', '.join(missing)}")
    return objects


def _common(response: Any, status: Any, resync_after_seconds: float | None, finalized: bool, events: Iterable[HookEvent]) -> None:
    if status is not None:
        response["status"] = dict(status)
    if resync_after_seconds is not None:
        if resync_after_seconds < 0:
            raise ValueError(f"resync_after_seconds must not be negative, got {resync_after_seconds}")
        response["resyncAfterSeconds"] = resync_after_seconds
    if finalized:
        response["finalized"] = True
    events = list(events)
    for i, e in enumerate(events):
        if e.get("type", "Normal") not in EVENT_TYPES or not e.get("reason"):
            raise ValueError(f"events[{i}] needs type 'Normal' or 'Warning' and a reason; build it with event()")
    if events:
        response["events"] = events
