"""Per-role NATS permissions (``bus.nats.agent_permissions`` / ``orchestrator_permissions``,
printed by ``cardbus nats permissions``) enforced by a real server: they are enough for
a run, and an agent can neither publish events nor read another agent's inbox."""

from __future__ import annotations

import asyncio
from typing import Any

import nats.errors
from natsprocs import FAST_BUS, N, Quick, until
from natsserver import NatsServer

from cardbus.agents import Agent, Capability
from cardbus.agents.cards import CancelNotice, TaskCard, encode
from cardbus.agents.requests import AgentRequest, AgentResponse
from cardbus.bus.orchestrator.plan import Plan, PlanTask
from cardbus.bus.runtime.nats import NatsRuntime, serve_agents
from cardbus.bus.transport.nats import (
    INBOX_STREAM,
    NatsBus,
    agent_inbox_prefix,
    cancel_subject,
    consumer_name,
)
from cardbus.eventstore.nats import NatsEventStore
from cardbus.eventstore.nats.connection import NatsOptions
from cardbus.tools.cmd_nats import authorization_config


class Slow(Agent):
    agent_id = "slow"
    description = "adds ten"
    capabilities = [Capability("slow", N, N, "add ten")]

    async def handle(self, task, inputs, ctx):  # type: ignore[no-untyped-def]
        return N(n=inputs.n + 10)


def as_agent(url: str, agent_id: str) -> NatsOptions:
    return NatsOptions(
        url=url, user=f"agent-{agent_id}", password="pw", inbox_prefix=agent_inbox_prefix(agent_id)
    )


