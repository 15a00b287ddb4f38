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
  soon as the streamed body passes the limit (what was read is dropped);
* a body not whole within ``body_timeout_s`` of the request's head (a client
  trickling a byte at a time holds a connection and a task): 408;
* a body that is not UTF-8 JSON (400, kind ``parse``) or is nested deeper than
  ``max_depth`` (400, kind ``too_deep``: Python's parsers, the JSON-RPC
  dispatcher's and protobuf's, recurse, and a deep body would answer with
  their own error text). An empty body passes.

Who a request is, is the guard's to say: every request it lets through
carries an :class:`Identity` in ``scope["user"]`` (the ASGI place starlette's
``request.user`` and a2a-sdk's call context read): the name of the token it
carried (tokens are named: :func:`load_tokens` reads ``name token`` lines),
or, on a door without tokens (loopback only), ``local:<user>``, the account
the door runs as (anyone who can reach a loopback port is on this machine).
The actor of a person's action is that name, never one the request claims.

What a refusal says is the door's own (``render``): the console answers
``{"error": ...}``, the A2A gateway a JSON-RPC error. :func:`is_loopback`,
:func:`host_names` and :func:`load_tokens` are the set-up both doors share.
No dependency but the standard library.
"""

from __future__ import annotations

import asyncio
import getpass
import hmac
import ipaddress
import json
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from cardbus.eventstore.errors import ConfigError

__all__ = [
    "DEFAULT_BODY_TIMEOUT_S",
    "DEFAULT_MAX_BODY",
    "DEFAULT_TOKEN_NAME",
    "LOOPBACK_NAMES",
    "MAX_JSON_DEPTH",
    "HttpGuard",
    "Identity",
    "Refusal",
    "Tokens",
    "host_names",
    "identity_of",
    "is_loopback",
    "load_tokens",
    "local_identity",
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
#: seconds a request's body may take to arrive, whole
DEFAULT_BODY_TIMEOUT_S = 10.0
#: the nesting of a JSON body taken (a plan is about 10 deep; protobuf stops at 100)
MAX_JSON_DEPTH = 64
#: the name of a token given without one (``--token``, a one-word line of a token file)
DEFAULT_TOKEN_NAME = "token"
#: the tokens a door accepts: token -> the name of who holds it (several tokens may
#: share a name: a new one let in before the old one goes)
Tokens = Mapping[str, str]
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
    token: str | None = None,
    token_file: str | os.PathLike[str] | None = None,
    token_name: str = DEFAULT_TOKEN_NAME,
) -> dict[str, str]:
    """The tokens a door accepts, each with the name actions taken with it are signed with.

    ``token`` is named ``token_name``. Each line of ``token_file`` is ``name token``
    (or a token alone, named ``token_name``: the format before names); blank lines and
    ``#`` comments are skipped; several lines may give one name (a new token let in
    before the old one goes). ``ConfigError`` for a file that cannot be read or holds
    no token, a line of more than two words, a token given two names.
    """
    _check_name(token_name, "--token-name")
    given: list[tuple[str, str]] = []
    if token and token.strip():
        given.append((token.strip(), token_name))
    if token_file:
        try:
            text = Path(token_file).read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"cannot read the token file {token_file}: {e.strerror}") from e
        except UnicodeDecodeError as e:
            raise ConfigError(f"the token file {token_file} is not UTF-8 text") from e
        found = 0
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            words = line.split()
            if len(words) > 2:
                raise ConfigError(
                    f"{token_file}:{number}: a line is `name token` (two words), not {len(words)}"
                )
            name, value = (token_name, words[0]) if len(words) == 1 else (words[0], words[1])
            _check_name(name, f"{token_file}:{number}")
            given.append((value, name))
            found += 1
        if not found:
            raise ConfigError(f"the token file {token_file} holds no token")
    tokens: dict[str, str] = {}
    for value, name in given:
        if any(c.isspace() for c in value):
            raise ConfigError("a token cannot contain whitespace")
        if tokens.get(value, name) != name:
            raise ConfigError(f"one token is given two names: {tokens[value]!r} and {name!r}")
        tokens[value] = name
    return tokens


def _check_name(name: str, where: str) -> None:
    if not name or len(name) > 200 or any(c.isspace() or not c.isprintable() for c in name):
        raise ConfigError(f"{where}: a token's name is one printable word, not {name!r}")


@dataclass(frozen=True)
class Identity:
    """Who sent a request, as the guard established it: ``name`` is the actor of what the
    request does. ``authenticated``: a token proved it (else it is the door's local
    identity, :func:`local_identity`). Read as starlette's ``BaseUser`` (``request.user``,
    a2a-sdk's ``context.user.user_name``)."""

    name: str
    authenticated: bool = True

    @property
    def is_authenticated(self) -> bool:
        return self.authenticated

    @property
    def display_name(self) -> str:
        return self.name

    @property
    def identity(self) -> str:
        return self.name


