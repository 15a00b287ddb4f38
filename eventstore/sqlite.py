"""SQLite ``EventStore`` (WAL): the embedded default.

Writes. ``append`` checks its arguments, queues the request and awaits it;
``append_many`` queues its requests together, and they are never cut apart, so
one call (one decision of the orchestrator) is always one transaction. Queued
requests (about ``_MAX_BATCH_REQUESTS``) go to the writer thread as one batch
in *one* call, which checks and seals all of them and inserts them in one
transaction committed once (one multi-row ``INSERT`` that SQLite commits on its
own; ``BEGIN IMMEDIATE`` ... ``COMMIT`` around a batch too big for one
statement, and around a redo); the callers are resolved after the commit.
Requests that arrive meanwhile form the next batch, queued behind it in the
thread (at most two batches in flight). So many concurrent appenders share one
transaction and one fsync (group commit), each call returns only once its own
events are durable, and a request that fails its checks (wrong expected
version, bad payload) fails alone without touching the others. The writer
thread owns a plain ``sqlite3`` connection: one thread hop per batch instead of
one per statement.

The writer keeps the log's last position and each stream's head (version,
hash) in memory, as its last commit left them, and plans a batch on them
without reading the file (a stream expected to be new is taken as new). That
is optimistic, and the constraints keep it safe: if another process wrote in
between, an insert collides with a position (``PRIMARY KEY``) or a stream
version (``UNIQUE (stream, version)``) it took, and the batch is rolled back
and redone from the file. Idempotent retries are found the same way, by the
``UNIQUE`` constraint on ``event_id``: the redo looks every id up. A request
whose expected version differs from the cached head re-reads that head
before it fails, and is looked up too, since a retry must return the stored
events whatever its expected version says.

Positions are assigned by the writer as ``MAX(position) + 1`` (planned from its
last commit, taken under the write lock the insert holds: a position another
process took collides, and the redo reads ``MAX(position)`` afresh under
``BEGIN IMMEDIATE``), so they are gap-free and in commit order; readers in this
or any other process see a prefix of the log, which is what makes ``subscribe``
gap-free.

Reads go through ``aiosqlite`` (one hop per query) and decode in the event
loop with ``decode_stored``.

Durability is the ``synchronous`` option of ``open``: ``FULL`` (the default)
fsyncs the WAL on every commit, so an appended event survives power loss;
``NORMAL`` survives a crash of the process but may lose the last commits on
power loss; ``OFF`` leaves it to the OS.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import itertools
import os
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

import aiosqlite

from cardbus.eventstore.audit import LogAudit, StoredRow, audit, audit_stream
from cardbus.eventstore.batch import check_append_args, check_replay, seal_batch
from cardbus.eventstore.envelope import (
    DEFAULT_MAX_EVENT_BYTES,
    GENESIS_HASH,
    ChainProblem,
    Envelope,
    NewEvent,
    decode_stored,
)
from cardbus.eventstore.errors import (
    CardbusError,
    PrerequisiteNotStored,
    StoreClosed,
    StoreError,
    StoreUnavailable,
    ValidationError,
)
from cardbus.eventstore.events import EVENT_TYPES, tag_of
from cardbus.eventstore.loghead import LOG_GENESIS, LogHead, link
from cardbus.eventstore.sqlite_follow import WalMark, backoff
from cardbus.eventstore.sqlite_heads import StreamHeads
from cardbus.eventstore.sqlite_memory import READER_CACHE_KIB, WRITER_CACHE_KIB, cache_pragmas
from cardbus.eventstore.sqlite_pages import decoded, packed
from cardbus.eventstore.store import Append, EventStore, check_after

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
    log_hash       TEXT,
    UNIQUE (stream, version)
);
CREATE INDEX IF NOT EXISTS events_by_correlation ON events (correlation_id, position);
"""
#: ``PRAGMA application_id`` of a cardbus log ("CBLG"): how a file is known for ours
APPLICATION_ID = 0x43424C47
_COLUMNS = {"position", "event_id", "stream", "version", "correlation_id", "type", "body", "hash"}

_INSERT = (
    "INSERT INTO events (position, event_id, stream, version, correlation_id, type,"
    " recorded_at, body, hash, log_hash) VALUES (?,?,?,?,?,?,?,?,?,?)"
)
_TOP = "SELECT COALESCE(MAX(position), 0) FROM events"
_LAST = (
    "SELECT position, log_hash, event_id, recorded_at FROM events ORDER BY position DESC LIMIT 1"
)
_AUDIT = (
    "SELECT position, event_id, stream, version, correlation_id, type, body, hash, log_hash"
    " FROM events"
)
_INSERT_CHUNK = 500  # rows per INSERT: 10 values each, well under SQLite's 32766 variables


