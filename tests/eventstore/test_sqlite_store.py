"""What only the SQLite backend promises: a real file, other connections, group commit."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from cardbus.eventstore import (
    Append,
    ConcurrencyError,
    ConfigError,
    Envelope,
    NewEvent,
    SqliteEventStore,
    StoreUnavailable,
    ValidationError,
    open_store,
)
from cardbus.eventstore import events as ev


def created(root: str = "root") -> NewEvent:
    return NewEvent(data=ev.TaskCreated(root_id=root, capability="echo"), correlation_id=root)


def started(attempt: int = 1) -> NewEvent:
    return NewEvent(data=ev.TaskStarted(attempt=attempt, agent_id="a"), correlation_id="root")


@contextlib.asynccontextmanager
async def opened(path: Path, **options: Any) -> AsyncIterator[SqliteEventStore]:
    store = await SqliteEventStore.open(path, **options)
    try:
        yield store
    finally:
        await store.close()


async def test_events_survive_close_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    async with opened(path) as store:
        first = await store.append("t1", [created(), started()], 0)
        first += await store.append("t2", [created()], 0)
    assert path.exists()
    async with opened(path, create=False) as store:
        assert await store.read_all() == first
        assert await store.stream_version("t1") == 2
        assert await store.last_position() == 3
        [more] = await store.append("t1", [started(2)], 2)
        assert (more.version, more.position, more.prev_hash) == (3, 4, first[1].hash)
        with pytest.raises(ConcurrencyError):
            await store.append("t2", [started()], 0)
        assert await store.verify() == []


async def test_retry_after_reopen_returns_original(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    batch = [created(), started()]
    async with opened(path) as store:
        original = await store.append("t1", batch, 0)
    async with opened(path) as store:
        assert await store.append("t1", batch, 0) == original
        assert await store.append("t1", batch, 2) == original
        assert await store.last_position() == 2


async def test_open_refuses_what_it_cannot_use(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailable):
        await SqliteEventStore.open(tmp_path / "missing.db", create=False)
    with pytest.raises(StoreUnavailable):
        await SqliteEventStore.open(tmp_path / "no-such-dir" / "x.db")
    with pytest.raises(StoreUnavailable):
        await SqliteEventStore.open(":memory:")
    with pytest.raises(ValidationError):
        await SqliteEventStore.open(tmp_path / "x.db", synchronous="FULL; DROP TABLE events")
    not_a_db = tmp_path / "junk.db"
    not_a_db.write_bytes(b"this is not an sqlite file" * 100)
    with pytest.raises(StoreUnavailable):
        await SqliteEventStore.open(not_a_db)


@pytest.mark.parametrize("mode", ["OFF", "NORMAL", "FULL", "EXTRA", "normal"])
async def test_synchronous_modes(tmp_path: Path, mode: str) -> None:
    async with opened(tmp_path / "log.db", synchronous=mode) as store:
        await store.append("t", [created()], 0)
        assert len(await store.read_stream("t")) == 1


async def test_open_store_by_url(tmp_path: Path) -> None:
    store = await open_store(f"sqlite:{tmp_path / 'u.db'}")
    try:
        assert isinstance(store, SqliteEventStore)
        await store.append("t", [created()], 0)
    finally:
        await store.close()
    again = await open_store(f"sqlite://{tmp_path / 'u.db'}")  # the URL form names the same file
    try:
        assert len(await again.read_stream("t")) == 1
    finally:
        await again.close()


async def test_open_store_refuses_an_unknown_scheme_by_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown scheme 'postgres'; known: memory:"):
        await open_store("postgres://db.example/cardbus")


async def test_closed_store_refuses_appends_and_reads(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "log.db")
    await store.append("t", [created()], 0)
    await store.close()
    await store.close()  # twice is fine
    with pytest.raises(StoreUnavailable):
        await store.append("t", [started()], 1)
    with pytest.raises(StoreUnavailable):
        await store.read_all()


async def test_close_waits_for_queued_appends(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    store = await SqliteEventStore.open(path)
    pending = [asyncio.ensure_future(store.append(f"t{i}", [created()], 0)) for i in range(50)]
    await asyncio.sleep(0)
    await store.close()
    results = await asyncio.gather(*pending, return_exceptions=True)
    stored = [r for r in results if isinstance(r, list)]
    async with opened(path) as again:
        assert await again.last_position() == len(stored) == 50


# -- other connections -----------------------------------------------------------


async def test_subscriber_sees_events_appended_by_another_connection(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    async with opened(path) as writer, opened(path, poll_interval=0.01) as reader:
        await writer.append("t1", [created()], 0)
        seen: list[Envelope] = []

        async def follow() -> None:
            async with contextlib.aclosing(reader.subscribe()) as it:  # type: ignore[type-var]
                async for env in it:
                    seen.append(env)
                    if len(seen) == 41:
                        return

        task = asyncio.ensure_future(follow())
        for i in range(20):
            await writer.append(f"s{i}", [created(), started()], 0)
        await asyncio.wait_for(task, 10)
        assert [e.position for e in seen] == list(range(1, 42))
        assert seen == await writer.read_all()


async def test_two_connections_appending_keep_versions_and_chains(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    async with opened(path) as a, opened(path) as b:
        await a.append("t", [created()], 0)
        await b.append("t", [started(1)], 1)  # b never saw t: reads its head
        await a.append("t", [started(2)], 2)  # a's cached head (version 1) is stale
        with pytest.raises(ConcurrencyError) as info:
            await b.append("t", [started(3)], 2)
        assert info.value.actual == 3
        await asyncio.gather(
            *(a.append(f"x{i}", [created()], 0) for i in range(30)),
            *(b.append(f"y{i}", [created()], 0) for i in range(30)),
        )
        log = await a.read_all(0, 1000)
        assert [e.position for e in log] == list(range(1, 64))
        assert [e.version for e in await b.read_stream("t")] == [1, 2, 3]
        assert await a.verify() == []


async def test_stale_caches_across_connections_are_caught(tmp_path: Path) -> None:
    """Each writer plans on its cached log end and heads: the constraints catch stale ones."""
    path = tmp_path / "log.db"
    async with opened(path) as a, opened(path) as b:
        await a.append("first", [created()], 0)  # a caches position 1
        await b.append("new", [created(), started()], 0)  # b takes positions 2, 3
        with pytest.raises(ConcurrencyError) as info:  # a takes "new" for new: it is not
            await a.append("new", [created()], 0)
        assert (info.value.expected, info.value.actual) == (0, 2)
        [env] = await a.append("other", [created()], 0)  # a's cached end (1) is stale
        assert env.position == 4
        assert [e.position for e in await b.read_all(0, 100)] == [1, 2, 3, 4]
        assert await b.verify() == []


@pytest.mark.parametrize("size", [3, 700])  # one INSERT (autocommit), or a transaction
async def test_a_batch_planned_on_a_stale_end_is_redone_whole(tmp_path: Path, size: int) -> None:
    """The writer plans outside any transaction: a batch whose planned positions another
    process took meanwhile is undone whole and redone from the file, gap-free."""
    path = tmp_path / "log.db"
    async with opened(path) as a, opened(path) as b:
        await a.append("first", [created()], 0)  # a caches the log's end: position 1
        await b.append("theirs", [created(), started()], 0)  # b takes positions 2, 3
        out = await asyncio.gather(*(a.append(f"s{i}", [created()], 0) for i in range(size)))
        assert sorted(e.position for [e] in out) == list(range(4, 4 + size))
        log = await b.read_all(0, 1000)
        assert [e.position for e in log] == list(range(1, 4 + size))
        assert await b.verify() == []
        assert (await b.audit())[0] == []  # the log chain too


ODD_NAMES = ['a"b', "back\\slash", "com,ma", "line\nbreak", "ünï ☃ 🚀", '["json"]', "\u2028"]


async def test_heads_looked_up_after_another_process_wrote_keep_every_stream_name(
    tmp_path: Path,
) -> None:
    """Another process's write makes a writer forget its streams' heads and look them up
    in the file (one JSON array for many streams): names of any kind come back whole."""
    path = tmp_path / "log.db"
    names = ODD_NAMES + [f"s{i}" for i in range(600)]  # more than one IN (...) chunk
    async with opened(path) as a, opened(path) as b:
        await asyncio.gather(*(a.append(n, [created()], 0) for n in names))
        await b.append("theirs", [created()], 0)
        await a.append("mine", [created()], 0)  # redone from the file: a's heads forgotten
        with pytest.raises(ConcurrencyError) as info:
            await a.append(ODD_NAMES[0], [started(1)], 0)
        assert info.value.actual == 1
        out = await asyncio.gather(*(a.append(n, [started(1)], 1) for n in names))
        assert [[(e.stream, e.version) for e in envs] for envs in out] == [[(n, 2)] for n in names]
        assert await b.verify() == []
        assert [e.stream for e in await b.read_stream(ODD_NAMES[4])] == [ODD_NAMES[4]] * 2


async def test_contention_across_connections_exactly_one_wins(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    async with opened(path) as a, opened(path) as b:
        await a.append("t", [created()], 0)
        await b.stream_version("t")
        results = await asyncio.gather(
            a.append("t", [started(1)], 1), b.append("t", [started(2)], 1), return_exceptions=True
        )
        assert sorted(type(r).__name__ for r in results) == ["ConcurrencyError", "list"]
        assert await a.stream_version("t") == 2
        assert await a.verify() == []


# -- group commit ----------------------------------------------------------------


async def test_concurrent_appends_share_transactions(sqlite_store: SqliteEventStore) -> None:
    before = sqlite_store.commits
    await asyncio.gather(
        *(sqlite_store.append(f"t{i}", [created(), started()], 0) for i in range(300))
    )
    commits = sqlite_store.commits - before
    assert 1 <= commits < 300 / 5
    assert await sqlite_store.last_position() == 600
    assert await sqlite_store.verify() == []


async def test_the_writer_s_busy_time_is_counted_within_the_wall_time(
    sqlite_store: SqliteEventStore,
) -> None:
    loop = asyncio.get_running_loop()
    busy, t = sqlite_store.writer_busy_s, loop.time()
    for i in range(20):
        await sqlite_store.append(f"t{i}", [created()], 0)
    wall, spent = loop.time() - t, sqlite_store.writer_busy_s - busy
    assert 0 < spent < wall  # each commit is timed, and nothing beyond them
    await asyncio.sleep(0.05)
    assert sqlite_store.writer_busy_s - busy == spent  # idle: nothing counted


async def test_sequential_appends_commit_one_by_one(sqlite_store: SqliteEventStore) -> None:
    before = sqlite_store.commits
    for i in range(5):
        await sqlite_store.append(f"t{i}", [created()], 0)
    assert sqlite_store.commits - before == 5


async def test_a_failing_request_fails_alone_in_its_batch(sqlite_store: SqliteEventStore) -> None:
    await sqlite_store.append("busy", [created()], 0)
    results = await asyncio.gather(
        *(sqlite_store.append(f"ok{i}", [created()], 0) for i in range(10)),
        sqlite_store.append("busy", [started()], 0),  # wrong version
        return_exceptions=True,
    )
    assert all(isinstance(r, list) for r in results[:10])
    assert isinstance(results[10], ConcurrencyError)
    assert await sqlite_store.last_position() == 11


async def test_append_many_answers_every_append_once_all_are_settled(
    sqlite_store: SqliteEventStore,
) -> None:
    """One call, one answer: its appends settled in different batches (one queued again
    behind a same-id append of another caller) and one refused are all in it, in order."""
    await sqlite_store.append("busy", [created()], 0)
    shared = [created()]
    other, mine = await asyncio.gather(
        sqlite_store.append("t", shared, 0),
        sqlite_store.append_many(
            [
                Append("fresh", [created()], 0),
                Append("t", shared, 0),  # the same ids in the same batch: queued again
                Append("busy", [started()], 0),  # wrong version
            ]
        ),
    )
    fresh, again, refused = mine
    assert isinstance(fresh, list) and fresh[0].stream == "fresh"
    assert again == other
    assert isinstance(refused, ConcurrencyError)
    assert await sqlite_store.last_position() == 3


async def test_a_cancelled_append_many_is_still_written_and_its_batch_answered(
    sqlite_store: SqliteEventStore,
) -> None:
    cancelled = asyncio.ensure_future(
        sqlite_store.append_many([Append("a", [created()], 0), Append("b", [created()], 0)])
    )
    bystander = asyncio.ensure_future(sqlite_store.append("c", [created()], 0))
    await asyncio.sleep(0)  # both queued for the same commit
    cancelled.cancel()
    assert len(await bystander) == 1
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    # what the cancelled caller queued was written all the same (cancelling the wait
    # cancels no append), and the store goes on
    await sqlite_store.append_many([Append("a", [started()], 1), Append("b", [started()], 1)])
    assert await sqlite_store.last_position() == 5
    assert await sqlite_store.verify() == []


async def test_a_retry_inside_a_batch_of_new_events(sqlite_store: SqliteEventStore) -> None:
    """A retry whose expected version happens to be right hits the UNIQUE constraint."""
    retry = [created()]
    [original] = await sqlite_store.append("t1", retry, 0)
    await sqlite_store.append("t1", [started()], 1)
    results = await asyncio.gather(
        sqlite_store.append("t1", retry, 2),
        *(sqlite_store.append(f"n{i}", [created()], 0) for i in range(10)),
    )
    assert results[0] == [original]
    assert all(len(r) == 1 for r in results[1:])
    assert await sqlite_store.last_position() == 12
    assert await sqlite_store.verify() == []


async def test_same_ids_twice_in_one_batch(sqlite_store: SqliteEventStore) -> None:
    batch = [created()]
    a, b, _ = await asyncio.gather(
        sqlite_store.append("t", batch, 0),
        sqlite_store.append("t", batch, 0),
        sqlite_store.append("u", [created()], 0),
    )
    assert a == b
    assert await sqlite_store.last_position() == 2


async def test_read_pages_are_consistent_with_subscribe(sqlite_store: SqliteEventStore) -> None:
    # More than one subscription page of catch-up.
    for i in range(50):
        await sqlite_store.append(f"t{i}", [created() for _ in range(60)], 0)
    total = 3000
    seen = []
    async with contextlib.aclosing(sqlite_store.subscribe(1)) as it:  # type: ignore[type-var]
        async for env in it:
            seen.append(env.position)
            if len(seen) == total:
                break
    assert seen == list(range(1, total + 1))


async def test_live_subscriber_misses_nothing_when_two_processes_interleave(tmp_path: Path) -> None:
    """Our own commits are served to our subscribers from memory; another connection's
    commits land between them, and the subscriber must still see every position once."""
    path = tmp_path / "log.db"
    async with opened(path, poll_interval=0.01) as ours, opened(path) as theirs:
        seen: list[Envelope] = []
        total = 60

        async def follow() -> None:
            async with contextlib.aclosing(ours.subscribe()) as it:  # type: ignore[type-var]
                async for env in it:
                    seen.append(env)
                    if len(seen) == total:
                        return

        task = asyncio.ensure_future(follow())
        for i in range(total // 2):
            await ours.append(f"o{i}", [created()], 0)
            await theirs.append(f"t{i}", [created()], 0)
            if i % 7 == 0:
                await asyncio.sleep(0.02)  # let the subscriber go live in between
        await asyncio.wait_for(task, 10)
        assert [e.position for e in seen] == list(range(1, total + 1))
        assert seen == await ours.read_all()


async def test_an_idle_subscription_reads_the_file_only_when_another_process_wrote(
    tmp_path: Path,
) -> None:
    """Polling for other connections' commits looks at the WAL file first: while it is
    unchanged the file is not read (it was read every poll_interval), and a commit by
    another connection is still seen."""
    path = tmp_path / "log.db"
    async with opened(path) as writer, opened(path, poll_interval=0.01) as reader:
        await writer.append("t0", [created()], 0)
        reads: list[int] = []
        real = reader.read_all

        async def counting(from_position: int = 0, limit: int = 1000) -> list[Envelope]:
            reads.append(from_position)
            return await real(from_position, limit)

        reader.read_all = counting  # type: ignore[method-assign]
        seen: list[Envelope] = []

        async def follow() -> None:
            async with contextlib.aclosing(reader.subscribe()) as it:  # type: ignore[type-var]
                async for env in it:
                    seen.append(env)
                    if len(seen) == 2:
                        return

        task = asyncio.ensure_future(follow())
        for _ in range(500):
            if seen:
                break
            await asyncio.sleep(0.01)
        assert [e.position for e in seen] == [1]
        before = len(reads)
        await asyncio.sleep(0.3)  # 30 polls: none finds the WAL file changed
        assert len(reads) - before < 5, reads
        await writer.append("t1", [created()], 0)
        await asyncio.wait_for(task, 10)
        assert [e.position for e in seen] == [1, 2]


async def test_an_idle_subscription_looks_less_and_less_yet_sees_another_process(
    tmp_path: Path,
) -> None:
    """While nothing changes, the wait between looks at the wal-index header doubles up
    to 20 poll intervals (an idle follower looked 20 times a second, and read the log
    every second); a commit by another connection after that is still seen, and so is
    the next one (events flowing, the wait is short again)."""
    path = tmp_path / "log.db"
    async with opened(path) as writer, opened(path, poll_interval=0.01) as reader:
        await writer.append("t0", [created()], 0)
        looks: list[float] = []
        real = reader._wal.mark

        def counting() -> bytes | None:
            looks.append(time.monotonic())
            return real()

        reader._wal.mark = counting  # type: ignore[method-assign]
        seen: list[Envelope] = []

        async def follow() -> None:
            async with contextlib.aclosing(reader.subscribe()) as it:  # type: ignore[type-var]
                async for env in it:
                    seen.append(env)
                    if len(seen) == 3:
                        return

        task = asyncio.ensure_future(follow())
        for _ in range(500):
            if seen:
                break
            await asyncio.sleep(0.01)
        before = len(looks)
        await asyncio.sleep(1.0)  # 100 polls at 0.01 s; backing off: about ten
        assert len(looks) - before < 20, len(looks) - before
        await writer.append("t1", [created()], 0)
        for _ in range(500):
            if len(seen) == 2:
                break
            await asyncio.sleep(0.01)
        await writer.append("t2", [created()], 0)
        await asyncio.wait_for(task, 10)
        assert [e.position for e in seen] == [1, 2, 3]


async def test_the_cache_keeps_only_what_a_live_subscription_has_not_read(
    sqlite_store: SqliteEventStore,
) -> None:
    """Envelopes committed here are kept for this process's live subscriptions, and only
    until each has read them: before, the latest 8,192 were kept whatever their size."""
    store = sqlite_store
    for i in range(20):
        await store.append(f"a{i}", [created()], 0)
    assert len(store._recent) == 0  # nobody follows: nothing kept

    fast: list[int] = []
    slow = store.subscribe(1)  # opened, then not read for a while
    first = await anext(slow)
    assert first.position == 1

    async def follow() -> None:
        async with contextlib.aclosing(store.subscribe(21)) as it:  # type: ignore[type-var]
            async for env in it:
                fast.append(env.position)
                if env.position == 60:
                    return

    task = asyncio.ensure_future(follow())
    for i in range(40):
        await store.append(f"b{i}", [created()], 0)
        await asyncio.sleep(0)
    await asyncio.wait_for(task, 10)
    assert fast == list(range(21, 61))
    # the slow subscription, still at position 2, keeps what it has not read...
    assert store._recent[0].position <= 21 and store._recent[-1].position == 60
    rest = [env.position async for env in _take(slow, 59)]
    assert rest == list(range(2, 61))  # ...and misses nothing, the older part from the file
    await slow.aclose()
    await store.append("c", [created()], 0)  # nobody follows any more
    assert [e.position for e in store._recent] == []


async def _take(it: AsyncIterator[Envelope], n: int) -> AsyncIterator[Envelope]:
    for _ in range(n):
        yield await anext(it)
