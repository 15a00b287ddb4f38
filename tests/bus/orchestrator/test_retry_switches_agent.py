"""A retry prefers another capable agent when the last attempt failed (issue 26, item 6)."""

from __future__ import annotations

from pathlib import Path

from sales_agents import FlakySales, SteadySales

from cardbus.bus.orchestrator import Policy, RetryPolicy
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev

PLAN = {
    "goal": "sales",
    "tasks": [
        {"id": "q", "capability": "sales_query", "inputs": {"region": "East", "period": "2026-10"}}
    ],
}


async def test_a_task_whose_agent_always_fails_completes_on_the_other_within_the_run(
    tmp_path: Path,
) -> None:
    store = await SqliteEventStore.open(tmp_path / "c.db")
    policy = Policy(retry=RetryPolicy(initial_interval_s=0.0, jitter=0.0))
    try:
        async with EmbeddedRuntime(store, [FlakySales, SteadySales], policy=policy) as rt:
            result = await rt.run(PLAN, timeout=30)
            task_id = rt.orchestrator.state.runs[result.root_id].names["q"]
        assert result.status == "completed", result
        assert result.outputs["q"]["region"] == "East"
        events = [e.data for e in await store.read_stream(task_id)]
    finally:
        await store.close()
    dispatched = [d for d in events if isinstance(d, ev.TaskDispatched)]
    # the first attempt goes to flaky-sales (the tie is broken by id), the retry to the other
    assert [d.agent_id for d in dispatched] == ["flaky-sales", "steady-sales"]
    penalties = {c.agent_id: c.recent_failures for c in dispatched[1].candidates}
    assert penalties == {"flaky-sales": 1.0, "steady-sales": 0.0}
    (completed,) = [d for d in events if isinstance(d, ev.TaskCompleted)]
    assert completed.agent_id == "steady-sales"