@functools.lru_cache(maxsize=64)
def _insert_sql(rows: int) -> str:
    return _INSERT + ",(?,?,?,?,?,?,?,?,?,?)" * (rows - 1)


def _kind_of_file(conn: sqlite3.Connection) -> str:
    """``"cardbus"``, ``"empty"`` (no tables: a new file) or ``"foreign"``."""
    if conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID:
        return "cardbus"
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if not tables:
        return "empty"
    columns = {r[1] for r in conn.execute("PRAGMA table_info(events)")}
    # a log written before the application id was set: the events table says it is ours
    return "cardbus" if columns >= _COLUMNS else "foreign"


def _add_log_chain(conn: sqlite3.Connection) -> None:
    """Give a log written before the log chain its ``log_hash`` column, filled in."""
    columns = {r[1] for r in conn.execute("PRAGMA table_info(events)")}
    if "log_hash" in columns:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("ALTER TABLE events ADD COLUMN log_hash TEXT")
        log = LOG_GENESIS
        updates = []
        for position, h in conn.execute("SELECT position, hash FROM events ORDER BY position"):
            log = link(log, h)
            updates.append((log, position))
        conn.executemany("UPDATE events SET log_hash = ? WHERE position = ?", updates)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _not_ours(path: str) -> StoreUnavailable:
    return StoreUnavailable(f"{path!r} is an SQLite database but not a cardbus log")


_TAGS = {t: tag_of(t) for t in EVENT_TYPES}
_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
_MAX_BATCH_REQUESTS = 2000
_MAX_INFLIGHT = 2  # batches handed to the writer thread at once (a two-stage pipeline)
_MAX_CACHED_HEADS = 100_000
_IN_CHUNK = 500  # bound on "IN (?, ...)" parameters per statement
_PAGE = 2000  # events per read while a subscription catches up
# Committed envelopes kept for live subscribers in this process: at most this many,
# and only those a live subscriber has not read yet (see _remember)
_RECENT = 8192

Outcome = list[Envelope] | CardbusError


class _Call:
    """One ``append`` or ``append_many`` call: its future is done once every request it
    queued has its outcome. One future a call, not one a stream it writes: each future
    set is a callback and a turn of the loop, and a decision writes several streams."""

    __slots__ = ("future", "left")

    def __init__(self, future: asyncio.Future[None]) -> None:
        self.future = future
        self.left = 0  # requests without an outcome yet


@dataclass(slots=True)
class _Request:
    stream: str
    events: Sequence[NewEvent]
    expected_version: int
    call: _Call = field(repr=False)
    after: tuple[_Request, ...] = ()  # store only if these were (append_many's ``after``)
    stored: bool = False  # set by the writer thread once committed
    joined: bool = False  # of the same append_many as the request queued before it
    outcome: Outcome | None = None  # set in the event loop once resolved

    def resolve(self, outcome: Outcome) -> None:
        """Give the request its outcome (once); the call's future is done with the last."""
        if self.outcome is not None:
            return
        self.outcome = outcome
        call = self.call
        call.left -= 1
        if not call.left and not call.future.done():  # (done: the caller was cancelled)
            call.future.set_result(None)


