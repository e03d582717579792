"""An asyncio HTTP/1.1 server that routes hook calls (JSON POSTs) to plain functions, sync or async.

Each route maps a path to `fn(request) -> response`, or to `async def fn(request)`. Plain functions run
in a thread pool, so one slow hook call does not hold up the others; coroutines run on the event loop.
Errors are answered so that the hub can put them in a Kubernetes Event on the parent: the hub reports
any non-200 answer as "unsupported status code: <code> body: <body>" (first 1 KiB of the body), so the
body starts with the one line a human needs and only then carries the traceback. Two exceptions say more
than "failed": `RetryLater(seconds)` answers 429 + `Retry-After` (call again then, no error recorded), and
`PermanentError(message)` answers 422 + `Metahook-Error: permanent` (retrying cannot help until the
parent or its children change: the hub reports it once and waits for a change instead of backing off).

A hook that names its version (`hook_version=`, or `$HOOK_VERSION` for `serve`) sends it with every
answer as `Metahook-Hook-Version`: when the hub hears a version it has not heard before, it syncs every
parent again (paced), so rolling out a new hook needs no resync period to show.

What a hook in a Pod needs besides routing: `GET /healthz` for probes, the listen address from `PORT`
and `HOST`, and a graceful stop: on SIGTERM (Kubernetes' way of stopping a Pod) the server stops
accepting connections, lets the calls in flight finish and answer, then returns. With a certificate and
key (`$TLS_CERT_FILE`, `$TLS_KEY_FILE`, and `$TLS_CLIENT_CA_FILE` for mutual TLS) it serves HTTPS, and
picks up a rotated certificate for new connections without a restart (see `tls.py`). Standard library only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import inspect
import json
import os
import signal
import socket
import ssl
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timezone
from typing import IO, Any
from urllib.parse import urlsplit

from .body import DEFAULT_MAX_BODY, BodyError, check_limit, max_body_from_env, read_body
from .request_log import Record, RequestLog, current, format_line, with_events
from .tls import ReloadingContext, TlsFiles, tls_files, tls_files_from_env
from .trace_context import TraceParent, parse_traceparent

__all__ = [
    "DEFAULT_MAX_BODY",
    "DEFAULT_PORT",
    "DRAIN_SECONDS",
    "Handler",
    "HookResult",
    "HOOK_VERSION_ENV",
    "HOOK_VERSION_HEADER",
    "HookServer",
    "PermanentError",
    "RetryLater",
    "listen_address",
    "make_server",
    "serve",
    "start_server",
]

HOOK_VERSION_HEADER = "Metahook-Hook-Version"
"""The response header a hook names its version in."""
HOOK_VERSION_ENV = "HOOK_VERSION"
"""Where `serve` reads the hook's version from when it is given none."""

HookResult = Mapping[str, Any] | None
"""What a hook function returns: the response dict (a `CompositeResponse`, ...), or None (a 500)."""

Handler = Callable[[Any], HookResult | Awaitable[HookResult]]
"""A route's function. The parameter is `Any` so that a function annotated with a precise request type
(`def sync(request: CompositeRequest) -> CompositeResponse`, or `async def`) is a Handler: a callable
taking only `CompositeRequest` is not a callable taking any dict, and a type checker would say so."""

DEFAULT_PORT = 8080
DRAIN_SECONDS = 25.0
"""How long calls in flight may take to finish after SIGTERM: under Kubernetes' default 30 s grace
period, after which the Pod is killed anyway."""

PERMANENT_HEADER = "Metahook-Error"
"""The header that tells the hub a 422 is a `PermanentError`, not some proxy's or framework's 422."""
LINGER_SECONDS = 1.0
"""After refusing a body it did not read, how long the server keeps discarding what the client still
sends before it closes: closing a socket with unread input makes the kernel answer with a reset, and the
client would see "connection reset" instead of the 413 that says why."""
HANDSHAKE_SECONDS = 10.0
"""How long a client may take over the TLS handshake before the connection is dropped."""
CLOSE_SECONDS = 1.0
"""How long closing a TLS connection waits for the client's close_notify before cutting it."""
STREAM_LIMIT = 64 * 1024
"""Longest request or header line (asyncio's default)."""
HOOK_THREADS = 64
HEALTH_PATH = "/healthz"
LOG_ENV = "METAHOOK_LOG_REQUESTS"
_MAX_HEADERS = 100


