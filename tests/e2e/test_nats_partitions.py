"""Orchestrators sharing the runs by partition (``NatsRuntime(partitions=...)``,
``cardbus orchestrator --partitions``): every run decided by one process, and a killed
process's runs finished by the other once its leases lapse."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from natsprocs import (
    FAST_BUS,
    Proc,
    Quick,
    chain,
    check_log,
    count,
    env_for,
    per_task,
    read_log,
    slow_agent,
    until,
    verify,
)
from natsserver import NatsServer

from cardbus.agents import Agent
from cardbus.agents.cards import Announce
from cardbus.bus.orchestrator.digest import plan_digest
from cardbus.bus.orchestrator.partition import partition_of
from cardbus.bus.orchestrator.plan import Plan
from cardbus.bus.orchestrator.submission import submit_to_log
from cardbus.bus.runtime.nats import NatsRuntime, serve_agents
from cardbus.bus.transport.nats import ORCHESTRATOR_DURABLE, REPLY_STREAM, NatsBus
from cardbus.bus.transport.nats_replies import PARTITION_CONSUMER, partition_consumer
from cardbus.eventstore import Envelope, NewEvent, new_id
from cardbus.eventstore import events as ev
from cardbus.eventstore.nats import NatsEventStore
from cardbus.eventstore.nats.connection import NatsOptions

PARTITIONS = 8
# what only a run's owner writes (a submit's events are the submitter's)
DECISIONS = (ev.TaskDispatched, ev.TaskStarted, ev.TaskCompleted, ev.RunCompleted)


Slow = slow_agent(0.6)


def plan(plan_id: str, slow_timeout: float = 20.0) -> Plan:
    return chain(plan_id, slow_timeout)


def decisions(events: list[Envelope], root: str) -> list[str]:
    """The actors of run ``root``'s decisions, in log order."""
    return [e.actor for e in events if e.correlation_id == root and isinstance(e.data, DECISIONS)]


def check_runs(events: list[Envelope], roots: list[str]) -> None:
    check_log(events)
    for root in roots:
        tasks = per_task(events, root)
        assert {k: count(v, ev.TaskCompleted) for k, v in tasks.items()} == {
            "a": 1,
            "b": 1,
            "c": 1,
        }, root
        finished = [e for e in events if e.stream == root and isinstance(e.data, ev.RunCompleted)]
        assert len(finished) == 1, root


class Asking(Quick):
    """``quick`` that asks the orchestrator once (a request) before it answers."""

    async def handle(self, task, inputs, ctx):  # type: ignore[no-untyped-def]
        await ctx.write_output(task.task_id, {"n": 0})  # its own task: allowed, recorded
        return await super().handle(task, inputs, ctx)


async def _agents(url: str, stop: asyncio.Event, quick: type[Agent] = Quick) -> asyncio.Task[None]:
    ready = asyncio.Event()
    serving = asyncio.create_task(
        serve_agents(
            NatsOptions(url=url), [quick, Slow], stop, replicas=2, bus_options=FAST_BUS, ready=ready
        )
    )
    await asyncio.wait_for(ready.wait(), 10)
    return serving


def _runtime(url: str, member: str, lease_s: float, local_runs: bool = False) -> NatsRuntime:
    # (not local: a run goes where its root id falls, so a submit reaches the other's runs)
    return NatsRuntime(
        NatsOptions(url=url),
        bus_options=FAST_BUS,
        name=member,
        partitions=PARTITIONS,
        partition_lease_s=lease_s,
        member=member,
        local_runs=local_runs,
    )


def _record_held(m: NatsRuntime) -> set[int]:
    """Every partition ``m`` holds a lease on from now (after each of its lease rounds), so
    a test tells a partition that moved on a busy machine (a renewal late: failover, not
    a fault) from a run placed or decided elsewhere."""
    partitions = m.partitions
    assert partitions is not None
    ever = set(partitions.holding)
    inner = partitions.on_change

    def on_change(held: frozenset[int]) -> None:
        ever.update(held)
        if inner is not None:
            inner(held)

    partitions.on_change = on_change
    return ever


