"""A page of the SQLite log read while the event loop is busy, read as one row of SQLite
against row by row (issue 34: a log follower behind its store's cache of own commits).

    .venv/bin/python bench/busy_read_bench.py [--events 2000] [--reads 5] [--busy-ms 20]

Python's ``sqlite3`` gives the GIL up around each step of a statement (a row), and the
reader thread waits for the loop's thread to hand it back, up to the switch interval
(5 ms), whenever the loop runs Python. The bench fills a log, then reads a page of
``--events`` events ``--reads`` times each way while a task on the loop runs Python for
``--busy-ms`` at a time between awaits (a saturated orchestrator), and with the loop
idle. It prints the median wall time of a read, both ways, and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from eventstore_bench import make_event

from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore.envelope import decode_stored

ROWS_SQL = "SELECT position, body, hash FROM events WHERE position >= ? ORDER BY position LIMIT ?"


async def busy(ms: float, stop: asyncio.Event) -> None:
    """Run Python on the loop for ``ms`` at a time, as a saturated orchestrator does."""
    while not stop.is_set():
        until = time.perf_counter() + ms / 1000
        while time.perf_counter() < until:
            pass
        await asyncio.sleep(0)


async def timed_reads(store: SqliteEventStore, n: int, reads: int) -> tuple[float, float]:
    """Median seconds of a page read as one row (``read_all``) and row by row."""
    packed, by_row = [], []
    for _ in range(reads):
        t0 = time.perf_counter()
        page = await store.read_all(1, n)
        packed.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        rows = await store._query(ROWS_SQL, (1, n))
        slow = decode_stored(rows)
        by_row.append(time.perf_counter() - t0)
        assert [e.event_id for e in page] == [e.event_id for e in slow]
        assert len(page) == n
    return statistics.median(packed), statistics.median(by_row)


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = await SqliteEventStore.open(Path(tmp) / "busy.db", synchronous="OFF")
        for start in range(0, args.events, 300):
            await store.append(
                f"s{start}",
                [make_event("root", i) for i in range(min(300, args.events - start))],
                0,
            )
        quiet = await timed_reads(store, args.events, args.reads)
        stop = asyncio.Event()
        spinning = asyncio.create_task(busy(args.busy_ms, stop))
        loaded = await timed_reads(store, args.events, args.reads)
        stop.set()
        await spinning
        await store.close()
    for name, (one_row, by_row) in (
        ("loop idle", quiet),
        (f"loop busy {args.busy_ms:g} ms", loaded),
    ):
        print(
            f"  {args.events} events, {name}: one row {one_row * 1000:8.1f} ms,"
            f" row by row {by_row * 1000:8.1f} ms ({by_row / one_row:.1f}x)"
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=2000)
    ap.add_argument("--reads", type=int, default=5)
    ap.add_argument("--busy-ms", type=float, default=20.0)
    from cardbus.bus.runtime.loop import run

    run(main(ap.parse_args()))
