"""The server, started on port 0 and called over real HTTP."""

import asyncio
import concurrent.futures
import http.client
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from metahook_hooks import (
    PermanentError,
    RetryLater,
    composite_response,
    listen_address,
    make_server,
    run_hook_on_fixtures,
    start_server,
)


def sync(request):
    return composite_response(children=[], status={"parent": request["parent"]["metadata"]["name"]})


def finalize(request):
    return composite_response(children=[], finalized=request["finalizing"])


def broken(request):
    raise ValueError("no replicas in spec")


def silent(request):
    return None


def busy(request):
    raise RetryLater(7, "database busy")


def not_json(request):
    return {"when": object()}


def invalid(request):
    raise PermanentError("spec.key 'a/b' is not a valid ConfigMap key")


ROUTES = {"/sync": sync, "/finalize": finalize, "/broken": broken, "/silent": silent, "/busy": busy, "/not-json": not_json,
          "/invalid": invalid}
REQUEST = {"parent": {"metadata": {"name": "p"}}, "finalizing": True}


@pytest.fixture(scope="module")
def server():
    server = start_server(ROUTES)
    yield server
    server.shutdown()
    server.server_close()


def call(server, path, body=REQUEST, method="POST", headers=None):
    """(status, headers, text) of one call; `body` bytes are sent as is, anything else as JSON."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    url = f"http://127.0.0.1:{server.server_address[1]}{path}"
    sent = {"Content-Type": "application/json", **(headers or {})}
    req = urllib.request.Request(url, data=data, method=method, headers=sent)
    try:
        with urllib.request.urlopen(req, timeout=5) as response:
            return response.status, response.headers, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


def test_routes_by_path(server):
    status, headers, text = call(server, "/sync")
    assert (status, headers["Content-Type"]) == (200, "application/json")
    assert json.loads(text) == {"children": [], "status": {"parent": "p"}}
    assert json.loads(call(server, "/finalize")[2]) == {"children": [], "finalized": True}


def test_query_strings_do_not_change_the_route(server):
    assert call(server, "/sync?debug=1")[0] == 200


def test_unknown_path_is_404_naming_the_known_ones(server):
    status, _, text = call(server, "/nope")
    assert status == 404
    assert "/nope" in text and "/finalize, /invalid, /not-json, /silent, /sync" in text


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
def test_other_methods_are_405(server, method):
    status, headers, text = call(server, "/sync", body=None, method=method)
    assert (status, headers["Allow"]) == (405, "POST")
    assert method in text


def test_body_that_is_not_json_is_400(server):
    status, _, text = call(server, "/sync", body=b"{not json")
    assert status == 400
    assert text.startswith("request body is not valid JSON")


def test_body_that_is_not_an_object_is_400(server):
    status, _, text = call(server, "/sync", body=[1, 2])
    assert (status, text.strip()) == (400, "request body must be a JSON object, not list")


def test_hook_exception_is_500_with_message_first_then_traceback(server):
    status, _, text = call(server, "/broken")
    assert status == 500
    first_line = text.splitlines()[0]
    assert first_line == "hook /broken raised ValueError: no replicas in spec"
    assert "Traceback (most recent call last)" in text and "in broken" in text


def test_hook_returning_none_is_500(server):
    assert call(server, "/silent")[:3:2] == (500, "hook /silent returned nothing\n")


def test_unserialisable_response_is_500(server):
    status, _, text = call(server, "/not-json")
    assert status == 500 and "response is not JSON" in text


def test_retry_later_is_429_with_retry_after(server):
    status, headers, text = call(server, "/busy")
    assert (status, headers["Retry-After"], text.strip()) == (429, "7", "database busy")


def test_permanent_error_is_422_marked_permanent_with_the_message_first(server):
    status, headers, text = call(server, "/invalid")
    assert (status, headers["Metahook-Error"]) == (422, "permanent")
    assert text.splitlines()[0] == "spec.key 'a/b' is not a valid ConfigMap key"
    assert "Traceback" not in text, "a permanent error is the hook's verdict, not a crash"


def test_a_hook_version_is_sent_with_every_answer_and_only_then():
    versioned = start_server(ROUTES, hook_version="2.1.0")
    try:
        status, headers, _ = call(versioned, "/sync")
        assert (status, headers["Metahook-Hook-Version"]) == (200, "2.1.0")
    finally:
        versioned.shutdown()
        versioned.server_close()
    with pytest.raises(ValueError, match="one line"):
        make_server(ROUTES, hook_version="v1\r\nX-Injected: 1")


def test_without_a_hook_version_no_header_is_sent(server):
    status, headers, _ = call(server, "/sync")
    assert status == 200 and headers.get("Metahook-Hook-Version") is None


def test_serve_takes_the_hook_version_from_the_environment(tmp_path):
    script = tmp_path / "hook.py"
    script.write_text("from metahook_hooks import serve\nserve({'/sync': lambda r: {'children': []}}, port=0, host='127.0.0.1')\n")
    env = {**os.environ, "HOOK_VERSION": "from-env", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    process = subprocess.Popen([sys.executable, str(script)], env=env, stderr=subprocess.PIPE, text=True)
    try:
        banner = process.stderr.readline()
        port = int(banner.split("listening on http://127.0.0.1:")[1].split()[0])
        req = urllib.request.Request(f"http://127.0.0.1:{port}/sync", data=b"{}", method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as response:
            assert response.headers["Metahook-Hook-Version"] == "from-env"
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_permanent_error_is_logged_with_its_message():
    log = io.StringIO()
    server = start_server(ROUTES, log_stream=log)
    try:
        call(server, "/invalid")
    finally:
        server.shutdown()
        server.server_close()
    assert log.getvalue() == "hook server: POST /invalid -> 422 (permanent: spec.key 'a/b' is not a valid ConfigMap key)\n"


def test_post_without_content_length_is_411(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=5)
    conn.putrequest("POST", "/sync")
    conn.endheaders()
    assert conn.getresponse().status == 411
    conn.close()


def test_connection_is_kept_alive_across_errors(server):
    # The hub pools connections: an error answer must not leave the body behind to poison the next call.
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=5)
    conn.connect()
    socket = conn.sock
    for path, body, expected in [("/nope", b'{"a": 1}', 404), ("/sync", b"[]", 400), ("/sync", json.dumps(REQUEST).encode(), 200)]:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        assert response.status == expected
        assert conn.sock is socket
    conn.close()


def test_routes_must_be_paths_to_functions():
    with pytest.raises(ValueError, match="'sync'"):
        make_server({"sync": sync})
    with pytest.raises(ValueError, match="'/sync'"):
        make_server({"/sync": "sync"})


# ---- what a hook in a Pod needs: health, address from the environment, async hooks, logs, drain ----


def test_healthz_answers_get_and_head_for_probes(server):
    status, _, text = call(server, "/healthz", body=None, method="GET")
    assert (status, text) == (200, "ok\n")
    assert call(server, "/healthz", body=None, method="HEAD")[0] == 200


def test_listen_address_comes_from_port_and_host(monkeypatch):
    monkeypatch.delenv("PORT", raising=False)
    monkeypatch.delenv("HOST", raising=False)
    assert listen_address() == ("0.0.0.0", 8080)
    monkeypatch.setenv("PORT", "18081")
    monkeypatch.setenv("HOST", "127.0.0.1")
    assert listen_address() == ("127.0.0.1", 18081)
    assert listen_address(9000, "::1") == ("::1", 9000), "explicit arguments win"
    monkeypatch.setenv("PORT", "http")
    with pytest.raises(ValueError, match="PORT must be a port number, not 'http'"):
        listen_address()


async def async_sync(request):
    await asyncio.sleep(0)
    return composite_response(children=[], status={"async": True})


def test_async_hooks_are_awaited():
    server = start_server({"/sync": async_sync})
    try:
        status, _, text = call(server, "/sync")
        assert status == 200 and json.loads(text) == {"children": [], "status": {"async": True}}
    finally:
        server.shutdown()
        server.server_close()


def test_async_hooks_run_concurrently():
    # /first waits for an event only /second sets: served one after the other, /first would never answer.
    released = asyncio.Event()

    async def first(request):
        await asyncio.wait_for(released.wait(), timeout=10)
        return composite_response(children=[])

    async def second(request):
        released.set()
        return composite_response(children=[])

    server = start_server({"/first": first, "/second": second})
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            waiting = pool.submit(call, server, "/first")
            assert call(server, "/second")[0] == 200
            assert waiting.result(timeout=15)[0] == 200
    finally:
        server.shutdown()
        server.server_close()


def test_requests_are_logged_as_json_with_parent_and_duration():
    log = io.StringIO()
    server = start_server(ROUTES, log_requests=True, log_stream=log)
    try:
        call(server, "/sync", body={"parent": {"kind": "Greeting", "metadata": {"name": "p", "namespace": "ns"}}, "finalizing": False})
        call(server, "/broken")
    finally:
        server.shutdown()
        server.server_close()
    lines = [json.loads(line) for line in log.getvalue().splitlines()]
    ok, failed = lines
    assert {k: ok[k] for k in ("method", "path", "status", "parent", "kind", "finalizing")} == {
        "method": "POST", "path": "/sync", "status": 200, "parent": "ns/p", "kind": "Greeting", "finalizing": False,
    }
    assert isinstance(ok["durationMs"], float) and ok["durationMs"] >= 0
    assert ok["time"].endswith("Z")
    assert (failed["status"], failed["error"]) == (500, "ValueError: no replicas in spec")


def test_fixture_helper_awaits_async_hooks():
    fixtures = Path(__file__).parent / "fixtures"
    response = run_hook_on_fixtures(
        async_sync, fixtures / "controller.json", fixtures / "parent.json", kinds={"caches": "Cache"}
    )
    assert response == {"children": [], "status": {"async": True}}


SIGTERM_HOOK = """
import os, sys, time
from pathlib import Path
from metahook_hooks import composite_response, serve

