"""Where an appended event's microseconds go in the SQLite store (issue 34, the appenders).

    .venv/bin/python bench/append_profile.py [--appenders 64] [--events 120000] [--runs 2]

The workload of ``eventstore_bench.py`` (N appenders, 3 events an append, each waiting
for its own commit), with the writer thread's parts timed from inside the thread:

* ``idle``: the writer waits for the next batch: the loop resumes the appenders the
  last commit answered and they queue their next appends (and the two thread hops);
* ``plan``: checks and seals a batch (encode, decode back, hash, log chain), Python
  holding the GIL;
* ``sqlite``: the rest of a batch's write: the INSERT and its commit (SQLite's own CPU,
  the WAL writes, the fsync, a checkpoint now and then), the GIL released; ``cpu`` is
  the thread's CPU in it.

Per event, with the loop thread's CPU during the run and rows per commit: a batch holds
at most one append per appender, since each waits for its own commit. The timing
wraps private methods of the writer, so it belongs to this version of the store.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from eventstore_bench import store_appends

from cardbus.eventstore import sqlite as sqlite_store


class Parts:
    def __init__(self) -> None:
        self.wall: dict[str, float] = {"idle": 0.0, "plan": 0.0, "sqlite": 0.0}
        self.cpu: dict[str, float] = {"plan": 0.0, "sqlite": 0.0}
        self.rows = 0
        self.commits = 0
        self.last_end: float | None = None
        self.opened_cpu = 0.0  # the loop thread's CPU when the store was open (work built)


PARTS = Parts()


def timed(part: str, method: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return method(*args, **kwargs)
        finally:
            PARTS.wall[part] += time.perf_counter() - wall
            PARTS.cpu[part] += time.thread_time() - cpu

    return wrapper


def write_timed(method: Callable[..., Any]) -> Callable[..., Any]:
    """A batch's write: what is not its plan is SQLite's (and a little bookkeeping)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        if PARTS.last_end is not None:
            PARTS.wall["idle"] += wall - PARTS.last_end
        plan_wall, plan_cpu = PARTS.wall["plan"], PARTS.cpu["plan"]
        try:
            outcome = method(*args, **kwargs)
            PARTS.rows += outcome[2]
            PARTS.commits += 1 if outcome[2] else 0
            return outcome
        finally:
            PARTS.last_end = time.perf_counter()
            planned = PARTS.wall["plan"] - plan_wall
            PARTS.wall["sqlite"] += PARTS.last_end - wall - planned
            PARTS.cpu["sqlite"] += time.thread_time() - cpu - (PARTS.cpu["plan"] - plan_cpu)

    return wrapper


def instrument() -> None:
    writer: Any = sqlite_store._Writer
    writer._plan = timed("plan", writer._plan)
    writer.write = write_timed(writer.write)
    store: Any = sqlite_store.SqliteEventStore
    open_store = store.open

    async def opened(*args: Any, **kwargs: Any) -> Any:
        got = await open_store(*args, **kwargs)
        PARTS.opened_cpu = time.thread_time()
        return got

    store.open = opened


async def one_run(path: Path, events: int, appenders: int, synchronous: str) -> None:
    global PARTS
    PARTS = Parts()
    rate = await store_appends(path, events, appenders, synchronous)
    loop_cpu = time.thread_time() - PARTS.opened_cpu  # the loop's thread: this one
    n = PARTS.rows
    us = 1e6 / n

    def show(part: str) -> str:
        cpu = f" (cpu {PARTS.cpu[part] * us:.2f})" if part in PARTS.cpu else ""
        return f"{part} {PARTS.wall[part] * us:.2f}{cpu}"

    print(
        f"    per event, us: writer {', '.join(show(p) for p in ('idle', 'plan', 'sqlite'))};"
        f" loop thread cpu {loop_cpu * us:.2f};"
        f" wall {1e6 / rate:.2f}; {n / max(PARTS.commits, 1):.0f} rows/commit",
        flush=True,
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--appenders", type=int, default=64)
    parser.add_argument("--events", type=int, default=120_000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--synchronous", default="FULL", choices=["FULL", "NORMAL", "OFF"])
    args = parser.parse_args()
    instrument()
    base = Path(tempfile.mkdtemp(prefix="cardbus-append-profile-"))
    try:
        for r in range(args.runs):
            await one_run(base / f"run{r}.db", args.events, args.appenders, args.synchronous)
    finally:
        for f in base.iterdir():
            f.unlink()
        os.rmdir(base)


if __name__ == "__main__":
    asyncio.run(main())
