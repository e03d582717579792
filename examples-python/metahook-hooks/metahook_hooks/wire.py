"""Wire types of the hook protocol (Metacontroller v1/v2 plus metahook's `events` extension).

They are TypedDicts: a hook receives and returns plain JSON dicts, and these types only tell a type
checker (and a reader) which keys exist. Sync and finalize share one request and one response type;
`finalizing` tells them apart. Field names are the JSON names, camelCase included.

The request and response types are generated from the hub's own (Rust) types into `wire_gen.py`
(`make hook-wire-types`, which a test keeps current) and re-exported here; `Condition` is a status
convention rather than part of the wire, and is written by hand below.
"""

from __future__ import annotations

from typing import Literal, TypedDict

from .wire_gen import (
    CompositeRequest,
    CompositeResponse,
    CustomizeRequest,
    CustomizeResponse,
    DecoratorRequest,
    DecoratorResponse,
    HookEvent,
    KubeObject,
    LabelSelector,
    LabelSelectorRequirement,
    MapFinalizeRequest,
    MapFinalizeResponse,
    MapRequest,
    MapResponse,
    ObjectMap,
    RelatedResourceRule,
    TombstoneRequest,
    TombstoneResponse,
)

__all__ = [
    "CompositeRequest",
    "CompositeResponse",
    "Condition",
    "CustomizeRequest",
    "CustomizeResponse",
    "DecoratorRequest",
    "DecoratorResponse",
    "HookEvent",
    "KubeObject",
    "LabelSelector",
    "LabelSelectorRequirement",
    "MapFinalizeRequest",
    "MapFinalizeResponse",
    "MapRequest",
    "MapResponse",
    "ObjectMap",
    "RelatedResourceRule",
    "TombstoneRequest",
    "TombstoneResponse",
]


class _ConditionFields(TypedDict):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str
    lastTransitionTime: str


class Condition(_ConditionFields, total=False):
    """One entry of `status.conditions` (metav1.Condition); build it with `set_condition`."""

    observedGeneration: int
