"""Whole-log tamper evidence on SQLite: a matrix of tampers over a realistic log, all caught.

A run of the lifecycle log (tests/lifecycle_log.py) is written, its head kept
"outside the log" (``store.head()``), the file closed; then each tamper is
made on a copy of the file with the raw ``sqlite3`` module, for every event
it applies to, and ``SqliteEventStore.verify_file(path, head)`` must name a
problem at (or, for a deletion, right at) the position touched. verify_file
reads the file only: a test checks it never changes a byte.
"""

from __future__ import annotations

import hashlib
import itertools
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import lifecycle_log
import pytest

from cardbus.eventstore import SqliteEventStore, StoreUnavailable
from cardbus.eventstore.audit import LOG_STREAM
from cardbus.eventstore.envelope import ChainProblem
from cardbus.eventstore.loghead import (
    LOG_GENESIS,
    LogHead,
    decode_head,
    encode_head,
    sign,
    signature_ok,
)

Tamper = Callable[[sqlite3.Connection, int], None]


@pytest.fixture(scope="module")
def clean_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, LogHead, list[tuple]]:
    """A closed log file, the head kept of it, and its rows (position, stream, version)."""
    import asyncio

    path = tmp_path_factory.mktemp("audit") / "clean.db"

    async def build() -> LogHead:
        store = await SqliteEventStore.open(path)
        try:
            await lifecycle_log.write_run(store, "a-")
            await lifecycle_log.write_run(store, "b-", t0=lifecycle_log.T0 + 500)
            assert await store.verify() == []
            return await store.head()
        finally:
            await store.close()

    head = asyncio.run(build())
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        rows = conn.execute("SELECT position, stream, version FROM events ORDER BY position")
        return path, head, rows.fetchall()


def tampered(clean: Path, tmp_path: Path, change: Callable[[sqlite3.Connection], None]) -> Path:
    copy = tmp_path / "copy.db"
    shutil.copy(clean, copy)
    conn = sqlite3.connect(copy, isolation_level=None)
    try:
        change(conn)
    finally:
        conn.close()
    return copy


async def problems(path: Path, head: LogHead | None) -> list[ChainProblem]:
    found, _ = await SqliteEventStore.verify_file(path, head)
    return found


def at(found: list[ChainProblem], position: int) -> bool:
    return any(p.position == position for p in found)


# -- each tamper, applied to every event it can be applied to ----------------------


def edit_body(c: sqlite3.Connection, pos: int) -> None:
    c.execute("UPDATE events SET body = CAST(replace(body, '\"v\"', '\"w\"') || ' ' AS BLOB)"
              " WHERE position = ?", (pos,))  # fmt: skip


def edit_column(column: str, value: object) -> Tamper:
    def change(c: sqlite3.Connection, pos: int) -> None:
        c.execute(f"UPDATE events SET {column} = ? WHERE position = ?", (value, pos))

    return change


def delete(c: sqlite3.Connection, pos: int) -> None:
    c.execute("DELETE FROM events WHERE position = ?", (pos,))


def duplicate(c: sqlite3.Connection, pos: int) -> None:
    top = c.execute("SELECT MAX(position) FROM events").fetchone()[0]
    c.execute(
        "INSERT INTO events (position, event_id, stream, version, correlation_id, type,"
        " recorded_at, body, hash, log_hash) SELECT ?, event_id || 'x', stream, version + 1000,"
        " correlation_id, type, recorded_at, body, hash, log_hash FROM events WHERE position = ?",
        (top + 1, pos),
    )


def swap_positions(c: sqlite3.Connection, a: int, b: int) -> None:
    c.execute("UPDATE events SET position = -1 WHERE position = ?", (a,))
    c.execute("UPDATE events SET position = ? WHERE position = ?", (a, b))
    c.execute("UPDATE events SET position = ? WHERE position = -1", (b,))


SINGLE_EVENT_TAMPERS: dict[str, Tamper] = {
    "edit the body": edit_body,
    "edit the stream column": edit_column("stream", "someone-else"),
    "edit the version column": edit_column("version", 999),
    "edit the correlation column": edit_column("correlation_id", "another-root"),
    "edit the type column": edit_column("type", "task.forged.v1"),
    "edit the event id column": edit_column("event_id", "forged-id"),
    "edit the hash column": edit_column("hash", "0" * 64),
    "erase the log hash": edit_column("log_hash", None),
    "make the body TEXT": lambda c, p: c.execute(
        "UPDATE events SET body = CAST(body AS TEXT) || 'x' WHERE position = ?", (p,)
    ),
    "make the body an integer": edit_column("body", 42),
    "delete it": delete,
    "duplicate it at the end": duplicate,
}


@pytest.mark.parametrize("tamper", SINGLE_EVENT_TAMPERS, ids=list(SINGLE_EVENT_TAMPERS))
async def test_every_single_event_tamper_is_caught_at_its_position(
    tamper: str, clean_log: tuple[Path, LogHead, list[tuple]], tmp_path: Path
) -> None:
    clean, head, rows = clean_log
    missed = []
    for position, _stream, _version in rows:
        path = tampered(clean, tmp_path, lambda c, p=position: SINGLE_EVENT_TAMPERS[tamper](c, p))
        found = await problems(path, head)
        top = rows[-1][0]
        where = top + 1 if tamper == "duplicate it at the end" else position
        if not at(found, where):
            missed.append((position, found))
    assert missed == [], f"{tamper}: missed at {[m[0] for m in missed]}"


