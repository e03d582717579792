"""request_log(): lines naming the call, and warnings that become Events in the response."""

import asyncio
import io
import json
import threading

import pytest

from metahook_hooks import RequestLog, composite_response, event, request_log, start_server

from test_server import call

PARENT = {"parent": {"kind": "Note", "metadata": {"name": "memo", "namespace": "team"}}, "finalizing": False}
WARNING = {"type": "Warning", "reason": "EmptyNote", "message": "spec.text is empty"}


def warns(request):
    log = request_log()
    log.info("making 1 ConfigMap")
    log.warning("spec.text is empty", reason="EmptyNote")
    return composite_response(children=[])


def warns_beside_its_own_events(request):
    request_log().warning("spec.text is empty", reason="EmptyNote")
    return composite_response(children=[], events=[event("Normal", "Created", "ConfigMap memo")])


async def warns_async(request):
    await asyncio.sleep(0)
    request_log().warning("spec.text is empty", reason="EmptyNote")
    return composite_response(children=[])


SHARED = {"children": []}


def returns_a_shared_dict(request):
    request_log().warning("again")
    return SHARED


def warns_then_fails(request):
    request_log().warning("about to fail")
    raise ValueError("boom")


def customize(request):
    request_log().warning("no related objects needed")
    return {"relatedResources": []}


def warns_at_length(request):
    request_log().warning("x" * 5000)
    return composite_response(children=[])


ROUTES = {
    "/warns": warns,
    "/own-events": warns_beside_its_own_events,
    "/async": warns_async,
    "/shared": returns_a_shared_dict,
    "/fails": warns_then_fails,
    "/customize": customize,
    "/long": warns_at_length,
}


@pytest.fixture()
def served():
    log = io.StringIO()
    server = start_server(ROUTES, log_stream=log)
    yield server, log
    server.shutdown()
    server.server_close()


def events_of(server, path, body=PARENT):
    status, _, text = call(server, path, body=body)
    assert status == 200, text
    return json.loads(text).get("events")


def test_a_plain_function_logs_lines_naming_the_parent_and_its_warnings_become_events(served):
    server, log = served
    assert events_of(server, "/warns") == [WARNING]
    assert log.getvalue().splitlines() == [
        "hook /warns team/memo: making 1 ConfigMap",
        "hook /warns team/memo: warning EmptyNote: spec.text is empty",
    ]


def test_warnings_come_after_the_events_the_hook_returned(served):
    server, _ = served
    assert events_of(server, "/own-events") == [
        {"type": "Normal", "reason": "Created", "message": "ConfigMap memo"},
        WARNING,
    ]


def test_async_hooks_have_their_call_logger(served):
    server, log = served
    assert events_of(server, "/async") == [WARNING]
    assert "hook /async team/memo: warning EmptyNote" in log.getvalue()


def test_the_returned_dict_is_not_changed_in_place(served):
    server, _ = served
    for _ in range(2):
        assert events_of(server, "/shared") == [{"type": "Warning", "reason": "HookWarning", "message": "again"}]
    assert SHARED == {"children": []}


def test_a_decorator_request_names_its_object(served):
    server, log = served
    body = {"object": {"metadata": {"name": "prod"}}, "attachments": {}, "finalizing": False}
    assert events_of(server, "/warns", body=body) == [WARNING]
    assert "hook /warns prod: making 1 ConfigMap" in log.getvalue()


def test_a_failed_call_prints_its_warnings_but_answers_without_them(served):
    server, log = served
    status, _, text = call(server, "/fails", body=PARENT)
    assert status == 500 and "events" not in text
    assert "hook /fails team/memo: warning HookWarning: about to fail" in log.getvalue()


def test_customize_responses_get_no_events(served):
    server, log = served
    status, _, text = call(server, "/customize", body={"controller": {}, "parent": PARENT["parent"]})
    assert (status, json.loads(text)) == (200, {"relatedResources": []})
    assert "hook /customize team/memo: warning HookWarning: no related objects needed" in log.getvalue()


def test_long_messages_are_cut_to_1024_characters(served):
    server, log = served
    (warning,) = events_of(server, "/long")
    assert len(warning["message"]) == 1024 and warning["message"].endswith("x...")
    (line,) = log.getvalue().splitlines()
    assert line == "hook /long team/memo: warning HookWarning: " + "x" * 1021 + "..."


def test_concurrent_calls_each_see_their_own_logger():
    # Both calls wait until both are running, then warn: a logger shared between calls would put
    # one parent's warning into the other's response.
    both_running = threading.Barrier(2, timeout=10)

    def sync(request):
        both_running.wait()
        request_log().warning(request["parent"]["metadata"]["name"])
        return composite_response(children=[])

    server = start_server({"/sync": sync}, log_stream=io.StringIO())
    try:
        bodies = [{"parent": {"metadata": {"name": name}}, "finalizing": False} for name in ("a", "b")]
        results = {}
        threads = [threading.Thread(target=lambda b=b: results.update({b["parent"]["metadata"]["name"]: events_of(server, "/sync", b)}))
                   for b in bodies]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(15)
        assert {name: [e["message"] for e in events] for name, events in results.items()} == {"a": ["a"], "b": ["b"]}
    finally:
        server.shutdown()
        server.server_close()


def test_request_logs_are_json_lines_when_request_logging_is_on():
    log = io.StringIO()
    server = start_server(ROUTES, log_requests=True, log_stream=log)
    try:
        call(server, "/warns", body=PARENT)
    finally:
        server.shutdown()
        server.server_close()
    info, warning, request = (json.loads(line) for line in log.getvalue().splitlines())
    assert {k: info[k] for k in ("level", "path", "parent", "message")} == {
        "level": "info", "path": "/warns", "parent": "team/memo", "message": "making 1 ConfigMap"}
    assert (warning["level"], warning["reason"]) == ("warning", "EmptyNote")
    assert request["status"] == 200


def test_outside_a_call_the_logger_only_prints(capsys):
    log = request_log()
    log.info("starting")
    log.warning("no cluster here", reason="Offline")
    assert log.events == []
    assert capsys.readouterr().err.splitlines() == ["hook: starting", "hook: warning Offline: no cluster here"]


def test_hook_functions_called_directly_can_log(capsys):
    # A unit test calls the hook without the server: the code that logs must still run.
    assert warns(PARENT) == {"children": []}
    assert "hook: warning EmptyNote: spec.text is empty" in capsys.readouterr().err


def test_a_warning_needs_a_reason():
    with pytest.raises(ValueError, match="reason"):
        RequestLog().warning("why?", reason="")
