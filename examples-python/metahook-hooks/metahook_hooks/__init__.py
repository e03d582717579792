"""metahook-hooks: write metahook (or Metacontroller) hooks as plain functions of dicts.

    from metahook_hooks import children_of, composite_response, serve

    def sync(request):
        pods = children_of(request, "Pod.v1")
        return composite_response(children=[...], status={"pods": len(pods)})

    serve({"/sync": sync})    # $PORT (default 8080), GET /healthz, drains on SIGTERM

Hooks may be `async def`. `request_log().warning(...)` logs a line naming the parent and adds a Warning
Event to the response; `raise PermanentError(...)` reports an invalid spec once instead of retrying.
Standard library only. See README.md for the whole API.
"""

__version__ = "0.1.0"
"""The library's version; pyproject.toml says the same (a test compares them)."""

from .conditions import condition_status, find_condition, set_condition
from .fixtures import fixture_request, load_objects, run_hook_on_fixtures
from .objects import (
    attachment,
    attachments_of,
    child,
    children_of,
    input_of,
    object_key,
    output,
    outputs_of,
    parent_of,
    related,
    related_of,
    type_key,
)
from .request_log import RequestLog, request_log
from .responses import (
    composite_response,
    customize_response,
    decorator_response,
    event,
    map_finalize_response,
    map_response,
    related_rule,
    tombstone_response,
)
from .server import (
    DEFAULT_MAX_BODY,
    DEFAULT_PORT,
    DRAIN_SECONDS,
    HOOK_VERSION_ENV,
    HOOK_VERSION_HEADER,
    Handler,
    HookResult,
    HookServer,
    PermanentError,
    RetryLater,
    listen_address,
    make_server,
    serve,
    start_server,
)
from .wire import (
    CompositeRequest,
    CompositeResponse,
    Condition,
    CustomizeRequest,
    CustomizeResponse,
    DecoratorRequest,
    DecoratorResponse,
    HookEvent,
    KubeObject,
    LabelSelector,
    MapFinalizeRequest,
    MapFinalizeResponse,
    MapRequest,
    MapResponse,
    ObjectMap,
    RelatedResourceRule,
    TombstoneRequest,
    TombstoneResponse,
)

__all__ = [
    "DEFAULT_MAX_BODY",
    "DEFAULT_PORT",
    "DRAIN_SECONDS",
    "CompositeRequest",
    "CompositeResponse",
    "Condition",
    "CustomizeRequest",
    "CustomizeResponse",
    "DecoratorRequest",
    "DecoratorResponse",
    "Handler",
    "HookEvent",
    "HookResult",
    "HOOK_VERSION_ENV",
    "HOOK_VERSION_HEADER",
    "HookServer",
    "KubeObject",
    "LabelSelector",
    "MapFinalizeRequest",
    "MapFinalizeResponse",
    "MapRequest",
    "MapResponse",
    "ObjectMap",
    "PermanentError",
    "RelatedResourceRule",
    "RequestLog",
    "RetryLater",
    "TombstoneRequest",
    "TombstoneResponse",
    "attachment",
    "attachments_of",
    "child",
    "children_of",
    "composite_response",
    "condition_status",
    "customize_response",
    "decorator_response",
    "event",
    "find_condition",
    "fixture_request",
    "input_of",
    "listen_address",
    "load_objects",
    "make_server",
    "map_finalize_response",
    "map_response",
    "object_key",
    "output",
    "outputs_of",
    "parent_of",
    "related",
    "related_of",
    "related_rule",
    "request_log",
    "run_hook_on_fixtures",
    "serve",
    "set_condition",
    "start_server",
    "tombstone_response",
    "type_key",
    "__version__",
]
