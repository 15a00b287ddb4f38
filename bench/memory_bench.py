"""A long-lived embedded runtime's memory: does it grow with the runs it has done?

Runs the 3-step pipeline (instant agents, SQLite log) in phases of RUNS runs,
32 in flight, and prints after each phase the process RSS, the objects Python
tracks by type that grew since the previous phase, and what the orchestrator
holds in memory. With ``Policy.retain_finished_runs`` (1000) finished runs
leave memory, so after the first phases the counts stay flat.

    .venv/bin/python bench/memory_bench.py [--runs 4000] [--phases 4]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from pipeline_bench import AGENTS, measure, pipeline_plan
from summary import record  # the figures for bench/summary.py ($CARDBUS_BENCH_JSON)

from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import SqliteEventStore


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 1e6


def object_counts() -> collections.Counter[str]:
    gc.collect()
    return collections.Counter(type(o).__name__ for o in gc.get_objects())


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=4000, help="runs per phase")
    ap.add_argument("--phases", type=int, default=4)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=".") as d:
        store = await SqliteEventStore.open(Path(d) / "memory-bench.db", synchronous="OFF")
        async with EmbeddedRuntime(store, AGENTS) as rt:

            async def run_one() -> None:
                result = await rt.run(pipeline_plan(), timeout=60)
                assert result.status == "completed", result

            before = object_counts()
            done = 0
            rss: list[float] = []
            for phase in range(1, args.phases + 1):
                await measure(run_one, args.runs, 32)
                done += args.runs
                now = object_counts()
                grown = {k: now[k] - before[k] for k in now if now[k] - before[k] >= 100}
                before = now
                state = rt.orchestrator.state
                rss.append(rss_mb())
                print(
                    f"phase {phase}: {done:>7} runs  RSS {rss_mb():6.1f} MB"
                    f"  runs/tasks in memory {len(state.runs)}/{len(state.tasks)}"
                    f"  types grown by >=100 objects: {dict(sorted(grown.items())) or 'none'}"
                )
            held = len(state.runs)
        await store.close()
    bench = "memory"
    record(None, bench, f"RSS after {done:,} runs", rss[-1], "MB")
    if len(rss) > 1:
        record(
            None,
            bench,
            f"RSS growth, phase 2 to {len(rss)} ({done - args.runs:,} runs)",
            rss[-1] - rss[0],
            "MB",
        )
    record(
        None,
        bench,
        f"runs held in memory after {done:,} runs",
        held,
        "runs",
        target="<= 1000 (retain_finished_runs)",
        met=held <= 1000,
        why=f"{held:,} runs kept after {done:,}: finished ones past `retain_finished_runs`"
        " (1,000) are retired once everything up to their end is folded",
    )


if __name__ == "__main__":
    asyncio.run(main())
