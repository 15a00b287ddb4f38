"""CPU an idle embedded runtime uses: the orchestrator's clock and the log follower.

After one run of the 3-step pipeline, the runtime waits ``--seconds`` with
nothing to do; printed: process CPU (all threads) per second of that wait, on
the in-memory store and on a SQLite file. What is left is the clock waking
for the sweep (``Policy.sweep_s``) and, on SQLite, the follower's stat of the
WAL file every ``poll_interval`` (a read when it changed, and every second).

    .venv/bin/python bench/idle_bench.py [--seconds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from pipeline_bench import AGENTS, pipeline_plan
from summary import record

from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.bus.runtime.loop import run
from cardbus.eventstore import EventStore, MemoryEventStore, SqliteEventStore


async def idle_cpu(store: EventStore, seconds: float) -> float:
    """ms of process CPU per second while the runtime has nothing to do."""
    async with EmbeddedRuntime(store, AGENTS) as rt:
        result = await rt.run(pipeline_plan(), timeout=60)
        assert result.status == "completed", result
        await asyncio.sleep(0.5)  # the run's aftermath (memory policy, snapshot) is over
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.sleep(seconds)
        return 1000 * (time.process_time() - cpu) / (time.perf_counter() - wall)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    memory = await idle_cpu(MemoryEventStore(), args.seconds)
    with tempfile.TemporaryDirectory() as d:
        store = await SqliteEventStore.open(Path(d) / "idle.db")
        try:
            sqlite = await idle_cpu(store, args.seconds)
        finally:
            await store.close()
    print(f"idle embedded runtime, {args.seconds:g} s: CPU {memory:.1f} ms/s on the memory store,")
    print(f"  {sqlite:.1f} ms/s on a SQLite file (all threads of the process)")
    for where, value in (("memory store", memory), ("SQLite file", sqlite)):
        record(None, "idle", f"CPU of an idle embedded runtime, {where}", value, "ms/s")


if __name__ == "__main__":
    run(main())
