"""A decision's cards go out before its stored events are folded (``bus.orchestrator.sending``),
so the agent sent to begins first; nothing it replies is lost.

* An agent that reports its start at once (``started_after_s=0``) sends ``Started`` as its
  handler begins, while the first task's creation (in-process bus) or a later task's
  dispatch may be unfolded yet: it is recorded, once, before the result, for every task.
* A card sent whose dispatch is not folded yet stays among the attempts this process's
  agents hold (``_sent``, given back on a stop) when that set is compacted.
"""

from __future__ import annotations

import asyncio
from typing import Any

from orchkit import FAST, make_agent, plan, run_log, task, tid

from cardbus.agents.cards import TaskCard
from cardbus.bus import InProcessBus, Orchestrator
from cardbus.bus.runtime.worker import AgentWorker
from cardbus.eventstore import SqliteEventStore, TaskState


async def test_a_start_reported_at_once_is_recorded_for_every_task(
    make_runtime: Any, store: SqliteEventStore
) -> None:
    rt = await make_runtime([make_agent("a")], started_after_s=0)
    for _ in range(3):  # the first task's creation and the later dispatches, more than once
        three = plan(task("one"), task("two", deps=["one"]), task("three", deps=["two"]))
        result = await rt.run(three)
        assert result.status == "completed", result
        log = await run_log(store, result.root_id)
        for name in ("one", "two", "three"):
            tags = log.tags(tid(result.root_id, name))
            assert tags == ["created", "dispatched", "started", "result_submitted", "completed"]


async def test_a_card_sent_before_its_dispatch_is_folded_stays_held(
    store: SqliteEventStore,
) -> None:
    bus = InProcessBus()
    orch = Orchestrator(store, bus, FAST, attempts_survive_restart=False)  # embedded
    await orch.start()
    try:
        orch._sent = {(f"settled-{i}", 1) for i in range(5000)}  # none of them in flight
        card = TaskCard(task_id="unfolded", root_id="unfolded", capability="echo", attempt=1)
        await orch._send_cards([("a", card)])  # past 4,096 held: the set is compacted
        assert orch._sent == {("unfolded", 1)}
    finally:
        orch._sent = set()  # nothing of this test's to give back
        await orch.stop()
        await bus.close()


class _OverTheNetwork(InProcessBus):
    """A bus whose send waits (as NATS waits for the server's ack): one card's send is
    held until the test lets it go."""

    local_delivery = False

    def __init__(self) -> None:
        super().__init__()
        self.held = asyncio.Event()
        self.go = asyncio.Event()

    async def send_task(self, agent_id: str, card: TaskCard) -> None:
        if card.task_id.startswith("two-"):
            self.held.set()
            await self.go.wait()
        await super().send_task(agent_id, card)


async def test_over_a_network_what_a_decision_stored_is_folded_before_its_send_ends(
    store: SqliteEventStore,
) -> None:
    """Folded after a send that waits on a server (a restart, an election), the state lagged
    the log for as long: ``wait`` and ``caught_up`` saw neither the dispatch nor what was
    written with it."""
    bus = _OverTheNetwork()
    orch = Orchestrator(store, bus, FAST)
    worker = AgentWorker(bus, make_agent("a"))
    await orch.start()
    try:
        await orch.register(worker.agent.card())
        await worker.start()
        root = await orch.submit(plan(task("one"), task("two", deps=["one"])))
        await asyncio.wait_for(bus.held.wait(), 10)  # two's card is being sent
        assert orch.state.tasks[tid(root, "two")].state is TaskState.DISPATCHED
        bus.go.set()
        result = await orch.wait(root, 10)
        assert result.status == "completed", result
    finally:
        bus.go.set()
        await worker.stop()
        await orch.stop()
        await bus.close()
