"""A logger for the hook call being served, whose warnings also reach the parent as Kubernetes Events.

A hook's `print` lands in the Pod's log without saying which parent it was about, and nobody reads
Pod logs when a parent misbehaves: they run `kubectl describe` on the parent. So `request_log()` gives
the current call's logger: every line names the hook path and the parent (`namespace/name`), and each
`warning` is also appended to the response's `events`, which the hub records as Events on the parent.
When the hub exports traces, every line also names the sync's trace (`trace=<id>`, see
`trace_context.py`), and `request_log().trace_id` / `.traceparent` give it to the hook.

The current logger lives in a `ContextVar`: the server sets it around each call, and plain hook
functions, which run in a thread pool, get a copy of that context. Outside a hook call (a unit test
calling the hook function directly, a background thread) `request_log()` returns a logger that only
prints, so code that logs works everywhere.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import Any

from .responses import event
from .trace_context import TraceParent
from .wire import HookEvent

__all__ = ["MAX_MESSAGE", "RequestLog", "request_log"]

MAX_MESSAGE = 1024
"""Longest message kept, in characters: what an Event's message holds (events.k8s.io `note`)."""

DEFAULT_REASON = "HookWarning"

Record = dict[str, str]
"""One log line's fields: level, path, parent, message, trace (when the call has one) and, for
warnings, reason."""


def _print_line(record: Record) -> None:
    print(format_line(record), file=sys.stderr, flush=True)


class RequestLog:
    """Logs for one hook call (or for none: then it only prints). Use `request_log()` to get it."""

    def __init__(
        self,
        path: str = "",
        parent: str = "",
        *,
        trace: TraceParent | None = None,
        emit: Callable[[Record], None] = _print_line,
        collect_events: bool = False,
    ) -> None:
        self.path = path
        self.parent = parent
        self._trace = trace
        self._emit = emit
        self._collect = collect_events
        self._events: list[HookEvent] = []

    def info(self, message: str) -> None:
        """One line on stderr naming the path and the parent."""
        self._emit(self._record("info", _cut(message)))

    def warning(self, message: str, reason: str = DEFAULT_REASON) -> None:
        """One line on stderr, and a Warning Event with `reason` (a CamelCase word) on the parent,
        sent in this call's response. (Not for customize calls: their responses carry no events.)"""
        cut = _cut(message)
        warning = event("Warning", reason, cut)
        self._emit({**self._record("warning", cut), "reason": reason})
        if self._collect:
            self._events.append(warning)

    @property
    def events(self) -> list[HookEvent]:
        """The Events the warnings so far have asked for."""
        return list(self._events)

    @property
    def trace_id(self) -> str:
        """The trace this call is part of (the hub's sync), 32 hex digits; "" when the request came
        without a valid `traceparent` (the hub exports no traces) or outside a call."""
        return self._trace.trace_id if self._trace else ""

    @property
    def traceparent(self) -> str:
        """The `traceparent` the call came with, checked: the parent of a hook's own spans, or "" (see
        `trace_id`)."""
        return self._trace.header if self._trace else ""

    def _record(self, level: str, message: str) -> Record:
        record = {"level": level, "path": self.path, "parent": self.parent, "message": message}
        if self._trace:
            record["trace"] = self._trace.trace_id
        return record


_CURRENT: ContextVar[RequestLog | None] = ContextVar("metahook_request_log", default=None)


def request_log() -> RequestLog:
    """The logger of the hook call being served; outside one, a logger that only prints."""
    return _CURRENT.get() or RequestLog()


def current() -> ContextVar[RequestLog | None]:
    """The context variable the server sets around each call (for the server, not for hooks)."""
    return _CURRENT


def format_line(record: Mapping[str, str]) -> str:
    """The text form of a record: `hook /sync default/world trace=4bf9...: warning EmptyNote: the message`."""
    trace = f"trace={record['trace']}" if record.get("trace") else ""
    where = " ".join(part for part in ("hook", record.get("path"), record.get("parent"), trace) if part)
    level = f"warning {record['reason']}: " if record.get("level") == "warning" else ""
    return f"{where}: {level}{record['message']}".replace("\n", "\\n")


def with_events(response: Mapping[str, Any], events: list[HookEvent]) -> Mapping[str, Any]:
    """`response` with `events` after the ones the hook put there itself. A response whose `events` is
    not a list is returned as is: the hub rejects it and says why, which is better than hiding it."""
    if not events:
        return response
    own = response.get("events")
    if own is None:
        own = []
    if not isinstance(own, (list, tuple)):
        return response
    return {**response, "events": [*own, *events]}


def _cut(message: str) -> str:
    """`message`, cut to `MAX_MESSAGE` characters (ending in "...") if longer."""
    text = str(message)
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."
