"""Wire types of the hook protocol (Metacontroller v1/v2 plus metahook's `events` extension).

They are TypedDicts: a hook receives and returns plain JSON dicts, and these types only tell a type
checker (and a reader) which keys exist. Sync and finalize share one request and one response type;
`finalizing` tells them apart. Field names are the JSON names, camelCase included.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

KubeObject = dict[str, Any]
"""A whole Kubernetes object as JSON: `apiVersion`, `kind`, `metadata`, ..."""

ObjectMap = dict[str, dict[str, KubeObject]]
"""`children` / `attachments` / `related`: `"Kind.group/version"` → object key → object.

The object key is `name` or `namespace/name` depending on the hook version; the accessors in
`metahook_hooks.objects` hide that.
"""


class HookEvent(TypedDict):
    """An Event the hub records on the parent (metahook extension; Metacontroller ignores it)."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


class CompositeRequest(TypedDict):
    """Body of a CompositeController `sync` or `finalize` call."""

    controller: KubeObject
    parent: KubeObject
    children: ObjectMap
    related: ObjectMap
    finalizing: bool


class CompositeResponse(TypedDict, total=False):
    """Answer to a CompositeController `sync` or `finalize` call; every key is optional."""

    status: dict[str, Any] | None
    children: list[KubeObject]
    resyncAfterSeconds: float
    finalized: bool
    events: list[HookEvent]


class DecoratorRequest(TypedDict):
    """Body of a DecoratorController `sync` or `finalize` call (the target is `object`)."""

    controller: KubeObject
    object: KubeObject
    attachments: ObjectMap
    related: ObjectMap
    finalizing: bool


class DecoratorResponse(TypedDict, total=False):
    """Answer to a DecoratorController call; labels/annotations merge (`None` deletes a key)."""

    labels: dict[str, str | None]
    annotations: dict[str, str | None]
    status: dict[str, Any] | None
    attachments: list[KubeObject]
    resyncAfterSeconds: float
    finalized: bool
    events: list[HookEvent]


class _ConditionFields(TypedDict):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str
    lastTransitionTime: str


class Condition(_ConditionFields, total=False):
    """One entry of `status.conditions` (metav1.Condition); build it with `set_condition`."""

    observedGeneration: int


class LabelSelectorRequirement(TypedDict, total=False):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str]


class LabelSelector(TypedDict, total=False):
    matchLabels: dict[str, str]
    matchExpressions: list[LabelSelectorRequirement]


class _RelatedResourceType(TypedDict):
    apiVersion: str
    resource: str


class RelatedResourceRule(_RelatedResourceType, total=False):
    """One kind of related object a customize hook asks for (`names` excludes the selectors)."""

    labelSelector: LabelSelector
    namespaceSelector: LabelSelector
    namespace: str
    names: list[str]


class CustomizeRequest(TypedDict):
    """Body of a `customize` call, for both controller kinds (the target is `parent` here too)."""

    controller: KubeObject
    parent: KubeObject


class CustomizeResponse(TypedDict):
    relatedResources: list[RelatedResourceRule]
