"""Run priority: a high-priority run submitted behind 2,000 queued runs starts first.

One ``EmbeddedRuntime`` on a SQLite file, ``Policy.max_runs_in_flight`` at its default
(500): 2,500 one-task runs are submitted while the agent holds every card it gets (500
in flight, 2,000 queued in the log), then two more: an urgent one (``priority`` 1) and,
the baseline measured in the same run, one of priority 0. The agent is let go at once
(each card then takes ``--work`` seconds, ``max_concurrency`` 50), and everything runs
to the end.

Printed, with met/MISSED: the seconds from the urgent run's submit to its dispatch
(target: within 5 s), and the runs dispatched before it among those that were queued
(target: fewer than the places in flight, i.e. it took the first free place; the
baseline run waits behind every one of them).

    .venv/bin/python -P bench/priority_bench.py [--queued 2000] [--work 0.005]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from summary import record  # the figures for bench/summary.py ($CARDBUS_BENCH_JSON)

from cardbus.agents import Agent, Capability
from cardbus.agents.cards import AgentConstraints
from cardbus.bus.orchestrator.policy import Policy
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev

IN_FLIGHT = Policy().max_runs_in_flight


class N(msgspec.Struct):
    n: int


def plan(plan_id: str, priority: int = 0) -> dict[str, Any]:
    task = {"id": "t", "capability": "work", "inputs": {"n": 0}, "timeout_s": 600}
    return {"plan_id": plan_id, "goal": "priority", "tasks": [task], "priority": priority}


async def bench(queued: int, work: float) -> bool:
    gate = asyncio.Event()

    class Worker(Agent):
        agent_id = "worker"
        capabilities = [Capability("work", N, N, "work")]
        constraints = AgentConstraints(max_concurrency=50)

        async def handle(self, task: Any, inputs: N, ctx: Any) -> N:
            await gate.wait()
            await asyncio.sleep(work)
            return N(n=inputs.n + 1)

    with tempfile.TemporaryDirectory(prefix="cardbus-priority-") as tmp:
        store = await SqliteEventStore.open(Path(tmp) / "priority.db")
        try:
            async with EmbeddedRuntime(store, [Worker], default_planner=False) as rt:
                orch = rt.orchestrator
                bulk = [await rt.submit(plan(f"bulk{i}")) for i in range(IN_FLIGHT + queued)]
                queue = set(orch.admission.queued(orch.state))  # not admitted: queued
                waiting = len(queue)
                t0 = time.monotonic()
                urgent = await rt.submit(plan("urgent", priority=1))
                baseline = await rt.submit(plan("baseline"))
                submitted = time.time()
                gate.set()
                results = [await orch.wait(r, None) for r in [urgent, baseline, *bulk]]
                wall = time.monotonic() - t0
            events = await store.read_all(1, 10_000_000)
        finally:
            await store.close()
    dispatched: dict[str, float] = {}  # root -> when its task was first dispatched
    order: dict[str, int] = {}  # root -> the log position of that dispatch
    for e in events:
        if isinstance(e.data, ev.TaskDispatched) and e.correlation_id not in order:
            dispatched[e.correlation_id] = e.recorded_at
            order[e.correlation_id] = e.position
    queued_roots = [r for r in bulk if r in queue]

    def before(root: str) -> int:
        return sum(1 for r in queued_roots if order[r] < order[root])

    seconds = dispatched[urgent] - submitted
    ahead, ahead_baseline = before(urgent), before(baseline)
    completed = sum(1 for r in results if r.status == "completed")
    checks = [
        (f"urgent run dispatched {seconds:.2f} s after its submit (target <= 5 s)", seconds <= 5),
        (
            f"runs of the queue dispatched before it: {ahead} (target < {IN_FLIGHT});"
            f" before the priority-0 baseline: {ahead_baseline}",
            ahead < IN_FLIGHT,
        ),
        (f"runs completed: {completed} of {len(results)}", completed == len(results)),
    ]
    print(
        f"{IN_FLIGHT} in flight, {waiting} queued when the urgent run was submitted;"
        f" all done in {wall:.1f} s"
    )
    for text, ok in checks:
        print(f"  {'met   ' if ok else 'MISSED'} {text}")
    name = "priority"
    record(
        None,
        name,
        "urgent run: s from submit to dispatch",
        seconds,
        "s",
        target="<= 5",
        met=seconds <= 5,
        why=f"{ahead} of {waiting} queued runs went first ({ahead_baseline} at priority 0)",
    )
    record(
        None,
        name,
        f"urgent run: queued runs dispatched before it (of {waiting})",
        ahead,
        "runs",
        target=f"< {IN_FLIGHT}",
        met=ahead < IN_FLIGHT,
        why=f"dispatched {seconds:.2f} s after its submission; at priority 0, {ahead_baseline}"
        " queued runs went first",
    )
    record(
        None, name, "priority-0 baseline: queued runs dispatched before it", ahead_baseline, "runs"
    )
    return waiting >= queued and all(ok for _, ok in checks)


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--queued", type=int, default=2000, help="runs queued behind those in flight")
    p.add_argument("--work", type=float, default=0.005, help="seconds each card takes")
    args = p.parse_args()
    ok = asyncio.run(bench(args.queued, args.work))
    print("every target met" if ok else "target MISSED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
