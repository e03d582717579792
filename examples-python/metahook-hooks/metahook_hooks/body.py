"""Reading a request body: `Content-Length` or `Transfer-Encoding: chunked`, never more than a limit.

The hub sends a parent with all its children, so bodies can be large, but not unbounded: a body over
the limit is refused with 413 as soon as its size is known (from `Content-Length`, or from the chunk
size line that would cross the limit), before its bytes are read, so a runaway client cannot make the
hook buffer gigabytes. Chunked bodies come from clients and proxies that stream a request whose length
they do not know in advance; refusing them (411) would make such a proxy unusable in front of a hook.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Mapping

__all__ = ["DEFAULT_MAX_BODY", "MAX_BODY_ENV", "BodyError", "max_body_from_env", "read_body"]

DEFAULT_MAX_BODY = 64 * 1024 * 1024
"""64 MiB: far above a parent with thousands of children, far below what would hurt a small Pod."""

MAX_BODY_ENV = "METAHOOK_MAX_BODY"

_MAX_TRAILERS = 100
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")
_SIZE = re.compile(r"([0-9]+)\s*(Ki|Mi|Gi)?")
_UNITS = {None: 1, "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3}


class BodyError(Exception):
    """The body cannot be read: `code` is the HTTP status to answer, the message its first line. The
    connection must be closed after the answer, since the rest of the body was not read."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def parse_size(text: str) -> int:
    """Bytes from `1048576`, `512Ki`, `64Mi` or `1Gi` (the binary suffixes Kubernetes manifests use)."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a size: write bytes (67108864) or 64Mi, 512Ki, 1Gi")
    return int(match.group(1)) * _UNITS[match.group(2)]


def max_body_from_env() -> int:
    """The body limit from `$METAHOOK_MAX_BODY` (bytes, or with a Ki/Mi/Gi suffix), else 64 MiB."""
    text = os.environ.get(MAX_BODY_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_BODY
    try:
        return check_limit(parse_size(text))
    except ValueError as e:
        raise ValueError(f"{MAX_BODY_ENV}: {e}") from None


def check_limit(limit: int) -> int:
    """`limit`, if it can be a body limit at all (a positive number of bytes)."""
    if limit <= 0:
        raise ValueError(f"the body limit must be a positive number of bytes, not {limit}")
    return limit


async def read_body(
    method: str,
    headers: Mapping[str, str],
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    limit: int,
) -> bytes:
    """The request body as its headers frame it, or `BodyError`. Answers `Expect: 100-continue` only
    once the body is known to be acceptable, so a client that waits for it sends nothing in vain."""
    length = _content_length(method, headers, limit)
    if length == 0:
        return b""
    if headers.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
    if length is None:
        return await _read_chunked(reader, limit)
    return await reader.readexactly(length)


def _content_length(method: str, headers: Mapping[str, str], limit: int) -> int | None:
    """The announced body length, or None for a chunked body."""
    encoding = headers.get("transfer-encoding")
    length = headers.get("content-length")
    if encoding is not None:
        _check_chunked(encoding, length)
        return None
    if length is None:
        if method == "POST":
            raise BodyError(411, "the request needs a Content-Length header or Transfer-Encoding: chunked")
        return 0
    try:
        size = int(length)
        if size < 0:
            raise ValueError(length)
    except ValueError:
        raise BodyError(400, f"bad Content-Length {length!r}") from None
    if size > limit:
        raise BodyError(413, _too_large(limit))
    return size


def _check_chunked(encoding: str, length: str | None) -> None:
    """Checks a `Transfer-Encoding` header: only `chunked` alone is understood."""
    if length is not None:
        # Which of the two frames the body is where request smuggling starts: refuse, as RFC 9112 allows.
        raise BodyError(400, "the request has both Transfer-Encoding and Content-Length")
    if [coding.strip().lower() for coding in encoding.split(",")] != ["chunked"]:
        raise BodyError(501, f"Transfer-Encoding {encoding!r} is not supported, only chunked")


async def _read_chunked(reader: asyncio.StreamReader, limit: int) -> bytes:
    """A chunked body (RFC 9112 section 7.1): sized chunks, then a zero-size chunk and trailers. Chunk
    extensions and trailer fields are read and ignored (nothing in a hook call uses them)."""
    chunks: list[bytes] = []
    total = 0
    while True:
        size = _chunk_size(await _line(reader))
        if size == 0:
            await _skip_trailers(reader)
            return b"".join(chunks)
        total += size
        if total > limit:
            raise BodyError(413, _too_large(limit))
        chunks.append(await reader.readexactly(size))
        if await _line(reader) not in (b"\r\n", b"\n"):
            raise BodyError(400, f"chunk of {size} bytes is not followed by CRLF")


def _chunk_size(line: bytes) -> int:
    """The size on a chunk's first line (`1a3;name=value` -> 0x1a3)."""
    text = line.split(b";", 1)[0].strip(b" \t\r\n")
    if not _CHUNK_SIZE.fullmatch(text):
        raise BodyError(400, f"bad chunk size line {line[:40]!r}")
    return int(text, 16)


async def _skip_trailers(reader: asyncio.StreamReader) -> None:
    """Reads the trailer section up to the empty line that ends the body."""
    for _ in range(_MAX_TRAILERS + 1):
        if await _line(reader) in (b"\r\n", b"\n"):
            return
    raise BodyError(400, f"more than {_MAX_TRAILERS} trailer lines")


async def _line(reader: asyncio.StreamReader) -> bytes:
    """One line, ending in LF; the end of the stream in mid-body is an incomplete read, not a line."""
    try:
        line = await reader.readline()
    except ValueError:  # longer than the stream's line limit
        raise BodyError(400, "chunk line too long") from None
    if not line.endswith(b"\n"):
        raise asyncio.IncompleteReadError(line, None)
    return line


def _too_large(limit: int) -> str:
    return f"request body larger than the hook's limit of {limit} bytes (max_body, ${MAX_BODY_ENV})"
