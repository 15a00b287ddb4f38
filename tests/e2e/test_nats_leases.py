"""Leases on a real nats-server: renewals keep an agent live past its lease (each renewal a
message of its own: JetStream drops one identical to a message of the last two minutes),
and a stopping worker deregisters its agent (issue 15 item 1)."""

from __future__ import annotations

import asyncio
import json
import sys
import time

from natsprocs import FAST_BUS, Quick, read_log, until
from natsserver import NatsServer

from cardbus.bus.runtime.nats import NatsRuntime
from cardbus.bus.runtime.worker import AgentWorker
from cardbus.bus.transport.nats import NatsBus
from cardbus.eventstore import events as ev
from cardbus.eventstore.nats.connection import NatsOptions
from cardbus.projections.agents import agent_directory


async def test_renewals_keep_an_agent_live_and_a_stop_deregisters_it(
    nats_server: NatsServer,
) -> None:
    options = NatsOptions(url=nats_server.url)
    async with NatsRuntime(options, bus_options=FAST_BUS) as rt:
        agent_bus = await NatsBus.connect(options, name="lease-agent", **FAST_BUS)
        worker = AgentWorker(agent_bus, Quick, lease_s=0.6)
        try:
            await worker.start()
            plan = {"goal": "g", "tasks": [{"id": "a", "capability": "quick", "inputs": {"n": 1}}]}
            first = await rt.run(plan, timeout=20, agent_timeout=10)
            assert first.status == "completed"
            await asyncio.sleep(2.0)  # over three leases: only renewals keep it live
            assert rt.orchestrator.leases.live("quick", time.time())
            again = {
                "goal": "g2",
                "tasks": [{"id": "a", "capability": "quick", "inputs": {"n": 5}}],
            }
            second = await rt.run(again, timeout=20, agent_timeout=10)
            assert second.status == "completed" and second.outputs["a"] == {"n": 6}
            await worker.stop()  # the last (only) replica goes: deregistered, stopped

            async def gone() -> bool:
                return any(
                    isinstance(e.data, ev.AgentDeregistered)
                    for e in await read_log(nats_server.url)
                )

            for _ in range(100):
                if await gone():
                    break
                await asyncio.sleep(0.1)
        finally:
            await agent_bus.close()
    events = await read_log(nats_server.url)
    agent = [e.data for e in events if e.stream == "agent-quick"]
    assert [type(x).__name__ for x in agent] == ["AgentRegistered", "AgentDeregistered"]
    assert agent[0].lease_s == 0.6 and agent[1].reason == "stopped"


async def _cardbus_agents(url: str) -> dict[str, dict[str, object]]:
    """``cardbus agents --json`` in a process of its own (this loop keeps answering)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "cardbus.tools", "agents", "--store", url, "--json"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return {row["agent_id"]: row for row in json.loads(out)}


async def test_an_idle_live_replica_is_live_in_cardbus_agents(nats_server: NatsServer) -> None:
    """The log holds no renewals: an agent idle for longer than its lease looks lapsed to
    the log alone. ``cardbus agents`` asks the orchestrators, which hold the renewals."""
    url = nats_server.url
    options = NatsOptions(url=url)
    async with NatsRuntime(options, bus_options=FAST_BUS) as rt:
        agent_bus = await NatsBus.connect(options, name="lease-agent", **FAST_BUS)
        worker = AgentWorker(agent_bus, Quick, lease_s=0.6)
        try:
            await worker.start()

            await until(  # idle past its lease: by the log alone, lapsed
                lambda: _log_status(url, "lapsed"), timeout=30, what="the log to call it lapsed"
            )
            assert rt.orchestrator.leases.live("quick", time.time())  # renewed all along
            row = (await _cardbus_agents(url))["quick"]
            assert (row["status"], row["status_from"]) == ("live", "orchestrator")

            # the replica dies without a word: its lease runs out, the orchestrator
            # deregisters it, and cardbus agents says so
            await worker.stop(announce=False)

            async def deregistered() -> bool:
                return any(isinstance(e.data, ev.AgentDeregistered) for e in await read_log(url))

            await until(deregistered, timeout=30, what="the lapsed agent deregistered")
            row = (await _cardbus_agents(url))["quick"]
            assert (row["status"], row["reason"]) == ("deregistered", "lease_expired")
        finally:
            await agent_bus.close()


async def test_with_no_orchestrator_running_the_status_is_the_logs(
    nats_server: NatsServer,
) -> None:
    url = nats_server.url
    options = NatsOptions(url=url)
    agent_bus = await NatsBus.connect(options, name="lease-agent", **FAST_BUS)
    try:
        async with NatsRuntime(options, bus_options=FAST_BUS) as rt:
            worker = AgentWorker(agent_bus, Quick, lease_s=0.6)
            await worker.start()
            await until(lambda: "quick" in rt.orchestrator.state.agents, what="registered")
        await worker.stop(announce=False)  # no orchestrator, nobody deregisters it
    finally:
        await agent_bus.close()
    await until(lambda: _log_status(url, "lapsed"), timeout=30, what="the log to call it lapsed")
    row = (await _cardbus_agents(url))["quick"]
    # nobody holds its lease now: the log's inference
    assert (row["status"], row["status_from"]) == ("lapsed", "log")


async def _log_status(url: str, status: str) -> bool:
    rows = agent_directory(await read_log(url), time.time())
    return [(r.agent_id, r.status) for r in rows] == [("quick", status)]
