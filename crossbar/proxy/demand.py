"""What one request asks of crossbar, read once from its target, head and body: its
route, the path it is for, the model the host is chosen by, its conversation, and what
goes to the host (the body, the headers, the client's credentials where they may)."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import quote

import attrs
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.web import server

from crossbar.config import Config, RouteConfig
from crossbar.http import (
    BODYLESS,
    BadTarget,
    RoutePath,
    parse_target,
    release_body,
    trusted_proxy,
    upstream_headers,
)
from crossbar.proxy.modelname import renamed, with_model
from crossbar.proxy.shapes import (
    MODEL_ENTRY,
    MODEL_ENTRY_PATH,
    Shape,
    model_in_path,
    read_body,
    shape_of,
)
from crossbar.routing import Conversation


@attrs.define
class Asked:
    """A request, as crossbar reads it."""

    model: str | None = None
    """The model the choice of host goes by: the body's, else the route's default."""
    asked: str | None = None
    """The model the request's body asks for (the route's default filled in, an alias
    mapped to its model), if it is a JSON object; a GET of /v1/models asks for none."""
    conversation: Conversation | None = None
    """The conversation, on a route whose policy places by it."""
    body: bytes | None = None
    """What is forwarded (the route's default model filled in); ``None``: no body."""
    url_rest: bytes = b""
    headers: bytes = b""
    """The lines for the host, less credentials."""
    credentials: bytes = b""
    """The client's own credential lines, for a host without a key of its own."""
    client: str = "unknown"
    api: str = ""
    """The API of its path (``chat``, ``anthropic``...: :data:`crossbar.proxy.shapes.SHAPES`)."""
    reply_limit: int | None = None
    """The tokens the answer may take at most, as the body asks (``max_tokens``...)."""
    slot: bool = True
    """It takes a slot of its host while it runs (:meth:`~crossbar.proxy.shapes.Shape.uses_slot`):
    only then does it wait for one, and count as one."""
    alias: str | None = None
    """The name the client sent, when one of the route's aliases mapped it to ``asked``."""


def route_of(config: Config, uri: bytes) -> tuple[RouteConfig, RoutePath, Shape | None]:
    """The route a target names (a JSON 404 otherwise), and the shape of its path
    (``None``: a path crossbar does not forward)."""
    target = parse_target(uri)
    route = config.routes.get(target.route)
    if route is None:
        raise BadTarget(404, "unknown route")
    return route, target, shape_of(target.rest)


def read_request(
    request: server.Request,
    config: Config,
    route: RouteConfig,
    target: RoutePath,
    shape: Shape,
    conversations: bool,
    real: Callable[[str], str] | None = None,
) -> Asked:
    """Everything that needs no host: the model, the conversation (``conversations``:
    the route's policy places by it), and what is sent on. ``real``: the model a name
    stands for on the route (:func:`crossbar.routing.real_model`, for a route with
    aliases); a body naming an alias goes on naming its model."""
    method, rest = request.method, target.rest
    body = request.content.getvalue() if request.content is not None else b""
    found = Asked(route.default_model, api=shape.name, slot=shape.uses_slot(method))
    default = route.default_model
    if body and method not in (b"GET", b"HEAD"):
        facts = read_body(shape, body, default, conversations and method == b"POST", real)
        peek = facts.peek
        if peek.model is not None:
            found.model = found.asked = model = _mapped(real, peek.model)
            if model is not None and model != peek.model:
                found.alias, body = peek.model, renamed(body, peek.model, model)
                release_body(request, keep_reserved=True)  # the copy is the one kept
        elif peek.missing and default is not None:
            body = with_model(body, default)
            found.asked = default
            release_body(request, keep_reserved=True)  # the copy is the one kept
        found.conversation = facts.conversation
        found.reply_limit = facts.reply_limit
    elif shape is MODEL_ENTRY:  # GET /v1/models/{id}: asked of a host that has it
        name = model_in_path(rest)
        found.model = found.asked = model = _mapped(real, name)
        if model is not None and model != name:  # an alias: the host is asked of its model
            found.alias, rest = name, MODEL_ENTRY_PATH + quote(model, safe="").encode()
    if body or method not in BODYLESS:
        found.body = body
    found.url_rest = rest + (b"?" + target.query if target.query else b"")
    address = request.getClientAddress()
    client = address.host if isinstance(address, IPv4Address | IPv6Address) else ""
    found.client = client = client or "unknown"
    proxies = config.trusted_proxies
    found.headers, credentials = upstream_headers(
        request.requestHeaders.getAllRawHeaders(),
        client,
        request.isSecure(),
        bool(proxies) and trusted_proxy(client, proxies),
    )
    if not route.api_keys:  # a key for crossbar is never one for a host
        found.credentials = credentials
    return found


def _mapped(real: Callable[[str], str] | None, name: str | None) -> str | None:
    """The model ``name`` stands for (an alias's), or ``name``."""
    return name if real is None or name is None else real(name)
