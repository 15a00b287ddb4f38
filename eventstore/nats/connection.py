"""The one way cardbus reaches NATS, for the event store and the bus alike.

* :class:`NatsOptions` -- URL(s), authentication, TLS and reconnect settings;
  the same names are keywords of ``NatsEventStore.connect``, and each has a
  ``CARDBUS_NATS_*`` environment variable (:data:`ENV_VARS`)::

      opts = NatsOptions(url="nats://h:4222", user="orch", password="...")
      nc = await opts.connect("cardbus-orchestrator")       # NatsBus(nc), from_connection
      store = await NatsEventStore.connect(**opts.store_kwargs())

* :func:`connect` -- the first connect gets ``connect_timeout`` seconds in all
  (nats-py alone would try forever) and a wrong credential or certificate
  fails at once; afterwards reconnects go on forever by default, with
  exponential backoff and jitter (:func:`reconnect_backoff`).
* :func:`translated` -- the one boundary where nats-py's errors become
  cardbus's (``eventstore/errors.py``), most specific first.
* :func:`retry_transient` -- store retries: an operation that failed
  transiently (a reconnect, a stream leader election, a server starting) is
  tried again with backoff for a while. Not to be confused with the
  redelivery of cards (the bus's ``MaxDeliver``/``BackOff``) or the
  orchestrator's task retries.

The event store opens its connections with ``no_echo`` (the server never
sends it its own publishes: ``subscribe`` gets its own appends from the
append itself, see ``follow.py``); a connection made here remembers how (:func:`opened_with`), so
a store handed one that echoes (shared with a bus, which may answer its own
requests) can open its own like it.

``inbox_prefix`` sets the prefix of the connection's reply subjects (JetStream
acks, pull deliveries); give each agent its own (``_INBOX.<agent>``) when the
server enforces the per-role permissions of the README, so no agent can
subscribe to another's deliveries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
import ssl
import weakref
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, TypeVar

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient

from cardbus.eventstore.errors import (
    BusError,
    CardbusError,
    PayloadTooLarge,
    StoreError,
    StoreUnavailable,
    ValidationError,
)

__all__ = [
    "ENV_VARS",
    "ERR_MESSAGE_TOO_LARGE",
    "TRANSPORT_ERRORS",
    "NatsOptions",
    "connect",
    "is_too_large",
    "opened_with",
    "on_reconnected",
    "is_transient",
    "reconnect_backoff",
    "retry_transient",
    "server_list",
    "tls_context",
    "transient",
    "translated",
    "version_at_least",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: option -> environment variable (the CLI's ``--nats-*`` options read the same ones)
ENV_VARS = {
    "url": "CARDBUS_NATS_URL",
    "token": "CARDBUS_NATS_TOKEN",
    "user": "CARDBUS_NATS_USER",
    "password": "CARDBUS_NATS_PASSWORD",
    "nkeys_seed": "CARDBUS_NATS_NKEY",
    "user_credentials": "CARDBUS_NATS_CREDS",
    "tls_ca": "CARDBUS_NATS_CA",
    "tls_cert": "CARDBUS_NATS_CERT",
    "tls_key": "CARDBUS_NATS_KEY",
}

#: what a call through nats-py raises when it fails (ssl.SSLError is an OSError)
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    nats.errors.Error,
    nats.js.errors.Error,
    OSError,
    asyncio.TimeoutError,
)

#: JetStream: "message size exceeds maximum allowed" (the stream's max_msg_size)
ERR_MESSAGE_TOO_LARGE = 10054


# -- options -------------------------------------------------------------------------


@dataclass(frozen=True)
class NatsOptions:
    """How to reach a NATS server or cluster; see the module docstring."""

    url: str | Sequence[str] = "nats://127.0.0.1:4222"
    token: str | None = None
    user: str | None = None
    password: str | None = None
    nkeys_seed: str | None = None
    user_credentials: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_hostname: str | None = None
    connect_timeout: float = 5.0
    max_reconnect_attempts: int = -1
    reconnect_time_wait: float = 0.25
    reconnect_max_wait: float = 5.0
    inbox_prefix: str | None = None

    @classmethod
    def from_env(
        cls, url: str | None = None, env: Mapping[str, str] | None = None, **given: Any
    ) -> NatsOptions:
        """Options from keywords, falling back to the ``CARDBUS_NATS_*`` variables."""
        env = os.environ if env is None else env
        values = {k: v for k, v in given.items() if v is not None}
        if url is not None:
            values["url"] = url
        for name, var in ENV_VARS.items():
            if name not in values and env.get(var):
                values[name] = env[var]
        return cls(**values)

    def with_(self, **changes: Any) -> NatsOptions:
        return replace(self, **changes)

    def store_kwargs(self) -> dict[str, Any]:
        """Keywords for ``NatsEventStore.connect`` (same names)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        if out["inbox_prefix"] is None:
            del out["inbox_prefix"]  # (passed through to nats.connect only when set)
        return out

    def connect_kwargs(self, name: str) -> dict[str, Any]:
        """Keywords for ``nats.connect``."""
        options: dict[str, Any] = {
            "servers": server_list(self.url),
            "name": name,
            "connect_timeout": self.connect_timeout,
            "max_reconnect_attempts": self.max_reconnect_attempts,
            "reconnect_time_wait": self.reconnect_time_wait,
            "reconnect_to_server_handler": reconnect_backoff(
                self.reconnect_time_wait, self.reconnect_max_wait
            ),
            "error_cb": _log_error,
        }
        for key in ("token", "user", "password", "nkeys_seed", "user_credentials"):
            value = getattr(self, key)
            if value is not None:
                options[key] = value
        tls = tls_context(self.tls_ca, self.tls_cert, self.tls_key)
        if tls is not None:
            options["tls"] = tls
        if self.tls_hostname is not None:
            options["tls_hostname"] = self.tls_hostname
        if self.inbox_prefix is not None:
            options["inbox_prefix"] = self.inbox_prefix
        return options

    async def connect(self, name: str = "cardbus", **extra: Any) -> NatsClient:
        """A connection for the bus: a failure is a ``BusError`` (see :func:`connect`)."""
        return await connect(self, name, error=BusError, **extra)


