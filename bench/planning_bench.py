"""What planning a goal costs (events, ms), against the same run from a hand-written plan.

Three ways to run the demo's report pipeline (research -> outline -> write,
reviewed), each ``--runs`` times on one embedded runtime, in the same process:

* ``hand-written``: the plan the rule planner produces, given as tasks;
* ``rule planner``: the goal alone, planned by ``RulePlanner`` (no model);
* ``LLM planner (mock)``: the goal alone, planned by ``LLMPlanner`` on the
  deterministic ``MockLLM`` answering with that same plan (so the runs match
  and only planning differs; a real model adds its latency on top).

For each: the median wall time of a whole run (submit to result), the events
it wrote, and the planning alone (run.started to plan.accepted, and the
events up to it); then each planned run's ratio to the hand-written one.

    .venv/bin/python bench/planning_bench.py [--runs 30] [--sqlite]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cardbus.agents.demo import DEMO_AGENTS
from cardbus.agents.llm import MockLLM
from cardbus.agents.planning import LLMPlanner, RulePlanner
from cardbus.bus.runtime.embedded import EmbeddedRuntime, plan_goal
from cardbus.eventstore import EventStore, MemoryEventStore, SqliteEventStore
from cardbus.eventstore import events as ev

sys.path.insert(0, str(Path(__file__).resolve().parent))

from summary import record  # the figures for bench/summary.py ($CARDBUS_BENCH_JSON)

GOAL = "Write a short report on tides"
SESSION = {"user": "bench", "preferences": {"report_format": "markdown"}}


async def _store(sqlite: bool, folder: str, name: str) -> EventStore:
    if sqlite:
        return await SqliteEventStore.open(Path(folder) / f"{name}.db")
    return MemoryEventStore()


async def measure(
    name: str,
    plan: dict[str, Any],
    agents: list[Any],
    runs: int,
    sqlite: bool,
    folder: str,
    llm: Any = None,
) -> dict[str, Any]:
    store = await _store(sqlite, folder, name.split()[0])
    walls, events, plan_ms, plan_events = [], [], [], []
    try:
        async with EmbeddedRuntime(store, agents, llm=llm, default_planner=False) as rt:
            for _ in range(runs):
                started = time.perf_counter()
                result = await rt.run(plan, timeout=60)
                walls.append((time.perf_counter() - started) * 1000)
                assert result.status == "completed", (name, result)
                log = await store.read_correlation(result.root_id)
                events.append(len(log))
                accepted = [e for e in log if isinstance(e.data, ev.PlanAccepted)]
                if accepted:
                    begin = next(e for e in log if isinstance(e.data, ev.RunStarted))
                    plan_ms.append((accepted[0].recorded_at - begin.recorded_at) * 1000)
                    plan_events.append(sum(1 for e in log if e.position <= accepted[0].position))
    finally:
        await store.close()
    return {
        "name": name,
        "ms": statistics.median(walls),
        "events": statistics.median(events),
        "plan_ms": statistics.median(plan_ms) if plan_ms else 0.0,
        "plan_events": statistics.median(plan_events) if plan_events else 0,
    }


async def main(runs: int, sqlite: bool) -> None:
    planned = await plan_goal({"goal": GOAL}, DEMO_AGENTS)
    assert planned.plan is not None, planned
    tasks = [json.loads(json.dumps(_task(t))) for t in planned.plan.tasks]
    hand = {"goal": GOAL, "session": SESSION, "tasks": tasks}
    goal = {"goal": GOAL, "session": SESSION}
    answer = json.dumps({"goal": GOAL, "tasks": tasks})

    def respond(prompt: str) -> str | None:  # the "model": the plan for the planner
        return answer if "input_schema" in prompt else None

    with tempfile.TemporaryDirectory() as folder:
        rows = [
            await measure("hand-written", hand, list(DEMO_AGENTS), runs, sqlite, folder),
            await measure("rule planner", goal, [*DEMO_AGENTS, RulePlanner], runs, sqlite, folder),
            await measure(
                "LLM planner (mock)",
                goal,
                [*DEMO_AGENTS, LLMPlanner],
                runs,
                sqlite,
                folder,
                llm=_Mock(respond),
            ),
        ]
    base = rows[0]
    store = "SQLite file (synchronous=FULL)" if sqlite else "in-memory store"
    print(f"goal {GOAL!r}: {len(tasks)} tasks; {runs} runs each on the {store}; medians\n")
    print(
        f"{'':<20} {'run ms':>8} {'events':>7} {'planning ms':>12} {'planning events':>16}"
        f" {'ms ratio':>9} {'events ratio':>13}"
    )
    for r in rows:
        print(
            f"{r['name']:<20} {r['ms']:>8.1f} {r['events']:>7.0f} {r['plan_ms']:>12.1f}"
            f" {r['plan_events']:>16.0f} {r['ms'] / base['ms']:>8.2f}x"
            f" {r['events'] / base['events']:>12.2f}x"
        )
    where = "SQLite" if sqlite else "memory"
    for r in rows:
        planned_row = r is not base
        record(
            None,
            "planning",
            f"run of the report goal, {r['name']}, {where}",
            r["ms"],
            "ms",
            **({"ratio": r["ms"] / base["ms"], "ratio_of": "hand-written"} if planned_row else {}),
        )
        record(
            None,
            "planning",
            f"events per run, {r['name']}",
            r["events"],
            "events",
            **(
                {"ratio": r["events"] / base["events"], "ratio_of": "hand-written"}
                if planned_row
                else {}
            ),
        )
        if planned_row:
            record(None, "planning", f"planning alone, {r['name']}", r["plan_ms"], "ms")


class _Mock(MockLLM):
    """``MockLLM`` answering the planner with the plan, every other call as ``MockLLM`` does
    without ``respond`` (an instance of the asked output schema: the demo's LLM agents
    want structured output)."""

    def __init__(self, plan_for: Any) -> None:
        super().__init__()
        self.plan_for = plan_for

    async def chat(self, messages: Any, **kw: Any) -> Any:
        prompt = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
        text = self.plan_for(prompt)
        self.respond = None if text is None else (lambda _p: text)
        return await super().chat(messages, **kw)

    async def complete(self, prompt: str, *, system: str = "") -> Any:
        text = self.plan_for(prompt)
        self.respond = (lambda _p: text) if text is not None else (lambda p: f"[mock] {p[:80]}")
        return await super().complete(prompt, system=system)


def _task(t: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"id": t.id, "capability": t.capability, "goal": t.goal}
    if t.inputs:
        out["inputs"] = t.inputs
    if t.deps:
        out["deps"] = t.deps
    if t.review_by:
        out["review_by"] = t.review_by
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--sqlite", action="store_true", help="a SQLite file instead of memory")
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.sqlite))