async def test_swaps_within_a_stream_and_across_streams_are_caught(
    clean_log: tuple[Path, LogHead, list[tuple]], tmp_path: Path
) -> None:
    clean, head, rows = clean_log
    pairs = list(itertools.pairwise(rows))
    assert any(a[1] == b[1] for a, b in pairs) and any(a[1] != b[1] for a, b in pairs)
    for a, b in pairs:
        path = tampered(clean, tmp_path, lambda c, a=a[0], b=b[0]: swap_positions(c, a, b))
        found = await problems(path, head)
        assert at(found, a[0]) or at(found, b[0]), (a, b, found)


async def test_deleting_a_streams_tail_or_a_whole_stream_is_caught(
    clean_log: tuple[Path, LogHead, list[tuple]], tmp_path: Path
) -> None:
    clean, head, rows = clean_log
    streams = {s for _, s, _ in rows}
    for stream in streams:
        versions = sorted(v for _, s, v in rows if s == stream)
        for cut in versions:  # delete from version `cut` to the stream's end
            first = min(p for p, s, v in rows if s == stream and v >= cut)
            path = tampered(
                clean,
                tmp_path,
                lambda c, s=stream, v=cut: c.execute(
                    "DELETE FROM events WHERE stream = ? AND version >= ?", (s, v)
                ),
            )
            found = await problems(path, head)
            assert at(found, first), (stream, cut, found)


async def test_truncating_the_logs_tail_is_caught_against_the_kept_head(
    clean_log: tuple[Path, LogHead, list[tuple]], tmp_path: Path
) -> None:
    clean, head, rows = clean_log
    for keep in (0, 1, len(rows) // 2, len(rows) - 1):
        path = tampered(
            clean,
            tmp_path,
            lambda c, k=keep: c.execute("DELETE FROM events WHERE position > ?", (k,)),
        )
        found = await problems(path, head)
        assert [p.stream for p in found] == [LOG_STREAM], found
        assert f"events {keep + 1}..{head.position} missing (truncated)" in found[0].problem
        assert (await problems(path, None)) == []  # without the head, a shorter log is a log


async def test_a_consistently_rewritten_log_is_caught_only_by_the_head(
    clean_log: tuple[Path, LogHead, list[tuple]], tmp_path: Path
) -> None:
    """Delete an event and recompute every log hash after it, as a careful forger would."""
    clean, head, rows = clean_log
    last = rows[-1][0]

    def rewrite(c: sqlite3.Connection) -> None:
        stream, version = rows[-1][1], rows[-1][2]
        c.execute("DELETE FROM events WHERE stream = ? AND version = ?", (stream, version))
        log = c.execute("SELECT log_hash FROM events WHERE position = ?", (last - 1,)).fetchone()[0]
        # add a forged last event: an old body re-stored under a new id and position
        c.execute(
            "INSERT INTO events SELECT ?, event_id || '-f', stream, version + 500, correlation_id,"
            " type, recorded_at, body, hash, ? FROM events WHERE position = 1",
            (last, hashlib.sha256(f"{log}:x".encode()).hexdigest()),
        )

    path = tampered(clean, tmp_path, rewrite)
    found = await problems(path, head)
    assert at(found, last)


async def test_the_head_round_trips_and_its_signature_is_checked(
    clean_log: tuple[Path, LogHead, list[tuple]],
) -> None:
    _, head, rows = clean_log
    assert head.position == rows[-1][0] and head.log_hash != LOG_GENESIS
    signed = sign(head, b"k3y")
    back = decode_head(encode_head(signed))
    assert back == signed and signature_ok(back, b"k3y")
    assert not signature_ok(back, b"other") and not signature_ok(head, b"k3y")
    forged = decode_head(encode_head(signed).replace(b'"position": ', b'"position": 1'))
    assert not signature_ok(forged, b"k3y")


async def test_verify_file_refuses_what_is_not_a_cardbus_log_and_writes_nothing(
    tmp_path: Path, clean_log: tuple[Path, LogHead, list[tuple]]
) -> None:
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
        conn.execute("INSERT INTO notes (text) VALUES ('mine')")
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database at all" * 100)
    for path in (empty, foreign, garbage):
        before = path.read_bytes()
        with pytest.raises(StoreUnavailable, match="not a cardbus log"):
            await SqliteEventStore.verify_file(path)
        assert path.read_bytes() == before
    clean = clean_log[0]
    before = clean.read_bytes()
    assert (await problems(clean, clean_log[1])) == []
    assert clean.read_bytes() == before


async def test_opening_a_foreign_database_for_writing_is_refused(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY)")
    with pytest.raises(StoreUnavailable, match="not a cardbus log"):
        await SqliteEventStore.open(foreign)
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    with pytest.raises(StoreUnavailable, match="not a cardbus log"):
        await SqliteEventStore.open(empty, create=False)  # an existing log is expected
    assert empty.read_bytes() == b""
    with sqlite3.connect(foreign) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert tables == {"notes"}


async def test_a_log_written_before_the_log_chain_gets_one_on_open(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    store = await SqliteEventStore.open(path)
    await lifecycle_log.write_run(store, "o-")
    head = await store.head()
    await store.close()
    with sqlite3.connect(path) as conn:  # make it look like a log of an older cardbus
        conn.execute("ALTER TABLE events DROP COLUMN log_hash")
        conn.execute("PRAGMA application_id=0")
    found, computed = await SqliteEventStore.verify_file(path, head)
    assert found == [] and computed.log_hash == head.log_hash  # computed without the column
    store = await SqliteEventStore.open(path)
    try:
        assert await store.head() == head
        assert (await store.audit(head))[0] == []
    finally:
        await store.close()
