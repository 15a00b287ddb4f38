"""What the process keeps per waiting run, by who allocated it (issue 34, RSS per waiting run).

    .venv/bin/python bench/rss_holders.py --n 500 --top 25 --frames 6

The workload of ``agent_latency_bench.py``'s RSS phase (3-step runs parked in their
first agent), with tracemalloc on: a snapshot with N runs waiting and another with
2N, diffed and grouped by the allocation's traceback, so what the warm-up, the
imports and the first N's caches took falls out and what remains is bytes per
waiting run. Tracemalloc's own bookkeeping is not in the figures; RSS is larger
(allocator slack, arenas), so read the ranking, not the sum, against the RSS bench.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from agent_latency_bench import AGENTS, WAITS, plan_for, policy_for

from cardbus.agents.cards import AgentConstraints
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.bus.runtime.loop import run
from cardbus.eventstore import SqliteEventStore


async def park(rt: EmbeddedRuntime, tag: str, n: int, roots: list[str]) -> None:
    target = WAITS.parked + n
    for i in range(n):
        roots.append(await rt.orchestrator.submit(plan_for(f"{tag}-{i}")))
    deadline = time.monotonic() + 120
    while WAITS.parked < target and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)  # let the writers and folds settle
    gc.collect()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--frames", type=int, default=6)
    ap.add_argument("--group", default="traceback", choices=["traceback", "lineno", "filename"])
    args = ap.parse_args()
    for agent in AGENTS:
        agent.constraints = AgentConstraints(max_concurrency=4 * args.n)
    tracemalloc.start(args.frames)
    with tempfile.TemporaryDirectory() as d:
        store = await SqliteEventStore.open(Path(d) / "holders.db")
        async with EmbeddedRuntime(store, AGENTS, policy=policy_for(4 * args.n)) as rt:
            WAITS.gate, WAITS.parked = asyncio.Event(), 0
            roots: list[str] = []
            await park(rt, "a", args.n, roots)
            first = tracemalloc.take_snapshot()
            await park(rt, "b", args.n, roots)
            second = tracemalloc.take_snapshot()
            stats = second.compare_to(first, args.group)
            total = sum(s.size_diff for s in stats)
            print(f"traced growth per waiting run: {total / args.n:,.0f} B ({args.n} more runs)")
            for s in stats[: args.top]:
                print(f"{s.size_diff / args.n:8.0f} B/run {s.count_diff / args.n:6.1f} blocks/run")
                for line in s.traceback.format()[-2 * args.frames :]:
                    print("        " + line.strip())
            WAITS.gate.set()
            for root in roots:
                await rt.orchestrator.wait(root, 600)
            WAITS.gate = None
        await store.close()


if __name__ == "__main__":
    run(main())
