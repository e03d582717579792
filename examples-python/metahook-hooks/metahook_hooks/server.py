"""A threaded HTTP server that routes hook calls (JSON POSTs) to plain Python functions.

Each route maps a path to `fn(request: dict) -> dict`. Errors are answered so that the hub can put
them in a Kubernetes Event on the parent: the hub reports any non-200 answer as
"unsupported status code: <code> body: <body>" (first 1 KiB of the body), so the body starts with
the one line a human needs and only then carries the traceback.
"""

from __future__ import annotations

import json
import sys
import threading
import traceback
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

__all__ = ["Handler", "RetryLater", "make_server", "serve", "start_server"]

Handler = Callable[[dict[str, Any]], Mapping[str, Any] | None]


class RetryLater(Exception):
    """Raise from a hook to answer 429 with `Retry-After`: the hub calls again after that many
    seconds, without recording an error (e.g. while an external system is busy)."""

    def __init__(self, seconds: int, message: str = "") -> None:
        super().__init__(message or f"retry after {seconds}s")
        self.seconds = seconds


def make_server(routes: Mapping[str, Handler], port: int = 0, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """A bound, not yet serving, server for `routes` (`{"/sync": sync, ...}`)."""
    for path, fn in routes.items():
        if not path.startswith("/") or not callable(fn):
            raise ValueError(f"route {path!r}: paths start with '/' and map to a function")
    return ThreadingHTTPServer((host, port), _handler_class(dict(routes)))


def start_server(routes: Mapping[str, Handler], port: int = 0, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """Serves `routes` in a background thread and returns the server at once (tests use port 0 and
    read `server.server_address[1]`). Stop it with `server.shutdown(); server.server_close()`."""
    server = make_server(routes, port, host)
    threading.Thread(target=server.serve_forever, name=f"metahook-hooks:{server.server_address[1]}", daemon=True).start()
    return server


def serve(routes: Mapping[str, Handler], port: int = 8080, host: str = "0.0.0.0") -> None:
    """Serves `routes` until interrupted. Listens on all interfaces by default, as a hook in a Pod must."""
    server = make_server(routes, port, host)
    print(f"metahook hooks {sorted(routes)} listening on http://{host}:{server.server_address[1]}", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def _handler_class(routes: dict[str, Handler]) -> type[BaseHTTPRequestHandler]:
    class HookRequestHandler(BaseHTTPRequestHandler):
        # HTTP/1.1 keeps the hub's connections alive; every answer therefore sets Content-Length.
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            body = self._read_body()
            if body is None:
                return
            fn = routes.get(self._path())
            if fn is None:
                return self._not_found()
            try:
                request = json.loads(body)
            except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
                return self._reply(400, f"request body is not valid JSON: {e}")
            if not isinstance(request, dict):
                return self._reply(400, f"request body must be a JSON object, not {type(request).__name__}")
            self._call(fn, request)

        def _call(self, fn: Handler, request: dict[str, Any]) -> None:
            path = self._path()
            try:
                response = fn(request)
            except RetryLater as e:
                return self._reply(429, str(e), {"Retry-After": str(int(e.seconds))})
            except Exception as e:  # any hook failure becomes a 500 that the hub reports
                trace = traceback.format_exc()
                self.log_error("hook %s failed:\n%s", path, trace)
                return self._reply(500, f"hook {path} raised {type(e).__name__}: {e}\n\n{trace}")
            if response is None:
                return self._reply(500, f"hook {path} returned nothing")
            if not isinstance(response, Mapping):
                return self._reply(500, f"hook {path} must return a dict, not {type(response).__name__}")
            try:
                encoded = json.dumps(response).encode()
            except (TypeError, ValueError) as e:
                return self._reply(500, f"hook {path} response is not JSON: {e}")
            self._send(200, "application/json", encoded)

        def _not_post(self) -> None:
            if self._read_body() is None:
                return
            if self._path() not in routes:
                return self._not_found()
            self._reply(405, f"{self.command} not allowed: hooks are called with POST", {"Allow": "POST"})

        do_GET = do_HEAD = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = _not_post

        def _path(self) -> str:
            return urlsplit(self.path).path

        def _not_found(self) -> None:
            self._reply(404, f"no hook at {self._path()}; known paths: {', '.join(sorted(routes))}")

        def _read_body(self) -> bytes | None:
            """The whole body, or None after answering 400/411. Read before answering anything, so
            that unread bytes cannot be taken for the next request on a kept-alive connection."""
            length = self.headers.get("Content-Length")
            if length is None and (self.command == "POST" or "Transfer-Encoding" in self.headers):
                self.close_connection = True
                self._reply(411, "the request needs a Content-Length header")
                return None
            try:
                return self.rfile.read(int(length)) if length is not None else b""
            except ValueError:
                self.close_connection = True
                self._reply(400, f"bad Content-Length {length!r}")
                return None

        def _reply(self, code: int, text: str, headers: Mapping[str, str] | None = None) -> None:
            self._send(code, "text/plain; charset=utf-8", (text + "\n").encode(), headers or {})

        def _send(self, code: int, content_type: str, body: bytes, headers: Mapping[str, str] | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            # Successful calls come at every resync; only failures are worth a log line.
            if isinstance(code, int) and code >= 400:
                super().log_request(code, size)

    return HookRequestHandler
