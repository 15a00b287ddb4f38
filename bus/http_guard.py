"""The lock on cardbus's network doors (the A2A gateway, the web console): one ASGI layer.

:class:`HttpGuard` wraps an ASGI app and refuses, before the app sees it and
without reading its body, any request a hostile web page (or a stranger)
could send:

* a ``Host`` that is not one of the names served (DNS rebinding): 400;
* a request that changes something (not GET/HEAD/OPTIONS) from another
  origin (``Origin`` is not the ``Host``, or ``Sec-Fetch-Site: cross-site``):
  403, or that is not JSON (a form or a ``text/plain`` POST needs no CORS
  preflight): 415;
* with tokens set, a request without one of them (``Authorization: Bearer``,
  a token header such as ``X-API-Key``, or ``?token=`` where allowed): 401
  with ``WWW-Authenticate: Bearer``; ``open_paths`` (a public card) are
  exempt;
* a body over ``max_body`` bytes: 413, from ``Content-Length`` alone or as
  soon as the streamed body passes the limit (what was read is dropped).

What a refusal says is the door's own (``render``): the console answers
``{"error": ...}``, the A2A gateway a JSON-RPC error. :func:`is_loopback`,
:func:`host_names` and :func:`load_tokens` are the set-up both doors share.
No dependency but the standard library.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from cardbus.eventstore.errors import ConfigError

__all__ = [
    "DEFAULT_MAX_BODY",
    "LOOPBACK_NAMES",
    "HttpGuard",
    "Refusal",
    "host_names",
    "is_loopback",
    "load_tokens",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: the names a loopback server answers to
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
#: 2 MiB: twice the largest event the log takes (a plan or a message bigger is refused anyway)
DEFAULT_MAX_BODY = 2 * 1024 * 1024
_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
_ANY = ("0.0.0.0", "::", "")


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_names(bind: str, public_url: str | None = None) -> list[str]:
    """The names a ``Host`` header may carry for a server bound to ``bind``.

    The loopback names, the interface bound, and the host of the URL the
    server is reached at (``public_url``); bound to every interface without a
    public URL, any name (``["*"]``: the token is the lock then).
    """
    names = set(LOOPBACK_NAMES)
    public = urlsplit(public_url).hostname if public_url else None
    if public:
        names.add(public.lower())
    if bind in _ANY:
        if not public:
            return ["*"]
    else:
        names.add(bind.strip("[]").lower())
    return sorted(names)


def load_tokens(
    token: str | None = None, token_file: str | os.PathLike[str] | None = None
) -> list[str]:
    """The tokens a door accepts: ``token`` and each line of ``token_file`` (blank lines and
    ``#`` comments skipped; several lines let a new token in before the old one goes)."""
    tokens = [token.strip()] if token and token.strip() else []
    if token_file:
        try:
            text = Path(token_file).read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"cannot read the token file {token_file}: {e.strerror}") from e
        lines = [line.strip() for line in text.splitlines()]
        found = [line for line in lines if line and not line.startswith("#")]
        if not found:
            raise ConfigError(f"the token file {token_file} holds no token")
        tokens += found
    if any(any(c.isspace() for c in t) for t in tokens):
        raise ConfigError("a token cannot contain whitespace")
    return tokens


@dataclass(frozen=True)
class Refusal:
    """Why a request was refused: its HTTP status, a short kind and a message."""

    status: int
    kind: str  # host | origin | content_type | token | too_large
    message: str


def _plain(refusal: Refusal) -> bytes:
    return json.dumps({"error": refusal.message}).encode()


def _host_of(value: str) -> str:
    """``"[::1]:9999"`` -> ``"::1"``; ``"Example.com:80"`` -> ``"example.com"``."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class HttpGuard:
    """ASGI middleware: the checks in the module docstring, in that order."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        hosts: Sequence[str] = LOOPBACK_NAMES,
        tokens: Sequence[str] = (),
        token_headers: Sequence[str] = ("x-cardbus-token",),
        token_query: bool = False,
        open_paths: Iterable[str] = (),
        max_body: int | None = DEFAULT_MAX_BODY,
        render: Callable[[Refusal], bytes] = _plain,
    ) -> None:
        self.app = app
        self.any_host = "*" in hosts
        self.hosts = frozenset(h.strip("[]").lower() for h in hosts)
        self.tokens = [t.encode() for t in tokens]
        self.token_headers = [h.lower() for h in token_headers]
        self.token_query = token_query
        self.open_paths = frozenset(open_paths)
        self.max_body = max_body
        self.render = render

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # no websockets behind these doors
            await send({"type": "websocket.close", "code": 1008})
            return
        headers: dict[str, str] = {}
        for key, value in scope.get("headers", []):
            headers[key.decode("latin-1").lower()] = value.decode("latin-1")
        refusal = self.check(scope, headers)
        if refusal is None and self.max_body is not None and scope["method"] not in _SAFE:
            body, refusal = await self._read(receive)
            if refusal is None:
                receive = _replay(body, receive)
        if refusal is not None:
            await self._refuse(send, refusal)
            return
        await self.app(scope, receive, send)

    def check(self, scope: Scope, headers: dict[str, str]) -> Refusal | None:
        """What is wrong with the request's head, if anything (the body is not read)."""
        host = headers.get("host", "")
        if not self.any_host and _host_of(host) not in self.hosts:
            return Refusal(400, "host", f"Host {host!r} is not served here")
        method = scope["method"]
        if method not in _SAFE:
            origin = headers.get("origin")
            cross = headers.get("sec-fetch-site") == "cross-site"
            if cross or (origin is not None and origin.split("://", 1)[-1].lower() != host.lower()):
                return Refusal(403, "origin", "cross-origin request refused")
            media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if media != "application/json" and not (
                media.startswith("application/") and media.endswith("+json")
            ):
                return Refusal(415, "content_type", "send JSON (Content-Type: application/json)")
            size = headers.get("content-length", "")
            if self.max_body is not None and size.isdigit() and int(size) > self.max_body:
                return self._too_large()
        if self.tokens and scope.get("path", "") not in self.open_paths:
            given = self._token(scope, headers)
            ok = False
            for token in self.tokens:  # every one compared: no early exit to time
                ok = hmac.compare_digest(given.encode(), token) or ok
            if not ok:
                return Refusal(401, "token", "a valid token is required (Authorization: Bearer)")
        return None

    def _token(self, scope: Scope, headers: dict[str, str]) -> str:
        auth = headers.get("authorization", "")
        if auth[:7].lower() == "bearer ":
            return auth[7:].strip()
        for name in self.token_headers:
            if headers.get(name):
                return headers[name].strip()
        if self.token_query:
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            return (query.get("token") or [""])[0]
        return ""

    def _too_large(self) -> Refusal:
        return Refusal(413, "too_large", f"request body over the limit of {self.max_body} bytes")

    async def _read(self, receive: Receive) -> tuple[bytes, Refusal | None]:
        """The body, read up to the limit; a refusal as soon as it passes it."""
        limit = self.max_body or 0
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return b"", Refusal(400, "disconnect", "the client went away")
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > limit:
                return b"", self._too_large()
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), None

    async def _refuse(self, send: Send, refusal: Refusal) -> None:
        body = self.render(refusal)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        if refusal.status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        if refusal.status in (400, 413):  # what is left of the body is not read
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the body already read, then the real one's messages."""
    given = False

    async def inner() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return inner
