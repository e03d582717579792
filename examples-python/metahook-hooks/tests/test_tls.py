"""HTTPS and mutual TLS, with certificates made by the openssl command, and certificate rotation the
way the kubelet does it (files renamed over, or the `..data` symlink swapped)."""

import http.client
import io
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest

from metahook_hooks import composite_response, make_server, start_server
from metahook_hooks.tls import ReloadingContext, TlsFiles

from test_server import REQUEST, connectable, free_port, wait_until
from tls_certs import make_ca, make_leaf


def sync(request):
    return composite_response(children=[], status={"parent": request["parent"]["metadata"]["name"]})


ROUTES = {"/sync": sync}


class Pki:
    def __init__(self, directory):
        self.ca = make_ca(directory / "ca")
        self.server1 = make_leaf(self.ca, directory / "s1", "server-1", "0x1001")
        self.server2 = make_leaf(self.ca, directory / "s2", "server-2", "0x1002")
        self.client = make_leaf(self.ca, directory / "client", "hub", "0x2001", server=False)
        self.other_ca = make_ca(directory / "other", "other-ca")
        self.stranger = make_leaf(self.other_ca, directory / "other", "stranger", "0x3001", server=False)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture()
def servers():
    """Starts servers and stops them all at the end of the test."""
    started = []

    def start(**options):
        server = start_server(ROUTES, log_stream=options.pop("log_stream", io.StringIO()), **options)
        started.append(server)
        return server

    yield start
    for server in started:
        server.shutdown()
        server.server_close()


def client_context(pki, client=None):
    context = ssl.create_default_context(cafile=str(pki.ca.cert))
    if client is not None:
        context.load_cert_chain(client.cert, client.key)
    return context


def https(server, context, path="/sync", method="POST"):
    """(status, text, the server certificate's serial number and common name) over a new connection."""
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=5)
    try:
        body = json.dumps(REQUEST).encode() if method == "POST" else None
        conn.request(method, path, body=body)
        response = conn.getresponse()
        text = response.read().decode()
        peer = conn.sock.getpeercert()
        common_name = dict(item[0] for item in peer["subject"])["commonName"]
        return response.status, text, (peer["serialNumber"], common_name)
    finally:
        conn.close()


def test_https_serves_hooks_and_health_checks(pki, servers):
    server = servers(tls_cert=str(pki.server1.cert), tls_key=str(pki.server1.key))
    assert server.url == f"https://127.0.0.1:{server.port}"
    status, text, peer = https(server, client_context(pki))
    assert (status, json.loads(text)["status"], peer) == (200, {"parent": "p"}, ("1001", "server-1"))
    assert https(server, client_context(pki), "/healthz", "GET")[:2] == (200, "ok\n")


def test_plain_http_to_the_tls_port_is_refused_and_logged(pki, servers):
    log = io.StringIO()
    server = servers(tls_cert=str(pki.server1.cert), tls_key=str(pki.server1.key), log_stream=log)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    with pytest.raises((ConnectionError, http.client.RemoteDisconnected)):
        conn.request("POST", "/sync", body=b"{}")
        conn.getresponse()
    conn.close()
    wait_until(lambda: "TLS handshake with 127.0.0.1:" in log.getvalue())


def test_with_a_client_ca_a_client_certificate_it_signed_is_required(pki, servers):
    server = servers(tls_cert=str(pki.server1.cert), tls_key=str(pki.server1.key), client_ca=str(pki.ca.cert))
    with pytest.raises((ssl.SSLError, ConnectionError)):
        https(server, client_context(pki))
    with pytest.raises((ssl.SSLError, ConnectionError)):
        https(server, client_context(pki, pki.stranger))
    assert https(server, client_context(pki, pki.client))[0] == 200
    assert https(server, client_context(pki, pki.client), "/healthz", "GET")[:2] == (200, "ok\n")


def test_a_drain_does_not_wait_for_idle_tls_clients_to_answer_the_close(pki):
    # A kept-alive client that is not reading never answers TLS close_notify; waiting for it would
    # hold the drain (and the Pod's termination) for its whole deadline.
    server = start_server(ROUTES, tls_cert=str(pki.server1.cert), tls_key=str(pki.server1.key), drain_seconds=20)
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=client_context(pki), timeout=30)
    try:
        conn.request("POST", "/sync", body=json.dumps(REQUEST).encode())
        conn.getresponse().read()
        started = time.monotonic()
        server.shutdown()
        assert time.monotonic() - started < 5
    finally:
        conn.close()
        server.server_close()


def install(pair, directory):
    """Puts `pair` at directory/tls.crt and tls.key by renaming new files over them, as an atomic
    writer does: a reader sees the old file or the new one, never half of one."""
    for source, name in [(pair.cert, "tls.crt"), (pair.key, "tls.key")]:
        shutil.copyfile(source, directory / f".{name}.tmp")
        os.replace(directory / f".{name}.tmp", directory / name)


def serial_of(server, pki):
    return https(server, client_context(pki))[2][0]


def test_files_renamed_over_serve_the_new_certificate_to_the_next_connection(pki, servers, tmp_path):
    install(pki.server1, tmp_path)
    server = servers(tls_cert=str(tmp_path / "tls.crt"), tls_key=str(tmp_path / "tls.key"))
    assert serial_of(server, pki) == "1001"
    install(pki.server2, tmp_path)
    wait_until(lambda: serial_of(server, pki) == "1002", timeout=10)