@contextlib.asynccontextmanager
async def _two_members(
    url: str, local_runs: bool = False, quick: type[Agent] = Quick
) -> AsyncIterator[tuple[NatsRuntime, NatsRuntime]]:
    """Members "a" and "b", once each holds half the partitions, and agents serving
    them. A long lease: no handover under load, where a late renewal could pass it on."""
    stop = asyncio.Event()
    serving = await _agents(url, stop, quick)
    try:
        async with (
            _runtime(url, "a", 6.0, local_runs) as a,
            _runtime(url, "b", 6.0, local_runs) as b,
        ):
            assert a.partitions is not None and b.partitions is not None
            pa, pb = a.partitions, b.partitions
            await until(lambda: len(pa.held) == len(pb.held) == 4, what="half each")
            yield a, b
    finally:
        stop.set()
        await serving


async def test_two_orchestrators_share_the_runs_each_decided_by_one(
    nats_server: NatsServer,
) -> None:
    url = nats_server.url
    async with _two_members(url) as (a, b):
        assert a.partitions is not None and b.partitions is not None
        pa, pb = a.partitions, b.partitions
        assert pa.held.isdisjoint(pb.held)
        owner = {p: "orchestrator-a" for p in pa.held} | {p: "orchestrator-b" for p in pb.held}
        # either accepts a submit: the run's owner decides it from then on
        roots = [
            await (a if i % 2 else b).submit(plan(f"run-{i}"), agent_timeout=10) for i in range(16)
        ]
        results = await asyncio.gather(
            *((b if i % 2 else a).orchestrator.wait(r, timeout=60) for i, r in enumerate(roots))
        )
        # each folded its share of the log as it is: no event out of its task's order
        assert list(a.orchestrator.state.anomalies) == []
        assert list(b.orchestrator.state.anomalies) == []
        # each folded only the shared partition and its own: less than the whole log
        total = await a.store.last_position()
        assert a.member_log is not None and b.member_log is not None
        folded = (a.member_log.folded_events, b.member_log.folded_events)
        assert all(0 < f < total for f in folded), (folded, total)
        # and each has only its own runs' state
        for m, held in ((a, pa.held), (b, pb.held)):
            assert {partition_of(r, PARTITIONS) for r in m.orchestrator.state.runs} <= held
        # standbys for the other's runs stay quiet: no bad message, no duplicate
        assert a.orchestrator.bad_messages == b.orchestrator.bad_messages == []
        # every reply went to its run's member alone, and nothing waits unread
        assert not a.orchestrator.foreign_replies and not b.orchestrator.foreign_replies
        await until(lambda: _replies_left(a), what="every reply acked")
    assert [r.status for r in results] == ["completed"] * len(roots)
    assert all(r.outputs["c"] == {"n": 13} for r in results)
    events = await read_log(url)
    check_runs(events, roots)
    assert await verify(url) == []
    for root in roots:
        assert set(decisions(events, root)) == {owner[partition_of(root, PARTITIONS)]}, root
    assert not [e.data for e in events if isinstance(e.data, ev.TaskResultIgnored)]
    # both decided (the runs' roots are random: all 16 on one side is a 2**-15 chance)
    assert set(Counter(a for r in roots for a in decisions(events, r))) == set(owner.values())


