"""``--store URL``: the one option by which every command names the log.

``--store`` (alias ``--db``; env ``CARDBUS_STORE``, then ``CARDBUS_DB``;
default ``cardbus.db``) takes

* a SQLite file: a path, ``sqlite:PATH`` or ``sqlite:///PATH``;
* a JetStream log: ``nats://HOST:PORT`` (``tls://...``; a comma-separated
  list for a cluster), with the NATS connection options ``--nats-token``,
  ``--nats-user``/``--nats-password``, ``--nats-nkey``, ``--nats-creds``,
  ``--tls-ca``/``--tls-cert``/``--tls-key`` (each also from its
  ``CARDBUS_NATS_*`` variable, ``eventstore.nats.connection.ENV_VARS``).

:func:`store_option` adds these to a command and hands it one
:class:`StoreRef`; :func:`open_store_option` opens the log it names. A
command never creates a stream on NATS (``create_stream=False``), and opens
an SQLite file only if it exists unless it asks to create it (``run``,
``demo``, ``ui``).

The projections' read model: on SQLite it is kept beside the file
(``<db>.proj``) and caught up incrementally; on NATS it is folded in memory
by each command (``:memory:``), so no cache can outlive or disagree with a
stream that was deleted and created again.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import click

from cardbus.eventstore import STORE_SCHEMES, EventStore, SqliteEventStore
from cardbus.eventstore import open_store as open_url
from cardbus.projections import projection_path

__all__ = ["STORE_ENV", "StoreRef", "open_store_option", "parse_store", "store_option"]

F = TypeVar("F", bound=Callable[..., Any])

#: the environment variables --store reads, first found wins
STORE_ENV = ["CARDBUS_STORE", "CARDBUS_DB"]

# option name -> (NatsOptions field, help)
_CONN = {
    "nats_token": ("token", "Auth token."),
    "nats_user": ("user", "User name."),
    "nats_password": ("password", "Password."),
    "nats_nkey": ("nkeys_seed", "Nkey seed file."),
    "nats_creds": ("user_credentials", ".creds file."),
    "tls_ca": ("tls_ca", "CA bundle for TLS."),
    "tls_cert": ("tls_cert", "Client certificate."),
    "tls_key": ("tls_key", "Client key."),
}
# NatsOptions field -> environment variable
_ENV = {
    "token": "CARDBUS_NATS_TOKEN",
    "user": "CARDBUS_NATS_USER",
    "password": "CARDBUS_NATS_PASSWORD",
    "nkeys_seed": "CARDBUS_NATS_NKEY",
    "user_credentials": "CARDBUS_NATS_CREDS",
    "tls_ca": "CARDBUS_NATS_CA",
    "tls_cert": "CARDBUS_NATS_CERT",
    "tls_key": "CARDBUS_NATS_KEY",
}  # == eventstore.nats.connection.ENV_VARS without "url" (a test pins it; no nats-py import)


@dataclass(frozen=True)
class StoreRef:
    """The log a command was pointed at: a SQLite file or a NATS JetStream log."""

    url: str
    kind: str  # "sqlite" or "nats"
    path: str | None = None  # the SQLite file
    nats: dict[str, Any] = field(default_factory=dict)  # given connection options

    @property
    def is_nats(self) -> bool:
        return self.kind == "nats"

    def projection_path(self) -> str:
        """Where the projections' read model lives: ``<db>.proj``, or memory on NATS."""
        return projection_path(self.path) if self.path is not None else ":memory:"

    def nats_options(self) -> Any:
        """The ``NatsOptions`` of a NATS store (given options, then ``CARDBUS_NATS_*``)."""
        from cardbus.eventstore.nats.connection import NatsOptions  # only with nats-py

        # a command fails at once when the server is gone instead of retrying forever
        return NatsOptions.from_env(self.url, max_reconnect_attempts=0, **self.nats)

    def flag(self) -> str:
        """`` --store URL`` to repeat in a suggested command ("" for the default file)."""
        return "" if self.url == "cardbus.db" else f" --store {self.url}"

    def __str__(self) -> str:
        return self.url


def parse_store(url: str, nats: dict[str, Any] | None = None) -> StoreRef:
    """``url`` as a :class:`StoreRef`; an unknown scheme or ``memory:`` is a ConfigError."""
    from cardbus.eventstore.errors import ConfigError

    scheme, sep, _ = url.partition("://")
    if url.startswith(("nats://", "tls://")):
        return StoreRef(url, "nats", None, {k: v for k, v in (nats or {}).items() if v})
    if url == "memory:" or (sep and scheme not in STORE_SCHEMES):
        raise ConfigError(
            f"store {url!r}: give a SQLite file (PATH, sqlite:///PATH) or a JetStream log"
            " (nats://HOST:PORT[,HOST:PORT...])"
        )
    path = url.removeprefix("sqlite://").removeprefix("sqlite:")
    if path.startswith("//"):  # sqlite:////abs/path (SQLAlchemy's spelling): the same file
        path = "/" + path.lstrip("/")
    if not path:
        raise ConfigError(f"store {url!r}: no file path")
    return StoreRef(url, "sqlite", path)


async def open_store_option(ref: StoreRef, *, create: bool = False) -> EventStore:
    """Open the log ``ref`` names: a missing file or stream is created only if ``create``.

    A missing SQLite file is ``StoreUnavailable`` (one line, exit 1) unless
    ``create``; an unreachable server or a missing stream is one line too.
    """
    if ref.path is not None:
        return await SqliteEventStore.open(ref.path, create=create)
    options = ref.nats_options().store_kwargs()
    url = options.pop("url")
    return await open_url(url, create_stream=create, **options)


def store_option(func: F | None = None, *, help: str | None = None) -> Any:
    """Add ``--store``/``--db`` and the NATS connection options; the command gets ``db``.

    The decorated function receives ``db: StoreRef`` in place of the raw
    options (they are folded together before it is called).
    """

    def decorate(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kw: Any) -> Any:
            given = {_CONN[k][0]: kw.pop(k, None) for k in _CONN}
            try:
                ref = parse_store(kw.pop("store"), given)
            except ValueError as e:  # ConfigError: a usage error (exit 2)
                raise click.BadParameter(str(e), param_hint="'--store'") from e
            return f(*args, db=ref, **kw)

        options = [
            click.option(
                "--store",
                "--db",
                "store",
                default="cardbus.db",
                envvar=STORE_ENV,
                show_default=True,
                show_envvar=True,
                metavar="PATH|URL",
                help=help
                or "The log: a SQLite file (PATH, sqlite:///PATH) or nats://HOST:PORT[,...].",
            ),
            *(
                click.option(
                    "--" + name.replace("_", "-"),
                    name,
                    envvar=_ENV[target],
                    show_envvar=True,
                    default=None,
                    help=f"With nats://: {text}",
                )
                for name, (target, text) in _CONN.items()
            ),
        ]
        out: Any = wrapper
        for o in reversed(options):
            out = o(out)
        return out

    return decorate(func) if func is not None else decorate
