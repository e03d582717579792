#!/usr/bin/env python3
"""A real hook server for the hook-transport tests and benchmark: TLS, client certificates, bearer and
basic auth, ETags, HTTP/1.1 keep-alive.

Usage: transport_hook.py CONFIG.json

CONFIG keys (all optional):
  tls:   {"cert": PEM file, "key": PEM file, "client_ca": PEM file}  serve HTTPS; with client_ca,
         a client certificate signed by it is required (mutual TLS)
  auth:  {"bearer_file": file}  expect "Authorization: Bearer <file contents>", re-read on every call
         so a test can rotate the token; {"basic": {"username": u, "password": p}}
  etag:  true  answer with an ETag (a digest of the parent's spec) and 304 to a matching If-None-Match
  log:   file  one JSON line per request: path, status, ifNoneMatch, clientCert, clientCertSubject (the
         client certificate's CN)
  pad:   n  put n characters before the 401 body's quote of the Authorization header, to place the
         credentials where the hub cuts what it quotes of a body
  nagle: true  leave Nagle's algorithm on, as http.server does by default (only the benchmark sets it,
         to show what that costs on kept-alive connections)

POST /sync answers like a small CompositeController hook: one ConfigMap "<parent>-cm" carrying
spec.greeting, and status {"greeting": ...}. A request with wrong credentials gets 401 whose body
quotes the Authorization header it received (a careless real hook would; the hub must not pass the
credentials on into its Events). The server binds 127.0.0.1 on a free port and prints "PORT <n>".
"""
import base64
import hashlib
import json
import ssl
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CONFIG = json.load(open(sys.argv[1], encoding="utf-8"))


def expected_authorization():
    auth = CONFIG.get("auth") or {}
    if "bearer_file" in auth:
        with open(auth["bearer_file"], encoding="utf-8") as f:
            return "Bearer " + f.read().strip()
    if "basic" in auth:
        pair = f"{auth['basic']['username']}:{auth['basic']['password']}".encode()
        return "Basic " + base64.b64encode(pair).decode()
    return None


def answer(request):
    parent = request["parent"]
    greeting = (parent.get("spec") or {}).get("greeting", "hi")
    return {
        "status": {"greeting": greeting},
        "children": [{"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": parent["metadata"]["name"] + "-cm"},
                      "data": {"greeting": greeting}}],
    }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a production hook server would
    # http.server sends headers and body in two writes. With Nagle's algorithm on, the body waits for
    # the client to ACK the headers, which a delayed ACK holds back for ~40 ms: every call on a
    # kept-alive connection would take 40 ms (see the hook benchmark).
    disable_nagle_algorithm = not CONFIG.get("nagle", False)

    def setup(self):
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()  # here, in the connection's thread, not in the accept loop
        super().setup()

    def do_POST(self):  # noqa: N802 (http.server naming)
        length = int(self.headers.get("Content-Length", 0))
        request = json.loads(self.rfile.read(length) or b"null")
        expected = expected_authorization()
        received = self.headers.get("Authorization")
        if expected is not None and received != expected:
            pad = "x" * CONFIG.get("pad", 0)
            self.reply(401, f"{pad}bad credentials: {received}", {"Content-Type": "text/plain"})
            return
        headers = {"Content-Type": "application/json"}
        if CONFIG.get("etag"):
            parent = request["parent"]
            digest = hashlib.sha256(json.dumps(parent.get("spec"), sort_keys=True).encode()).hexdigest()
            tag = f'"{digest[:16]}"'
            if self.headers.get("If-None-Match") == tag:
                self.reply(304, b"", {"ETag": tag})
                return
            headers["ETag"] = tag
        self.reply(200, json.dumps(answer(request)), headers)

    def reply(self, code, body, headers):
        data = body.encode() if isinstance(body, str) else body
        self.send_response(code)
        for key, value in headers.items():
            self.send_header(key, value)
        if code != 304:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        if CONFIG.get("log"):
            cert = self.request.getpeercert() if isinstance(self.request, ssl.SSLSocket) else None
            subject = dict(rdn[0] for rdn in cert["subject"]) if cert else {}
            entry = {"path": self.path, "status": code, "ifNoneMatch": self.headers.get("If-None-Match"),
                     "clientCert": bool(cert), "clientCertSubject": subject.get("commonName")}
            with open(CONFIG["log"], "a", encoding="utf-8") as log:
                log.write(json.dumps(entry) + "\n")

    def log_message(self, *args):
        pass


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # Refused handshakes (no client certificate, an untrusted server certificate on the client's
        # side) and clients hanging up are what some tests are about, not errors of this server.
        if not isinstance(sys.exc_info()[1], (ssl.SSLError, ConnectionError, OSError)):
            super().handle_error(request, client_address)


server = Server(("127.0.0.1", 0), Handler)
tls = CONFIG.get("tls")
if tls:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(tls["cert"], tls["key"])
    if tls.get("client_ca"):
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(tls["client_ca"])
    server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
print(f"PORT {server.server_address[1]}", flush=True)
server.serve_forever()
