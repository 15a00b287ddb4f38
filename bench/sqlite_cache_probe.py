"""What SQLite's page caches hold with N runs waiting (issue 34, RSS per waiting run).

    .venv/bin/python bench/sqlite_cache_probe.py --n 100
    .venv/bin/python bench/sqlite_cache_probe.py --n 1000 --cache-kib 256

The RSS phase of ``agent_latency_bench.py`` (3 warm-up runs, then N runs parked in
their first agent), in this fresh process, printing before and after the park: the
process's RSS, SQLite's heap (``sqlite3_memory_used``, every connection's caches and
statements) and each connection the store opened (the writer's, the reader's) with
its ``cache_size`` and the bytes its page cache uses (``SQLITE_DBSTATUS_CACHE_USED``),
hits, misses and pages written; the database and WAL file sizes. ``--cache-kib`` sets
``PRAGMA cache_size`` on both connections after the store opens (an experiment: the
store's own setting is what it ships).

Diagnostic only: it reads the ``sqlite3 *`` of a ``sqlite3.Connection`` at its C
offset (CPython 3.11's ``pysqlite_Connection``), good for this interpreter, no more.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import gc
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from agent_latency_bench import AGENTS, WAITS, closed_loop, plan_for, policy_for, rss_bytes

from cardbus.agents.cards import AgentConstraints
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.bus.runtime.loop import run
from cardbus.eventstore import SqliteEventStore

_LIB = ctypes.CDLL(ctypes.util.find_library("sqlite3") or "libsqlite3.so.0")
_LIB.sqlite3_memory_used.restype = ctypes.c_int64
_DBSTATUS = {"cache": 1, "hit": 7, "miss": 8, "write": 9, "spill": 12}


def _db_pointer(conn: sqlite3.Connection) -> int:
    return ctypes.c_void_p.from_address(id(conn) + object.__basicsize__).value or 0


def db_status(conn: sqlite3.Connection) -> dict[str, int]:
    db = ctypes.c_void_p(_db_pointer(conn))
    out = {}
    for name, op in _DBSTATUS.items():
        cur, hi = ctypes.c_int(), ctypes.c_int()
        _LIB.sqlite3_db_status(db, op, ctypes.byref(cur), ctypes.byref(hi), 0)
        out[name] = cur.value
    return out


def connections(store: SqliteEventStore) -> dict[str, sqlite3.Connection]:
    return {"writer": store._writer.conn, "reader": store._reader._conn}  # type: ignore[dict-item]


async def pragma(store: SqliteEventStore, name: str, sql: str) -> Any:
    """Run ``sql`` on the store's connection ``name``, in the thread that owns it."""
    if name == "reader":
        rows = await store._reader.execute_fetchall(sql)
        return next(iter(rows))[0] if rows else None
    row = store._writer.conn.execute(sql).fetchone()  # the writer's pool is idle here
    return row[0] if row else None


async def report(label: str, store: SqliteEventStore, path: Path, rss0: int) -> None:
    files = ", ".join(
        f"{s or 'db'} {os.path.getsize(f'{path}{s}') / 1024:,.0f} KiB"
        for s in ("", "-wal")
        if os.path.exists(f"{path}{s}")
    )
    print(
        f"{label}: RSS +{(rss_bytes() - rss0) / 1024:,.0f} KiB, sqlite heap"
        f" {_LIB.sqlite3_memory_used() / 1024:,.0f} KiB, files"
        f" {files}"
    )
    for name, conn in connections(store).items():
        s = db_status(conn)
        size = await pragma(store, name, "PRAGMA cache_size")
        print(
            f"    {name:6} cache_size {size:>6}: page cache {s['cache'] / 1024:,.0f} KiB,"
            f" hits {s['hit']:,} misses {s['miss']:,} writes {s['write']:,} spills {s['spill']:,}"
        )


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--cache-kib", type=int, default=None, help="PRAGMA cache_size=-KiB on both")
    args = ap.parse_args()
    for agent in AGENTS:
        agent.constraints = AgentConstraints(max_concurrency=args.n)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "probe.db"
        store = await SqliteEventStore.open(path)
        if args.cache_kib is not None:
            for name in connections(store):
                await pragma(store, name, f"PRAGMA cache_size=-{args.cache_kib}")
        async with EmbeddedRuntime(store, AGENTS, policy=policy_for(args.n)) as rt:

            async def run_one(marker: str) -> None:
                r = await rt.run(plan_for(marker), timeout=600)
                assert r.status == "completed", r

            await closed_loop(run_one, 3, 1, "warm-")
            gc.collect()
            rss0 = rss_bytes()
            await report("after warm-up", store, path, rss0)
            WAITS.gate, WAITS.parked = asyncio.Event(), 0
            roots: list[Any] = [
                await rt.orchestrator.submit(plan_for(f"park-{i}")) for i in range(args.n)
            ]
            deadline = time.monotonic() + 120
            while WAITS.parked < args.n and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            gc.collect()
            await report(f"{args.n} parked", store, path, rss0)
            print(f"    RSS per waiting run {(rss_bytes() - rss0) / args.n / 1024:.1f} KiB")
            WAITS.gate.set()
            for root in roots:
                await rt.orchestrator.wait(root, 600)
            WAITS.gate = None
        await store.close()


if __name__ == "__main__":
    run(main())