async def test_roles_are_enough_and_an_agent_is_confined(tmp_path: Any) -> None:
    config = authorization_config(["quick", "slow"], "pw")
    with NatsServer(tmp_path / "nats", extra_config=config) as server:
        url = server.url
        orch = NatsOptions(url=url, user="orchestrator", password="pw")
        async with NatsRuntime(orch, bus_options=FAST_BUS) as rt:
            # 1. the documented permissions are enough for a whole run
            stops = {a.agent_id: asyncio.Event() for a in (Quick, Slow)}
            serving = [
                asyncio.create_task(
                    serve_agents(
                        as_agent(url, a.agent_id), [a], stops[a.agent_id], bus_options=FAST_BUS
                    )
                )
                for a in (Quick, Slow)
            ]
            plan = Plan(
                goal="confined",
                tasks=[
                    PlanTask(id="a", capability="quick", inputs={"n": 1}),
                    PlanTask(
                        id="b",
                        capability="slow",
                        deps=["a"],
                        inputs={"n": {"$dep": "a", "path": "n"}},
                    ),
                ],
            )
            result = await rt.run(plan, timeout=20, agent_timeout=10)
            assert result.status == "completed" and result.outputs["b"] == {"n": 12}

            # an agent's request to the orchestrator is answered (allow_responses)
            async def serve(r: AgentRequest) -> AgentResponse:
                return AgentResponse(request_id=r.request_id, ok=True, result=r.agent_id)

            await rt.bus.serve_requests(serve)
            quick_bus = await NatsBus.connect(as_agent(url, "quick"), **FAST_BUS)
            try:
                ask = AgentRequest(
                    request_id="q1", task_id="t", attempt=1, agent_id="quick", kind="tool"
                )
                answer = await quick_bus.request(ask, timeout=5)
                # Answered by this test's handler or by the runtime's own orchestrator
                # (same queue group; it refuses task "t" as unknown): either way the
                # agent may ask and hear back, which is what the permissions allow.
                assert answer.request_id == "q1"
                assert answer.result == "quick" or answer.error_type == "access_denied", answer
            finally:
                await quick_bus.close()
            stops["slow"].set()  # the slow agent goes away; a card waits in its inbox
            await serving[1]
            waiting = TaskCard(task_id="secret", root_id="r", capability="slow", inputs={"n": 7})
            await rt.bus.send_task("slow", waiting)

            # 2. the quick agent tries what it must not do
            errors: list[str] = []

            async def on_error(e: Exception) -> None:
                errors.append(str(e))

            # the slow agent hears its own cancel notices (only from an orchestrator)
            heard: list[bytes] = []

            async def hear(msg: Any) -> None:
                heard.append(msg.data)

            slow_nc = await as_agent(url, "slow").connect("slow-listener", error_cb=on_error)
            await slow_nc.subscribe(cancel_subject("slow"), cb=hear)
            await slow_nc.flush()
            nc = await as_agent(url, "quick").connect("intruder", error_cb=on_error)
            js = nc.jetstream(timeout=1.0)
            try:
                try:  # write an event into the log
                    await js.publish("cardbus.evt.t.r.task_completed_v1", b"{}", timeout=1.0)
                except (nats.errors.Error, TimeoutError):
                    pass
                try:  # ask the orchestrator in another agent's name
                    await nc.request("cardbus.req.slow", b"{}", timeout=0.5)
                except (nats.errors.Error, TimeoutError):
                    pass
                try:  # send a card to another agent
                    await js.publish("cardbus.agent.slow", b"{}", timeout=1.0)
                except (nats.errors.Error, TimeoutError):
                    pass
                seen: list[bytes] = []

                async def spy(msg: Any) -> None:
                    seen.append(msg.data)

                # listen to another agent's inbox subject and to its deliveries
                await nc.subscribe("cardbus.agent.slow", cb=spy)
                await nc.subscribe(f"{agent_inbox_prefix('slow')}.>", cb=spy)
                await nc.subscribe("cardbus.agent.>", cb=spy)
                # pull from the other agent's durable consumer
                stolen: list[Any] = []
                try:
                    sub = await js.pull_subscribe_bind(
                        durable=consumer_name("slow"), stream=INBOX_STREAM
                    )
                    stolen = await sub.fetch(1, timeout=1.0)
                except (nats.errors.Error, TimeoutError):
                    pass
                # forge a cancel of the other agent's work, or listen to its notices
                forged = CancelNotice(task_id="t2", attempt=1, agent_id="slow", by="quick")
                await nc.publish(cancel_subject("slow"), encode(forged))
                await nc.subscribe(cancel_subject("slow"), cb=spy)
                await nc.subscribe("cardbus.cancel.>", cb=spy)
                await nc.flush()
                await rt.bus.send_task(
                    "slow", TaskCard(task_id="t2", root_id="r", capability="slow")
                )
                genuine = CancelNotice(task_id="t2", attempt=1, agent_id="slow", by="ops")
                await rt.bus.cancel_attempt(genuine)
                await until(lambda: heard, what="the orchestrator's notice")
                await asyncio.sleep(0.5)
            finally:
                await nc.close()
                await slow_nc.close()
            assert stolen == [] and seen == []
            assert heard == [encode(genuine)]  # the orchestrator's, never the forged one
            text = "\n".join(errors).lower()  # nats-py lower-cases the server's -ERR
            assert 'violation for publish to "cardbus.evt.t.r.task_completed_v1"' in text, text
            assert 'violation for publish to "cardbus.agent.slow"' in text, text
            assert 'violation for publish to "cardbus.req.slow"' in text, text
            assert 'violation for subscription to "cardbus.agent.slow"' in text, text
            assert 'violation for subscription to "_inbox.slow.>"' in text, text
            assert 'violation for subscription to "cardbus.agent.>"' in text, text
            assert 'violation for publish to "cardbus.cancel.slow"' in text, text
            assert 'violation for subscription to "cardbus.cancel.slow"' in text, text
            assert 'violation for subscription to "cardbus.cancel.>"' in text, text
            assert 'publish to "$js.api.consumer.msg.next.cardbus_inbox.agent-slow"' in text

            # nothing reached the log, and the cards still wait for the slow agent
            store = await NatsEventStore.from_connection(rt.bus.nc, create_stream=False)
            assert not [e for e in await store.read_all(0, 10_000) if e.stream == "t"]
            info = await rt.bus._js.consumer_info(INBOX_STREAM, consumer_name("slow"))
            assert info.num_pending + info.num_ack_pending == 2
            stops["quick"].set()
            await serving[0]


async def test_connection_options_token_and_tls_serve_bus_and_store_alike(tmp_path: Any) -> None:
    """One NatsOptions (token + TLS with a client certificate) opens the bus and the store."""
    from natsserver import make_tls_files, tls_config

    from cardbus.eventstore.errors import BusError

    tls = make_tls_files(tmp_path / "tls")
    config = tls_config(tls) + '\nauthorization { token: "s3cret" }\n'
    with NatsServer(tmp_path / "nats", extra_config=config) as server:
        opts = NatsOptions(
            url=server.url,
            token="s3cret",
            tls_ca=str(tls.ca),
            tls_cert=str(tls.client_cert),
            tls_key=str(tls.client_key),
        )
        async with NatsRuntime(opts, [Quick], bus_options=FAST_BUS) as rt:
            plan = Plan(goal="tls", tasks=[PlanTask(id="a", capability="quick", inputs={"n": 1})])
            result = await rt.run(plan, timeout=20, agent_timeout=10)
        assert result.status == "completed"
        store = await NatsEventStore.connect(**opts.store_kwargs(), create_stream=False)
        try:
            assert any(e.correlation_id == result.root_id for e in await store.read_all(0, 1000))
        finally:
            await store.close()
        bad = opts.with_(token="wrong", max_reconnect_attempts=0, connect_timeout=1.0)
        try:
            await asyncio.wait_for(NatsBus.connect(bad), 10)
            raise AssertionError("a wrong token was accepted")
        except BusError as e:
            assert "cannot connect" in str(e)