def kubelet_update(pair, mount, version):
    """What the kubelet does to a mounted Secret: the files go into a new hidden directory, then the
    `..data` symlink is swapped to it in one rename; tls.crt and tls.key are links through `..data`."""
    data = mount / f"..{version}"
    data.mkdir()
    shutil.copyfile(pair.cert, data / "tls.crt")
    shutil.copyfile(pair.key, data / "tls.key")
    (mount / "..data_tmp").symlink_to(data.name)
    os.replace(mount / "..data_tmp", mount / "..data")
    for name in ("tls.crt", "tls.key"):
        if not (mount / name).is_symlink():
            (mount / name).symlink_to(f"..data/{name}")


def test_a_kubelet_secret_update_serves_the_new_certificate_to_the_next_connection(pki, servers, tmp_path):
    kubelet_update(pki.server1, tmp_path, "2024_01_01_00_00_00.1")
    server = servers(tls_cert=str(tmp_path / "tls.crt"), tls_key=str(tmp_path / "tls.key"))
    assert serial_of(server, pki) == "1001"
    kubelet_update(pki.server2, tmp_path, "2024_01_01_00_05_00.2")
    wait_until(lambda: serial_of(server, pki) == "1002", timeout=10)


def test_a_new_pair_that_does_not_load_keeps_the_old_certificate_and_logs_one_line(pki, servers, tmp_path):
    install(pki.server1, tmp_path)
    log = io.StringIO()
    server = servers(tls_cert=str(tmp_path / "tls.crt"), tls_key=str(tmp_path / "tls.key"), log_stream=log)
    # The new certificate arrives, but not its key: the pair does not match.
    shutil.copyfile(pki.server2.cert, tmp_path / ".tmp")
    os.replace(tmp_path / ".tmp", tmp_path / "tls.crt")
    deadline = time.monotonic() + 2.5  # several checks, a second apart
    while time.monotonic() < deadline:
        assert serial_of(server, pki) == "1001"
        time.sleep(0.2)
    errors = [line for line in log.getvalue().splitlines() if "still serving the previous certificate" in line]
    assert len(errors) == 1, log.getvalue()
    assert errors[0].startswith(f"hook server: TLS: cannot load TLS certificate {tmp_path / 'tls.crt'}")
    # The key follows: now the new pair loads.
    install(pki.server2, tmp_path)
    wait_until(lambda: serial_of(server, pki) == "1002", timeout=10)
    assert f"TLS: loaded the new certificate {tmp_path / 'tls.crt'}" in log.getvalue()


def test_the_files_are_checked_at_most_once_a_second(pki, tmp_path):
    install(pki.server1, tmp_path)
    now = [100.0]
    tls = ReloadingContext(TlsFiles(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key")), print, clock=lambda: now[0])
    first = tls.context()
    install(pki.server2, tmp_path)
    now[0] += 0.9
    assert tls.context() is first, "checked again within the second"
    now[0] += 0.1
    second = tls.context()
    assert second is not first
    now[0] += 5
    assert tls.context() is second, "unchanged files are not loaded again"


def test_tls_settings_that_cannot_work_are_refused_at_start(pki, tmp_path):
    with pytest.raises(ValueError, match="both a certificate and its private key"):
        make_server(ROUTES, tls_cert=str(pki.server1.cert))
    with pytest.raises(ValueError, match="client CA .* needs a server certificate"):
        make_server(ROUTES, client_ca=str(pki.ca.cert))
    with pytest.raises(ValueError, match=f"cannot load TLS certificate {tmp_path / 'missing.crt'}"):
        make_server(ROUTES, tls_cert=str(tmp_path / "missing.crt"), tls_key=str(pki.server1.key))
    with pytest.raises(ValueError, match="cannot load TLS certificate"):
        make_server(ROUTES, tls_cert=str(pki.server1.cert), tls_key=str(pki.server2.key))
    with pytest.raises(ValueError, match=f"cannot load client CA {pki.server1.key}"):
        make_server(ROUTES, tls_cert=str(pki.server1.cert), tls_key=str(pki.server1.key), client_ca=str(pki.server1.key))


ENV_HOOK = """
from metahook_hooks import composite_response, serve
serve({"/sync": lambda request: composite_response(children=[])})
"""


def test_serve_takes_the_tls_files_from_the_environment(pki):
    port = free_port()
    env = {**os.environ, "PORT": str(port), "HOST": "127.0.0.1", "PYTHONPATH": str(Path(__file__).parent.parent),
           "TLS_CERT_FILE": str(pki.server1.cert), "TLS_KEY_FILE": str(pki.server1.key),
           "TLS_CLIENT_CA_FILE": str(pki.ca.cert)}
    hook = subprocess.Popen([sys.executable, "-c", ENV_HOOK], env=env, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: connectable(port))

        class Server:
            pass

        server = Server()
        server.port = port
        with pytest.raises((ssl.SSLError, ConnectionError)):
            https(server, client_context(pki))
        assert https(server, client_context(pki, pki.client))[:2] == (200, '{"children": []}')
        hook.terminate()
        assert hook.wait(timeout=15) == 0
        banner = hook.stderr.readline()
        assert f"listening on https://127.0.0.1:{port}" in banner
        assert f"client certificates signed by {pki.ca.cert} required" in banner
    finally:
        hook.kill()
        hook.wait()
