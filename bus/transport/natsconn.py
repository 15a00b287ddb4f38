"""NATS connection options shared by the bus and the event store.

One :class:`NatsOptions` describes how to reach a NATS server or cluster:
URL(s), authentication (``token``, ``user``/``password``, ``nkeys_seed`` =
path of an nkey seed file, ``user_credentials`` = a ``.creds`` file), TLS
(``tls_ca``, ``tls_cert``, ``tls_key``, ``tls_hostname``) and reconnects
(forever by default, exponential backoff with jitter from
``reconnect_time_wait`` to ``reconnect_max_wait`` seconds). The parameter
names are those of ``NatsEventStore.connect``, so the same options open both:

    opts = NatsOptions(url="nats://h:4222", user="orch", password="...")
    nc = await opts.connect("cardbus-orchestrator")        # for NatsBus / from_connection
    store = await NatsEventStore.connect(**opts.store_kwargs())

``inbox_prefix`` sets the prefix of the connection's reply subjects (JetStream
acks, pull deliveries); give each agent its own (``_INBOX_<agent>``) when the
server enforces the per-role permissions of the README, so no agent can
subscribe to another's deliveries.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

import nats.errors
from nats.aio.client import Client as NatsClient

from cardbus.eventstore.errors import BusError
from cardbus.eventstore.nats import _backoff_handler, _is_permanent, _server_list, _tls_context

__all__ = ["NatsOptions"]

_ENV = {
    "token": "CARDBUS_NATS_TOKEN",
    "user": "CARDBUS_NATS_USER",
    "password": "CARDBUS_NATS_PASSWORD",
    "nkeys_seed": "CARDBUS_NATS_NKEY",
    "user_credentials": "CARDBUS_NATS_CREDS",
    "tls_ca": "CARDBUS_NATS_CA",
    "tls_cert": "CARDBUS_NATS_CERT",
    "tls_key": "CARDBUS_NATS_KEY",
}


async def _quiet(e: Exception) -> None:
    pass


@dataclass(frozen=True)
class NatsOptions:
    url: str = "nats://127.0.0.1:4222"
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
    def from_env(cls, url: str, env: Mapping[str, str] | None = None, **given: Any) -> NatsOptions:
        """Options from keywords, falling back to ``CARDBUS_NATS_*`` environment variables."""
        env = os.environ if env is None else env
        values = {k: v for k, v in given.items() if v is not None}
        for name, var in _ENV.items():
            if name not in values and env.get(var):
                values[name] = env[var]
        return cls(url=url, **values)

    def with_(self, **changes: Any) -> NatsOptions:
        return replace(self, **changes)

    def store_kwargs(self) -> dict[str, Any]:
        """Keywords for ``NatsEventStore.connect`` (same names)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        inbox = out.pop("inbox_prefix")
        if inbox is not None:
            out["inbox_prefix"] = inbox  # passed through to nats.connect
        return out

    def connect_kwargs(self, name: str) -> dict[str, Any]:
        """Keywords for ``nats.connect``."""
        options: dict[str, Any] = {
            "servers": _server_list(self.url),
            "name": name,
            "connect_timeout": self.connect_timeout,
            "max_reconnect_attempts": self.max_reconnect_attempts,
            "reconnect_time_wait": self.reconnect_time_wait,
            "reconnect_to_server_handler": _backoff_handler(
                self.reconnect_time_wait, self.reconnect_max_wait
            ),
            "error_cb": _quiet,
        }
        for key in ("token", "user", "password", "nkeys_seed", "user_credentials"):
            value = getattr(self, key)
            if value is not None:
                options[key] = value
        tls = _tls_context(self.tls_ca, self.tls_cert, self.tls_key)
        if tls is not None:
            options["tls"] = tls
        if self.tls_hostname is not None:
            options["tls_hostname"] = self.tls_hostname
        if self.inbox_prefix is not None:
            options["inbox_prefix"] = self.inbox_prefix
        return options

    async def connect(self, name: str = "cardbus", **extra: Any) -> NatsClient:
        """Open a connection; a failure is a ``BusError`` naming the servers and the cause.

        The first connect gets ``connect_timeout`` seconds in all (nats-py alone
        would retry it forever); a wrong credential or certificate fails at once.
        Once connected, reconnects go on as configured.
        """
        options = {**self.connect_kwargs(name), **extra}
        user_cb = options.get("error_cb")
        last: list[Exception] = []
        connecting = [True]

        async def on_error(e: Exception) -> None:
            last[:] = [e]
            if user_cb is not None:
                await user_cb(e)
            if connecting[0] and _is_permanent(e):
                raise e  # does not get better by retrying

        options["error_cb"] = on_error
        options["connect_timeout"] = min(self.connect_timeout, 2.0)
        nc = NatsClient()
        try:
            await asyncio.wait_for(nc.connect(**options), self.connect_timeout)
        except ImportError as e:  # nats-py imports nkeys only for seeds and .creds files
            raise BusError(f"nkeys_seed/user_credentials need the 'nkeys' package: {e}") from e
        except (nats.errors.Error, OSError, TimeoutError) as e:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.close(), 1.0)
            why = repr(last[0]) if last else repr(e)
            raise BusError(f"cannot connect to NATS at {self.url}: {why}") from e
        connecting[0] = False
        return nc
