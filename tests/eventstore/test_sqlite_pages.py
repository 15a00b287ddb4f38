"""Events read from SQLite as one row of a statement (``sqlite_pages``), and the row by
row read each falls back to: the same events either way."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cardbus.eventstore import CardbusError, Envelope, NewEvent, SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.eventstore.envelope import decode_stored
from cardbus.eventstore.sqlite_pages import decoded, packed

ROWS_SQL = "SELECT position, body, hash FROM events WHERE position >= ? ORDER BY position LIMIT ?"


def started(root: str, attempt: int) -> NewEvent:
    return NewEvent(data=ev.TaskStarted(attempt=attempt, agent_id="a"), correlation_id=root)


async def filled(path: Path) -> SqliteEventStore:
    """Two streams of two runs, interleaved in the log."""
    store = await SqliteEventStore.open(path)
    for i in range(5):
        await store.append("s1", [started("r1", 2 * i + 1), started("r1", 2 * i + 2)], 2 * i)
        await store.append("s2", [started("r2", i + 1)], i)
    return store


def rows_of(path: Path, where: str, args: tuple[Any, ...]) -> list[tuple[int, bytes, str]]:
    with sqlite3.connect(path) as conn:
        return list(conn.execute(f"SELECT position, body, hash FROM events {where}", args))


async def reads(store: SqliteEventStore) -> list[list[tuple[int, str, str]]]:
    """Each read's events as (position, event id, hash)."""
    out = []
    for page in (
        await store.read_all(0, 1000),
        await store.read_all(4, 3),
        await store.read_stream("s1", 3),
        await store.read_correlation("r2"),
        await store.read_stream("nothing"),
    ):
        out.append([(e.position, e.event_id, e.hash) for e in page])
    return out


def expected(path: Path) -> list[list[tuple[int, str, str]]]:
    """What the reads must return, from the file row by row with another connection."""
    with sqlite3.connect(path) as conn:

        def q(where: str, args: tuple[Any, ...]) -> list[tuple[int, str, str]]:
            sql = f"SELECT position, event_id, hash FROM events {where}"
            return [tuple(r) for r in conn.execute(sql, args)]  # type: ignore[misc]

        return [
            q("WHERE position >= 0 ORDER BY position LIMIT 1000", ()),
            q("WHERE position >= 4 ORDER BY position LIMIT 3", ()),
            q("WHERE stream = 's1' AND version >= 3 ORDER BY version", ()),
            q("WHERE correlation_id = 'r2' ORDER BY position", ()),
            [],
        ]


async def test_a_page_comes_back_from_sqlite_as_one_row(tmp_path: Path) -> None:
    """One step of the statement: the reader thread waits for the GIL once a page, not
    once an event (2,000 events read while the loop was busy: 63 ms, not 19 s)."""
    store = await filled(tmp_path / "log.db")
    returned: list[int] = []
    fetch = store._reader.execute_fetchall

    async def counted(sql: str, args: Any = ()) -> Any:
        rows = await fetch(sql, args)
        returned.append(len(list(rows)))
        return rows

    store._reader.execute_fetchall = counted  # type: ignore[method-assign]
    try:
        page = await store.read_all(0, 1000)
        assert len(page) == 15
        assert returned == [1]
        assert await reads(store) == expected(tmp_path / "log.db")
    finally:
        await store.close()


EDITS = {
    "spaces": lambda body: body.replace(b'{"event_id"', b'{\n  "event_id"', 1),
    "two objects": lambda body: body + b"," + body,
    "not JSON": lambda body: body[:-1],
    "an unknown type": lambda body: body.replace(b"task.started.v1", b"task.nothing.v1"),
}


@pytest.mark.parametrize("edit", list(EDITS))
async def test_a_body_edited_by_hand_reads_as_it_does_row_by_row(tmp_path: Path, edit: str) -> None:
    """A body that is not one JSON object any more makes the one-row read give up; the
    rows are then read one by one, and a bad one named with a typed error, as before."""
    path = tmp_path / "log.db"
    store = await filled(path)
    await store.close()
    (position, body, _), *_ = rows_of(path, "WHERE stream = 's2' AND version = 2", ())
    edited = EDITS[edit](body)
    assert edited != body
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE events SET body = ? WHERE position = ?", (edited, position))
    rows = rows_of(path, "WHERE correlation_id = 'r2' ORDER BY position", ())
    try:
        wanted: object = [(e.position, e.event_id, e.hash) for e in decode_stored(rows)]
    except CardbusError as e:
        wanted = (type(e), str(e))
    store = await SqliteEventStore.open(path)
    try:
        try:
            got: object = [
                (e.position, e.event_id, e.hash) for e in await store.read_correlation("r2")
            ]
        except CardbusError as e:
            got = (type(e), str(e))
        assert got == wanted
        assert (edit == "spaces") == isinstance(got, list)
        assert (await store.verify("s2"))[0].position == position  # and the edit is caught
    finally:
        await store.close()


