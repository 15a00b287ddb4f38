"""``CancelNotices`` and ``attempt_live`` on a folded log: which attempts are told to stop,
and what the worker's check hears (``bus.orchestrator.cancel_notices``)."""

from __future__ import annotations

import asyncio

from cardbus.agents.cards import CancelNotice
from cardbus.agents.requests import AgentRequest
from cardbus.bus.orchestrator.cancel_notices import CancelNotices, attempt_live
from cardbus.bus.orchestrator.runstate import RunState
from cardbus.bus.transport.inprocess import InProcessBus
from cardbus.eventstore import MemoryEventStore, NewEvent
from cardbus.eventstore import events as ev


class Told(InProcessBus):
    """Keeps the notices sent."""

    def __init__(self) -> None:
        super().__init__()
        self.told: list[CancelNotice] = []

    async def cancel_attempt(self, notice: CancelNotice) -> None:
        self.told.append(notice)


def ask(task_id: str, agent_id: str, attempt: int = 1) -> AgentRequest:
    return AgentRequest(
        request_id="q", task_id=task_id, attempt=attempt, agent_id=agent_id, kind="attempt.live"
    )


async def test_an_ended_task_stops_the_attempts_that_have_not_answered() -> None:
    store = MemoryEventStore()
    created = ev.TaskCreated(root_id="r", capability="c", fanout=2)
    to = [ev.TaskDispatched(attempt=1, agent_id=a) for a in ("a", "b")]
    answered = ev.TaskResultSubmitted(attempt=1, agent_id="b", status="completed")
    ends: dict[str, ev.Event] = {
        "halted": ev.TaskHalted(reason="budget_exceeded"),
        "cancelled": ev.TaskCancelled(reason="cancelled_by_user", whole_run=True),
        "never-sent": ev.TaskCancelled(reason="cancelled_by_user"),
    }
    for stream, end in ends.items():
        sent = [] if stream == "never-sent" else [*to, answered]
        events = [created, *sent, end]
        await store.append(
            stream, [NewEvent(data=d, correlation_id="r", actor="ops") for d in events], 0
        )
    state, bus = RunState(), Told()
    notices = CancelNotices(bus, state)
    before = {s: ask(s, "a") for s in ends}
    live_before = {s: attempt_live(state, q)["live"] for s, q in before.items()}
    for env in await store.read_all(0, 1000):
        state.apply(env)
        notices.observe(env)
    await asyncio.sleep(0)  # the sends are tasks of their own
    await asyncio.sleep(0)
    # only agent a, which had not answered; the task never dispatched tells nobody
    assert sorted((n.task_id, n.agent_id, n.attempt, n.reason, n.by) for n in bus.told) == [
        ("cancelled", "a", 1, "cancelled_by_user", "ops"),
        ("halted", "a", 1, "budget_exceeded", "ops"),
    ]
    assert live_before == {s: True for s in ends}  # unknown tasks: never stopped
    assert attempt_live(state, ask("cancelled", "a")) == {
        "live": False,
        "reason": "cancelled_by_user",
        "by": "ops",
    }
    assert attempt_live(state, ask("halted", "a")) == {
        "live": False,
        "reason": "budget_exceeded",
        "by": "",
    }
    # another agent learns nothing of a task not its own; a later attempt is not this one
    assert attempt_live(state, ask("cancelled", "intruder")) == {"live": True}
    assert attempt_live(state, ask("cancelled", "a", attempt=2)) == {"live": True}
