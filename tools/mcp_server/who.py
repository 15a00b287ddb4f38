"""Who an MCP request is: the one place the server says it (the actor of what it writes).

Over stdio the client is a process this user started: ``local:<user>``. Over HTTP the
door is :class:`~cardbus.bus.http_guard.HttpGuard`, the console's and the A2A
gateway's lock (Host allow-list, same-origin JSON, named tokens): a request it lets
through carries the identity it authenticated as in the ASGI ``scope["user"]`` (the
token's name; ``local:<user>`` on a loopback door without tokens). No name a request
claims is taken instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cardbus.bus.http_guard import (
    DEFAULT_TOKEN_NAME,
    LOOPBACK_NAMES,
    HttpGuard,
    Receive,
    Scope,
    Send,
    identity_of,
    local_identity,
)

__all__ = ["DEFAULT_TOKEN_NAME", "actor_of", "guarded", "local_actor"]

ASGIApp = Any


def local_actor() -> str:
    """``local:<user>``: the account this server runs as (stdio, or a loopback door
    without a token: only someone on this machine reaches it)."""
    return local_identity().name


def actor_of(scope: Mapping[str, Any] | None) -> str:
    """The actor of a request: the identity the door put in its scope; no scope (stdio):
    :func:`local_actor`."""
    who = identity_of(scope) if scope is not None else None
    return who.name if who is not None else local_actor()


class _SessionEnd:
    """In front of the guard: the client's ``DELETE`` that ends its MCP session has no
    body and no Content-Type; the guard asks a changing request for JSON because a form
    or a ``text/plain`` POST needs no CORS preflight, and a DELETE always needs one, so
    it is marked JSON here (its Host, Origin and token are still checked)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") == "DELETE":
            headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-type"]
            scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


def guarded(
    app: ASGIApp, *, hosts: Sequence[str] = LOOPBACK_NAMES, tokens: Mapping[str, str] = {}
) -> ASGIApp:
    """``app`` behind the doors' lock: one of ``tokens`` (token -> the name it stands for:
    ``http_guard.load_tokens``) on every request, as ``Authorization: Bearer`` or
    ``X-Cardbus-Token``; none, loopback only."""
    return _SessionEnd(HttpGuard(app, hosts=hosts, tokens=dict(tokens)))
