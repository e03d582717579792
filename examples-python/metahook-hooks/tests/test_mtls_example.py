"""examples-python/mtls as its README runs it: certificates from its make-certs.sh, `python3 hook.py` with
PORT and the TLS_* variables, called with and without the hub's client certificate."""

import http.client
import json
import os
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from test_server import connectable, free_port, wait_until

EXAMPLE = Path(__file__).resolve().parents[2] / "mtls"
LIBRARY = Path(__file__).resolve().parents[1]

@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("certs")
    subprocess.run(["sh", str(EXAMPLE / "make-certs.sh"), str(directory)], check=True, capture_output=True)
    return directory


@pytest.fixture(scope="module")
def hook(certs):
    port = free_port()
    env = {**os.environ, "PORT": str(port), "HOST": "127.0.0.1", "PYTHONPATH": str(LIBRARY),
           "TLS_CERT_FILE": str(certs / "hook.crt"), "TLS_KEY_FILE": str(certs / "hook.key"),
           "TLS_CLIENT_CA_FILE": str(certs / "ca.crt")}
    process = subprocess.Popen([sys.executable, "hook.py"], cwd=EXAMPLE, env=env, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: connectable(port))
        yield port, process
    finally:
        process.terminate()
        process.wait(timeout=15)


def hub_context(certs, with_certificate=True):
    context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    if with_certificate:
        context.load_cert_chain(certs / "hub.crt", certs / "hub.key")
    return context


def note(name, spec):
    return {"controller": {}, "parent": {"apiVersion": "python.examples.metahook.dev/v1", "kind": "Note",
            "metadata": {"name": name, "namespace": "docs"}, "spec": spec},
            "children": {"ConfigMap.v1": {}}, "related": {}, "finalizing": False}


def post(port, context, body, path="/sync"):
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.headers, response.read().decode()
    finally:
        conn.close()


def test_a_json_note_becomes_a_configmap(hook, certs):
    port, _ = hook
    status, _, text = post(port, hub_context(certs), note("release", {"format": "json", "text": '{"v": 1}'}))
    assert status == 200
    response = json.loads(text)
    assert [(c["metadata"]["name"], c["data"]) for c in response["children"]] == [("release-note", {"note.json": '{"v": 1}'})]
    assert response["status"] == {"configMap": "release-note", "key": "note.json"}
    assert "events" not in response


def test_a_note_that_is_not_json_is_a_permanent_error(hook, certs):
    port, _ = hook
    status, headers, text = post(port, hub_context(certs), note("broken", {"format": "json", "text": "{not json"}))
    assert (status, headers["Metahook-Error"]) == (422, "permanent")
    assert text.splitlines()[0].startswith("spec.text is not valid JSON (")


def test_an_empty_note_is_published_with_a_warning_event(hook, certs):
    port, _ = hook
    status, _, text = post(port, hub_context(certs), note("blank", {"text": ""}))
    assert status == 200
    assert json.loads(text)["events"] == [{"type": "Warning", "reason": "EmptyNote",
                                           "message": "spec.text is empty: the ConfigMap will hold an empty note"}]


def test_only_the_hub_with_its_client_certificate_gets_through(hook, certs):
    port, _ = hook
    with pytest.raises((ssl.SSLError, ConnectionError)):
        post(port, hub_context(certs, with_certificate=False), note("x", {"text": "hi"}))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=hub_context(certs), timeout=10)
    conn.request("GET", "/healthz")
    assert conn.getresponse().status == 200
    conn.close()


def test_without_the_tls_files_the_hook_refuses_to_start():
    env = {k: v for k, v in os.environ.items() if not k.startswith("TLS_")}
    result = subprocess.run([sys.executable, "hook.py"], cwd=EXAMPLE, env={**env, "PYTHONPATH": str(LIBRARY), "PORT": "0"},
                            capture_output=True, text=True, timeout=30)
    assert result.returncode != 0
    assert "set TLS_CERT_FILE, TLS_KEY_FILE, TLS_CLIENT_CA_FILE" in result.stderr
