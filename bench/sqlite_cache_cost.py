"""What the writer's page cache size costs in CPU (issue 34, RSS per waiting run).

    .venv/bin/python bench/sqlite_cache_cost.py app 2000,512 --rounds 5
    .venv/bin/python bench/sqlite_cache_cost.py loop 2000,512 --rounds 4

Alternating the writer's ``cache_size`` (KiB) round by round in one process, the CPU
time of the SQLite writer thread (``/proc/self/task/<tid>/stat``) and of the process,
per event (``app``: ``eventstore_bench.py``'s 64 appenders, 120,000 events) or per
step (``loop``: ``agent_latency_bench.py`` at 1,000 in flight, 3,000 runs). A smaller
cache makes the writer read pages again (a ``pread`` each): that is CPU of the
writer thread, which a loaded machine changes much less than it changes wall time
and throughput (``bench/sqlite_cache_probe.py`` counts the misses).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import agent_latency_bench as alb
import eventstore_bench as eb

import cardbus.eventstore.sqlite as sqlite_store
from cardbus.agents.cards import AgentConstraints
from cardbus.bus.runtime.loop import run
from cardbus.eventstore import SqliteEventStore

_TICK = os.sysconf("SC_CLK_TCK")
_WRITER = "cardbus-sqlite-writer"
_writer_cpu: list[float] = []  # the writer thread's CPU seconds, read as its store closes


def thread_cpu_s(prefix: str) -> float:
    for t in threading.enumerate():
        if t.name.startswith(prefix) and t.native_id is not None:
            with open(f"/proc/self/task/{t.native_id}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime
    return 0.0


_close = SqliteEventStore.close


async def _close_counting(self: SqliteEventStore) -> None:
    if not self._closed:
        _writer_cpu.append(thread_cpu_s(_WRITER))
    await _close(self)


async def one(workload: str, tmp: Path) -> int:
    """Run the workload once; the units (events or steps) it did."""
    if workload == "app":
        await eb.store_appends(tmp / "app.db", 120_000, 64, "FULL")
        return 120_000
    for agent in alb.AGENTS:
        agent.constraints = AgentConstraints(max_concurrency=1000)
    f = await alb.bench_cardbus(tmp, 1000, 3000)
    return (f.runs + 3) * len(alb.STEPS)  # and the three warm-up runs


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workload", choices=["app", "loop"])
    ap.add_argument("sizes", help="writer cache sizes in KiB, comma-separated")
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    SqliteEventStore.close = _close_counting  # type: ignore[method-assign]
    sizes = [int(s) for s in args.sizes.split(",")]
    figures: dict[int, list[tuple[float, float]]] = {s: [] for s in sizes}
    load = os.getloadavg()
    print(f"load {load[0]:.2f} {load[1]:.2f} (1/5 min), cpus {os.cpu_count()}")
    for _ in range(args.rounds):
        for size in sizes:
            sqlite_store.WRITER_CACHE_KIB = size  # read as the store opens its writer
            with tempfile.TemporaryDirectory() as d:
                cpu0 = time.process_time()
                units = await one(args.workload, Path(d))
                cpu = time.process_time() - cpu0
            figures[size].append((_writer_cpu[-1] / units * 1e6, cpu / units * 1e6))
    unit = "event" if args.workload == "app" else "step"
    for size, got in figures.items():
        writer: list[Any] = [round(w, 1) for w, _ in got]
        print(
            f"writer cache {size:>5} KiB: writer thread"
            f" {statistics.median(w for w, _ in got):.1f} us/{unit} (median of {writer}),"
            f" process {statistics.median(c for _, c in got):.1f} us/{unit}"
        )


if __name__ == "__main__":
    run(main())
