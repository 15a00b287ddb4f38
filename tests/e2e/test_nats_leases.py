"""Leases on a real nats-server: renewals keep an agent live past its lease (each renewal a
message of its own: JetStream drops one identical to a message of the last two minutes),
and a stopping worker deregisters its agent (issue 15 item 1)."""

from __future__ import annotations

import asyncio
import time

from natsprocs import FAST_BUS, Quick, read_log
from natsserver import NatsServer

from cardbus.bus.runtime.nats import NatsRuntime
from cardbus.bus.runtime.worker import AgentWorker
from cardbus.bus.transport.nats import NatsBus
from cardbus.eventstore import events as ev
from cardbus.eventstore.nats.connection import NatsOptions


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
