"""cardbus event log: envelope, event catalogue, state machine and the EventStore backends."""

from __future__ import annotations

from cardbus.eventstore import events
from cardbus.eventstore.envelope import (
    DEFAULT_MAX_EVENT_BYTES,
    ChainProblem,
    Envelope,
    NewEvent,
    decode_body,
)
from cardbus.eventstore.errors import (
    AccessDenied,
    BusError,
    CardbusError,
    ConcurrencyError,
    ConfigError,
    DecodeError,
    IdempotencyError,
    IllegalTransition,
    InvalidPlan,
    InvalidSchedule,
    PayloadTooLarge,
    PlanConflict,
    PrerequisiteNotStored,
    StoreClosed,
    StoreError,
    StoreUnavailable,
    StreamNotFound,
    UnknownEventType,
    ValidationError,
)
from cardbus.eventstore.ids import id_time, new_id
from cardbus.eventstore.memory import MemoryEventStore
from cardbus.eventstore.sqlite import SqliteEventStore
from cardbus.eventstore.states import A2A_STATE, TERMINAL, TaskState, fold_state, transition
from cardbus.eventstore.store import Append, EventStore

__all__ = [
    "A2A_STATE",
    "DEFAULT_MAX_EVENT_BYTES",
    "TERMINAL",
    "AccessDenied",
    "Append",
    "BusError",
    "CardbusError",
    "ChainProblem",
    "ConfigError",
    "ConcurrencyError",
    "DecodeError",
    "Envelope",
    "EventStore",
    "IdempotencyError",
    "IllegalTransition",
    "InvalidPlan",
    "InvalidSchedule",
    "PlanConflict",
    "MemoryEventStore",
    "NewEvent",
    "PayloadTooLarge",
    "PrerequisiteNotStored",
    "SqliteEventStore",
    "StoreError",
    "StoreClosed",
    "StoreUnavailable",
    "StreamNotFound",
    "TaskState",
    "UnknownEventType",
    "ValidationError",
    "decode_body",
    "events",
    "fold_state",
    "id_time",
    "new_id",
    "open_store",
    "transition",
]


#: URL schemes open_store knows (a URL without a scheme is an SQLite file path)
STORE_SCHEMES = ("memory", "sqlite", "nats", "tls")


async def open_store(url: str, **options: object) -> EventStore:
    """Open a store by URL: ``memory:``, ``sqlite:PATH`` (or a bare path), ``nats://HOST:PORT``.

    A URL with any other scheme (``postgres://...``) is a ``ConfigError``
    naming the known ones, rather than a file of that name.
    """
    scheme, sep, _ = url.partition("://")
    if sep and scheme not in STORE_SCHEMES:
        raise ConfigError(
            f"store URL {url!r}: unknown scheme {scheme!r}; known: memory:, sqlite:PATH, "
            "a file path, nats://HOST:PORT, tls://HOST:PORT"
        )
    if url == "memory:":
        return MemoryEventStore(**options)  # type: ignore[arg-type]
    if url.startswith(("nats://", "tls://")):
        from cardbus.eventstore.nats import (
            NatsEventStore,  # imported lazily: nats-py is only needed here
        )

        return await NatsEventStore.connect(url, **options)  # type: ignore[arg-type]
    path = url.removeprefix("sqlite://").removeprefix("sqlite:")
    return await SqliteEventStore.open(path, **options)  # type: ignore[arg-type]
