"""``needs_retry`` on an agent's result is honoured (issue 26, item 6)."""

from __future__ import annotations

from pathlib import Path

import msgspec

from cardbus.agents.agent import Agent, Capability, TaskContext
from cardbus.agents.cards import TaskCard
from cardbus.bus.orchestrator import Policy, RetryPolicy
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev


class Q(msgspec.Struct, frozen=True):
    q: str


class A(msgspec.Struct, frozen=True):
    a: str


class Provisional(Agent):
    """Answers, but asks for another attempt until its third."""

    agent_id = "provisional"
    capabilities = [Capability("answer", Q, A)]

    async def handle(self, task: TaskCard, inputs: Q, ctx: TaskContext) -> A:
        if task.attempt < 3:
            ctx.needs_retry = True
            ctx.notes = "the index was still warming up"
        return A(f"{inputs.q}#{task.attempt}")


PLAN = {"goal": "g", "tasks": [{"id": "t", "capability": "answer", "inputs": {"q": "x"}}]}


async def _run(tmp_path: Path, max_attempts: int) -> tuple[object, list[object]]:
    store = await SqliteEventStore.open(tmp_path / f"c{max_attempts}.db")
    policy = Policy(
        retry=RetryPolicy(initial_interval_s=0.0, jitter=0.0, max_attempts=max_attempts)
    )
    try:
        async with EmbeddedRuntime(store, [Provisional], policy=policy) as rt:
            result = await rt.run(PLAN, timeout=30)
            task_id = rt.orchestrator.state.runs[result.root_id].names["t"]
        return result, [e.data for e in await store.read_stream(task_id)]
    finally:
        await store.close()


async def test_needs_retry_is_retried_and_the_last_answer_kept(tmp_path: Path) -> None:
    result, events = await _run(tmp_path, 3)
    assert result.status == "completed", result  # type: ignore[attr-defined]
    assert result.outputs == {"t": {"a": "x#3"}}  # type: ignore[attr-defined]
    retries = [d for d in events if isinstance(d, ev.TaskRetryScheduled)]
    assert [r.reason for r in retries] == ["needs_retry: the index was still warming up"] * 2
    submitted = [d for d in events if isinstance(d, ev.TaskResultSubmitted)]
    assert [s.needs_retry for s in submitted] == [True, True, False]


async def test_needs_retry_with_no_attempt_left_fails_naming_it(tmp_path: Path) -> None:
    result, events = await _run(tmp_path, 2)
    assert result.status == "failed"  # type: ignore[attr-defined]
    (failed,) = [d for d in events if isinstance(d, ev.TaskFailed)]
    assert failed.reason == "needs_retry" and "warming up" in failed.error
