"""Two orchestrators on one log, and a 3-node JetStream cluster losing a node mid-run."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import nats.errors
import pytest
from natsprocs import (
    FAST_BUS,
    Quick,
    chain,
    check_log,
    count,
    per_task,
    read_log,
    slow_agent,
    until,
    verify,
)
from natsserver import NatsCluster, NatsServer

from cardbus.bus.orchestrator.plan import Plan
from cardbus.bus.runtime.nats import NatsRuntime, serve_agents
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import StoreUnavailable
from cardbus.eventstore.nats.connection import NatsOptions

Slow = slow_agent(0.3)


def plan(plan_id: str, slow_timeout: float = 5.0) -> Plan:
    return chain(plan_id, slow_timeout)


@pytest.mark.both_loops
async def test_two_orchestrators_on_the_same_log_stay_consistent(nats_server: NatsServer) -> None:
    url = nats_server.url
    stop = asyncio.Event()
    ready = asyncio.Event()
    serving = asyncio.create_task(
        serve_agents(
            NatsOptions(url=url), [Quick, Slow], stop, replicas=2, bus_options=FAST_BUS, ready=ready
        )
    )
    try:
        await asyncio.wait_for(ready.wait(), 10)
        opts = NatsOptions(url=url)
        async with (
            NatsRuntime(opts, bus_options={**FAST_BUS, "reply_durable": "orch-a"}, name="a") as a,
            NatsRuntime(opts, bus_options={**FAST_BUS, "reply_durable": "orch-b"}, name="b") as b,
        ):
            # the same plan submitted to both at once is one run
            same = await asyncio.gather(
                a.submit(plan("both"), agent_timeout=10), b.submit(plan("both"), agent_timeout=10)
            )
            assert same[0] == same[1]
            roots = [same[0]]
            for i in range(8):
                rt = a if i % 2 else b
                roots.append(await rt.submit(plan(f"run-{i}"), agent_timeout=10))
            results = await asyncio.gather(
                *((a if i % 2 else b).orchestrator.wait(r, timeout=40) for i, r in enumerate(roots))
            )
            # both orchestrators see every run finish
            for r in roots:
                await until(lambda r=r: r in b.orchestrator.state.runs, what="b to see the run")
                await until(lambda r=r: a.orchestrator.state.runs[r].finished, what="a done")
            # each reads every reply: one for a task it has not folded yet (the other just
            # created it) is looked at again once caught up, not called unknown
            assert a.orchestrator.bad_messages == b.orchestrator.bad_messages == []
    finally:
        stop.set()
        await serving
    assert [r.status for r in results] == ["completed"] * len(roots)
    assert all(r.outputs["c"] == {"n": 13} for r in results)
    events = await read_log(url)
    check_log(events)  # no duplicate versions, no duplicate ids
    # a reply one recorded is, to the other, the same reply again: nothing written for it
    assert not [e.data for e in events if isinstance(e.data, ev.TaskResultIgnored)]
    assert await verify(url) == []
    actors = Counter(e.actor for e in events)
    assert actors  # both wrote to the log (the two orchestrators share the actor name)
    for root in roots:
        tasks = per_task(events, root)
        assert {k: count(v, ev.TaskCompleted) for k, v in tasks.items()} == {
            "a": 1,
            "b": 1,
            "c": 1,
        }, root
        for name, data in tasks.items():  # one dispatch per attempt: no decision taken twice
            attempts = [d.attempt for d in data if isinstance(d, ev.TaskDispatched)]
            assert len(attempts) == len(set(attempts)), (name, attempts)
        runs = [e for e in events if e.stream == root and isinstance(e.data, ev.RunCompleted)]
        assert len(runs) == 1


async def _submit_retrying(rt: NatsRuntime, p) -> str:  # type: ignore[no-untyped-def]
    for _ in range(100):
        try:
            return await rt.submit(p, agent_timeout=20)
        except StoreUnavailable:
            await asyncio.sleep(0.2)
    raise AssertionError("the cluster never took the plan")


async def _stream_info(rt: NatsRuntime):  # type: ignore[no-untyped-def]
    try:
        return await rt.bus._js.stream_info("CARDBUS_EVENTS")
    except nats.errors.TimeoutError:
        return None


@pytest.mark.both_loops
async def test_three_node_cluster_loses_a_node_mid_run_and_nothing(tmp_path: Path) -> None:
    cluster = NatsCluster(tmp_path / "cluster").start()
    try:
        url = cluster.url
        stop = asyncio.Event()
        ready = asyncio.Event()
        bus_r3 = {**FAST_BUS, "replicas": 3}
        serving = asyncio.create_task(
            serve_agents(NatsOptions(url=url), [Quick, Slow], stop, bus_options=bus_r3, ready=ready)
        )
        try:
            await asyncio.wait_for(ready.wait(), 20)
            async with NatsRuntime(
                NatsOptions(url=url), bus_options=bus_r3, store_options={"replicas": 3}
            ) as rt:
                # a fresh R3 stream may still be electing its leader: ask again meanwhile
                info = await until(lambda: _stream_info(rt), 30, "the stream's info")
                assert info.config.num_replicas == 3
                roots = [await rt.submit(plan(f"r3-{i}"), agent_timeout=20) for i in range(4)]

                def some_slow_running() -> bool:
                    # (dispatched: a card answered within NATS_STARTED_AFTER_S sends no
                    # Started, so a 0.3 s task is never recorded running)
                    return any(
                        t.task_id.startswith("b-") and t.state.value in ("dispatched", "running")
                        for t in rt.orchestrator.state.tasks.values()
                    )

                await until(some_slow_running, what="a slow task to run")
                victim = next(
                    n for n in cluster.nodes if n.url.endswith(str(rt.bus.nc.connected_url.port))
                )  # type: ignore[union-attr]
                victim.stop()  # the node this orchestrator is connected to
                # submitting during the fail-over may time out; the same plan id is one run
                roots += [await _submit_retrying(rt, plan(f"r3-late-{i}")) for i in range(2)]
                try:
                    results = await asyncio.wait_for(
                        asyncio.gather(*(rt.orchestrator.wait(r) for r in roots)), 60
                    )
                except TimeoutError:
                    stuck = [
                        (t.task_id, t.state.value, t.attempt)
                        for t in rt.orchestrator.state.tasks.values()
                        if not t.terminal
                    ]
                    raise AssertionError(f"runs not finished; open tasks: {stuck}") from None
        finally:
            stop.set()
            await serving
        assert [r.status for r in results] == ["completed"] * len(roots)
        live = next(n for n in cluster.nodes if n.running).url
        events = await read_log(live)
        check_log(events)
        assert await verify(live) == []
        for root in roots:
            tasks = per_task(events, root)
            assert {k: count(v, ev.TaskCompleted) for k, v in tasks.items()} == {
                "a": 1,
                "b": 1,
                "c": 1,
            }
    finally:
        cluster.stop()