async def test_a_page_too_long_for_one_sqlite_value_is_read_row_by_row(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    store = await filled(path)
    try:
        reader = store._reader
        await reader._execute(reader._conn.setlimit, sqlite3.SQLITE_LIMIT_LENGTH, 2000)
        with pytest.raises(sqlite3.DataError):  # the page of 15 events is too long now
            await reader.execute_fetchall(packed(ROWS_SQL), (0, 1000))
        assert await reads(store) == expected(path)
    finally:
        await store.close()


def seal(i: int) -> Envelope:
    return Envelope(
        event_id=f"e{i}",
        stream="s",
        version=i,
        recorded_at=1.0,
        correlation_id="r",
        data=ev.TaskStarted(attempt=i, agent_id="a"),
    )


def test_decoded_refuses_what_is_not_one_object_each_or_out_of_position_order() -> None:
    bodies = [msgspec.json.encode(seal(i)) for i in (1, 2)]
    array = b"[" + b",".join(bodies) + b"]"
    assert decoded((0, None, None, None)) == []
    got = decoded((2, b"[3,7]", b'["h3","h7"]', array))
    assert got is not None
    assert [(e.position, e.hash, e.event_id) for e in got] == [(3, "h3", "e1"), (7, "h7", "e2")]
    assert decoded((2, b"[7,3]", b'["h7","h3"]', array)) is None  # out of order: row by row
    assert decoded((3, b"[1,2]", b'["a","b"]', array)) is None  # a body of two objects
    assert decoded((2, b"[1,2]", b'["a","b"]', array[:-2])) is None  # not JSON
    assert decoded((2, b"[1,2]", b'["a","b"]', b"[" + bodies[0] + b",1]")) is None


def test_random_logs_read_as_row_by_row_reads_them(tmp_path: Path) -> None:
    """Random appends (streams, runs, payloads of any JSON text), then random reads: each
    one-row read returns exactly what the row by row read of the same rows decodes to."""
    with asyncio.Runner() as runner:
        path = tmp_path / "log.db"
        store = runner.run(SqliteEventStore.open(path))
        versions: dict[str, int] = {}

        @settings(max_examples=60, deadline=None)
        @given(
            st.lists(
                st.tuples(st.integers(0, 5), st.integers(0, 3), st.lists(st.text(), max_size=3)),
                min_size=1,
                max_size=6,
            ),
            st.integers(0, 200),
            st.integers(-1, 40),
            st.integers(0, 5),
            st.integers(1, 4),
        )
        def check(
            appends: list[tuple[int, int, list[str]]],
            start: int,
            limit: int,
            stream: int,
            from_version: int,
        ) -> None:
            for s, root, notes in appends:
                name = f"s{s}"
                news = [
                    NewEvent(data=ev.TaskFailed(reason=n), correlation_id=f"r{root}")
                    for n in notes or ["-"]
                ]
                runner.run(store.append(name, news, versions.get(name, 0)))
                versions[name] = versions.get(name, 0) + len(news)
            where = {
                "all": ("WHERE position >= ? ORDER BY position LIMIT ?", (start, limit)),
                "stream": (
                    "WHERE stream = ? AND version >= ? ORDER BY version",
                    (f"s{stream}", from_version),
                ),
                "run": ("WHERE correlation_id = ? ORDER BY position", (f"r{stream % 4}",)),
            }
            got = {
                "all": runner.run(store.read_all(start, limit)),
                "stream": runner.run(store.read_stream(f"s{stream}", from_version)),
                "run": runner.run(store.read_correlation(f"r{stream % 4}")),
            }
            for read, (sql, args) in where.items():
                assert got[read] == decode_stored(rows_of(path, sql, args)), read

        try:
            check()
        finally:
            runner.run(store.close())
