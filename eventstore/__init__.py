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
    DecodeError,
    IdempotencyError,
    IllegalTransition,
    InvalidPlan,
    PayloadTooLarge,
    PrerequisiteNotStored,
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
    "ConcurrencyError",
    "DecodeError",
    "Envelope",
    "EventStore",
    "IdempotencyError",
    "IllegalTransition",
    "InvalidPlan",
    "MemoryEventStore",
    "NewEvent",
    "PayloadTooLarge",
    "PrerequisiteNotStored",
    "SqliteEventStore",
    "StoreError",
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


async def open_store(url: str, **options: object) -> EventStore:
    """Open a store by URL: ``memory:``, ``sqlite:PATH`` (or a bare path), ``nats://HOST:PORT``."""
    if url == "memory:":
        return MemoryEventStore(**options)  # type: ignore[arg-type]
    if url.startswith(("nats://", "tls://")):
        from cardbus.eventstore.nats import (
            NatsEventStore,  # imported lazily: nats-py is only needed here
        )

        return await NatsEventStore.connect(url, **options)  # type: ignore[arg-type]
    path = url.removeprefix("sqlite://").removeprefix("sqlite:")
    return await SqliteEventStore.open(path, **options)  # type: ignore[arg-type]
