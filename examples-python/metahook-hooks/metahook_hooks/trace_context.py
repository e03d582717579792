"""The W3C trace context a hook call arrives with, so that the call's log lines name the sync's trace.

A hub that exports traces sends every hook request with the `traceparent` of the call's span
(W3C Trace Context: `00-<trace id>-<parent id>-<flags>`, lower-case hex). The server checks it and
gives it to the call's logger: each line of the call then says `trace=<trace id>`, which finds the
sync in a tracing UI, and a hook that makes spans of its own starts them from
`request_log().traceparent`. A missing or malformed header means no trace, never an error: the
specification says to ignore a `traceparent` that does not parse, and a hook must work with a hub that
sends none.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["TraceParent", "parse_traceparent"]

_VERSION_00 = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
"""Version 00, the only one there is: exactly these four fields, in lower-case hex."""


class TraceParent(NamedTuple):
    """A checked `traceparent`."""

    trace_id: str
    """The trace (the hub's sync), 32 hex digits."""
    parent_id: str
    """The span that made the call (the hub's `hook` span), 16 hex digits."""
    flags: str
    """Trace flags, 2 hex digits (`01`: sampled)."""

    @property
    def header(self) -> str:
        """The header value, as a hook passes it on to its own tracer or to services it calls."""
        return f"00-{self.trace_id}-{self.parent_id}-{self.flags}"


def parse_traceparent(value: str | None) -> TraceParent | None:
    """`value` as a `traceparent`, or None when it is absent or not a valid version-00 one (all-zero
    ids are invalid too)."""
    if value is None:
        return None
    match = _VERSION_00.fullmatch(value.strip(" \t"))
    if match is None:
        return None
    trace_id, parent_id, flags = match.groups()
    if trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    return TraceParent(trace_id, parent_id, flags)
