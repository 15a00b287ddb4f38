"""A schedule on two NATS members (issue 32 item 3; real nats-server): every due time
fires once across the members, also after the member that fired last stops (the other
goes on; checked from the log's firing events). The 60 s version, with a kill -9 of a
`cardbus orchestrator` process, is ``bench/schedules_bench.py``."""

from __future__ import annotations

import asyncio

import msgspec

from cardbus import Agent, Capability, TaskCard, TaskContext
from cardbus.bus.orchestrator.scheduler import create_schedule
from cardbus.bus.orchestrator.schedules import stream_of
from cardbus.bus.runtime.nats import NatsRuntime
from cardbus.eventstore import events as ev
from cardbus.eventstore.nats.connection import NatsOptions


class Text(msgspec.Struct):
    text: str


class Echo(Agent):
    agent_id = "echo"
    capabilities = [Capability("echo", Text, Text, "answer the text")]

    async def handle(self, task: TaskCard, inputs: Text, ctx: TaskContext) -> Text:
        return Text(text=inputs.text)


PLAN = {"goal": "echo", "tasks": [{"id": "e", "capability": "echo", "inputs": {"text": "x"}}]}


def member(name: str, nats_url: str) -> NatsRuntime:
    # on a busy machine a member may look late: a late due time still fires (catch-up all)
    options = {"tick": 0.1, "grace": 3.0}
    return NatsRuntime(
        NatsOptions(url=nats_url), [Echo], name=f"sched-{name}", scheduler_options=options
    )


async def firings(rt: NatsRuntime, sid: str, at_least: int) -> list[ev.ScheduleFired]:
    """The schedule's firings once there are ``at_least`` (a condition on the log)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + 60
    while True:
        events = await rt.store.read_stream(stream_of(sid))
        fired = [e.data for e in events if isinstance(e.data, ev.ScheduleFired)]
        if len(fired) >= at_least or loop.time() > end:
            return fired
        await asyncio.sleep(0.1)


def name_of(rt: NatsRuntime) -> str:
    assert rt.scheduler is not None  # running
    return rt.scheduler.member


async def test_two_members_fire_each_due_time_once_also_when_one_stops(nats_url: str) -> None:
    members = [member("a", nats_url), member("b", nats_url)]
    running: list[NatsRuntime] = []
    try:
        for rt in members:
            await rt.__aenter__()
            running.append(rt)
        names = {name_of(rt): rt for rt in members}
        sid = await create_schedule(
            members[0].store, PLAN, interval_seconds=1, overlap="allow_all", catchup="all"
        )
        before = await firings(members[0], sid, 5)
        assert {f.member for f in before} <= set(names)
        stopping = names[before[-1].member]  # the member that fired last stops
        staying = next(rt for rt in members if rt is not stopping)
        kept = name_of(staying)
        running.remove(stopping)
        await stopping.__aexit__(None, None, None)
        fired = await firings(staying, sid, len(before) + 4)
    finally:
        for rt in running:
            await rt.__aexit__(None, None, None)
    dues = [f.due for f in fired]
    assert len(fired) >= len(before) + 4
    assert len(dues) == len(set(dues)), "a due time fired twice"
    steps = [d - dues[0] for d in dues]  # 1 s apart: none missed, none out of order
    assert all(abs(s - k) < 1e-6 for k, s in enumerate(steps)), steps
    # after the stop, only the member that stayed fires (the first may be the stopping one's)
    assert {f.member for f in fired[len(before) + 1 :]} == {kept}
