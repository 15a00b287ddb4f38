"""Overload: many runs submitted at once, default settings. Do they all complete, once?

2,000 runs (3-task chains, each task a 50 ms agent with ``max_concurrency`` 1) submitted
at once to one ``EmbeddedRuntime`` on a SQLite file, then 500 to a ``NatsRuntime`` on a
real nats-server: every ``timeout_s`` at its default (30 s), every policy setting too.
Before deadlines counted from an agent's start (``bus.orchestrator.deadlines``) and
runs were admitted (``admission``), 0 of 2,000 completed (6,000 ``task.timed_out``).

Printed per backend: runs completed, failed and raised, tasks completed more than once,
``task.timed_out`` events, the wall time, and met/MISSED against the target "all
complete, each task once".

    .venv/bin/python bench/overload_bench.py [--runs 2000] [--nats-runs 500] [--work 0.05]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from summary import record  # the figures for bench/summary.py ($CARDBUS_BENCH_JSON)

from cardbus.agents import Agent, Capability
from cardbus.bus.orchestrator.core import RunResult
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.bus.runtime.nats import LocalNatsServer, NatsRuntime
from cardbus.eventstore import Envelope, EventStore, SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.eventstore.nats.connection import NatsOptions

STEPS = ("step1", "step2", "step3")


class N(msgspec.Struct):
    n: int


def agents(work: float) -> list[type[Agent]]:
    async def handle(self: Agent, task: Any, inputs: N, ctx: Any) -> N:
        await asyncio.sleep(work)
        return N(n=inputs.n + 1)

    return [
        type(
            s, (Agent,), {"agent_id": s, "capabilities": [Capability(s, N, N, s)], "handle": handle}
        )
        for s in STEPS
    ]


def chain(plan_id: str) -> dict[str, Any]:
    tasks: list[dict[str, Any]] = [{"id": "s1", "capability": "step1", "inputs": {"n": 0}}]
    for i in (2, 3):
        dep = f"s{i - 1}"
        tasks.append(
            {
                "id": f"s{i}",
                "capability": f"step{i}",
                "deps": [dep],
                "inputs": {"n": {"$dep": dep, "path": "n"}},
            }
        )
    return {"plan_id": plan_id, "goal": "overload", "tasks": tasks}


async def _log(store: EventStore) -> list[Envelope]:
    out: list[Envelope] = []
    while True:
        page = await store.read_all(out[-1].position + 1 if out else 1, 5000)
        out += page
        if len(page) < 5000:
            return out


def _report(
    backend: str, runs: int, outcomes: list[Any], events: list[Envelope], wall: float
) -> dict[str, Any]:
    done = [o for o in outcomes if isinstance(o, RunResult) and o.status == "completed"]
    raised = [o for o in outcomes if isinstance(o, BaseException)]
    completions = Counter(e.stream for e in events if isinstance(e.data, ev.TaskCompleted))
    twice = sum(1 for n in completions.values() if n > 1)
    timed_out = sum(1 for e in events if isinstance(e.data, ev.TaskTimedOut))
    met = len(done) == runs and twice == 0 and len(completions) == 3 * runs
    print(
        f"{backend}: {len(done)}/{runs} runs completed, {len(outcomes) - len(done) - len(raised)}"
        f" failed, {len(raised)} raised; {len(completions)} tasks completed, {twice} twice;"
        f" {timed_out} task.timed_out; {wall:.1f} s wall ({runs / wall:.1f} runs/s)"
        f"  target all complete once: {'met' if met else 'MISSED'}"
    )
    if raised:
        print(f"  first raised: {raised[0]!r}")
    bench = "overload"
    target = f"all {runs} complete, each task once"
    record(
        None,
        bench,
        f"{backend}: runs completed of {runs}",
        len(done),
        "runs",
        target=target,
        met=met,
        why=(
            f"{len(done)} completed, {len(raised)} raised, {timed_out} task.timed_out"
            + (f"; the first raised: {raised[0]!r}" if raised else "")
        ),
    )
    record(
        None,
        bench,
        f"{backend}: tasks completed twice",
        twice,
        "tasks",
        target="0",
        met=twice == 0,
        why=f"{twice} of the {len(completions)} tasks completed more than once; a task's"
        " timeline: `cardbus replay`",
    )
    record(None, bench, f"{backend}: task.timed_out", timed_out, "events")
    record(None, bench, f"{backend}: wall time for {runs} runs", wall, "s")
    return {"met": met}


async def embedded(runs: int, work: float) -> bool:
    with tempfile.TemporaryDirectory(prefix="cardbus-overload-") as tmp:
        store = await SqliteEventStore.open(Path(tmp) / "overload.db")
        try:
            async with EmbeddedRuntime(store, agents(work)) as rt:
                t = time.perf_counter()
                outcomes = await asyncio.gather(
                    *(rt.run(chain(f"e{i}"), timeout=None) for i in range(runs)),
                    return_exceptions=True,
                )
                wall = time.perf_counter() - t
            events = await _log(store)
        finally:
            await store.close()
    return bool(_report("embedded (SQLite)", runs, list(outcomes), events, wall)["met"])


async def nats(runs: int, work: float) -> bool:
    server = LocalNatsServer().start()
    try:
        async with NatsRuntime(NatsOptions(url=server.url), agents(work)) as rt:
            await rt.wait_for_capabilities(STEPS, 60)
            orch = rt.orchestrator

            async def one(i: int) -> RunResult:
                return await orch.wait(await rt.submit(chain(f"n{i}")))

            t = time.perf_counter()
            outcomes = await asyncio.gather(*(one(i) for i in range(runs)), return_exceptions=True)
            wall = time.perf_counter() - t
            events = await _log(orch.store)
    finally:
        server.stop()
    return bool(_report("NATS", runs, list(outcomes), events, wall)["met"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=2000, help="runs at once, embedded")
    p.add_argument("--nats-runs", type=int, default=500, help="runs at once on NATS (0: skip)")
    p.add_argument("--work", type=float, default=0.05, help="seconds each agent takes")
    args = p.parse_args()
    ok = asyncio.run(embedded(args.runs, args.work))
    if args.nats_runs:
        ok = asyncio.run(nats(args.nats_runs, args.work)) and ok
    print("every target met" if ok else "target MISSED")


if __name__ == "__main__":
    main()
