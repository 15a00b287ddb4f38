"""SQLite ``EventStore`` (aiosqlite, WAL): the embedded default.

Group commit: ``append`` queues its request and one writer task drains the
queue, checking and inserting every queued request inside one ``BEGIN
IMMEDIATE`` transaction, then resolves each caller after the commit. So many
concurrent appenders share one fsync, while each call still returns only once
its own events are durable, and a request that fails its checks (wrong
expected version, bad payload) fails alone without touching the others.

Positions are assigned by the writer as ``max(position) + 1`` under the write
lock, so they are gap-free and in commit order; readers in this or any other
process see a prefix of the log, which is what makes ``subscribe`` gap-free.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiosqlite

from .batch import check_append_args, check_replay, seal_batch
from .envelope import (
    DEFAULT_MAX_EVENT_BYTES,
    GENESIS_HASH,
    ChainProblem,
    Envelope,
    NewEvent,
    decode_body,
    verify_chain,
)
from .errors import CardbusError, StoreError, StoreUnavailable
from .store import EventStore

__all__ = ["SqliteEventStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    position       INTEGER PRIMARY KEY,
    event_id       TEXT NOT NULL UNIQUE,
    stream         TEXT NOT NULL,
    version        INTEGER NOT NULL,
    correlation_id TEXT NOT NULL,
    type           TEXT NOT NULL,
    recorded_at    REAL NOT NULL,
    body           BLOB NOT NULL,
    hash           TEXT NOT NULL,
    UNIQUE (stream, version)
);
CREATE INDEX IF NOT EXISTS events_by_correlation ON events (correlation_id, position);
"""

_MAX_BATCH_REQUESTS = 2000
_IN_CHUNK = 500  # bound on "IN (?, ...)" parameters per statement


@dataclass
class _Request:
    stream: str
    events: Sequence[NewEvent]
    expected_version: int
    future: asyncio.Future[list[Envelope]] = field(repr=False)


