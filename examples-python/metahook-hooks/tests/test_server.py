"""The server, started on port 0 and called over real HTTP."""

import http.client
import json
import urllib.error
import urllib.request

import pytest

from metahook_hooks import RetryLater, composite_response, make_server, start_server


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


ROUTES = {"/sync": sync, "/finalize": finalize, "/broken": broken, "/silent": silent, "/busy": busy, "/not-json": not_json}
REQUEST = {"parent": {"metadata": {"name": "p"}}, "finalizing": True}


@pytest.fixture(scope="module")
def server():
    server = start_server(ROUTES)
    yield server
    server.shutdown()
    server.server_close()


def call(server, path, body=REQUEST, method="POST"):
    """(status, headers, text) of one call; `body` bytes are sent as is, anything else as JSON."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    url = f"http://127.0.0.1:{server.server_address[1]}{path}"
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
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
    assert "/nope" in text and "/finalize, /not-json, /silent, /sync" in text


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
