"""TLS for the hook server, from PEM files that may be replaced while it runs.

In a Pod the certificate comes from a mounted Secret, and cert-manager (or a person) rotates it without
restarting the Pod: the kubelet writes the new files into a fresh directory and swaps the `..data`
symlink the file names go through. So the files are watched, not read once: when a connection arrives,
and at most once a second, each file's resolved path, inode, mtime and size are compared with those of
the loaded ones; on a change the certificate is loaded again and new connections get the new context.
Connections already open keep theirs. A new set that does not load (a key that does not match the
certificate, a file caught half-written) is reported in one log line and the previous context stays
in use, so a bad rotation does not take the hook down.

With a client CA, a client certificate signed by it is required (mutual TLS): the hub presents the
one its controller's `clientTLS` names, and connections without one fail the handshake.
"""

from __future__ import annotations

import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "CERT_ENV",
    "CLIENT_CA_ENV",
    "KEY_ENV",
    "ReloadingContext",
    "TlsFiles",
    "load_context",
    "tls_files",
    "tls_files_from_env",
]

CERT_ENV = "TLS_CERT_FILE"
KEY_ENV = "TLS_KEY_FILE"
CLIENT_CA_ENV = "TLS_CLIENT_CA_FILE"
CHECK_SECONDS = 1.0

Stamp = tuple[tuple[str, int, int, int, int] | None, ...]
"""Per file: (resolved path, device, inode, mtime in ns, size), or None when it cannot be read."""


@dataclass(frozen=True)
class TlsFiles:
    """The PEM files a TLS listener is made of."""

    cert: str
    key: str
    client_ca: str | None = None

    def paths(self) -> list[str]:
        return [self.cert, self.key] + ([self.client_ca] if self.client_ca else [])


def tls_files(cert: str | None, key: str | None, client_ca: str | None = None) -> TlsFiles | None:
    """The files, checked for being a usable combination; None when there is no certificate (plain HTTP)."""
    if not cert and not key:
        if client_ca:
            raise ValueError("a client CA (mutual TLS) needs a server certificate and key too")
        return None
    if not cert or not key:
        raise ValueError("TLS needs both a certificate and its private key (tls_cert and tls_key)")
    return TlsFiles(cert, key, client_ca or None)


def tls_files_from_env() -> TlsFiles | None:
    """The files `$TLS_CERT_FILE`, `$TLS_KEY_FILE` and `$TLS_CLIENT_CA_FILE` name (a Pod that mounts a
    Secret sets these); None when none is set."""
    return tls_files(
        os.environ.get(CERT_ENV, "").strip(),
        os.environ.get(KEY_ENV, "").strip(),
        os.environ.get(CLIENT_CA_ENV, "").strip(),
    )


def load_context(files: TlsFiles) -> ssl.SSLContext:
    """A server context from the files; `ValueError` naming the file that does not load."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])  # this server speaks HTTP/1.1 only; say so, not just hope
    try:
        context.load_cert_chain(files.cert, files.key)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"cannot load TLS certificate {files.cert} with key {files.key}: {e}") from None
    if files.client_ca:
        try:
            context.load_verify_locations(cafile=files.client_ca)
        except (OSError, ssl.SSLError) as e:
            raise ValueError(f"cannot load client CA {files.client_ca}: {e}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def stamp(files: TlsFiles) -> Stamp:
    """What identifies the current contents of the files, without reading them."""
    return tuple(_file_stamp(path) for path in files.paths())


def _file_stamp(path: str) -> tuple[str, int, int, int, int] | None:
    resolved = os.path.realpath(path)
    try:
        st = os.stat(resolved)
    except OSError:
        return None
    return resolved, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size


class ReloadingContext:
    """The current `ssl.SSLContext` for `files`, loaded again when they change. Not thread-safe: the
    server calls it from its event loop only."""

    def __init__(
        self,
        files: TlsFiles,
        log: Callable[[str], None],
        *,
        check_seconds: float = CHECK_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.files = files
        self._log = log
        self._check_seconds = check_seconds
        self._clock = clock
        self._stamp = stamp(files)
        self._context = load_context(files)  # at start, a bad file is an error, not a log line
        self._refused: Stamp | None = None
        self._checked = clock()

    def context(self) -> ssl.SSLContext:
        """The context for a new connection (the files are checked if a second has passed)."""
        now = self._clock()
        if now - self._checked >= self._check_seconds:
            self._checked = now
            self._reload_if_changed()
        return self._context

    def _reload_if_changed(self) -> None:
        current = stamp(self.files)
        if current in (self._stamp, self._refused):
            return
        try:
            context = load_context(self.files)
        except ValueError as e:
            self._refused = current  # one line per bad set of files, not one per second
            self._log(f"TLS: {e}; still serving the previous certificate")
            return
        self._context, self._stamp, self._refused = context, current, None
        self._log(f"TLS: loaded the new certificate {self.files.cert}")
