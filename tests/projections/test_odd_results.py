"""Projections never crash on odd values in the log: stats and rebuild always work.

They are pure folds over whatever the log holds, including results written
before the orchestrator checked token ranges (2**64 tokens, negative counts),
outputs of any JSON shape, odd agent ids and statuses, times out of order.
Random result cards are appended through the store's public API and folded
through the projections' public API (``cardbus stats``, ``cardbus rebuild``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cardbus.eventstore import MemoryEventStore, NewEvent
from cardbus.eventstore import events as ev
from cardbus.eventstore.batch import MAX_TOKENS
from cardbus.projections import (
    AgentStats,
    Cost,
    ProjectionRunner,
    Quality,
    Runs,
    TaskTable,
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
tokens = st.integers(min_value=-(2**70), max_value=2**70)
agent_ids = st.sampled_from(["a", "b", "", "x" * 300, "é☃", "agent.with.dots"])
statuses = st.sampled_from(["completed", "failed", "needs_input", "rejected", "", "weird"])

result = st.builds(
    dict,
    agent_id=agent_ids,
    status=statuses,
    output=json_values,
    confidence=st.floats(min_value=-10, max_value=10),
    usage=st.builds(ev.Usage, input_tokens=tokens, output_tokens=tokens),
    duration_s=st.floats(min_value=-1e12, max_value=1e12),
    attempt=st.integers(min_value=-3, max_value=2**70),
    recorded_at=st.floats(min_value=-1e10, max_value=1e11),
    then=st.sampled_from(["completed", "failed", "timed_out", "rejected", "none"]),
)


async def append_results(store: MemoryEventStore, results: list[dict[str, Any]]) -> None:
    root = "root-1"
    await store.append(
        root,
        [NewEvent(data=ev.RunStarted(goal="g", plan_id="p", task_ids=[]), correlation_id=root)],
        0,
    )
    for i, r in enumerate(results):
        stream = f"t{i}"
        at = r["recorded_at"]
        data: list[ev.Event] = [
            ev.TaskCreated(capability="echo", root_id=root, plan_id=stream),
            ev.TaskDispatched(attempt=r["attempt"], agent_id=r["agent_id"]),
            ev.TaskResultSubmitted(
                attempt=r["attempt"],
                agent_id=r["agent_id"],
                status=r["status"],
                output=r["output"],
                confidence=r["confidence"],
                usage=r["usage"],
                duration_s=r["duration_s"],
            ),
        ]
        match r["then"]:
            case "completed":
                data.append(
                    ev.TaskCompleted(
                        attempt=r["attempt"], agent_id=r["agent_id"], output=r["output"]
                    )
                )
            case "failed":
                data.append(ev.TaskFailed(reason="agent_error", attempts=r["attempt"]))
            case "timed_out":
                data.append(
                    ev.TaskTimedOut(attempt=r["attempt"], agent_id=r["agent_id"], deadline=at)
                )
            case "rejected":
                data.append(
                    ev.TaskRejected(attempt=r["attempt"], agent_id=r["agent_id"], reason="x")
                )
        events = [
            NewEvent(data=d, correlation_id=root, recorded_at=at + k) for k, d in enumerate(data)
        ]
        await store.append(stream, events, 0)


async def fold_everything(store: MemoryEventStore) -> list[Any]:
    """What stats, cost, tasks, quality and runs list, folded as the log came and then
    rebuilt: the two must be the same (rebuild is the fold from zero). Returns the listing."""
    runner = ProjectionRunner.open(store, ":memory:")
    try:
        await runner.catch_up()
        listings = []
        for _ in range(2):  # cardbus stats / cost / tasks / runs, then cardbus rebuild
            listings.append(
                [
                    AgentStats().all(runner.conn),
                    Cost().list(runner.conn),
                    Cost().list(runner.conn, "root"),
                    TaskTable().list(runner.conn),
                    Quality().list(runner.conn),
                    Runs().list(runner.conn),
                ]
            )
            await runner.rebuild()
    finally:
        runner.close()
    assert repr(listings[0]) == repr(listings[1])  # repr: NaN-safe equality of the rows
    return listings[0]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(result, min_size=1, max_size=6))
def test_stats_and_rebuild_work_over_any_results(results: list[dict[str, Any]]) -> None:
    async def go() -> None:
        store = MemoryEventStore()
        await append_results(store, results)
        _, _, _, tasks, _, runs = await fold_everything(store)
        assert len(tasks) == len(results)  # every task is in the table, however odd
        assert len(runs) == 1

    asyncio.run(go())


def test_tokens_past_any_integer_column_do_not_break_stats_or_rebuild() -> None:
    """The measured wedge: an agent reporting 2**64 tokens broke stats and rebuild for good."""
    one = {
        "agent_id": "a",
        "status": "completed",
        "output": {"text": "ok"},
        "confidence": 1.0,
        "usage": ev.Usage(input_tokens=2**64, output_tokens=2**64),
        "duration_s": 0.1,
        "attempt": 1,
        "recorded_at": 1.7e9,
        "then": "completed",
    }

    async def go() -> None:
        store = MemoryEventStore()
        await append_results(store, [one, one])
        _, _, per_root, _, _, _ = await fold_everything(store)
        # counted at the bound of the token range, not lost and not wrapped around
        assert [r["input_tokens"] for r in per_root] == [2 * MAX_TOKENS]

    asyncio.run(go())
