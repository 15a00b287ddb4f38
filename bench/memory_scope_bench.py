"""Long-term memory by scope: what a scoped read costs, and what reuse saves.

    .venv/bin/python bench/memory_scope_bench.py [--records 20000] [--tenants 100] [--runs 50]

1. Reads of the fold (``projections.memory``) holding ``--records`` records over
   ``--tenants`` tenants (a user each, plus global records): ``get``, ``list``
   and ``search`` through a run's scope chain against the operator's view of
   every scope; mean microseconds per call.
2. ``--runs`` runs of a 3-task pipeline (each task's agent waits 20 ms, as a
   short model call would) on the embedded runtime and an SQLite log, for one
   tenant: without reuse, then with ``ReusePolicy(keep=True, reuse=True)``
   (the first run fills memory, the rest are answered from it): agent calls
   and wall time per run.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cardbus.agents.agent import Agent, Capability, TaskContext
from cardbus.agents.cards import TaskCard
from cardbus.agents.embedding import HashingEmbedder
from cardbus.bus.orchestrator.plan import Plan, PlanTask
from cardbus.bus.orchestrator.reuse import ReusePolicy
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import Envelope, SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.projections.memory import MEMORY_STREAM, MemoryFold
from cardbus.projections.scope import scope_chain, scope_of


def fold_of(records: int, tenants: int) -> MemoryFold:
    fold = MemoryFold()
    for i in range(records):
        t = i % (tenants + 1)
        scope = "global" if t == tenants else scope_of("u" if i % 2 else "", f"t{t}")
        data = ev.MemoryWritten(
            key=f"k{i % 50}", value=i, text=f"note {i} about topic {i % 37}", scope=scope
        )
        fold.apply(
            Envelope(
                event_id=str(i),
                stream=MEMORY_STREAM,
                version=i + 1,
                recorded_at=1.0,
                correlation_id=MEMORY_STREAM,
                data=data,
            )
        )
    return fold


def per_call_us(fn: Any, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


class Step(Agent):
    agent_id = "step"
    capabilities = [Capability("step", dict, dict)]
    calls: ClassVar[int] = 0

    async def handle(self, task: TaskCard, inputs: dict, ctx: TaskContext) -> dict:
        type(self).calls += 1
        await asyncio.sleep(0.02)
        return {"n": inputs["n"] + 1}


def pipeline() -> Plan:
    return Plan(
        goal="pipeline",
        tenant="acme",
        tasks=[
            PlanTask(id="a", capability="step", inputs={"n": 1}),
            PlanTask(
                id="b", capability="step", deps=["a"], inputs={"n": {"$dep": "a", "path": "n"}}
            ),
            PlanTask(
                id="c", capability="step", deps=["b"], inputs={"n": {"$dep": "b", "path": "n"}}
            ),
        ],
    )


async def runs(runs: int, reuse: ReusePolicy | None) -> tuple[int, float]:
    Step.calls = 0
    with tempfile.TemporaryDirectory(dir=".") as d:
        store = await SqliteEventStore.open(Path(d) / "scope-bench.db")
        try:
            async with EmbeddedRuntime(store, [Step], reuse=reuse) as rt:
                start = time.perf_counter()
                for _ in range(runs):
                    result = await rt.run(pipeline())
                    assert result.outputs["c"] == {"n": 4}, result
                wall = time.perf_counter() - start
        finally:
            await store.close()
    return Step.calls, wall / runs * 1000


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--tenants", type=int, default=100)
    ap.add_argument("--runs", type=int, default=50)
    args = ap.parse_args()
    fold = fold_of(args.records, args.tenants)
    chain = scope_chain("u", "t7")
    emb = HashingEmbedder()
    fold.search("warm", emb, scopes=None)  # vectors cached, as a long-lived reader has them
    print(f"fold: {args.records:,} records over {args.tenants} tenants (+ global)")
    for name, scopes in (("chain of one user", chain), ("every scope", None)):
        g = per_call_us(lambda s=scopes: fold.get("k7", s), 2000)
        n = len(fold.list(scopes=scopes))
        lst = per_call_us(lambda s=scopes: fold.list(scopes=s), 20)
        srch = per_call_us(lambda s=scopes: fold.search("topic 5", emb, scopes=s), 20)
        print(
            f"  {name:<18} get {g:8.1f} us   list ({n:>6} records) {lst:9.0f} us"
            f"   search {srch:9.0f} us"
        )
    for label, policy in (
        ("no reuse", None),
        ("reuse", ReusePolicy(keep=True, reuse=True)),
    ):
        calls, ms = await runs(args.runs, policy)
        print(f"{args.runs} runs, {label:<8}: {calls:>4} agent calls, {ms:6.1f} ms per run")


if __name__ == "__main__":
    asyncio.run(main())