class RetryLater(Exception):
    """Raise from a hook to answer 429 with `Retry-After`: the hub calls again after that many
    seconds, without recording an error (e.g. while an external system is busy)."""

    def __init__(self, seconds: int, message: str = "") -> None:
        super().__init__(message or f"retry after {seconds}s")
        self.seconds = seconds


class PermanentError(Exception):
    """Raise from a hook when calling again cannot help until the parent or its children change (an
    invalid spec field, say): the answer is 422 with `Metahook-Error: permanent` and the message as the
    body's first line. The hub reports it once, as an Event and a parent condition, and does not retry
    it with backoff as it does a 500; it calls again when the parent or a child changes, or at resync."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def listen_address(port: int | None = None, host: str | None = None) -> tuple[str, int]:
    """(host, port) to listen on: the arguments, else `$HOST` / `$PORT`, else all interfaces and 8080.

    Tools that start a hook (`metahook render --hook-cmd`, test harnesses, Cloud-Run-like platforms)
    pick a free port and pass it in `PORT`, so a hook that does not hard-code one works everywhere.
    """
    if port is None:
        text = os.environ.get("PORT", "").strip()
        try:
            port = int(text) if text else DEFAULT_PORT
        except ValueError:
            raise ValueError(f"PORT must be a port number, not {text!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be between 0 and 65535, not {port}")
    if host is None:
        host = os.environ.get("HOST", "").strip() or "0.0.0.0"
    return host, port


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "json")


class _Connection:
    """One client connection; `idle` while it waits for the next request (safe to close on drain)."""

    def __init__(self, task: asyncio.Task[None]) -> None:
        self.task = task
        self.idle = True


class _Request:
    def __init__(self, method: str, target: str, version: str, headers: dict[str, str]) -> None:
        self.method = method
        self.path = urlsplit(target).path
        self.version = version
        self.headers = headers
        self.body = b""


class _Reply:
    def __init__(self, code: int, body: bytes, content_type: str, headers: Mapping[str, str] | None = None) -> None:
        self.code = code
        self.body = body
        self.content_type = content_type
        self.headers = dict(headers or {})
        self.close = False
        self.linger = False
        self.log: dict[str, Any] = {}


def _text(code: int, text: str, headers: Mapping[str, str] | None = None) -> _Reply:
    return _Reply(code, (text + "\n").encode(), "text/plain; charset=utf-8", headers)


_REASONS = {
    200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 411: "Length Required",
    413: "Content Too Large", 422: "Unprocessable Entity", 429: "Too Many Requests", 500: "Internal Server Error",
    501: "Not Implemented", 503: "Service Unavailable",
}


class HookServer:
    """A bound hook server for `routes` (`{"/sync": sync, ...}`). The socket is bound at construction,
    so `server_address` is known at once (tests bind port 0 and read it).

    Run it with `serve_forever()` (blocking) or `await serve()`; stop it from another thread with
    `shutdown()`, which drains like SIGTERM does, then release the socket with `server_close()`.
    """

    def __init__(
        self,
        routes: Mapping[str, Handler],
        port: int = 0,
        host: str = "127.0.0.1",
        *,
        log_requests: bool = False,
        drain_seconds: float = DRAIN_SECONDS,
        log_stream: IO[str] | None = None,
        max_body: int = DEFAULT_MAX_BODY,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        client_ca: str | None = None,
        hook_version: str | None = None,
    ) -> None:
        if hook_version is not None and (not hook_version.strip() or any(c in hook_version for c in "\r\n")):
            raise ValueError(f"hook_version {hook_version!r}: one line, not empty")
        self.hook_version = hook_version.strip() if hook_version else None
        for path, fn in routes.items():
            if not isinstance(path, str) or not path.startswith("/") or not callable(fn):
                raise ValueError(f"route {path!r}: paths start with '/' and map to a function")
        self.routes = dict(routes)
        self.log_requests = log_requests
        self.drain_seconds = drain_seconds
        self.max_body = check_limit(max_body)
        self._log_stream = log_stream
        files = tls_files(tls_cert, tls_key, client_ca)
        self.tls: ReloadingContext | None = ReloadingContext(files, self._log_text) if files else None
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.create_server((host, port), family=family)
        self.server_address: tuple[str, int] = self._socket.getsockname()[:2]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._connections: set[_Connection] = set()
        self._handshakes: set[asyncio.Task[None]] = set()
        self._ready = threading.Event()
        self._done = threading.Event()

    @property
    def port(self) -> int:
        return self.server_address[1]

    @property
    def url(self) -> str:
        """`http://host:port` or `https://host:port`, for log lines and tests."""
        scheme = "https" if self.tls else "http"
        host = f"[{self.server_address[0]}]" if ":" in self.server_address[0] else self.server_address[0]
        return f"{scheme}://{host}:{self.port}"

    # ---- lifecycle ---------------------------------------------------------------------------

    async def serve(self, *, handle_signals: bool = False) -> None:
        """Serves until `shutdown()` (or SIGTERM/SIGINT with `handle_signals`), then drains: no new
        connections, calls in flight finish (for up to `drain_seconds`), idle connections close."""
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(sig, self._begin_drain, sig)
        accepting = asyncio.ensure_future(self._accept_loop())
        self._ready.set()
        try:
            await self._stopping.wait()
        finally:
            accepting.cancel()
            await asyncio.wait([accepting])
            self._socket.close()
            await self._drain()
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    self._loop.remove_signal_handler(sig)
            self._done.set()

    def serve_forever(self) -> None:
        """Serves in this thread (with its own event loop) until `shutdown()`."""
        asyncio.run(self._serve_on_own_loop(handle_signals=False))

    async def _serve_on_own_loop(self, *, handle_signals: bool) -> None:
        # Plain hook functions run in the loop's default pool, which asyncio keeps small (CPUs + 4
        # threads); the hub calls with many workers at once, and a hook waiting on I/O should not queue
        # the others behind it. Threads are started only as calls need them. (Only on a loop we own:
        # someone else's loop keeps its executor.)
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=HOOK_THREADS, thread_name_prefix="metahook-hook")
        asyncio.get_running_loop().set_default_executor(pool)
        await self.serve(handle_signals=handle_signals)

    def shutdown(self) -> None:
        """Stops a server running in another thread, draining as on SIGTERM, and waits until it has."""
        if self._loop is None or self._done.is_set():
            return
        self._loop.call_soon_threadsafe(self._begin_drain)
        self._done.wait()

    def server_close(self) -> None:
        """Releases the listening socket (already closed after a drain; harmless twice)."""
        self._socket.close()

    def _begin_drain(self, sig: signal.Signals | None = None) -> None:
        if self._stopping is None or self._stopping.is_set():
            return
        if sig is not None:
            busy = sum(1 for c in self._connections if not c.idle)
            self._log_text(f"{sig.name}: draining ({busy} call(s) in flight), then exiting")
        self._stopping.set()

    async def _drain(self) -> None:
        for handshake in list(self._handshakes):
            handshake.cancel()
        for connection in list(self._connections):
            if connection.idle:
                connection.task.cancel()
        tasks = [c.task for c in self._connections]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=self.drain_seconds)
            for task in late:
                task.cancel()
            if late:
                self._log_text(f"{len(late)} call(s) still running after {self.drain_seconds}s: cut")
                await asyncio.wait(late)

    # ---- accepting connections -----------------------------------------------------------------

    async def _accept_loop(self) -> None:
        """Accepts connections until cancelled. Each connection is opened with the TLS context current
        when it arrives (asyncio's own server fixes one context for the listener's whole life, which
        would leave a rotated certificate unused until a restart)."""
        loop = asyncio.get_running_loop()
        self._socket.setblocking(False)
        while True:
            try:
                sock, _ = await loop.sock_accept(self._socket)
            except OSError as e:  # out of file descriptors and the like: let some connections end
                self._log_text(f"accepting a connection failed: {e}")
                await asyncio.sleep(1)
                continue
            task = asyncio.ensure_future(self._open(sock))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _open(self, sock: socket.socket) -> None:
        """Wraps an accepted socket in streams (after the TLS handshake, with TLS); `_accept` then
        serves it in a task of its own."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=STREAM_LIMIT)
        protocol = asyncio.StreamReaderProtocol(reader, self._accept)
        context = self.tls.context() if self.tls else None
        peer = _peer(sock)
        try:
            await loop.connect_accepted_socket(
                lambda: protocol, sock, ssl=context, ssl_handshake_timeout=HANDSHAKE_SECONDS if context else None
            )
        except ssl.SSLError as e:
            # A client without an acceptable certificate, or one that does not speak TLS. (A peer that
            # connects and closes, as a TCP probe does, is not worth a line.)
            sock.close()
            self._log_text(f"TLS handshake with {peer} failed: {e}")
        except (OSError, asyncio.TimeoutError):
            sock.close()

    # ---- one connection ----------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        connection = _Connection(task)
        self._connections.add(connection)
        try:
            await self._converse(connection, reader, writer)
        except (asyncio.CancelledError, ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            self._connections.discard(connection)
            await _close(writer)

    async def _converse(
        self, connection: _Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """HTTP/1.1 keep-alive: requests one after another until the client or a drain closes."""
        assert self._stopping is not None
        while not self._stopping.is_set():
            connection.idle = True
            line = await reader.readline()
            if not line:
                return
            connection.idle = False
            started = time.monotonic()
            request, reply = await self._read_request(line, reader, writer)
            if reply is None:
                assert request is not None
                reply = await self._route(request)
            if request is None or request.version != "HTTP/1.1" or request.headers.get("connection") == "close":
                reply.close = True
            if self._stopping.is_set():
                reply.close = True
            await self._write(writer, reply, request)
            self._log(request, reply, time.monotonic() - started)
            if reply.linger:
                await _linger(reader, writer)
            if reply.close:
                return

    async def _read_request(
        self, line: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[_Request | None, _Reply | None]:
        """The whole request (body included), or an error reply. The body is read before anything
        is answered, so unread bytes cannot be taken for the next request on a kept-alive connection."""
        parts = line.decode("latin-1").rstrip("\r\n").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            reply = _text(400, "malformed request line")
            reply.close = True
            return None, reply
        headers: dict[str, str] = {}
        for _ in range(_MAX_HEADERS + 1):
            raw = await reader.readline()
            if raw in (b"\r\n", b"\n", b""):
                break
            name, _, value = raw.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        else:
            reply = _text(400, f"more than {_MAX_HEADERS} header lines")
            reply.close = True
            return None, reply
        request = _Request(parts[0].upper(), parts[1], parts[2], headers)
        try:
            request.body = await read_body(request.method, headers, reader, writer, self.max_body)
        except BodyError as e:
            # The rest of the body is unread: the connection cannot carry another request.
            reply = _text(e.code, e.message)
            reply.close = reply.linger = True
            return request, reply
        return request, None

    async def _route(self, request: _Request) -> _Reply:
        assert self._stopping is not None
        if request.path == HEALTH_PATH and request.method in ("GET", "HEAD"):
            # Failing readiness while draining takes the Pod out of its Service before it is gone.
            return _text(503, "draining") if self._stopping.is_set() else _text(200, "ok")
        fn = self.routes.get(request.path)
        if fn is None:
            known = ", ".join(sorted(self.routes))
            return _text(404, f"no hook at {request.path}; known paths: {known}; health: GET {HEALTH_PATH}")
        if request.method != "POST":
            return _text(405, f"{request.method} not allowed: hooks are called with POST", {"Allow": "POST"})
        try:
            body = json.loads(request.body)
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
            return _text(400, f"request body is not valid JSON: {e}")
        if not isinstance(body, dict):
            return _text(400, f"request body must be a JSON object, not {type(body).__name__}")
        trace = parse_traceparent(request.headers.get("traceparent"))
        reply = await self._call(fn, request.path, body, trace)
        reply.log.update(_describe_parent(body))
        if trace:
            reply.log["trace"] = trace.trace_id
        return reply

    async def _call(self, fn: Handler, path: str, body: dict[str, Any], trace: TraceParent | None) -> _Reply:
        # Sync and finalize requests always carry `finalizing`, and MapController map calls an `input`;
        # customize and tombstone requests, whose responses have no `events`, carry neither.
        parent = _describe_parent(body).get("parent", "")
        collect_events = "finalizing" in body or "input" in body
        log = RequestLog(path, parent, trace=trace, emit=self._emit, collect_events=collect_events)
        token = current().set(log)
        try:
            response = await _invoke(fn, body)
        except Exception as e:  # any hook failure becomes an answer the hub can report
            return self._failure(path, e)
        finally:
            current().reset(token)
        return self._answer(path, response, log)

    def _failure(self, path: str, e: Exception) -> _Reply:
        """The reply to a hook function that raised: 429 and 422 for the exceptions that say what the
        hub should do, else a 500 with the message first and then the traceback."""
        if isinstance(e, RetryLater):
            return _text(429, str(e), {"Retry-After": str(int(e.seconds))})
        if isinstance(e, PermanentError):
            reply = _text(422, e.message, {PERMANENT_HEADER: "permanent"})
            reply.log["error"] = f"permanent: {e.message}"
            return reply
        trace = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        reply = _text(500, f"hook {path} raised {type(e).__name__}: {e}\n\n{trace}")
        reply.log["error"] = f"{type(e).__name__}: {e}"
        if not self.log_requests:
            self._log_text(f"hook {path} failed:\n{trace}")
        return reply

    def _answer(self, path: str, response: HookResult, log: RequestLog) -> _Reply:
        """The reply to a hook function's return value, with the Events its warnings asked for."""
        if response is None:
            return _text(500, f"hook {path} returned nothing")
        if not isinstance(response, Mapping):
            return _text(500, f"hook {path} must return a dict, not {type(response).__name__}")
        try:
            encoded = json.dumps(with_events(response, log.events)).encode()
        except (TypeError, ValueError) as e:
            return _text(500, f"hook {path} response is not JSON: {e}")
        headers = {HOOK_VERSION_HEADER: self.hook_version} if self.hook_version else None
        return _Reply(200, encoded, "application/json", headers)

    async def _write(self, writer: asyncio.StreamWriter, reply: _Reply, request: _Request | None) -> None:
        head = [f"HTTP/1.1 {reply.code} {_REASONS.get(reply.code, 'Unknown')}"]
        headers = {"Content-Type": reply.content_type, "Content-Length": str(len(reply.body)), **reply.headers}
        if reply.close:
            headers["Connection"] = "close"
        head += [f"{name}: {value}" for name, value in headers.items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        if request is None or request.method != "HEAD":
            writer.write(reply.body)
        await writer.drain()

    # ---- logs ----------------------------------------------------------------------------------

    def _log(self, request: _Request | None, reply: _Reply, seconds: float) -> None:
        method = request.method if request else "?"
        path = request.path if request else "?"
        if self.log_requests:
            line = {
                "time": _now(),
                "method": method,
                "path": path,
                "status": reply.code,
                "durationMs": round(seconds * 1000, 3),
                **reply.log,
            }
            self._write_log(json.dumps(line))
        elif reply.code >= 400 and reply.code != 429:
            # Successful calls come at every resync; only failures are worth a line by default.
            error = reply.log.get("error")
            trace = reply.log.get("trace")
            text = f"hook server: {method} {path} -> {reply.code}" + (f" ({error})" if error else "")
            self._write_log(text + (f" trace={trace}" if trace else ""))

    def _emit(self, record: Record) -> None:
        """Writes a `request_log()` line: JSON when request logs are on, like the other lines."""
        if self.log_requests:
            self._write_log(json.dumps({"time": _now(), **record}))
        else:
            self._write_log(format_line(record))

    def _log_text(self, text: str) -> None:
        if self.log_requests:
            self._write_log(json.dumps({"time": _now(), "message": text}))
        else:
            self._write_log(f"hook server: {text}")

    def _write_log(self, line: str) -> None:
        stream = self._log_stream or sys.stderr
        print(line, file=stream, flush=True)


async def _close(writer: asyncio.StreamWriter) -> None:
    """Closes a connection once what was written to it is sent. Over TLS, closing waits for the
    client's close_notify, which a kept-alive client that is not reading never sends: after
    `CLOSE_SECONDS` the connection is cut, or a drain would wait out its whole deadline for it."""
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), CLOSE_SECONDS)
    except (asyncio.TimeoutError, ConnectionError, ssl.SSLError):
        writer.transport.abort()
    except asyncio.CancelledError:
        writer.transport.abort()
        raise


def _peer(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return "a client that left"
    return f"{host}:{port}"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Ends a connection whose request body was refused unread: the answer is sent and (over plain TCP)
    the write side shut, then whatever the client is still sending is discarded until it closes or
    `LINGER_SECONDS` pass. Nothing is kept, so the limit still bounds memory."""
    if writer.can_write_eof():
        writer.write_eof()
    deadline = time.monotonic() + LINGER_SECONDS
    while (left := deadline - time.monotonic()) > 0:
        try:
            if not await asyncio.wait_for(reader.read(65536), left):
                return
        except (asyncio.TimeoutError, ConnectionError):
            return


async def _invoke(fn: Handler, body: dict[str, Any]) -> HookResult:
    """Calls a hook function: coroutine functions on the loop, plain ones in the thread pool (a plain
    function that returns an awaitable, e.g. a partial of an async one, has it awaited). The thread
    runs in a copy of this task's context, so `request_log()` finds the call's logger there too
    (`run_in_executor`, unlike `asyncio.to_thread`, does not carry the context by itself)."""
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)):
        result = fn(body)
    else:
        context = contextvars.copy_context()
        result = await asyncio.get_running_loop().run_in_executor(None, context.run, fn, body)
    if inspect.isawaitable(result):
        result = await result
    return result


def _describe_parent(body: Mapping[str, Any]) -> dict[str, Any]:
    """The request log fields naming the object the call is for."""
    parent = body.get("parent", body.get("object"))
    if not isinstance(parent, Mapping):
        return {}
    metadata = parent.get("metadata") or {}
    name = metadata.get("name", "")
    namespace = metadata.get("namespace")
    fields: dict[str, Any] = {"parent": f"{namespace}/{name}" if namespace else name, "kind": parent.get("kind", "")}
    if "finalizing" in body:
        fields["finalizing"] = bool(body["finalizing"])
    if isinstance(body.get("mapKey"), str):
        fields["mapKey"] = body["mapKey"]
    return fields


def make_server(
    routes: Mapping[str, Handler],
    port: int = 0,
    host: str = "127.0.0.1",
    *,
    log_requests: bool = False,
    drain_seconds: float = DRAIN_SECONDS,
    log_stream: IO[str] | None = None,
    max_body: int = DEFAULT_MAX_BODY,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    client_ca: str | None = None,
    hook_version: str | None = None,
) -> HookServer:
    """A bound, not yet serving, server for `routes` (`{"/sync": sync, ...}`); HTTPS when `tls_cert`
    and `tls_key` name PEM files, requiring client certificates signed by `client_ca` if given."""
    return HookServer(
        routes,
        port,
        host,
        log_requests=log_requests,
        drain_seconds=drain_seconds,
        log_stream=log_stream,
        max_body=max_body,
        tls_cert=tls_cert,
        tls_key=tls_key,
        client_ca=client_ca,
        hook_version=hook_version,
    )


def start_server(
    routes: Mapping[str, Handler],
    port: int = 0,
    host: str = "127.0.0.1",
    *,
    log_requests: bool = False,
    drain_seconds: float = DRAIN_SECONDS,
    log_stream: IO[str] | None = None,
    max_body: int = DEFAULT_MAX_BODY,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    client_ca: str | None = None,
    hook_version: str | None = None,
) -> HookServer:
    """Serves `routes` in a background thread and returns the server once it accepts calls (tests use
    port 0 and read `server.port` or `server.url`). Stop it with `server.shutdown(); server.server_close()`."""
    server = make_server(
        routes,
        port,
        host,
        log_requests=log_requests,
        drain_seconds=drain_seconds,
        log_stream=log_stream,
        max_body=max_body,
        tls_cert=tls_cert,
        tls_key=tls_key,
        client_ca=client_ca,
        hook_version=hook_version,
    )
    threading.Thread(target=server.serve_forever, name=f"metahook-hooks:{server.port}", daemon=True).start()
    server._ready.wait()
    return server


def serve(
    routes: Mapping[str, Handler],
    port: int | None = None,
    host: str | None = None,
    *,
    log_requests: bool | None = None,
    drain_seconds: float = DRAIN_SECONDS,
    max_body: int | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    client_ca: str | None = None,
    hook_version: str | None = None,
) -> None:
    """Serves `routes` until SIGTERM or Ctrl-C, then drains and returns.

    The address is `port`/`host` if given, else `$PORT`/`$HOST`, else `0.0.0.0:8080` (all interfaces,
    as a hook in a Pod must). `GET /healthz` answers 200 (503 while draining) for probes.
    `log_requests` (default: `$METAHOOK_LOG_REQUESTS` is `1`/`true`/`json`) writes one JSON line per
    call to stderr: time, path, status, durationMs, and the parent's kind and namespace/name.
    `max_body` (default: `$METAHOOK_MAX_BODY`, bytes or `64Mi`-style, else 64 MiB) caps request bodies:
    a larger one is answered 413 before it is read.
    `tls_cert`, `tls_key` and `client_ca` (default, when none is given: `$TLS_CERT_FILE`,
    `$TLS_KEY_FILE`, `$TLS_CLIENT_CA_FILE`) serve HTTPS, health checks included, from PEM files that
    are loaded again when they change; with a client CA, clients must present a certificate it signed.
    `hook_version` (default: `$HOOK_VERSION`) is sent with every answer as `Metahook-Hook-Version`.

    Only `serve` reads the environment: `make_server` and `start_server` (tests, embedding) take
    arguments only, so a test suite run in a shell with these variables set behaves the same.
    """
    host, port = listen_address(port, host)
    if log_requests is None:
        log_requests = _env_flag(LOG_ENV)
    if max_body is None:
        max_body = max_body_from_env()
    files = _tls_arguments(tls_cert, tls_key, client_ca)
    server = HookServer(
        routes,
        port,
        host,
        log_requests=log_requests,
        drain_seconds=drain_seconds,
        max_body=max_body,
        tls_cert=files.cert if files else None,
        tls_key=files.key if files else None,
        client_ca=files.client_ca if files else None,
        hook_version=hook_version if hook_version is not None else (os.environ.get(HOOK_VERSION_ENV) or None),
    )
    print(_banner(server), file=sys.stderr, flush=True)
    try:
        asyncio.run(server._serve_on_own_loop(handle_signals=True))
    finally:
        server.server_close()


def _tls_arguments(cert: str | None, key: str | None, client_ca: str | None) -> TlsFiles | None:
    """The TLS files `serve` was given, or, when it was given none, those the environment names."""
    if cert is None and key is None and client_ca is None:
        return tls_files_from_env()
    return tls_files(cert, key, client_ca)


def _banner(server: HookServer) -> str:
    """The line `serve` starts with: where it listens, and how."""
    line = f"metahook hooks {sorted(server.routes)} listening on {server.url} (health: GET {HEALTH_PATH})"
    if server.tls and server.tls.files.client_ca:
        line += f"; client certificates signed by {server.tls.files.client_ca} required"
    return line
