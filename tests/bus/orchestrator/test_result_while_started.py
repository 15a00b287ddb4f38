"""A result that arrives while its attempt's ``task.started`` is being written is decided
once, after that commit (``bus.orchestrator.reply_intake``), not first looked at on the
state before it, deferred and decided again: at 1,000 runs in flight that was about
every other result, and each look a second decision of the same reply.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from orchkit import FAST, make_agent, plan, task, tid

from cardbus.agents.cards import ResultCard, TaskCard
from cardbus.bus.orchestrator.replies import Replies
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev

#: no clock ticks during a test: each would look at every open run
QUIET_CLOCK = dataclasses.replace(FAST, tick_s=60)


def _started_only(appends: Any) -> bool:
    return all(all(type(e.data) is ev.TaskStarted for e in a.events) for a in appends)


async def test_a_result_during_its_start_commit_is_decided_once(
    store: SqliteEventStore, make_runtime: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = asyncio.Event()

    async def gated(card: TaskCard, inputs: Any, ctx: Any) -> dict[str, str]:
        await gate.wait()
        return {"text": inputs.text}

    rt = await make_runtime(
        [make_agent("echo", handler=gated)], policy=QUIET_CLOCK, started_after_s=0.2
    )
    decided: list[str] = []  # task id of each result the decider is handed
    on_reply = Replies.on_reply

    def counting(self: Replies, reply: Any) -> None:
        if isinstance(reply, ResultCard):
            decided.append(reply.task_id)
        on_reply(self, reply)

    monkeypatch.setattr(Replies, "on_reply", counting)
    writing, held = asyncio.Event(), asyncio.Event()
    append_many = store.append_many

    async def holding(appends: Any) -> Any:
        if _started_only(appends):
            writing.set()
            await held.wait()  # the start's append stays in flight
        return await append_many(appends)

    store.append_many = holding  # type: ignore[method-assign]
    taken = asyncio.Event()
    step = rt.orch._step

    async def noting_results(items: list[object]) -> None:
        await step(items)
        if any(isinstance(x, ResultCard) for x in items):
            taken.set()

    rt.orch._step = noting_results
    root = await rt.orch.submit(plan(task("a")))
    try:
        await asyncio.wait_for(writing.wait(), 5)
        gate.set()  # the result comes back while the start is still being written
        await asyncio.wait_for(taken.wait(), 5)
        assert decided == []  # taken by a step, not decided on the state before the start
    finally:
        held.set()  # else the runtime's stop waits for the held append
    result = await rt.orch.wait(root, 10)
    assert result.status == "completed"
    assert decided == [tid(root, "a")]  # once, after the start's commit
    kinds = [type(e.data) for e in await store.read_stream(tid(root, "a"))]
    assert kinds.count(ev.TaskStarted) == 1
    assert kinds.count(ev.TaskResultSubmitted) == 1
