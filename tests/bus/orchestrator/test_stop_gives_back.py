"""An embedded process that stops gives back every attempt it dispatched, even one whose
dispatch was still being written when the stop began.

Two ``cardbus run`` processes on one file decide each other's runs and send the cards to
their own agents. When one stops (its own run done), the attempts its agents held are
recorded as host losses, so the other process retries them at once. A dispatch whose
append was in flight as the stop began was written after the give-back looked, sent to
agents already gone, and never given back: the other process (whose agent of the same
id is live) waited on it until its run's limit: a wedge that fits issue 30's
two-process test beside busy loops (``cardbus run`` hit its 60 s), found by reading
the stop path; the failure itself left no log to confirm it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from orchkit import FAST, make_agent, plan, run_log, task, tid, wait_for

from cardbus.agents.cards import ResultCard
from cardbus.bus import InProcessBus, Orchestrator
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.eventstore.store import Append


def _gate_dispatch_of(store: SqliteEventStore, stream: str) -> tuple[asyncio.Event, asyncio.Event]:
    """Hold the append that dispatches ``stream`` until ``release`` is set; ``held`` says
    it is being held (the decision is made, its write in flight)."""
    held, release = asyncio.Event(), asyncio.Event()
    append_many = store.append_many

    async def gated(appends: Sequence[Append]) -> list[Any]:
        if any(
            a.stream == stream and any(isinstance(e.data, ev.TaskDispatched) for e in a.events)
            for a in appends
        ):
            held.set()
            await release.wait()
        return await append_many(appends)

    store.append_many = gated  # type: ignore[method-assign]
    return held, release


async def test_a_dispatch_written_while_stopping_is_given_back(store: SqliteEventStore) -> None:
    bus = InProcessBus()
    # embedded: its agents live and die with it
    orch = Orchestrator(store, bus, FAST, attempts_survive_restart=False)
    await orch.start()
    stopping: asyncio.Task[None] | None = None
    try:
        await orch.register(make_agent("a").card())  # no worker: the test answers for it
        root = await orch.submit(plan(task("one", timeout_s=60), task("two", deps=["one"])))
        one, two = tid(root, "one"), tid(root, "two")
        held, release = _gate_dispatch_of(store, two)
        await wait_for(store, lambda e: isinstance(e.data, ev.TaskDispatched) and e.stream == one)
        await bus.reply(
            ResultCard(
                task_id=one, attempt=1, agent_id="a", status="completed", output={"text": "one"}
            )
        )
        await held.wait()  # "two" is decided and dispatched; the write is in flight
        stopping = asyncio.create_task(orch.stop())
        while not orch._stopping:  # the stop has begun (and looked at what it sent)
            await asyncio.sleep(0)
        release.set()
        await asyncio.wait_for(stopping, 10)  # a wedge here is the bug too, with a reason
    finally:
        if stopping is None:
            await orch.stop()
    log = await run_log(store, root)
    dispatched = [e.attempt for e in log.of(ev.TaskDispatched, two)]
    lost = [(e.attempt, e.reason) for e in log.of(ev.TaskTimedOut, two)]
    # written, sent to this process's agents, and given back as a host loss: another
    # process on the log retries it at once instead of waiting on it
    assert dispatched == [1]
    assert lost == [(1, "host_lost")]
    retry = log.of(ev.TaskRetryScheduled, two)
    assert retry and retry[0].reason.startswith("host_lost")