def slow(request):
    Path(os.environ["STARTED"]).touch()
    while not Path(os.environ["RELEASE"]).exists():
        time.sleep(0.01)
    return composite_response(children=[], status={"finished": True})

serve({"/slow": slow})
print("serve returned", file=sys.stderr)
"""


def test_sigterm_drains_calls_in_flight_then_exits_cleanly(tmp_path):
    started, release = tmp_path / "started", tmp_path / "release"
    port = free_port()
    env = {**os.environ, "PORT": str(port), "HOST": "127.0.0.1", "STARTED": str(started), "RELEASE": str(release),
           "PYTHONPATH": str(Path(__file__).parent.parent)}
    hook = subprocess.Popen([sys.executable, "-c", SIGTERM_HOOK], env=env, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: connectable(port))
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            in_flight = pool.submit(call_port, port, "/slow")
            wait_until(started.exists)
            hook.send_signal(signal.SIGTERM)
            # Draining: no new connections, while the call in flight is still running.
            wait_until(lambda: not connectable(port))
            assert not in_flight.done()
            release.touch()
            status, text = in_flight.result(timeout=15)
        assert (status, json.loads(text)) == (200, {"children": [], "status": {"finished": True}})
        assert hook.wait(timeout=15) == 0
        assert "SIGTERM: draining (1 call(s) in flight)" in hook.stderr.read()
    finally:
        hook.kill()
        hook.wait()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def connectable(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def wait_until(check, timeout=20):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{check} never became true"
        time.sleep(0.02)


def call_port(port, path):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(REQUEST).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=15) as response:
        return response.status, response.read().decode()