class SqliteEventStore(EventStore):
    """Open with ``await SqliteEventStore.open(path)``; close with ``await store.close()``."""

    def __init__(
        self,
        writer: aiosqlite.Connection,
        reader: aiosqlite.Connection,
        path: str,
        max_event_bytes: int,
        poll_interval: float,
    ) -> None:
        self.path = path
        self.max_event_bytes = max_event_bytes
        self.poll_interval = poll_interval
        self._writer = writer
        self._reader = reader
        self._queue: list[_Request] = []
        self._writer_task: asyncio.Task[None] | None = None
        self._committed = asyncio.Condition()
        self._last_committed = 0
        self._closed = False

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        create: bool = True,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        poll_interval: float = 0.05,
        synchronous: str = "FULL",
    ) -> SqliteEventStore:
        """Open (and by default create) the log at ``path``.

        ``synchronous=FULL`` makes every commit durable against power loss;
        ``NORMAL`` survives process crashes only and is faster.
        """
        path = os.fspath(path)
        if not create and (path == ":memory:" or not os.path.exists(path)):
            raise StoreUnavailable(f"no event store at {path!r}")
        try:
            writer = await aiosqlite.connect(path, isolation_level=None)
            await writer.executescript(
                "PRAGMA journal_mode=WAL;"
                f"PRAGMA synchronous={synchronous};"
                "PRAGMA busy_timeout=10000;"
            )
            await writer.executescript(_SCHEMA)
            reader = await aiosqlite.connect(path, isolation_level=None)
            await reader.execute("PRAGMA busy_timeout=10000")
            await reader.execute("PRAGMA query_only=1")
        except sqlite3.Error as e:
            raise StoreUnavailable(f"cannot open event store {path!r}: {e}") from e
        store = cls(writer, reader, path, max_event_bytes, poll_interval)
        store._last_committed = await store.last_position()
        return store

    # -- writing -------------------------------------------------------------

    async def append(
        self, stream: str, events: Sequence[NewEvent], expected_version: int
    ) -> list[Envelope]:
        check_append_args(stream, events, expected_version)
        if self._closed:
            raise StoreUnavailable("the event store is closed")
        future: asyncio.Future[list[Envelope]] = asyncio.get_running_loop().create_future()
        self._queue.append(_Request(stream, list(events), expected_version, future))
        if self._writer_task is None or self._writer_task.done():
            self._writer_task = asyncio.create_task(self._drain(), name="cardbus-sqlite-writer")
        return await future

    async def _drain(self) -> None:
        while self._queue:
            batch, self._queue = (
                self._queue[:_MAX_BATCH_REQUESTS],
                self._queue[_MAX_BATCH_REQUESTS:],
            )
            try:
                await self._commit(batch)
            except BaseException as e:  # resolve every caller, whatever happened
                err = e if isinstance(e, CardbusError) else StoreError(f"append failed: {e!r}")
                for r in batch:
                    if not r.future.done():
                        r.future.set_exception(err)
                if not isinstance(e, Exception):
                    raise

    async def _commit(self, batch: list[_Request]) -> None:
        db = self._writer
        try:
            await db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            raise StoreUnavailable(f"cannot write to {self.path!r}: {e}") from e
        try:
            heads = await self._stream_heads(db, {r.stream for r in batch})
            stored = await self._stored_ids(db, [e.event_id for r in batch for e in r.events])
            async with db.execute("SELECT COALESCE(MAX(position), 0) FROM events") as cur:
                row = await cur.fetchone()
            position = row[0] if row else 0
            rows: list[tuple[Any, ...]] = []
            results: list[tuple[_Request, list[Envelope] | BaseException]] = []
            claimed: set[str] = set()
            for r in batch:
                try:
                    ids = [e.event_id for e in r.events]
                    if any(i in stored for i in ids):
                        check_replay([stored[i] for i in ids if i in stored], r.events, r.stream)
                        results.append((r, [stored[i] for i in ids]))
                        continue
                    if any(i in claimed for i in ids):  # same ids twice in one batch: retry later
                        self._queue.append(r)
                        continue
                    version, last_hash = heads.get(r.stream, (0, GENESIS_HASH))
                    sealed = seal_batch(
                        r.stream,
                        r.events,
                        r.expected_version,
                        version,
                        last_hash,
                        self.max_event_bytes,
                    )
                except CardbusError as e:
                    results.append((r, e))
                    continue
                out = []
                for env, body in sealed:
                    position += 1
                    out.append(_placed(env, position))
                    rows.append(
                        (
                            position,
                            env.event_id,
                            env.stream,
                            env.version,
                            env.correlation_id,
                            env.type,
                            env.recorded_at,
                            body,
                            env.hash,
                        )
                    )
                claimed.update(ids)
                heads[r.stream] = (sealed[-1][0].version, sealed[-1][0].hash)
                results.append((r, out))
            if rows:
                await db.executemany(
                    "INSERT INTO events (position, event_id, stream, version, correlation_id,"
                    " type, recorded_at, body, hash) VALUES (?,?,?,?,?,?,?,?,?)",
                    rows,
                )
            await db.execute("COMMIT")
        except BaseException:
            try:
                await db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            raise
        if rows:
            async with self._committed:
                self._last_committed = max(self._last_committed, position)
                self._committed.notify_all()
        for r, res in results:
            if r.future.done():
                continue
            if isinstance(res, BaseException):
                r.future.set_exception(res)
            else:
                r.future.set_result(res)

    async def _stream_heads(
        self, db: aiosqlite.Connection, streams: set[str]
    ) -> dict[str, tuple[int, str]]:
        heads: dict[str, tuple[int, str]] = {}
        names = list(streams)
        for i in range(0, len(names), _IN_CHUNK):
            chunk = names[i : i + _IN_CHUNK]
            marks = ",".join("?" * len(chunk))
            sql = (
                "SELECT e.stream, e.version, e.hash FROM events e JOIN ("
                f" SELECT stream, MAX(version) AS v FROM events WHERE stream IN ({marks})"
                " GROUP BY stream) m ON e.stream = m.stream AND e.version = m.v"
            )
            async with db.execute(sql, chunk) as cur:
                for stream, version, h in await cur.fetchall():
                    heads[stream] = (version, h)
        return heads

    async def _stored_ids(self, db: aiosqlite.Connection, ids: list[str]) -> dict[str, Envelope]:
        found: dict[str, Envelope] = {}
        for i in range(0, len(ids), _IN_CHUNK):
            chunk = ids[i : i + _IN_CHUNK]
            marks = ",".join("?" * len(chunk))
            sql = f"SELECT position, body, hash FROM events WHERE event_id IN ({marks})"
            async with db.execute(sql, chunk) as cur:
                for env in self._decode_rows(await cur.fetchall()):
                    found[env.event_id] = env
        return found

    # -- reading -------------------------------------------------------------

    def _decode_rows(self, rows: Any) -> list[Envelope]:
        limit = self.max_event_bytes
        return [decode_body(body, position, h, limit) for position, body, h in rows]

    async def _query(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        try:
            async with self._reader.execute(sql, args) as cur:
                return list(await cur.fetchall())
        except sqlite3.Error as e:
            raise StoreUnavailable(f"cannot read {self.path!r}: {e}") from e
        except ValueError as e:  # aiosqlite: connection closed
            raise StoreUnavailable(f"event store {self.path!r} is closed") from e

    async def read_stream(self, stream: str, from_version: int = 1) -> list[Envelope]:
        rows = await self._query(
            "SELECT position, body, hash FROM events WHERE stream = ? AND version >= ?"
            " ORDER BY version",
            (stream, from_version),
        )
        return self._decode_rows(rows)

    async def read_all(self, from_position: int = 0, limit: int = 1000) -> list[Envelope]:
        rows = await self._query(
            "SELECT position, body, hash FROM events WHERE position >= ? ORDER BY position LIMIT ?",
            (from_position, limit),
        )
        return self._decode_rows(rows)

    async def read_correlation(self, correlation_id: str) -> list[Envelope]:
        rows = await self._query(
            "SELECT position, body, hash FROM events WHERE correlation_id = ? ORDER BY position",
            (correlation_id,),
        )
        return self._decode_rows(rows)

    async def stream_version(self, stream: str) -> int:
        rows = await self._query("SELECT MAX(version) FROM events WHERE stream = ?", (stream,))
        return int(rows[0][0] or 0)

    async def last_position(self) -> int:
        rows = await self._query("SELECT COALESCE(MAX(position), 0) FROM events")
        return int(rows[0][0])

    async def subscribe(self, from_position: int = 0) -> AsyncIterator[Envelope]:
        next_position = max(from_position, 1)
        while True:
            page = await self.read_all(next_position, 1000)
            for env in page:
                yield env
                next_position = env.position + 1
            if len(page) == 1000:
                continue
            # Live: woken by our own commits, polling for other processes' commits.
            wanted = next_position
            async with self._committed:
                try:
                    await asyncio.wait_for(
                        self._committed.wait_for(lambda: self._last_committed >= wanted),  # noqa: B023
                        self.poll_interval,
                    )
                except TimeoutError:
                    pass

    async def verify(self, stream: str | None = None) -> list[ChainProblem]:
        if stream is not None:
            rows = await self._query(
                "SELECT stream, position, body, hash FROM events WHERE stream = ?"
                " ORDER BY position",
                (stream,),
            )
        else:
            rows = await self._query(
                "SELECT stream, position, body, hash FROM events ORDER BY stream, position"
            )
        problems: list[ChainProblem] = []
        by_stream: dict[str, list[tuple[int, bytes, str]]] = {}
        for s, position, body, h in rows:
            by_stream.setdefault(s, []).append((position, body, h))
        for s, stream_rows in by_stream.items():
            problems.extend(verify_chain(stream_rows, s))
        return sorted(problems, key=lambda p: p.position)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._writer_task is not None:
            try:
                await self._writer_task
            except Exception:
                pass
        await self._writer.close()
        await self._reader.close()


def _placed(env: Envelope, position: int) -> Envelope:
    import msgspec

    return msgspec.structs.replace(env, position=position)
