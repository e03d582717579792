"""Status conditions (`status.conditions[]`) the way Kubernetes keeps them.

A hook's `status` replaces the parent's whole status, so a hook that reports conditions must carry
the observed ones forward and change only what changed. `set_condition` does that with the rules of
`meta.SetStatusCondition` in apimachinery: a condition whose `status` changes gets a new
`lastTransitionTime`; one whose status stays keeps its time, even if its reason or message change.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Any, Literal, cast

from .wire import Condition

__all__ = ["condition_status", "find_condition", "set_condition"]

ConditionStatus = Literal["True", "False", "Unknown"]

# apimachinery's validation of `reason` (metav1.Condition): CamelCase, no spaces.
_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")


def set_condition(
    conditions: Iterable[Mapping[str, Any]] | None,
    type_: str,
    status: bool | ConditionStatus,
    reason: str,
    message: str = "",
    *,
    observed_generation: int | None = None,
    now: datetime | None = None,
) -> list[Condition]:
    """The conditions with `type_` set (added, or replaced in place); the others are kept as they are.

    `conditions` are usually the observed ones: `parent.get("status", {}).get("conditions")`.
    `status` is `True`/`False` or `"True"`/`"False"`/`"Unknown"`. `lastTransitionTime` is `now`
    (default: the current time, in UTC, to the second) when the status changes or the condition is new.
    """
    if not type_:
        raise ValueError("condition type must not be empty")
    if not _REASON.match(reason):
        raise ValueError(f"condition reason must be a CamelCase word (e.g. 'AllReplicasReady'), not {reason!r}")
    if isinstance(status, bool):
        text: ConditionStatus = "True" if status else "False"
    elif status in ("True", "False", "Unknown"):
        text = status
    else:
        raise ValueError(f"condition status must be True, False or Unknown, not {status!r}")
    stamp = _rfc3339(now or datetime.now(timezone.utc))
    result: list[Condition] = []
    found = False
    for old in conditions or ():
        if old.get("type") != type_:
            result.append(cast(Condition, dict(old)))
            continue
        found = True
        changed = old.get("status") != text or not old.get("lastTransitionTime")
        since = stamp if changed else str(old["lastTransitionTime"])
        result.append(_condition(type_, text, reason, message, since, observed_generation))
    if not found:
        result.append(_condition(type_, text, reason, message, stamp, observed_generation))
    return result


def find_condition(conditions: Iterable[Mapping[str, Any]] | None, type_: str) -> Condition | None:
    """The condition of that type, or None."""
    for condition in conditions or ():
        if condition.get("type") == type_:
            return cast(Condition, dict(condition))
    return None


def condition_status(conditions: Iterable[Mapping[str, Any]] | None, type_: str) -> str | None:
    """`"True"`, `"False"`, `"Unknown"`, or None when there is no condition of that type."""
    found = find_condition(conditions, type_)
    return found["status"] if found else None


def _condition(
    type_: str, status: ConditionStatus, reason: str, message: str, stamp: str, observed_generation: int | None
) -> Condition:
    condition: Condition = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": stamp,
    }
    if observed_generation is not None:
        condition["observedGeneration"] = observed_generation
    return condition


def _rfc3339(when: datetime) -> str:
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")
