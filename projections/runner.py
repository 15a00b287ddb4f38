"""The runner: keeps projections' read models current from an ``EventStore``.

Where the read models live: in their own SQLite file, by default the event
database's path plus ``.proj`` (``cardbus.db`` -> ``cardbus.db.proj``; see
:func:`projection_path`), in tables prefixed ``proj_``, with one row per
projection in ``proj_checkpoints`` (name, position, version). A sibling file
rather than the events file, so a projection's write transactions never hold
the event log's write lock, the read model can be deleted at will (it is
rebuilt from the log on the next run), and the same file works whatever the
event store is (SQLite, in-memory, NATS). ``":memory:"`` gives a throw-away
model, which is how time travel works.

Exactly once: each batch of events is folded into the cached rows, then the
changed rows and the new checkpoint are written in one ``BEGIN IMMEDIATE``
transaction. A crash before ``COMMIT`` loses the batch and its checkpoint
together, so the next run folds the same events again from the old
checkpoint; no event is applied twice and none is skipped. At the start of
each batch the checkpoints are read again under the write lock, so two
runners (say two CLI processes) sharing one file never apply an event twice
either: the slower one notices, drops its cache and continues from there.

Never served stale: each checkpoint keeps the hash of the last event folded.
Before its first catch-up a runner reads the event at each checkpoint; a
checkpoint beyond the log's end (the log's tail was cut) or at an event with
another hash (the log was replaced or rewritten) has its projections rebuilt
from the log, and the runner says so once in :attr:`ProjectionRunner.notices`
(the CLI prints it as one line).
"""

from __future__ import annotations

import asyncio
import gc
import os
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from cardbus.eventstore.envelope import Envelope
from cardbus.eventstore.errors import ConfigError
from cardbus.eventstore.store import EventStore
from cardbus.projections.base import Projection
from cardbus.projections.model import Model

__all__ = ["ProjectionRunner", "ProjectionError", "dump_tables", "projection_path"]

_CHECKPOINTS = (
    "CREATE TABLE IF NOT EXISTS proj_checkpoints ("
    " name TEXT PRIMARY KEY, position INTEGER NOT NULL, version INTEGER NOT NULL,"
    " last_hash TEXT NOT NULL DEFAULT '')"
)


def projection_path(event_db: str | os.PathLike[str]) -> str:
    """The default read-model file beside an SQLite event database."""
    return os.fspath(event_db) + ".proj"


class ProjectionError:
    """An event a projection's fold raised on; it was skipped and recorded here."""

    def __init__(self, projection: str, position: int, event_id: str, error: str) -> None:
        self.projection = projection
        self.position = position
        self.event_id = event_id
        self.error = error

    def __repr__(self) -> str:
        return f"ProjectionError({self.projection!r}, {self.position}, {self.error!r})"


