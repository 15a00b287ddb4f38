"""Three independent tasks on one agent: max_concurrency 3 against 1, and a blocking handler.

Each task takes ``--work`` seconds (default 1.0). Printed per handler kind
(``async def`` awaiting a sleep, plain ``def`` blocking in ``time.sleep``): the
wall time of the run with ``max_concurrency`` 1 and 3 on the embedded runtime
(SQLite log), and the ratio; the issue's target is three 1 s tasks in under
2 s, a ratio under 0.67. Then a blocking ``def`` agent beside an async one:
how long the async agent's task takes next to it, against alone.

    .venv/bin/python bench/concurrency_bench.py [--work 1.0]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from summary import record  # the figures for bench/summary.py ($CARDBUS_BENCH_JSON)

from cardbus.agents import Agent, AgentConstraints, Capability
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore.events import TaskCompleted


class Job(msgspec.Struct):
    n: int


def agent(agent_id: str, capability: str, concurrency: int, sync: bool, work: float) -> type[Agent]:
    if sync:

        def handle(self: Agent, task: Any, inputs: Job, ctx: Any) -> Job:
            time.sleep(work)
            return inputs

    else:

        async def handle(self: Agent, task: Any, inputs: Job, ctx: Any) -> Job:
            await asyncio.sleep(work)
            return inputs

    return type(
        agent_id,
        (Agent,),
        {
            "agent_id": agent_id,
            "capabilities": [Capability(capability, Job, Job, capability)],
            "constraints": AgentConstraints(max_concurrency=concurrency),
            "handle": handle,
        },
    )


def plan(capabilities: list[str]) -> dict[str, Any]:
    tasks = [
        {"id": f"t{i}", "capability": c, "inputs": {"n": i}} for i, c in enumerate(capabilities)
    ]
    return {"goal": "independent jobs", "tasks": tasks}


async def timed(
    agents: list[type[Agent]], capabilities: list[str]
) -> tuple[float, dict[str, float]]:
    """The run's wall time, and per agent the seconds from the run's start to its completion."""
    with tempfile.TemporaryDirectory() as tmp:
        store = await SqliteEventStore.open(Path(tmp) / "bench.db")
        try:
            async with EmbeddedRuntime(store, agents) as rt:
                began = time.perf_counter()
                result = await rt.run(plan(capabilities), timeout=120)
                took = time.perf_counter() - began
                assert result.status == "completed", result.reason
                events = await store.read_correlation(result.root_id)
                start = events[0].recorded_at
                done = {
                    e.data.agent_id: e.recorded_at - start
                    for e in events
                    if isinstance(e.data, TaskCompleted)
                }
                return took, done
        finally:
            await store.close()


async def main(work: float) -> None:
    print(f"three independent {work:g} s tasks on one agent (embedded runtime, SQLite log)")
    for sync in (False, True):
        kind = "def (blocking)" if sync else "async def"
        one, _ = await timed([agent("w1", "w", 1, sync, work)], ["w"] * 3)
        three, _ = await timed([agent("w3", "w", 3, sync, work)], ["w"] * 3)
        print(
            f"  {kind:15} max_concurrency 1: {one:5.2f} s   3: {three:5.2f} s"
            f"   ratio {three / one:.2f} (target < 0.67)"
        )
        record(
            None,
            "concurrency",
            f"three {work:g} s tasks, {kind}, max_concurrency 3",
            three,
            "s",
            target="< 0.67x max_concurrency 1",
            met=three / one < 0.67,
            why=(
                f"three {work:g} s tasks ({kind}) took {one:.2f} s one at a time and"
                f" {three:.2f} s three at a time, where a third is the ideal"
            ),
            ratio=three / one,
            ratio_of="max_concurrency 1",
        )
    quick = agent("quick", "quick", 1, False, work / 4)
    blocker = agent("blocker", "block", 1, True, work)
    _, alone = await timed([quick], ["quick"])
    _, beside = await timed([quick, blocker], ["quick", "block"])
    print(
        f"  an async {work / 4:g} s task done after {alone['quick']:5.2f} s alone,"
        f" {beside['quick']:5.2f} s beside a blocking {work:g} s def"
        f" (done after {beside['blocker']:5.2f} s): ratio {beside['quick'] / alone['quick']:.2f}"
    )
    record(
        None,
        "concurrency",
        f"async {work / 4:g} s task beside a blocking {work:g} s def",
        beside["quick"],
        "s",
        ratio=beside["quick"] / alone["quick"],
        ratio_of="alone",
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=float, default=1.0, help="seconds each task takes")
    asyncio.run(main(parser.parse_args().work))