async def test_a_run_is_decided_by_the_member_it_was_submitted_to(
    nats_server: NatsServer,
) -> None:
    """``local_runs`` (the default): a submit draws its root in a partition the member
    holds, so the run is created with its first dispatches and waited for there.

    Submitted right after the two split the partitions: a member then holds leases on
    partitions it is still catching up (not folded, not decided yet); a run is placed
    in one of those all the same (it once fell anywhere: seen under load)."""
    async with _two_members(nats_server.url, local_runs=True) as (a, b):
        ever = {"a": _record_held(a), "b": _record_held(b)}
        roots = []
        for i, m in enumerate([a, b] * 4):
            roots.append(await m.submit(plan(f"run-{i}"), agent_timeout=10))
        results = await asyncio.gather(
            *(m.orchestrator.wait(r, timeout=60) for m, r in zip([a, b] * 4, roots, strict=True))
        )
        assert a.orchestrator.bad_messages == b.orchestrator.bad_messages == []
    assert [r.status for r in results] == ["completed"] * len(roots)
    events = await read_log(nats_server.url)
    check_runs(events, roots)
    for i, root in enumerate(roots):
        me, other = "ab"[i % 2], "ba"[i % 2]
        p = partition_of(root, PARTITIONS)
        # drawn in a partition the submitter held (a quiet machine: its half, unchanged)
        assert p in ever[me], (root, p, ever)
        # and decided there first, unless that partition moved to the other member (a
        # lease renewed late on a busy machine: failover, which the other then decides)
        first = decisions(events, root)[0]
        assert first == f"orchestrator-{me}" or p in ever[other], (root, first, ever)


async def test_a_waiter_is_answered_when_its_partition_is_lost_while_it_registers(
    nats_server: NatsServer,
) -> None:
    """``wait`` on a run this member folds but has not folded yet (its creation on its
    way: submitted through another process) reads the log first; the partition is lost
    during that read (a lease renewed late on a busy machine; here forced) and the other
    member decides the run. The waiter is answered all the same: it is registered before
    the read, and a lost partition hands every waiter of its runs over, folded or not
    (it once waited for ever: a run seen not ended within 60 s under load)."""
    async with _two_members(nats_server.url, local_runs=True) as (x, y):
        px, py = x.partitions, y.partitions
        assert px is not None and py is not None and px._loop is not None
        px._loop.cancel()  # x renews no more: what it gives up stays given up
        with contextlib.suppress(asyncio.CancelledError):
            await px._loop
        the_plan = plan("lost")
        root = new_id()
        while partition_of(root, PARTITIONS) not in px.holding:
            root = new_id()
        p = partition_of(root, PARTITIONS)
        submitter = await NatsEventStore.connect(nats_server.url, create_stream=False)
        # the run's root claimed first (a submit names its root so), its creation later
        claim = ev.PlanSubmitted(plan_id="lost", root_id=root, plan_digest=plan_digest(the_plan))
        await submitter.append("plan-lost", [NewEvent(data=claim, correlation_id=root)], 0)
        store = x.orchestrator.store
        read_correlation = store.read_correlation
        lost = asyncio.Event()

        async def lose_partition_first(root_id: str) -> list[Envelope]:
            if root_id == root and not lost.is_set():  # wait's read of the log: p goes now
                lost.set()
                await px._release(p)
                assert px.on_change is not None
                px.on_change(px.holding)
                assert x.member_log is not None
                await until(lambda: not x.member_log.folds(root), what="x folds p no more")
                forgotten = asyncio.Event()  # queued after the follower's marker of p lost
                x.orchestrator.later(forgotten.set)
                await forgotten.wait()
            return await read_correlation(root_id)

        store.read_correlation = lose_partition_first  # type: ignore[method-assign]
        try:
            waiting = asyncio.create_task(x.orchestrator.wait(root, timeout=60))
            await until(lost.is_set, what="wait reading the log")
            # y takes p (x counts as gone: its member key deleted), then the run is created
            assert px._kv is not None
            await px._kv.delete(f"member.{px.member}")

            async def taken() -> bool:  # (a round under way when asked is joined, not rerun)
                await py.round()
                return p in py.holding

            await until(taken, what="y takes p")
            cards = list(y.orchestrator.state.agents.values())
            assert await submit_to_log(submitter, the_plan, cards, "someone") == root
            result = await waiting
        finally:
            await submitter.close()
    assert result.status == "completed", result
    events = await read_log(nats_server.url)
    check_runs(events, [root])
    assert set(decisions(events, root)) == {"orchestrator-b"}