class ProjectionRunner:
    """Catch up from each projection's checkpoint, then (optionally) follow the live log.

    Open with :meth:`open` (a file path or ``":memory:"``), then ``await
    runner.catch_up()`` to fold everything stored, or run ``await
    runner.follow()`` in a task to keep up with new events until cancelled.
    Read the models with the projections' query methods on ``runner.conn``.
    """

    def __init__(
        self,
        store: EventStore,
        conn: sqlite3.Connection,
        projections: Sequence[Projection],
        *,
        batch_size: int = 5000,
        max_cached_rows: int = 200_000,
    ) -> None:
        if not projections:
            raise ConfigError("a runner needs at least one projection")
        names = [p.name for p in projections]
        if len(set(names)) != len(names):
            raise ConfigError(f"duplicate projection names: {names}")
        self.store = store
        self.conn = conn
        self.projections = list(projections)
        self.batch_size = batch_size
        self.max_cached_rows = max_cached_rows
        self.errors: list[ProjectionError] = []
        self._models = {p.name: Model.in_sqlite(conn, p.tables) for p in self.projections}
        self._checkpoints: dict[str, int] = {}
        self._advanced = asyncio.Condition()
        self.notices: list[str] = []  # read models found stale and rebuilt (one line each)
        self._checked = False  # the checkpoints were checked against the log
        self._init_schema()

    @classmethod
    def open(
        cls,
        store: EventStore,
        path: str | os.PathLike[str] = ":memory:",
        projections: Sequence[Projection] | None = None,
        **options: Any,
    ) -> ProjectionRunner:
        """A runner over a read-model file (created if needed) or ``":memory:"``."""
        from cardbus.projections import all_projections

        path = os.fspath(path)
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout=10000")
        if path != ":memory:":
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")  # the model is rebuildable from the log
        conn.execute("PRAGMA cache_size=-65536")  # 64 MiB: rebuilds touch the whole table
        return cls(store, conn, projections or all_projections(), **options)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> ProjectionRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- schema and checkpoints ------------------------------------------------

    def _init_schema(self) -> None:
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            c.execute(_CHECKPOINTS)
            columns = {row[1] for row in c.execute("PRAGMA table_info(proj_checkpoints)")}
            if "last_hash" not in columns:  # a file from before the hashes: unknown
                c.execute(
                    "ALTER TABLE proj_checkpoints ADD COLUMN last_hash TEXT NOT NULL DEFAULT ''"
                )
            stored = {
                n: (pos, ver)
                for n, pos, ver in c.execute("SELECT name, position, version FROM proj_checkpoints")
            }
            for p in self.projections:
                if p.name in stored and stored[p.name][1] != p.version:
                    self._drop(p)  # written by another version of the fold: rebuild
                    stored.pop(p.name)
                for spec in p.tables:
                    for sql in spec.ddl():
                        c.execute(sql)
                if p.name not in stored:
                    c.execute(
                        "INSERT OR REPLACE INTO proj_checkpoints VALUES (?, 0, ?, '')",
                        (p.name, p.version),
                    )
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise
        self._checkpoints = self._read_checkpoints()
        for p in self.projections:
            if self._checkpoints[p.name] == 0:
                self._models[p.name].mark_empty()

    def _drop(self, p: Projection) -> None:
        for spec in p.tables:
            self.conn.execute(f"DROP TABLE IF EXISTS {spec.name}")
        self.conn.execute("DELETE FROM proj_checkpoints WHERE name = ?", (p.name,))

    def _read_checkpoints(self) -> dict[str, int]:
        mine = {p.name for p in self.projections}
        return {
            n: pos
            for n, pos in self.conn.execute("SELECT name, position FROM proj_checkpoints")
            if n in mine
        }

    def checkpoint(self, name: str) -> int:
        """The position up to which projection ``name`` has folded the log."""
        return self._checkpoints[name]

    @property
    def position(self) -> int:
        """The position every projection of this runner has reached."""
        return min(self._checkpoints.values())

    def projection(self, name: str) -> Projection:
        for p in self.projections:
            if p.name == name:
                return p
        known = ", ".join(p.name for p in self.projections)
        raise ConfigError(f"no projection named {name!r} (known: {known})")

    # -- folding ---------------------------------------------------------------

    async def catch_up(
        self, *, until_position: int | None = None, until_time: float | None = None
    ) -> int:
        """Fold every stored event not folded yet; return the position reached.

        ``until_position`` stops after that position; ``until_time`` folds only
        events recorded at or before that unix time (both are for time travel,
        on a throw-away model).
        """
        if not self._checked:
            self._checked = True
            await self._check_against_log()
        next_position = self.position + 1
        gc_paused = False
        try:
            while until_position is None or next_position <= until_position:
                page = await self.store.read_all(next_position, self.batch_size)
                full = len(page) == self.batch_size
                if full and not gc_paused and gc.isenabled():
                    # A long catch-up (a rebuild) allocates millions of short-lived
                    # envelopes: the cyclic collector only slows it down.
                    gc.disable()
                    gc_paused = True
                if until_position is not None and page and page[-1].position >= until_position:
                    page = [e for e in page if e.position <= until_position]
                    full = False
                if not page:
                    break
                self.apply_batch(page, until_time=until_time)
                next_position = page[-1].position + 1
                if not full:
                    break
                await asyncio.sleep(0)  # let other tasks run during a long rebuild
        finally:
            if gc_paused:
                gc.enable()
        return self.position

    async def _check_against_log(self) -> None:
        """Rebuild the projections whose checkpoint the log no longer reaches, or reaches
        at another event (a cut tail, a replaced log); each such finding is one notice."""
        rows = {
            n: (pos, h)
            for n, pos, h in self.conn.execute(
                "SELECT name, position, last_hash FROM proj_checkpoints"
            )
        }
        at: dict[int, Envelope | None] = {}
        stale: dict[str, str] = {}
        end: int | None = None
        for p in self.projections:
            pos, kept = rows.get(p.name, (0, ""))
            if pos <= 0:
                continue
            if pos not in at:
                page = await self.store.read_all(pos, 1)
                at[pos] = page[0] if page and page[0].position == pos else None
            env = at[pos]
            if env is None:
                if end is None:
                    end = (await self.store.head()).position
                if end < pos:
                    stale[p.name] = (
                        f"its checkpoint (position {pos}) lies beyond the log's end ({end})"
                    )
            elif kept and env.hash != kept:
                stale[p.name] = (
                    f"the log's event at its checkpoint (position {pos}) is not the one it folded"
                )
        if not stale:
            return
        names = sorted(stale)
        self.notices.append(
            f"read model was stale ({stale[names[0]]}): rebuilt from the log ({', '.join(names)})"
        )
        await self.rebuild(names)

    async def follow(self) -> None:
        """Catch up, then fold new events as they are appended, until cancelled."""
        await self.catch_up()
        queue: asyncio.Queue[Envelope] = asyncio.Queue(maxsize=self.batch_size * 2)

        async def pump() -> None:
            events = self.store.subscribe(self.position + 1)
            try:
                async for env in events:
                    await queue.put(env)
            finally:
                await events.aclose()  # type: ignore[attr-defined]

        pump_task = asyncio.create_task(pump(), name="cardbus-projection-pump")
        try:
            while True:
                get = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait({get, pump_task}, return_when=asyncio.FIRST_COMPLETED)
                if get not in done:
                    get.cancel()
                    pump_task.result()  # the subscription ended: raise its error
                    return
                batch = [get.result()]
                while len(batch) < self.batch_size and not queue.empty():
                    batch.append(queue.get_nowait())
                self.apply_batch(batch)
        finally:
            pump_task.cancel()
            try:
                await pump_task
            except (asyncio.CancelledError, Exception):
                pass

    async def wait_for(self, position: int, timeout: float | None = None) -> None:
        """Wait until every projection has folded the log up to ``position``."""

        async def reached() -> None:
            async with self._advanced:
                await self._advanced.wait_for(lambda: self.position >= position)

        await asyncio.wait_for(reached(), timeout)

    def apply_batch(self, events: Iterable[Envelope], *, until_time: float | None = None) -> None:
        """Fold ``events`` (in position order) and commit rows plus checkpoints at once."""
        events = list(events)
        if not events:
            return
        conn = self.conn
        # The fold allocates many long-lived rows; the cyclic GC would rescan them on
        # every few thousand allocations. Nothing else runs during this synchronous
        # batch, so pause the collector for it (reference counting still frees).
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            self._apply_batch(conn, events, until_time)
        finally:
            if gc_was_enabled:
                gc.enable()
        self._notify()

    def _apply_batch(
        self, conn: sqlite3.Connection, events: list[Envelope], until_time: float | None
    ) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            stored = self._read_checkpoints()
            if stored != self._checkpoints:  # another runner moved on: our cache is stale
                for m in self._models.values():
                    m.discard()
                self._checkpoints = stored
            last = events[-1].position
            active = [
                (p, self._models[p.name], self._checkpoints[p.name])
                for p in self.projections
                if self._checkpoints[p.name] < last
            ]
            for p, model, cp in active:
                todo = events
                if cp >= events[0].position:
                    todo = [e for e in events if e.position > cp]
                if until_time is not None:
                    todo = [e for e in todo if e.recorded_at <= until_time]
                # a fold bug must not wedge the runner: the event is skipped and recorded
                for env, e in p.apply_many(model, todo):
                    self.errors.append(ProjectionError(p.name, env.position, env.event_id, repr(e)))
            for p, model, _ in active:
                model.flush()
                conn.execute(
                    "UPDATE proj_checkpoints SET position = ?, last_hash = ? WHERE name = ?",
                    (last, events[-1].hash, p.name),
                )
            conn.execute("COMMIT")
        except BaseException:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            for m in self._models.values():
                m.discard()
            self._checkpoints = self._read_checkpoints()
            raise
        for p, *_ in active:
            self._checkpoints[p.name] = last
        for m in self._models.values():
            if m.cached() > self.max_cached_rows:
                m.evict()

    def _notify(self) -> None:
        async def wake() -> None:
            async with self._advanced:
                self._advanced.notify_all()

        try:
            asyncio.get_running_loop().create_task(wake())
        except RuntimeError:  # no loop: nobody can be waiting
            pass

    async def rebuild(self, names: Sequence[str] | None = None) -> int:
        """Drop the named projections' models (all by default) and fold the log from zero."""
        chosen = [self.projection(n) for n in names] if names else self.projections
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            for p in chosen:
                self._drop(p)
                for spec in p.tables:
                    for sql in spec.ddl(indexes=False):
                        c.execute(sql)
                c.execute("INSERT INTO proj_checkpoints VALUES (?, 0, ?, '')", (p.name, p.version))
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise
        for p in chosen:
            self._models[p.name].discard()
            self._models[p.name].mark_empty()
        self._checkpoints = self._read_checkpoints()
        # A rebuild can always be redone from the log: skip the fsyncs while it runs
        # (a process crash still loses nothing committed; only a power loss could).
        (mode,) = c.execute("PRAGMA synchronous").fetchone()
        c.execute("PRAGMA synchronous=OFF")
        try:
            return await self.catch_up()
        finally:
            c.execute(f"PRAGMA synchronous={int(mode)}")
            for p in chosen:  # secondary indexes last: one sort instead of a write per row
                for spec in p.tables:
                    for sql in spec.index_ddl():
                        c.execute(sql)


def dump_tables(
    conn: sqlite3.Connection, projections: Sequence[Projection]
) -> dict[str, list[Any]]:
    """Every row of the projections' tables, sorted: equal dumps mean equal models."""
    out: dict[str, list[Any]] = {}
    for p in projections:
        for spec in p.tables:
            rows = conn.execute(f"SELECT * FROM {spec.name}").fetchall()
            out[spec.name] = sorted(rows, key=repr)
    return out
