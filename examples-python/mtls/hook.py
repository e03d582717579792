#!/usr/bin/env python3
"""mtls-notes sync hook: every Note gets a ConfigMap `<name>-note` with its text, served over mutual TLS.

The server certificate and key come from $TLS_CERT_FILE and $TLS_KEY_FILE, and only clients with a
certificate signed by the CA in $TLS_CLIENT_CA_FILE (the hub, through the controller's `clientTLS`)
get through the handshake. The files are watched, so a rotated certificate is served without a
restart. What the hook shows besides:

- `PermanentError` for a spec it cannot publish (a `json` note whose text is not JSON): the hub
  reports it once, as an Event and a condition on the Note, and calls again when the Note changes;
- `request_log().warning(...)` for a spec that is valid but probably not meant (an empty note): one
  log line naming the Note, and a Warning Event on it.
"""

import json
import os
import sys
from typing import Any, Literal, TypedDict

from metahook_hooks import (
    CompositeRequest,
    CompositeResponse,
    KubeObject,
    PermanentError,
    composite_response,
    parent_of,
    request_log,
    serve,
)

TLS_ENV = ("TLS_CERT_FILE", "TLS_KEY_FILE", "TLS_CLIENT_CA_FILE")
KEYS = {"text": "note.txt", "json": "note.json"}


class NoteSpec(TypedDict, total=False):
    format: Literal["text", "json"]
    text: str


class Note(TypedDict):
    """The parent, as crd.yaml declares it."""

    apiVersion: str
    kind: str
    metadata: dict[str, Any]
    spec: NoteSpec


def checked_text(spec: NoteSpec) -> str:
    """The text to publish; a JSON note must parse, or no call will ever publish it."""
    text = spec.get("text", "")
    if spec.get("format", "text") == "json":
        try:
            json.loads(text)
        except ValueError as e:
            raise PermanentError(f"spec.text is not valid JSON ({e}), and spec.format is json") from None
    if not text.strip():
        request_log().warning("spec.text is empty: the ConfigMap will hold an empty note", reason="EmptyNote")
    return text


def sync(request: CompositeRequest) -> CompositeResponse:
    note = parent_of(request, as_type=Note)
    name, spec = note["metadata"]["name"], note.get("spec", {})
    key = KEYS[spec.get("format", "text")]
    config_map: KubeObject = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-note", "labels": {"python.examples.metahook.dev/note": name}},
        "data": {key: checked_text(spec)},
    }
    return composite_response(children=[config_map], status={"configMap": f"{name}-note", "key": key})


def require_tls() -> None:
    """This example is about mutual TLS: without the three files it would serve plain HTTP, so it
    refuses to start instead."""
    missing = [name for name in TLS_ENV if not os.environ.get(name)]
    if missing:
        sys.exit(f"hook.py serves mutual TLS only: set {', '.join(missing)} (README.md shows how to make the files)")


if __name__ == "__main__":
    require_tls()
    serve({"/sync": sync})  # $PORT; TLS from the TLS_* files; GET /healthz; drains on SIGTERM