@pytest.mark.both_loops
async def test_an_agents_request_is_answered_by_its_runs_member(
    nats_server: NatsServer,
) -> None:
    """Agents' requests go to any member (a queue group); one that does not fold the run
    hands it to the member that does (``cardbus.orch.req.<partition>``)."""
    async with _two_members(nats_server.url, local_runs=True, quick=Asking) as (a, b):
        members = [a, b] * 4
        roots = [await m.submit(plan(f"run-{i}"), agent_timeout=10) for i, m in enumerate(members)]
        results = await asyncio.gather(
            *(m.orchestrator.wait(r, timeout=60) for m, r in zip(members, roots, strict=True))
        )
        assert a.member_log is not None and b.member_log is not None
        # 16 requests, each to either member: none handed over is a 2**-16 chance
        assert a.member_log.handed_over + b.member_log.handed_over > 0
    assert [r.status for r in results] == ["completed"] * len(roots)
    events = await read_log(nats_server.url)
    check_runs(events, roots)
    # (a member that does not fold the task refuses it: unknown_task, recorded)
    assert not [e for e in events if isinstance(e.data, ev.AccessRefused)]


async def test_a_run_placed_in_a_partition_still_being_caught_up_is_decided(
    nats_server: NatsServer,
) -> None:
    """A member just given a partition (leased, its events not caught up yet) places a
    submit's run there (``local_runs``) and folds its creation at once. Its decision loop
    busy with a step meanwhile (here an announcement held), the catch-up's copy of those
    events is dropped as folded already, and the loop's next step runs what the submit
    queued before the partition's marker: the run must stay in the state, or nobody
    ever decides it (seen under load: a run left at its creation, its waiter timed out)."""
    async with _two_members(nats_server.url, local_runs=True) as (a, b):
        pa, pb, ml, o = a.partitions, b.partitions, b.member_log, b.orchestrator
        assert pa is not None and pb is not None and ml is not None and pa._loop is not None
        pa._loop.cancel()  # a renews no more: what it gives up stays given up
        with contextlib.suppress(asyncio.CancelledError):
            await pa._loop
        p = min(pa.holding)
        read, catching_up, go = ml._read, asyncio.Event(), asyncio.Event()

        async def held_catch_up(parts, start, end):  # type: ignore[no-untyped-def]
            parts = list(parts)
            if p in parts:  # b's catch-up of p waits until the run is submitted
                catching_up.set()
                await go.wait()
            return await read(parts, start, end)

        busy, free = asyncio.Event(), asyncio.Event()
        registers = o.announced

        async def held_announcement(announce: Announce) -> None:
            if busy.is_set():  # only the first is held: the agents' renewals after it
                await registers(announce)  # register as ever (swallowed, their leases
                return  # lapsed under load and the run failed: "no registered agent")
            busy.set()
            await free.wait()

        ml._read = held_catch_up  # type: ignore[method-assign]
        o.announced = held_announcement  # type: ignore[method-assign]
        # p goes from a to b (a counts as gone: its member key deleted)
        await pa._release(p)
        assert pa.on_change is not None and pa._kv is not None
        pa.on_change(pa.holding)
        await pa._kv.delete(f"member.{pa.member}")

        async def taken() -> bool:
            await pb.round()
            return p in pb.holding

        await until(taken, what="b takes p")
        await until(catching_up.is_set, what="b catching p up")
        o._queue.put_nowait(Announce(card=Quick().card()))  # the decision loop busy
        await until(busy.is_set, what="a step under way")
        o.places = lambda root: partition_of(root, PARTITIONS) == p
        root = await b.submit(plan("caught-up"), agent_timeout=10)
        assert partition_of(root, PARTITIONS) == p
        created = max(e.position for e in await b.store.read_correlation(root))
        go.set()  # the catch-up goes on; the run's events then come (folded already)
        await until(lambda: o._followed >= created, what="the run's creation followed")
        free.set()  # the decision loop's next step: what the submit queued, then p's marker
        result = await o.wait(root, timeout=30)
    assert result.status == "completed", result
    events = await read_log(nats_server.url)
    check_runs(events, [root])
    assert set(decisions(events, root)) == {"orchestrator-b"}


