"""The hub's `traceparent`: checked, handed to the hook, and named in every log line of the call."""

import io
import json

import pytest

from metahook_hooks import composite_response, request_log, start_server
from metahook_hooks.trace_context import TraceParent, parse_traceparent

from test_server import call

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE}-00f067aa0ba902b7-01"
PARENT = {"parent": {"kind": "Note", "metadata": {"name": "memo", "namespace": "team"}}, "finalizing": False}


def test_a_version_00_traceparent_is_read_field_by_field():
    parsed = parse_traceparent(TRACEPARENT)
    assert parsed == TraceParent(TRACE, "00f067aa0ba902b7", "01")
    assert parsed.header == TRACEPARENT
    assert parse_traceparent(f" {TRACEPARENT}\t") == parsed, "optional white space around the value"
    assert parse_traceparent(f"00-{TRACE}-00f067aa0ba902b7-00").flags == "00", "not sampled is still a trace"


@pytest.mark.parametrize("value", [
    None,
    "",
    f"01-{TRACE}-00f067aa0ba902b7-01",                  # a version this library does not know
    f"ff-{TRACE}-00f067aa0ba902b7-01",                  # the invalid version
    f"00-{'0' * 32}-00f067aa0ba902b7-01",               # all-zero trace id
    f"00-{TRACE}-{'0' * 16}-01",                        # all-zero parent id
    f"00-{TRACE.upper()}-00f067aa0ba902b7-01",          # upper-case hex
    f"00-{TRACE[:-1]}-00f067aa0ba902b7-01",             # a digit short
    f"00-{TRACE}-00f067aa0ba902b7-01-extra",            # fields version 00 does not have
    f"00_{TRACE}_00f067aa0ba902b7_01",
    f"00-{TRACE[:-1]}g-00f067aa0ba902b7-01",            # not hex
])
def test_anything_else_is_no_trace(value):
    assert parse_traceparent(value) is None


SEEN = {}


def sync(request):
    log = request_log()
    SEEN.update(trace_id=log.trace_id, traceparent=log.traceparent)
    log.info("making 1 ConfigMap")
    log.warning("spec.text is empty", reason="EmptyNote")
    return composite_response(children=[])


def broken(request):
    raise ValueError("no replicas in spec")


def served_call(path, headers, log_requests=False):
    """The log lines of one call of `path` with `headers`; the hook's view of the trace is in SEEN."""
    SEEN.clear()
    log = io.StringIO()
    server = start_server({"/sync": sync, "/broken": broken}, log_requests=log_requests, log_stream=log)
    try:
        call(server, path, body=PARENT, headers=headers)
    finally:
        server.shutdown()
        server.server_close()
    return log.getvalue().splitlines()


def test_the_hook_and_each_line_of_the_call_name_the_trace():
    lines = served_call("/sync", {"traceparent": TRACEPARENT})
    assert SEEN == {"trace_id": TRACE, "traceparent": TRACEPARENT}
    assert lines == [
        f"hook /sync team/memo trace={TRACE}: making 1 ConfigMap",
        f"hook /sync team/memo trace={TRACE}: warning EmptyNote: spec.text is empty",
    ]


def test_json_lines_and_the_request_line_carry_the_trace():
    info, warning, request = (json.loads(line) for line in served_call("/sync", {"traceparent": TRACEPARENT}, True))
    assert (info["trace"], warning["trace"], request["trace"]) == (TRACE, TRACE, TRACE)
    assert request["status"] == 200


def test_a_failed_call_names_its_trace():
    (line, *_) = [line for line in served_call("/broken", {"traceparent": TRACEPARENT}) if "->" in line]
    assert line == f"hook server: POST /broken -> 500 (ValueError: no replicas in spec) trace={TRACE}"


@pytest.mark.parametrize("headers", [{}, {"traceparent": f"00-{'0' * 32}-00f067aa0ba902b7-01"}])
def test_without_a_valid_traceparent_there_is_no_trace(headers):
    lines = served_call("/sync", headers)
    assert SEEN == {"trace_id": "", "traceparent": ""}
    assert lines[0] == "hook /sync team/memo: making 1 ConfigMap"
    request = json.loads(served_call("/sync", headers, True)[-1])
    assert "trace" not in request


def test_outside_a_call_there_is_no_trace():
    assert (request_log().trace_id, request_log().traceparent) == ("", "")