class _Writer:
    """The one write connection, used only from the writer thread."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.heads = StreamHeads()  # stream -> (version, hash), packed (sqlite_heads)
        self.top = -1  # MAX(position) after our last commit; -1: unknown
        self.top_log = LOG_GENESIS  # the log hash at ``top``
        self.busy_s = 0.0  # time spent in write(): checking, sealing, inserting, committing

    @classmethod
    def connect(cls, path: str, synchronous: str, create: bool = True) -> _Writer:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA busy_timeout=10000")
            # Two processes opening a new file at once: switching it to WAL takes an
            # exclusive lock that SQLite's busy handler does not always wait for, so the
            # set-up is tried again (reading the file's kind afresh) until it works.
            deadline = time.monotonic() + 10.0
            delay = 0.02
            while True:
                try:
                    cls._set_up(conn, path, synchronous, create)
                    break
                except sqlite3.OperationalError as e:
                    busy = "locked" in str(e) or "busy" in str(e)
                    if not busy or time.monotonic() + delay > deadline:
                        raise
                    time.sleep(delay)
                    delay = min(delay * 2, 0.5)
        except BaseException:
            conn.close()
            raise
        return cls(conn)

    @staticmethod
    def _set_up(conn: sqlite3.Connection, path: str, synchronous: str, create: bool) -> None:
        kind = _kind_of_file(conn)
        if kind == "foreign":
            raise _not_ours(path)
        if kind == "empty" and not create:
            raise StoreUnavailable(f"{path!r} is not a cardbus log: it holds no tables")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        for pragma in cache_pragmas(WRITER_CACHE_KIB):  # what it reads again (sqlite_memory)
            conn.execute(pragma)
        if kind == "empty":
            conn.executescript(_SCHEMA)
            conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
        else:
            conn.executescript(_SCHEMA)  # the index, should it be missing
            _add_log_chain(conn)

    def _read_top(self) -> int:
        row = self.conn.execute(_LAST).fetchone()
        if row is None:
            self.top_log = LOG_GENESIS
            return 0
        self.top_log = row[1] or LOG_GENESIS
        return int(row[0])

    def close(self) -> None:
        self.conn.close()

    def write(self, batch: list[_Request], max_bytes: int) -> tuple[list[Outcome | None], int, int]:
        """Check, seal and insert a batch in one transaction.

        Returns one outcome per request (``None``: an id it carries is also in
        an earlier request of this batch; queue it again), the log's last
        position after the commit and the number of events written.
        """
        started = time.perf_counter()
        try:
            return self._write(batch, max_bytes)
        finally:
            self.busy_s += time.perf_counter() - started

    def _write(
        self, batch: list[_Request], max_bytes: int
    ) -> tuple[list[Outcome | None], int, int]:
        try:
            # Optimistic: planned outside any transaction on the log's end and the
            # streams' heads as our last commit left them, and written by one INSERT
            # that SQLite commits on its own (autocommit: atomic, and fsync'd as any
            # commit is). If another process wrote since our last commit, the INSERT
            # collides with a position or a (stream, version) it took, as a retry's
            # ids collide with the stored ones (UNIQUE event_id): the statement is
            # undone whole, and the batch redone from the file under the write lock.
            # One statement is one release of the GIL and one retake; BEGIN, INSERT
            # and COMMIT were three, and each retake by the writer waits while the
            # event loop runs Python (up to the switch interval, 5 ms).
            top = self.top if self.top >= 0 else self._read_top()
            outcomes, rows, heads = self._plan(batch, top, max_bytes, careful=False)
            try:
                if len(rows) > _INSERT_CHUNK:
                    self._in_transaction(rows)  # more than one statement takes
                elif rows:
                    self._insert(rows)
            except sqlite3.IntegrityError:
                top, (outcomes, rows, heads) = self._redo(batch, max_bytes)
            for r, outcome in zip(batch, outcomes, strict=True):
                r.stored = isinstance(outcome, list)
        except BaseException:
            self.heads.clear()
            self.top = -1
            raise
        if len(self.heads) + len(heads) > _MAX_CACHED_HEADS:
            self.heads.clear()
        self.heads.update(heads)
        self.top = top + len(rows)
        if rows:
            self.top_log = rows[-1][-1]
        return outcomes, self.top, len(rows)

    def _redo(
        self, batch: list[_Request], max_bytes: int
    ) -> tuple[int, tuple[list[Outcome | None], list[tuple[Any, ...]], dict[str, tuple[int, str]]]]:
        """An id is already stored (a retry after a lost reply) or another process
        wrote: the batch planned again from the file, every id looked up, and written,
        all under the write lock (``BEGIN IMMEDIATE``)."""
        self._begin()
        try:
            self.heads.clear()
            top = self._read_top()
            planned = self._plan(batch, top, max_bytes, careful=True)
            self._insert(planned[1])
            self.conn.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        return top, planned

    def _in_transaction(self, rows: list[tuple[Any, ...]]) -> None:
        self._begin()
        try:
            self._insert(rows)
            self.conn.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise

    def _begin(self) -> None:
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            raise StoreUnavailable(f"cannot write: {e}") from e

    def _rollback(self) -> None:
        try:
            self.conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass

    def _insert(self, rows: list[tuple[Any, ...]]) -> None:
        # One multi-row INSERT per chunk, not executemany: executemany gives up and
        # retakes the GIL around every row, and while the event loop is busy each
        # retake waits; one statement waits once.
        for i in range(0, len(rows), _INSERT_CHUNK):
            chunk = rows[i : i + _INSERT_CHUNK]
            self.conn.execute(_insert_sql(len(chunk)), [v for row in chunk for v in row])

    def _plan(
        self, batch: list[_Request], top: int, max_bytes: int, careful: bool
    ) -> tuple[list[Outcome | None], list[tuple[Any, ...]], dict[str, tuple[int, str]]]:
        cached = self.heads
        heads: dict[str, tuple[int, str]] = {}  # written by this batch
        stored = self._lookup([e.event_id for r in batch for e in r.events]) if careful else {}
        outcomes: list[Outcome | None] = []
        rows: list[tuple[Any, ...]] = []
        claimed: set[str] = set()
        # a stream expected to be new is taken as new (the UNIQUE constraint on
        # (stream, version) catches it if not); others are looked up
        missing = {
            r.stream for r in batch if r.stream not in cached and (careful or r.expected_version)
        }
        for r in batch:
            if r.stream not in cached and r.stream not in missing:
                cached[r.stream] = (0, GENESIS_HASH)
        if missing:
            found = self._heads(list(missing))
            for stream in missing:
                cached[stream] = found.get(stream, (0, GENESIS_HASH))
        position = top
        log = self.top_log  # the log chain goes on from the last stored event
        planned: dict[int, Outcome | None] = {}  # id(request) -> its outcome in this batch
        for r in batch:
            ids = [e.event_id for e in r.events]
            stream = r.stream
            if r.after:
                before = [p.stored or planned.get(id(p), False) for p in r.after]
                if any(b is None for b in before):  # a prerequisite is queued again: so is it
                    outcomes.append(planned.setdefault(id(r), None))
                    continue
                if not all(b is True or isinstance(b, list) for b in before):
                    error = PrerequisiteNotStored(f"{stream}: what it follows was not stored")
                    outcomes.append(planned.setdefault(id(r), error))
                    continue
            try:
                if careful and any(i in stored for i in ids):
                    old = [stored[i] for i in ids if i in stored]
                    check_replay(old, r.events, stream)
                    outcomes.append(planned.setdefault(id(r), old))
                    continue
                if not claimed.isdisjoint(ids):  # the same ids twice in one batch
                    outcomes.append(planned.setdefault(id(r), None))
                    continue
                head = heads.get(stream) or cached[stream]
                if r.expected_version != head[0] and not careful and stream not in heads:
                    # our cached head may be stale (another process wrote): the file decides
                    head = cached[stream] = self._heads([stream]).get(stream, (0, GENESIS_HASH))
                if r.expected_version != head[0] and not careful:
                    old = list(self._lookup(ids).values())
                    if old:  # a retry with a stale expected version
                        old = sorted(old, key=lambda e: ids.index(e.event_id))
                        check_replay(old, r.events, stream)
                        outcomes.append(planned.setdefault(id(r), old))
                        continue
                sealed = seal_batch(
                    stream, r.events, r.expected_version, head[0], head[1], max_bytes, position + 1
                )
            except CardbusError as e:
                outcomes.append(planned.setdefault(id(r), e))
                continue
            envs: list[Envelope] = []
            for env, body in sealed:
                h = env.hash
                log = link(log, h)
                rows.append(
                    (
                        env.position,
                        env.event_id,
                        stream,
                        env.version,
                        env.correlation_id,
                        _TAGS[type(env.data)],
                        env.recorded_at,
                        body,
                        h,
                        log,
                    )
                )
                envs.append(env)
            position += len(envs)
            claimed.update(ids)
            heads[stream] = (env.version, h)  # the last one's
            outcomes.append(planned.setdefault(id(r), envs))
        return outcomes, rows, heads

    def _heads(self, streams: list[str]) -> dict[str, tuple[int, str]]:
        """(version, hash) of the last event of each stream that has one."""
        found: dict[str, tuple[int, str]] = {}
        for i in range(0, len(streams), _IN_CHUNK):
            chunk = streams[i : i + _IN_CHUNK]
            marks = ",".join("?" * len(chunk))
            # SQLite returns the bare column (hash) from the row that has the MAX. The
            # rows as one, one step of the statement (see sqlite_pages): names and hashes
            # in hex, so that no character of theirs is taken for a separator
            sql = (
                "SELECT count(*), group_concat(hex(stream)), group_concat(v),"
                " group_concat(hex(hash)) FROM (SELECT stream, MAX(version) AS v, hash"
                f" FROM events WHERE stream IN ({marks}) GROUP BY stream)"
            )
            count, streams_hex, versions, hashes_hex = self.conn.execute(sql, chunk).fetchone()
            if count:
                for stream_hex, version, hash_hex in zip(
                    streams_hex.split(","), versions.split(","), hashes_hex.split(","), strict=True
                ):
                    found[bytes.fromhex(stream_hex).decode()] = (
                        int(version),
                        bytes.fromhex(hash_hex).decode(),
                    )
        return found

    def _lookup(self, ids: list[str]) -> dict[str, Envelope]:
        found: dict[str, Envelope] = {}
        for i in range(0, len(ids), _IN_CHUNK):
            chunk = ids[i : i + _IN_CHUNK]
            marks = ",".join("?" * len(chunk))
            sql = f"SELECT position, body, hash FROM events WHERE event_id IN ({marks})"
            for env in decode_stored(self.conn.execute(sql, chunk).fetchall()):
                found[env.event_id] = env
        return found


def _back_on(
    loop: asyncio.AbstractEventLoop,
    finished: Callable[[list[_Request], concurrent.futures.Future[Any]], None],
    batch: list[_Request],
    done: concurrent.futures.Future[Any],
) -> None:
    """In the writer thread, a batch written: its outcome goes to the event loop."""
    try:
        loop.call_soon_threadsafe(finished, batch, done)
    except RuntimeError:  # the loop is closed: nobody is left to tell
        pass


def _expire(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)


def _wake(waiters: list[asyncio.Future[bool]]) -> None:
    """Tell the live subscribers waiting for a commit that one was made."""
    for w in waiters:
        if not w.done():
            w.set_result(True)


class SqliteEventStore(EventStore):
    """Open with ``await SqliteEventStore.open(path)``; close with ``await store.close()``."""

    def __init__(
        self,
        writer: _Writer,
        executor: ThreadPoolExecutor,
        reader: aiosqlite.Connection,
        path: str,
        max_event_bytes: int,
        poll_interval: float,
    ) -> None:
        self.path = path
        self._wal = WalMark(path)
        self.max_event_bytes = max_event_bytes
        self.poll_interval = poll_interval
        self.commits = 0  # write transactions committed: group commit makes this < appends
        self._writer = writer
        self._executor = executor
        self._reader = reader
        self._queue: list[_Request] = []
        self._inflight = 0  # batches handed to the writer thread, not yet resolved
        self._kick_scheduled = False
        self._idle: asyncio.Event = asyncio.Event()
        self._idle.set()
        # live subscribers waiting for this store's next commit (True) or a timer (False)
        self._commit_waiters: list[asyncio.Future[bool]] = []
        self._last_committed = 0
        self._recent: collections.deque[Envelope] = collections.deque(maxlen=_RECENT)
        # each live subscription's next position (a lower bound: updated once per page)
        self._live: dict[int, int] = {}
        self._subscriptions = itertools.count()
        self._closed = False

    @property
    def writer_busy_s(self) -> float:
        """Seconds the writer thread has spent writing (checking, sealing, inserting and
        committing batches): over a wall time, how busy the one writer was."""
        return self._writer.busy_s

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

        ``synchronous`` is SQLite's pragma: ``FULL`` (default) makes every
        commit durable against power loss; ``NORMAL`` survives process crashes
        only and is faster; ``OFF`` leaves flushing to the OS. ``poll_interval``
        is how often a subscription looks for events appended by *other*
        processes (its own store's appends wake it at once): a read of the wal-index
        header, the log read when it changed; the interval doubles while nothing
        changes, up to 20 of them (``eventstore.sqlite_follow``).
        """
        path = os.fspath(path)
        mode = str(synchronous).upper()
        if mode not in _SYNCHRONOUS:
            raise ValidationError(f"synchronous must be one of {_SYNCHRONOUS}: {synchronous!r}")
        if path == ":memory:" or path.startswith("file::memory:"):
            raise StoreUnavailable("the SQLite store needs a file; use MemoryEventStore instead")
        if not create and not os.path.exists(path):
            raise StoreUnavailable(f"no event store at {path!r}")
        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(1, thread_name_prefix="cardbus-sqlite-writer")
        reader: aiosqlite.Connection | None = None
        try:
            writer = await loop.run_in_executor(executor, _Writer.connect, path, mode, create)
            try:
                reader = await _daemon(aiosqlite.connect(path, isolation_level=None))
                await reader.execute("PRAGMA busy_timeout=10000")
                await reader.execute("PRAGMA query_only=1")
                for pragma in cache_pragmas(READER_CACHE_KIB):  # one query's pages
                    await reader.execute(pragma)
            except BaseException:
                await loop.run_in_executor(executor, writer.close)
                if reader is not None:
                    await reader.close()
                raise
        except sqlite3.Error as e:
            executor.shutdown(wait=False)
            raise StoreUnavailable(f"cannot open event store {path!r}: {e}") from e
        except BaseException:
            executor.shutdown(wait=False)
            raise
        store = cls(writer, executor, reader, path, max_event_bytes, poll_interval)
        store._last_committed = await store.last_position()
        return store

    # -- writing -------------------------------------------------------------

    async def append(
        self, stream: str, events: Sequence[NewEvent], expected_version: int
    ) -> list[Envelope]:
        check_append_args(stream, events, expected_version)
        if self._closed:
            raise StoreClosed("the event store is closed")
        loop = asyncio.get_running_loop()
        call = _Call(loop.create_future())
        call.left = 1
        r = _Request(stream, list(events), expected_version, call)
        self._queue.append(r)
        self._idle.clear()
        if not self._kick_scheduled:
            self._kick_scheduled = True
            loop.call_soon(self._kick)  # after the other ready appenders have queued too
        await call.future
        outcome = r.outcome
        if isinstance(outcome, BaseException):
            raise outcome
        return cast(list[Envelope], outcome)

    async def append_many(self, appends: Sequence[Append]) -> list[list[Envelope] | Exception]:
        # Queued together, so they share a commit; one future for the call, no task each.
        if self._closed:
            raise StoreClosed("the event store is closed")
        check_after(appends)
        loop = asyncio.get_running_loop()
        call = _Call(loop.create_future())
        results: list[_Request | Exception] = []  # per append: queued, or refused at once
        requests: list[_Request | None] = []
        for a in appends:
            after: tuple[_Request, ...] = ()
            try:
                check_append_args(a.stream, a.events, a.expected_version)
                if a.after:
                    before = [requests[j] for j in a.after]
                    if None in before:
                        raise PrerequisiteNotStored(f"{a.stream}: what it follows was refused")
                    after = tuple(r for r in before if r is not None)
            except CardbusError as e:
                results.append(e)
                requests.append(None)
                continue
            r = _Request(a.stream, list(a.events), a.expected_version, call, after=after)
            r.joined = call.left > 0
            call.left += 1
            self._queue.append(r)
            requests.append(r)
            results.append(r)
        if self._queue:
            self._idle.clear()
            if not self._kick_scheduled:
                self._kick_scheduled = True
                loop.call_soon(self._kick)
        if call.left:
            await call.future
        return [r if isinstance(r, Exception) else cast(Outcome, r.outcome) for r in results]

    def _kick(self) -> None:
        """Hand queued requests to the writer thread, keeping at most two batches in flight.

        Requests that arrive while a batch is being committed form the next
        batch at once, queued behind it in the writer thread, so the thread
        never waits for the event loop between two commits. Batches are not cut
        smaller on purpose: each commit has a fixed cost (the WAL pages it
        rewrites, the fsync), so the fewer, the better.
        """
        self._kick_scheduled = False
        loop = asyncio.get_running_loop()
        while self._queue and self._inflight < _MAX_INFLIGHT:
            n = min(len(self._queue), _MAX_BATCH_REQUESTS)
            while n < len(self._queue) and self._queue[n].joined:
                n += 1  # one append_many (one decision) is never cut: one transaction
            batch = self._queue[:n]
            del self._queue[:n]
            self._inflight += 1
            # Straight to the pool, back with one call_soon_threadsafe: run_in_executor
            # wraps the pool's future in an asyncio future, chained by two more callbacks
            # and a second hop, for every commit (issue 34, the writer's hand-off).
            done = self._executor.submit(self._writer.write, batch, self.max_event_bytes)
            done.add_done_callback(functools.partial(_back_on, loop, self._finished, batch))
        if not self._queue and not self._inflight:
            self._idle.set()

    def _finished(
        self,
        batch: list[_Request],
        done: concurrent.futures.Future[tuple[list[Outcome | None], int, int]],
    ) -> None:
        self._inflight -= 1
        try:
            outcomes, top, written = done.result()
        except BaseException as e:  # resolve every caller, whatever happened
            if isinstance(e, CardbusError):
                err: CardbusError = e
            elif isinstance(e, sqlite3.Error):
                err = StoreUnavailable(f"cannot write to {self.path!r}: {e}")
            else:
                err = StoreError(f"append failed: {e!r}")
            if err is not e:
                err.__cause__ = e
            for r in batch:
                r.resolve(err)
            self._kick()
            return
        waiters: list[asyncio.Future[bool]] = []
        if written:
            self.commits += 1
            self._remember(outcomes, top, written)
            self._last_committed = max(self._last_committed, top)
            waiters, self._commit_waiters = self._commit_waiters, []
        for r, outcome in zip(batch, outcomes, strict=True):
            if outcome is None:
                self._queue.append(r)
            else:
                r.resolve(outcome)
        if waiters:
            # The appenders first, the live subscribers two turns of the loop later. An
            # appender (the orchestrator's commit, which then sends the next card) resumes
            # one callback after its call's future is set, a subscriber one after its
            # waiter: woken at once, the follower and the memory keeper ran before the
            # commit went on, and before the agent it sent a card to began, on the
            # critical path of every step. They miss nothing: ``_last_committed`` is
            # already past what they wait for.
            loop = asyncio.get_running_loop()
            loop.call_soon(loop.call_soon, _wake, waiters)
        self._kick()

    def _remember(self, outcomes: list[Outcome | None], top: int, written: int) -> None:
        """Keep the envelopes this commit wrote, for live subscribers in this process.

        They are exactly positions ``top - written + 1 .. top``; the cache only
        ever holds a gap-free run of positions, so a subscriber served from it
        misses nothing (it reads the file for anything before the cache).
        """
        if not self._live:
            # Nobody follows this store: whatever is kept would be dropped below at once
            # (needed = top + 1), after a list and a deque walk of every event committed.
            self._recent.clear()
            return
        first = top - written + 1
        new: list[Envelope | None] = [None] * written
        for o in outcomes:
            if isinstance(o, list):
                for e in o:
                    i = e.position - first
                    if 0 <= i < written:  # not a replay's older envelopes
                        new[i] = e
        if None in new:
            self._recent.clear()
            return
        if self._recent and self._recent[-1].position + 1 != first:
            self._recent.clear()  # another process wrote in between
        self._recent.extend(cast(list[Envelope], new))  # no None left: checked above
        # What every live subscription has read is needed by none: a subscription that
        # starts later reads the file. Kept whole, the cache held the latest 8,192
        # envelopes whatever their size, about 3 KiB a run with a thousand waiting.
        needed = min(self._live.values(), default=top + 1)
        recent = self._recent
        while recent and recent[0].position < needed:
            recent.popleft()

    def _cached_from(self, position: int) -> list[Envelope]:
        """Envelopes from ``position`` on if the cache holds ``position``, else []."""
        if not self._recent or not (
            self._recent[0].position <= position <= self._recent[-1].position
        ):
            return []
        # a live subscriber wants the newest few: walk in from the right end
        wanted = self._recent[-1].position - position + 1
        return list(itertools.islice(reversed(self._recent), wanted))[::-1]

    # -- reading -------------------------------------------------------------

    async def _query(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        if self._closed:
            raise StoreClosed(f"event store {self.path!r} is closed")
        try:
            return list(await self._reader.execute_fetchall(sql, args))
        except UnicodeEncodeError:
            return []  # a name that is not valid unicode names nothing stored
        except sqlite3.Error as e:
            raise StoreUnavailable(f"cannot read {self.path!r}: {e}") from e
        except ValueError as e:  # aiosqlite: connection closed
            raise StoreUnavailable(f"cannot read {self.path!r}: {e}") from e

    async def _read_events(self, rows_sql: str, args: Sequence[Any]) -> list[Envelope]:
        """The events ``rows_sql`` selects (``position, body, hash``), read as one row of
        SQLite rather than one row an event, each of which waits for the GIL while the
        event loop is busy (``sqlite_pages``); row by row where that cannot be."""
        try:
            page = await self._query(packed(rows_sql), args)
        except StoreUnavailable as e:
            if not isinstance(e.__cause__, sqlite3.DataError):  # not "too big": a real fault
                raise
            page = []
        envelopes = decoded(page[0]) if page else None
        if envelopes is None:
            return decode_stored(await self._query(rows_sql, args))
        return envelopes

    async def read_stream(self, stream: str, from_version: int = 1) -> list[Envelope]:
        return await self._read_events(
            "SELECT position, body, hash FROM events WHERE stream = ? AND version >= ?"
            " ORDER BY version",
            (stream, from_version),
        )

    async def read_all(self, from_position: int = 0, limit: int = 1000) -> list[Envelope]:
        return await self._read_events(
            "SELECT position, body, hash FROM events WHERE position >= ? ORDER BY position LIMIT ?",
            (from_position, limit),
        )

    async def read_correlation(self, correlation_id: str) -> list[Envelope]:
        return await self._read_events(
            "SELECT position, body, hash FROM events WHERE correlation_id = ? ORDER BY position",
            (correlation_id,),
        )

    async def stream_version(self, stream: str) -> int:
        rows = await self._query("SELECT MAX(version) FROM events WHERE stream = ?", (stream,))
        return int(rows[0][0] or 0) if rows else 0

    async def last_position(self) -> int:
        rows = await self._query(_TOP)
        return int(rows[0][0])

    async def subscribe(self, from_position: int = 0) -> AsyncIterator[Envelope]:
        next_position = max(from_position, 1)
        token = next(self._subscriptions)
        self._live[token] = next_position
        wait = self.poll_interval
        try:
            while True:
                # taken before the read: a commit after it changes the header from this mark
                mark = self._wal.mark()
                # Live subscribers in this process are served what this process just
                # committed without reading it back; anything else comes from the file.
                cached = self._cached_from(next_position)
                page = cached or await self.read_all(next_position, _PAGE)
                if cached:
                    # what the file holds past our own commits was not read: another
                    # process's commit before the mark would hide behind it
                    mark = None
                for env in page:
                    yield env
                    next_position = env.position + 1
                self._live[token] = next_position
                if len(page) >= _PAGE:
                    continue
                if page:
                    wait = self.poll_interval  # events flow: look often (sqlite_follow)
                # Live: woken by our own commits, looking for other processes' commits
                # at a wait that grows while nothing changes (sqlite_follow).
                while self._last_committed < next_position and not self._closed:
                    if await self._commit_within(wait):
                        break  # our own commit
                    wait = backoff(wait, self.poll_interval)
                    # Another process's commit changes the wal-index header: while it
                    # stays as it was there is nothing to read (one pread, not a query
                    # through the reader thread).
                    if mark is None or self._wal.mark() != mark:
                        break
        finally:
            self._live.pop(token, None)  # the cache need not keep anything for it

    async def _commit_within(self, wait: float) -> bool:
        """Whether this store commits within ``wait`` seconds.

        One future and one timer handle, not ``asyncio.wait_for`` (a timeout context, a
        task-like wrapper and callbacks): a live subscriber waits once per commit."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self._commit_waiters.append(waiter)
        timer = loop.call_later(wait, _expire, waiter)
        try:
            return await waiter
        finally:
            timer.cancel()
            if not (waiter.done() and not waiter.cancelled() and waiter.result()):
                with contextlib.suppress(ValueError):
                    self._commit_waiters.remove(waiter)

    async def verify(self, stream: str | None = None) -> list[ChainProblem]:
        if stream is not None:
            rows = await self._query(_AUDIT + " WHERE stream = ? ORDER BY position", (stream,))
            return audit_stream(StoredRow(*r) for r in rows)
        problems, _ = await self.audit()
        return problems

    async def audit(self, head: LogHead | None = None) -> tuple[list[ChainProblem], LogHead]:
        rows = await self._query(_AUDIT + " ORDER BY position")
        return audit((StoredRow(*r) for r in rows), head)

    async def log_hash_at(self, position: int) -> str | None:
        rows = await self._query("SELECT log_hash FROM events WHERE position = ?", (position,))
        return rows[0][0] if rows else None

    async def head(self) -> LogHead:
        rows = await self._query(_LAST)
        if not rows:
            return LogHead(position=0, log_hash=LOG_GENESIS)
        position, log_hash, event_id, recorded_at = rows[0]
        return LogHead(
            position=position, log_hash=log_hash, event_id=event_id, recorded_at=recorded_at
        )

    @staticmethod
    async def verify_file(
        path: str | os.PathLike[str], head: LogHead | None = None
    ) -> tuple[list[ChainProblem], LogHead]:
        """Audit the log at ``path`` read-only: nothing is written, not even a schema.

        A missing file, or one that is not a cardbus log (an empty file, another
        application's database), is ``StoreUnavailable``; the problems and the
        head the log ends at otherwise.
        """
        found = await asyncio.to_thread(_verify_file, os.fspath(path), head)
        return found.problems, found.head

    @staticmethod
    async def audit_file(path: str | os.PathLike[str], head: LogHead | None = None) -> LogAudit:
        """``verify_file``, saying whether the log keeps a log chain: an older log
        (written before cardbus kept one, and not opened by a writer since) has
        only its stream chains checked (``LogAudit.log_chain`` False)."""
        return await asyncio.to_thread(_verify_file, os.fspath(path), head)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._idle.wait()
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._writer.close)
        finally:
            self._executor.shutdown(wait=True)
            self._wal.close()
            await self._reader.close()


def _verify_file(path: str, head: LogHead | None) -> LogAudit:
    if not os.path.isfile(path):
        raise StoreUnavailable(f"no event store at {path!r}")
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout=10000")  # a writer in another process: wait
    except sqlite3.Error as e:
        raise StoreUnavailable(f"cannot open event store {path!r}: {e}") from e
    try:
        try:
            kind = _kind_of_file(conn)
        except sqlite3.DatabaseError as e:  # not an SQLite file at all
            raise StoreUnavailable(f"{path!r} is not a cardbus log: {e}") from e
        if kind == "empty":
            raise StoreUnavailable(f"{path!r} is not a cardbus log: it holds no tables")
        if kind == "foreign":
            raise _not_ours(path)
        columns = {r[1] for r in conn.execute("PRAGMA table_info(events)")}
        sql = _AUDIT if "log_hash" in columns else _AUDIT.replace("log_hash", "NULL")
        rows = conn.execute(sql + " ORDER BY position")
        chained = "log_hash" in columns
        return LogAudit(*audit((StoredRow(*r) for r in rows), head, log_chain=chained), chained)
    except sqlite3.Error as e:
        raise StoreUnavailable(f"cannot read {path!r}: {e}") from e
    finally:
        conn.close()


def _daemon(connection: aiosqlite.Connection) -> aiosqlite.Connection:
    """The reader's thread as a daemon: a store never closed (an exception in the
    caller's code) must not keep the process from exiting. It only reads; the
    writer's pool is joined at exit after the writes it was given."""
    thread = getattr(connection, "_thread", connection)  # aiosqlite < 0.20: a Thread itself
    if isinstance(thread, threading.Thread) and not thread.is_alive():
        thread.daemon = True
    return connection
