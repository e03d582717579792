"""metahook-hooks: write metahook (or Metacontroller) hooks as plain functions of dicts.

    from metahook_hooks import children_of, composite_response, serve

    def sync(request):
        pods = children_of(request, "Pod.v1")
        return composite_response(children=[...], status={"pods": len(pods)})

    serve({"/sync": sync})

Standard library only. See README.md for the whole API.
"""

from .fixtures import fixture_request, load_objects, run_hook_on_fixtures
from .objects import (
    attachment,
    attachments_of,
    child,
    children_of,
    object_key,
    parent_of,
    related,
    related_of,
    type_key,
)
from .responses import composite_response, customize_response, decorator_response, event, related_rule
from .server import Handler, RetryLater, make_server, serve, start_server
from .wire import (
    CompositeRequest,
    CompositeResponse,
    CustomizeRequest,
    CustomizeResponse,
    DecoratorRequest,
    DecoratorResponse,
    HookEvent,
    KubeObject,
    LabelSelector,
    ObjectMap,
    RelatedResourceRule,
)

__all__ = [
    "CompositeRequest",
    "CompositeResponse",
    "CustomizeRequest",
    "CustomizeResponse",
    "DecoratorRequest",
    "DecoratorResponse",
    "Handler",
    "HookEvent",
    "KubeObject",
    "LabelSelector",
    "ObjectMap",
    "RelatedResourceRule",
    "RetryLater",
    "attachment",
    "attachments_of",
    "child",
    "children_of",
    "composite_response",
    "customize_response",
    "decorator_response",
    "event",
    "fixture_request",
    "load_objects",
    "make_server",
    "object_key",
    "parent_of",
    "related",
    "related_of",
    "related_rule",
    "run_hook_on_fixtures",
    "serve",
    "start_server",
    "type_key",
]
