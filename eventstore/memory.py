"""In-memory ``EventStore``: a product backend for tests, notebooks and short runs.

Same contract as the SQLite and NATS backends (see ``store.py``); nothing
survives the process.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from cardbus.eventstore.batch import check_append_args, check_replay, seal_batch
from cardbus.eventstore.envelope import (
    DEFAULT_MAX_EVENT_BYTES,
    GENESIS_HASH,
    ChainProblem,
    Envelope,
    NewEvent,
    verify_chain,
)
from cardbus.eventstore.store import EventStore

__all__ = ["MemoryEventStore"]


class MemoryEventStore(EventStore):
    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self.max_event_bytes = max_event_bytes
        self._log: list[Envelope] = []  # index = position - 1
        self._bodies: list[bytes] = []
        self._streams: dict[str, list[int]] = {}  # stream -> positions
        self._by_id: dict[str, int] = {}
        self._by_correlation: dict[str, list[int]] = {}
        self._appended = asyncio.Condition()

    async def append(
        self, stream: str, events: Sequence[NewEvent], expected_version: int
    ) -> list[Envelope]:
        check_append_args(stream, events, expected_version)
        known = [self._by_id[e.event_id] for e in events if e.event_id in self._by_id]
        if known:
            stored = [self._log[p - 1] for p in known]
            check_replay(stored, events, stream)
            return stored
        positions = self._streams.get(stream, [])
        last = self._log[positions[-1] - 1] if positions else None
        sealed = seal_batch(
            stream,
            events,
            expected_version,
            last.version if last else 0,
            last.hash if last else GENESIS_HASH,
            self.max_event_bytes,
        )
        out: list[Envelope] = []
        for env, body in sealed:
            position = len(self._log) + 1
            env = _with_position(env, position)
            self._log.append(env)
            self._bodies.append(body)
            self._streams.setdefault(stream, []).append(position)
            self._by_id[env.event_id] = position
            self._by_correlation.setdefault(env.correlation_id, []).append(position)
            out.append(env)
        async with self._appended:
            self._appended.notify_all()
        return out

    async def read_stream(self, stream: str, from_version: int = 1) -> list[Envelope]:
        return [self._log[p - 1] for p in self._streams.get(stream, [])[max(from_version, 1) - 1 :]]

    async def read_all(self, from_position: int = 0, limit: int = 1000) -> list[Envelope]:
        start = max(from_position, 1) - 1
        return self._log[start : start + max(limit, 0)]

    async def read_correlation(self, correlation_id: str) -> list[Envelope]:
        return [self._log[p - 1] for p in self._by_correlation.get(correlation_id, [])]

    async def subscribe(self, from_position: int = 0) -> AsyncIterator[Envelope]:
        next_position = max(from_position, 1)
        while True:
            while next_position <= len(self._log):
                yield self._log[next_position - 1]
                next_position += 1
            async with self._appended:
                wanted = next_position
                await self._appended.wait_for(lambda: wanted <= len(self._log))  # noqa: B023

    async def stream_version(self, stream: str) -> int:
        return len(self._streams.get(stream, []))

    async def last_position(self) -> int:
        return len(self._log)

    async def verify(self, stream: str | None = None) -> list[ChainProblem]:
        streams = [stream] if stream is not None else list(self._streams)
        problems: list[ChainProblem] = []
        for s in streams:
            rows = [
                (p, self._bodies[p - 1], self._log[p - 1].hash) for p in self._streams.get(s, [])
            ]
            problems.extend(verify_chain(rows, s))
        return problems


def _with_position(env: Envelope, position: int) -> Envelope:
    import msgspec

    return msgspec.structs.replace(env, position=position)