@pytest.mark.both_loops
async def test_a_killed_orchestrators_runs_are_finished_by_the_other(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    url = nats_server.url
    lease = 3.0
    await _reply_consumers_made(url)
    stop = asyncio.Event()
    serving = await _agents(url, stop)
    killed = Proc(
        [
            *("orchestrator", "--nats", url, "--partitions", str(PARTITIONS)),
            *("--partition-lease", str(lease), "--member", "k", "--ack-wait", "1"),
        ],
        tmp_path,
        env_for(tmp_path),
        "orchestrator-k",
    )
    try:
        killed.wait_for("open run(s) resumed", timeout=30)
        async with _runtime(url, "b", lease) as b:
            pb = b.partitions
            assert pb is not None
            await until(lambda: len(pb.held) == 4, timeout=30, what="the killed one to share")
            roots = [await b.submit(plan(f"run-{i}"), agent_timeout=10) for i in range(12)]
            theirs = [r for r in roots if not pb.owns(r)]
            assert theirs  # all 12 on one side is a 2**-11 chance

            async def slow_step_running() -> bool:  # the killed one's run is mid-way
                # (read from the log: b folds only its own partitions' runs)
                for root in theirs:
                    events = await b.store.read_correlation(root)
                    slow = [e for e in events if e.stream.startswith("b-")]
                    if any(isinstance(e.data, ev.TaskDispatched) for e in slow) and not any(
                        isinstance(e.data, ev.TaskCompleted) for e in slow
                    ):
                        return True
                return False

            await until(slow_step_running, timeout=30, what="a slow step of the other's run")
            killed.kill()  # kill -9: no release, its leases lapse on the server
            results = await asyncio.gather(*(b.orchestrator.wait(r, timeout=90) for r in roots))
            assert len(pb.held) == PARTITIONS
            # every reply read and acked, the killed one's partitions' too; no consumer
            # that nobody reads (the default one) keeps replies
            # (what the killed one took and did not settle comes back after the consumers'
            # ack wait: FAST_BUS's, they were made so)
            await until(lambda: _replies_left(b), timeout=120, what="every reply acked")
            # the replies the killed one recorded and did not ack came to b again: not
            # news, and not "unknown" either
            assert b.orchestrator.bad_messages == []
    finally:
        killed.kill()
        stop.set()
        await serving
    assert [r.status for r in results] == ["completed"] * len(roots)
    events = await read_log(url)
    check_runs(events, roots)
    assert await verify(url) == []
    for root in roots:
        actors = decisions(events, root)
        if root in theirs and "orchestrator-b" not in actors:
            assert set(actors) == {"orchestrator-k"}  # finished before the kill
        elif root in theirs:  # the killed one's decisions, then only the survivor's
            first_b = actors.index("orchestrator-b")
            assert set(actors[:first_b]) <= {"orchestrator-k"}
            assert set(actors[first_b:]) == {"orchestrator-b"}
        else:
            assert set(actors) == {"orchestrator-b"}
    # no reply recorded by one was written down again as ignored by the other
    assert not [e.data for e in events if isinstance(e.data, ev.TaskResultIgnored)]
    # a run was taken over mid-way: decided by both
    assert any("orchestrator-k" in decisions(events, r) for r in theirs)
    # and an attempt the killed one dispatched was answered to the survivor, which held
    # the reply while it did not own the run (or got it after): recorded, not timed out
    dispatched_by_k = {
        (e.stream, e.data.attempt)
        for e in events
        if isinstance(e.data, ev.TaskDispatched) and e.actor == "orchestrator-k"
    }
    assert any(
        isinstance(e.data, ev.TaskResultSubmitted)
        and e.actor == "orchestrator-b"
        and (e.stream, e.data.attempt) in dispatched_by_k
        for e in events
    )


async def _reply_consumers_made(url: str) -> None:
    """The partitions' reply consumers made, as a member with ``FAST_BUS`` makes them,
    before a ``cardbus orchestrator`` process does: whoever makes them sets their ack wait
    (the command's is 30 s), after which a reply a killed member took and did not settle
    comes to the next owner of its partition."""
    bus = await NatsBus.connect(
        NatsOptions(url=url),
        **{**FAST_BUS, "reply_partitions": PARTITIONS, "reply_durable": "test-consumers"},
        delete_reply_consumer=True,  # (its own consumer: gone on close)
    )
    try:
        await bus.prepare_replies()
    finally:
        await bus.close()


async def _replies_left(m: NatsRuntime) -> bool:
    """Whether nothing waits in the reply stream's consumers but for a member's own."""
    infos = await m.bus._js.consumers_info(REPLY_STREAM)
    names = {i.name for i in infos}
    assert ORCHESTRATOR_DURABLE not in names
    assert {partition_consumer(p) for p in range(PARTITIONS)} <= names
    parts = [i for i in infos if i.name.startswith(PARTITION_CONSUMER)]
    return all(not i.num_pending and not i.num_ack_pending for i in parts)


async def test_runs_submitted_at_once_to_both_fold_in_order_on_both(
    nats_server: NatsServer,
) -> None:
    url = nats_server.url
    async with _two_members(url) as (a, b):
        # without a plan id every other run: its first dispatch goes in its creation's
        # append when the submitter owns it (``Orchestrator._first_step``)
        plans = [plan(f"run-{i}", 30) for i in range(24)]
        plans = [
            p if i % 2 else msgspec.structs.replace(p, plan_id=None) for i, p in enumerate(plans)
        ]
        roots = await asyncio.gather(
            *((a if i // 2 % 2 else b).submit(p, agent_timeout=20) for i, p in enumerate(plans))
        )
        results = await asyncio.gather(
            *(
                (b if i // 2 % 2 else a).orchestrator.wait(r, timeout=90)
                for i, r in enumerate(roots)
            )
        )
        anomalies = [*a.orchestrator.state.anomalies, *b.orchestrator.state.anomalies]
    assert [r.status for r in results] == ["completed"] * len(roots)
    assert anomalies == []
    events = await read_log(url)
    check_runs(events, roots)


def _lead(plan_id: str) -> dict[str, object]:
    """A parent whose task ``dept`` runs a child plan (quick, then quick)."""
    return {
        "plan_id": plan_id,
        "goal": "a lead and its department",
        "tasks": [
            {"id": "a", "capability": "quick", "inputs": {"n": 1}},
            {
                "id": "dept",
                "capability": "department",
                "deps": ["a"],
                "timeout_s": 30,
                "inputs": {"n": {"$dep": "a", "path": "n"}},
                "child": {
                    "plan": {
                        "goal": "department",
                        "tasks": [
                            {"id": "x", "capability": "quick", "inputs": {"n": {"$parent": "n"}}},
                            {
                                "id": "y",
                                "capability": "quick",
                                "deps": ["x"],
                                "inputs": {"n": {"$dep": "x", "path": "n"}},
                            },
                        ],
                    }
                },
            },
        ],
    }


async def test_a_child_run_is_decided_by_its_parents_member(nats_server: NatsServer) -> None:
    """Child runs on members sharing the runs: each child's root is drawn in its parent's
    partition, so the member deciding the parent decides the child and folds its end."""
    async with _two_members(nats_server.url) as (a, b):
        roots = [
            await (a if i % 2 else b).submit(_lead(f"lead-{i}"), agent_timeout=10) for i in range(6)
        ]
        results = await asyncio.gather(
            *((b if i % 2 else a).orchestrator.wait(r, timeout=60) for i, r in enumerate(roots))
        )
        assert list(a.orchestrator.state.anomalies) == list(b.orchestrator.state.anomalies) == []
    assert [r.status for r in results] == ["completed"] * len(roots), [r.detail for r in results]
    assert all(r.outputs["dept"]["y"] == {"n": 4} for r in results)
    events = await read_log(nats_server.url)
    children = {
        e.data.parent_root: e.stream
        for e in events
        if isinstance(e.data, ev.RunStarted) and e.data.parent_root
    }
    assert set(children) == set(roots)
    for parent, child in children.items():
        assert partition_of(child, PARTITIONS) == partition_of(parent, PARTITIONS)
        assert set(decisions(events, child)) == set(decisions(events, parent)), (parent, child)
