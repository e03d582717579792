#!/usr/bin/env python3
"""A real HTTP hook server for integration tests.

Usage: hookserver.py HANDLERS.py

HANDLERS.py defines plain functions named after URL paths: POST /sync calls sync(request).
A handler returns the response object (serialised as JSON with status 200), or a tuple
(status_code, body_text[, headers]) to send something else verbatim — how tests make a hook
misbehave. A handler that raises answers 500 with the exception text.

The server binds 127.0.0.1 on $HOOK_PORT (default: a free port), prints "PORT <n>" on stdout, and appends
one JSON line per request ({"path", "request", "headers"}, header names in lower case) to the file named
by $HOOK_LOG, if set.
"""
import json
import os
import runpy
import sys
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HANDLERS = runpy.run_path(sys.argv[1])
LOG = os.environ.get("HOOK_LOG")


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server naming)
        length = int(self.headers.get("Content-Length", 0))
        request = json.loads(self.rfile.read(length) or b"null")
        name = self.path.strip("/").replace("/", "_")
        if LOG:
            with open(LOG, "a", encoding="utf-8") as log:
                headers = {key.lower(): value for key, value in self.headers.items()}
                log.write(json.dumps({"path": self.path, "request": request, "headers": headers}) + "\n")
        handler = HANDLERS.get(name)
        if handler is None:
            self.reply(404, f"no handler for {self.path}")
            return
        try:
            result = handler(request)
        except Exception:  # a crashing hook must answer 500, like a real one
            self.reply(500, traceback.format_exc())
            return
        if isinstance(result, tuple):
            self.reply(*result)
        else:
            self.reply(200, json.dumps(result), {"Content-Type": "application/json"})

    def reply(self, code, body, headers=None):
        data = body.encode() if isinstance(body, str) else body
        self.send_response(code)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # The hub hanging up on a slow hook (its timeout) is expected in tests, not an error.
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class ReusableServer(Server):
    allow_reuse_address = True  # a restarted hook takes its old port back at once


server = ReusableServer(("127.0.0.1", int(os.environ.get("HOOK_PORT", "0"))), Handler)
print(f"PORT {server.server_address[1]}", flush=True)
server.serve_forever()