def local_identity() -> Identity:
    """A door without tokens (loopback only): ``local:<user>``, the account the door runs
    as. Anyone on this machine can reach it; no name a request gives is taken instead."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError, ImportError):  # no login name (a container's bare uid)
        user = str(os.getuid()) if hasattr(os, "getuid") else "unknown"
    return Identity(f"local:{user}", authenticated=False)


def identity_of(scope: Mapping[str, Any]) -> Identity | None:
    """The :class:`Identity` the guard put in ``scope`` (None: no guard saw the request)."""
    user = scope.get("user")
    return user if isinstance(user, Identity) else None


@dataclass(frozen=True)
class Refusal:
    """Why a request was refused: its HTTP status, a short kind and a message."""

    status: int
    kind: str  # host | origin | content_type | token | too_large | timeout | parse | too_deep
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
    """ASGI middleware: the checks in the module docstring, in that order.

    ``tokens``: token -> name (:data:`Tokens`), or a list of tokens, each named
    :data:`DEFAULT_TOKEN_NAME`; none: the door is open (loopback) and its requests
    are ``local`` (:func:`local_identity`). ``body_timeout_s``: the time a body
    may take to arrive, whole (None: no limit); ``max_depth``: the nesting of a
    JSON body taken (None: not checked).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        hosts: Sequence[str] = LOOPBACK_NAMES,
        tokens: Tokens | Sequence[str] = (),
        token_headers: Sequence[str] = ("x-cardbus-token",),
        token_query: bool = False,
        open_paths: Iterable[str] = (),
        max_body: int | None = DEFAULT_MAX_BODY,
        body_timeout_s: float | None = DEFAULT_BODY_TIMEOUT_S,
        max_depth: int | None = MAX_JSON_DEPTH,
        render: Callable[[Refusal], bytes] = _plain,
    ) -> None:
        if body_timeout_s is not None and not body_timeout_s > 0:
            raise ConfigError(f"the request body timeout must be > 0 s, not {body_timeout_s}")
        self.app = app
        self.any_host = "*" in hosts
        self.hosts = frozenset(h.strip("[]").lower() for h in hosts)
        named = tokens if isinstance(tokens, Mapping) else dict.fromkeys(tokens, DEFAULT_TOKEN_NAME)
        self.tokens = [(t.encode(), Identity(name)) for t, name in named.items()]
        self.local = local_identity()
        self.token_headers = [h.lower() for h in token_headers]
        self.token_query = token_query
        self.open_paths = frozenset(open_paths)
        self.max_body = max_body
        self.body_timeout_s = body_timeout_s
        self.max_depth = max_depth
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
        if refusal is None and scope["method"] not in _SAFE:
            body, refusal = await self._read(receive)
            if refusal is None:
                refusal = self._check_json(body)
            if refusal is None:
                receive = _replay(body, receive)
        if refusal is not None:
            await self._refuse(send, refusal)
            return
        await self.app(scope, receive, send)

    def check(self, scope: Scope, headers: dict[str, str]) -> Refusal | None:
        """What is wrong with the request's head, if anything (the body is not read).
        Let through, the request's :class:`Identity` is put in ``scope["user"]``."""
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
        scope.pop("user", None)  # only the guard says who a request is
        if not self.tokens:
            scope["user"] = self.local
            return None
        if scope.get("path", "") in self.open_paths:
            return None  # a public page: nobody in particular, and nothing it can do
        given = self._token(scope, headers).encode()
        who: Identity | None = None
        for token, identity in self.tokens:  # every one compared: no early exit to time
            if hmac.compare_digest(given, token):
                who = identity
        if who is None:
            return Refusal(401, "token", "a valid token is required (Authorization: Bearer)")
        scope["user"] = who
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
        """The body, read up to the limit within the deadline; a refusal as soon as it
        passes the limit, or when the deadline passes first."""
        try:
            async with asyncio.timeout(self.body_timeout_s):
                return await self._read_all(receive)
        except TimeoutError:
            return b"", Refusal(
                408,
                "timeout",
                f"the request body did not arrive within {self.body_timeout_s:g} s",
            )

    async def _read_all(self, receive: Receive) -> tuple[bytes, Refusal | None]:
        limit = self.max_body
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return b"", Refusal(400, "disconnect", "the client went away")
            chunk = message.get("body", b"")
            total += len(chunk)
            if limit is not None and total > limit:
                return b"", self._too_large()
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), None

    def _check_json(self, body: bytes) -> Refusal | None:
        """A parse or depth refusal of the body, in words of our own (never the parser's)."""
        if self.max_depth is None or not body.strip():
            return None
        try:
            value = json.loads(body.decode("utf-8"))
        except UnicodeDecodeError:
            return Refusal(400, "parse", "the body is not UTF-8 text")
        except RecursionError:
            return self._too_deep()
        except ValueError:
            return Refusal(400, "parse", "the body is not JSON")
        if _deeper_than(value, self.max_depth):
            return self._too_deep()
        return None

    def _too_deep(self) -> Refusal:
        return Refusal(400, "too_deep", f"the JSON body is nested over {self.max_depth} levels")

    async def _refuse(self, send: Send, refusal: Refusal) -> None:
        body = self.render(refusal)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        if refusal.status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        if refusal.status in (400, 408, 413):  # what is left of the body is not read
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether a parsed JSON value nests arrays and objects over ``limit`` levels
    (walked with a list, not recursion: the point is not to recurse on a client's say)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Iterable[Any] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


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
