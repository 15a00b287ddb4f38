"""Who an MCP request is: the one place the server says it (the actor of what it writes).

Over stdio the client is a process this user started: ``local:<user>``. Over
HTTP the door is :class:`~cardbus.bus.http_guard.HttpGuard`, the console's and
the A2A gateway's lock (Host allow-list, same-origin JSON, the token): a request
it lets through with a token is the token's name (``--token-name``, default
``token``); a door without a token (loopback only) is ``local:<user>``. The
name travels in the ASGI ``scope["user"]``, where a guard that names its tokens
itself puts its own identity (then :class:`_Named` leaves it alone). No name a
request claims is taken instead.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cardbus.bus.http_guard import LOOPBACK_NAMES, HttpGuard, Receive, Scope, Send

__all__ = ["DEFAULT_TOKEN_NAME", "Who", "actor_of", "guarded", "local_actor"]

ASGIApp = Any
#: the name of the actor behind a token given without one
DEFAULT_TOKEN_NAME = "token"


@dataclass(frozen=True)
class Who:
    """Who a request is (read as starlette's ``request.user``)."""

    name: str
    authenticated: bool = True

    @property
    def is_authenticated(self) -> bool:
        return self.authenticated

    @property
    def display_name(self) -> str:
        return self.name


def local_actor() -> str:
    """``local:<user>``: the account this server runs as (stdio, or a loopback door
    without a token: only someone on this machine reaches it)."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError, ImportError):  # no login name (a container's bare uid)
        user = str(os.getuid()) if hasattr(os, "getuid") else "unknown"
    return f"local:{user}"


def actor_of(scope: Mapping[str, Any] | None) -> str:
    """The actor of a request: the name the door put in its scope; no scope (stdio):
    :func:`local_actor`."""
    if scope is None:
        return local_actor()
    name = getattr(scope.get("user"), "name", None)
    return name if isinstance(name, str) and name else local_actor()


class _Named:
    """Behind the guard: a request that passed it is the token's name (or local)."""

    def __init__(self, app: ASGIApp, who: Who) -> None:
        self.app = app
        self.who = who

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not isinstance(
            getattr(scope.get("user"), "name", None), str
        ):
            scope["user"] = self.who
        await self.app(scope, receive, send)


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
    app: ASGIApp,
    *,
    hosts: Sequence[str] = LOOPBACK_NAMES,
    token: str | None = None,
    token_name: str = DEFAULT_TOKEN_NAME,
) -> ASGIApp:
    """``app`` behind the doors' lock: ``token`` (if given) on every request, as
    ``Authorization: Bearer`` or ``X-Cardbus-Token``; each request let through named."""
    who = Who(token_name) if token else Who(local_actor(), authenticated=False)
    return _SessionEnd(HttpGuard(_Named(app, who), hosts=hosts, tokens=[token] if token else []))