def server_list(url: str | Sequence[str]) -> list[str]:
    """One URL, a comma-separated list or a sequence of URLs -> the list nats-py wants."""
    urls = [u.strip() for u in url.split(",")] if isinstance(url, str) else list(url)
    urls = [u for u in urls if u]
    if not urls:
        raise ValidationError("no NATS server URL given")
    return urls


def tls_context(ca: str | None, cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """A client TLS context from a CA bundle and/or a client certificate (None: neither)."""
    if ca is None and cert is None:
        return None
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
        if cert is not None:
            ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise StoreUnavailable(f"cannot load TLS files: {e}") from e
    return ctx


def reconnect_backoff(base: float, cap: float) -> Callable[..., tuple[Any, float]]:
    """nats-py reconnect hook: round-robin over servers, exponential backoff with jitter."""

    def choose(servers: list[Any], info: dict[str, Any]) -> tuple[Any, float]:
        server = min(servers, key=lambda s: s.reconnects)
        attempts = server.reconnects
        if attempts == 0:
            return server, 0.0
        delay = min(cap, base * 2 ** min(attempts - 1, 16))
        return server, delay * (0.8 + random.random() * 0.4)

    return choose


# -- connecting ------------------------------------------------------------------------


async def connect(
    options: NatsOptions,
    name: str = "cardbus",
    *,
    error: Callable[[str], CardbusError] = StoreUnavailable,
    **extra: Any,
) -> NatsClient:
    """Open a connection; a failure is ``error`` naming the servers and the cause.

    ``extra`` goes to ``nats.connect`` (an ``error_cb`` there is called too).
    """
    kwargs = {**options.connect_kwargs(name), **extra}
    servers = ", ".join(kwargs["servers"])
    user_cb = kwargs.get("error_cb")
    last: list[Exception] = []  # the error nats-py saw last (refused, authorization, TLS...)
    connecting = True

    async def on_error(e: Exception) -> None:
        last[:] = [e]
        if user_cb is not None:
            await user_cb(e)
        if connecting and _is_permanent(e):
            raise e  # a wrong credential or certificate does not get better: fail now

    kwargs["error_cb"] = on_error
    kwargs["connect_timeout"] = min(options.connect_timeout, 2.0)
    nc = NatsClient()
    user_reconnected = kwargs.get("reconnected_cb")

    async def on_reconnected() -> None:
        for listener in list(_RECONNECT_LISTENERS.get(nc, ())):
            try:
                listener()
            except Exception:  # one listener's bug does not keep the others unwarned
                log.exception("reconnect listener failed")
        if user_reconnected is not None:
            await user_reconnected()

    kwargs["reconnected_cb"] = on_reconnected
    with translated(f"cannot connect to NATS at {servers}", error=error, refused=error):
        try:
            await asyncio.wait_for(nc.connect(**kwargs), options.connect_timeout)
        except BaseException as e:
            with contextlib.suppress(Exception):  # (close can hang on a failed TLS handshake)
                await asyncio.wait_for(nc.close(), 1.0)
            if last and last[0] is not e and isinstance(e, TRANSPORT_ERRORS):
                raise last[0] from e  # the reason, rather than "timed out"
            raise
    connecting = False
    _OPENED[nc] = (options, name, dict(extra))
    return nc


_OPENED: weakref.WeakKeyDictionary[NatsClient, tuple[NatsOptions, str, dict[str, Any]]] = (
    weakref.WeakKeyDictionary()
)


_RECONNECT_LISTENERS: weakref.WeakKeyDictionary[NatsClient, list[Callable[[], None]]] = (
    weakref.WeakKeyDictionary()
)


def on_reconnected(nc: NatsClient, listener: Callable[[], None]) -> Callable[[], None] | None:
    """Call ``listener()`` each time ``nc`` has reconnected (its subscriptions made again,
    so a pull request it had outstanding may be gone with the old server connection);
    returns the function that stops it, or None when ``nc`` was not opened by
    :func:`connect` (nothing tells of its reconnects: callers keep their own bound)."""
    if nc not in _OPENED:
        return None
    listeners = _RECONNECT_LISTENERS.setdefault(nc, [])
    listeners.append(listener)

    def stop() -> None:
        with contextlib.suppress(ValueError):
            listeners.remove(listener)

    return stop


def opened_with(nc: NatsClient) -> tuple[NatsOptions, str, dict[str, Any]] | None:
    """The options, name and extra keywords :func:`connect` opened ``nc`` with (None: it
    did not)."""
    return _OPENED.get(nc)


def _is_permanent(e: Exception) -> bool:
    """Authorization and certificate errors: trying the first connect again cannot help."""
    if isinstance(e, nats.errors.AuthorizationError | ssl.SSLCertVerificationError):
        return True
    return "authorization" in str(e).lower()


async def _log_error(e: Exception) -> None:
    log.debug("nats: %r", e)


def version_at_least(version: Any, major: int, minor: int) -> bool:
    """Whether a server's version (``nc.connected_server_version``) is ``major.minor``+."""
    try:
        return (int(version.major), int(version.minor)) >= (major, minor)
    except (AttributeError, TypeError, ValueError):
        return False


# -- errors ------------------------------------------------------------------------------


class _Transient(StoreUnavailable):
    """A store failure worth trying again (:func:`retry_transient` does); never reaches a
    caller: the retry loop raises a plain ``StoreUnavailable`` when it gives up."""


def transient(message: str) -> StoreUnavailable:
    """A store failure :func:`retry_transient` tries again (a timeout, a leader election)."""
    return _Transient(message)


def is_too_large(e: BaseException) -> bool:
    """nats-py's way of saying a message is over the server's or the stream's size limit."""
    if isinstance(e, nats.errors.MaxPayloadError):
        return True
    return isinstance(e, nats.js.errors.APIError) and e.err_code == ERR_MESSAGE_TOO_LARGE


def is_transient(e: BaseException) -> bool:
    """Whether trying again may help: a transient store failure, or a nats-py error of the
    kind a reconnect, a leader election or a server starting up causes."""
    if isinstance(e, _Transient):
        return True
    if isinstance(e, CardbusError) or is_too_large(e):
        return False
    if isinstance(e, nats.js.errors.APIError):
        return isinstance(e, nats.js.errors.ServiceUnavailableError) or (e.code or 0) >= 500
    return isinstance(e, TRANSPORT_ERRORS)


@contextlib.contextmanager
def translated(
    what: str,
    *,
    error: Callable[[str], CardbusError] = StoreUnavailable,
    refused: Callable[[str], CardbusError] = StoreError,
    too_large: Callable[[], PayloadTooLarge] | None = None,
) -> Iterator[None]:
    """Raise nats-py's errors in the block as cardbus's, ``raise ... from e``.

    ``what`` starts the message (``"cannot read 't'"``). A server that cannot
    be reached or answered too late is ``error`` (``StoreUnavailable``;
    :func:`transient` for an operation in a store retry; ``BusError`` on the
    bus); a request JetStream refused is ``refused``; a message over a size
    limit is ``too_large()`` when given. Our own errors pass unchanged.
    """
    try:
        yield
    except CardbusError:
        raise
    except ImportError as e:
        if e.name != "nkeys":
            raise
        # nats-py imports nkeys only for nkey seeds and .creds files
        raise error(
            f"nkeys_seed/user_credentials need the 'nkeys' package (pip install nkeys): {e}"
        ) from e
    except (nats.errors.MaxPayloadError, nats.js.errors.APIError) as e:
        if too_large is not None and is_too_large(e):
            raise too_large() from e
        if is_transient(e):
            raise error(f"{what}: JetStream unavailable: {e!r}") from e
        raise refused(f"{what}: refused: {e!r}") from e
    except TRANSPORT_ERRORS as e:
        raise error(f"{what}: {e!r}") from e


async def retry_transient(
    op: Callable[[], Awaitable[T]],
    *,
    within: float = math.inf,
    stopped: Callable[[], bool] = lambda: False,
    retry_on: Callable[[BaseException], bool] = is_transient,
    pause: float = 0.05,
    max_pause: float = 1.0,
) -> T:
    """``await op()``, tried again while it fails with an error ``retry_on`` accepts, with
    exponential backoff (``pause`` doubling up to ``max_pause``, with jitter), for at most
    ``within`` seconds and until ``stopped()``; then the last error is raised.

    Only safe for operations that are idempotent: the store's appends are (a first
    try that was stored after all is found again by its event ids).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    delay = pause
    while True:
        try:
            return await op()
        except Exception as e:
            if not retry_on(e):
                raise
            if stopped() or loop.time() + delay > deadline:
                if isinstance(e, _Transient):  # the private marker stays in here
                    raise StoreUnavailable(str(e)) from (e.__cause__ or e)
                raise
            log.debug("trying again after %r", e)
        await asyncio.sleep(delay * (0.8 + random.random() * 0.4))
        delay = min(delay * 2, max_pause)
