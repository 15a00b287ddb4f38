"""The forging and re-announcing attack of issue 14, on a real nats-server with the
documented per-agent permissions (``cardbus nats permissions``).

Agent ``quick`` tries to answer for a task dispatched to ``slow``: a result in slow's
name (on its own reply subject, and on slow's, which the server refuses), a
``Started`` in slow's name, a result in its own name for slow's task, a request in
slow's name, and announcements of ``slow`` with a tool it was never granted. Then
``slow`` itself re-announces with that tool. The run must end with slow's honest
output, every forgery recorded as ``reply.refused`` with the claimed and the actual
sender, and slow's registration unchanged.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from natsprocs import FAST_BUS, N, slow_agent
from natsserver import NatsServer

from cardbus.agents import Agent, Capability
from cardbus.agents.cards import Announce, ResultCard, Started, encode
from cardbus.agents.requests import AgentRequest
from cardbus.bus.orchestrator.plan import Plan, PlanTask
from cardbus.bus.orchestrator.registry import AgentGrants
from cardbus.bus.runtime.nats import NatsRuntime, serve_agents
from cardbus.bus.transport.nats import NatsBus, agent_inbox_prefix
from cardbus.eventstore import Envelope
from cardbus.eventstore import events as ev
from cardbus.eventstore.nats.connection import NatsOptions
from cardbus.tools.cmd_nats import authorization_config


class Quick(Agent):
    agent_id = "quick"
    description = "adds one"
    capabilities = [Capability("quick", N, N, "add one")]

    async def handle(self, task, inputs, ctx):  # type: ignore[no-untyped-def]
        return N(n=inputs.n + 1)


Slow = slow_agent(1.5)  # time for the forgeries to arrive first


def as_agent(url: str, agent_id: str) -> NatsOptions:
    return NatsOptions(
        url=url, user=f"agent-{agent_id}", password="pw", inbox_prefix=agent_inbox_prefix(agent_id)
    )


async def test_forged_results_and_announcements_change_nothing(tmp_path: Any) -> None:
    config = authorization_config(["quick", "slow"], "pw")
    with NatsServer(tmp_path / "nats", extra_config=config) as server:
        url = server.url
        orch = NatsOptions(url=url, user="orchestrator", password="pw")
        async with NatsRuntime(orch, bus_options=FAST_BUS) as rt:
            dispatched: asyncio.Future[Envelope] = asyncio.get_running_loop().create_future()

            def watch(env: Envelope) -> None:
                if isinstance(env.data, ev.TaskDispatched) and not dispatched.done():
                    dispatched.set_result(env)

            rt.orchestrator.observers.append(watch)
            stops = {a.agent_id: asyncio.Event() for a in (Quick, Slow)}
            serving = [
                asyncio.create_task(
                    serve_agents(
                        as_agent(url, a.agent_id), [a], stops[a.agent_id], bus_options=FAST_BUS
                    )
                )
                for a in (Quick, Slow)
            ]
            await rt.wait_for_capabilities(["quick", "slow"], 10)
            slow_card = rt.orchestrator.state.agents["slow"]
            assert slow_card.constraints.tools == []
            plan = Plan(goal="forge", tasks=[PlanTask(id="b", capability="slow", inputs={"n": 1})])
            root = await rt.submit(plan)
            env = await asyncio.wait_for(dispatched, 10)
            task, attempt = env.stream, env.data.attempt  # type: ignore[union-attr]
            assert env.data.agent_id == "slow"  # type: ignore[union-attr]

            # quick attacks, with its own user
            errors: list[str] = []

            async def on_error(e: Exception) -> None:
                errors.append(str(e).lower())

            quick = NatsBus(await as_agent(url, "quick").connect("quick", error_cb=on_error))
            try:
                forged = ResultCard(
                    task_id=task, attempt=attempt, agent_id="slow", status="completed",
                    output={"n": 999},
                )  # fmt: skip
                started = Started(task_id=task, attempt=attempt, agent_id="slow")
                own = ResultCard(
                    task_id=task, attempt=attempt, agent_id="quick", status="completed",
                    output={"n": 998},
                )  # fmt: skip
                widened = msgspec_replace_tools(slow_card, ["http_fetch"])
                await quick.reply_raw(encode(forged), f"cardbus.reply.quick.{task}")
                await quick.reply_raw(encode(started), f"cardbus.reply.quick.{task}")
                await quick.reply(own)  # its own name, on its own subject, not its task
                await quick.reply_raw(encode(Announce(card=widened)), "cardbus.reply.quick.x")
                await quick.reply_raw(encode(Announce(card=widened)), "cardbus.announce.quick")
                for subject in (f"cardbus.reply.slow.{task}", "cardbus.announce.slow"):
                    await quick.nc.publish(subject, encode(forged))  # slow's: the server refuses
                await quick.nc.flush()
                ask = AgentRequest(
                    request_id="r1", task_id=task, attempt=attempt, agent_id="slow", kind="tool",
                    target="http_fetch",
                )  # fmt: skip
                from cardbus.agents import requests as rq

                answer = rq.decode_response(
                    (await quick.nc.request("cardbus.req.quick", rq.encode(ask), timeout=5)).data
                )
                assert answer.error_type == "access_denied" and "in the name of 'slow'" in (
                    answer.error or ""
                )
            finally:
                await quick.close()
            assert any('violation for publish to "cardbus.reply.slow.' in e for e in errors)
            assert any('violation for publish to "cardbus.announce.slow"' in e for e in errors)

            # slow itself asks for a tool it was never granted
            slow = await NatsBus.connect(as_agent(url, "slow"), **FAST_BUS)
            try:
                await slow.reply(Announce(card=widened))
            finally:
                await slow.close()

            result = await rt.orchestrator.wait(root, 20)
            assert result.status == "completed" and result.outputs["b"] == {"n": 11}

            log = await rt.store.read_all(0, 10_000)

            def refusals() -> list[ev.ReplyRefused]:
                return [e.data for e in log if isinstance(e.data, ev.ReplyRefused)]

            for _ in range(100):  # the refusals are recorded by the decision loop
                log = await rt.store.read_all(0, 10_000)
                if len(refusals()) >= 7:
                    break
                await asyncio.sleep(0.05)
            got = {(r.kind, r.claimed_agent_id, r.sender) for r in refusals()}
            assert got >= {
                ("result", "slow", "quick"),  # forged, on quick's subject
                ("started", "slow", "quick"),
                ("result", "quick", "quick"),  # its own name, a task never dispatched to it
                ("announce", "slow", "quick"),  # on a reply subject, and on quick's own
                ("request", "slow", "quick"),
                ("announce", "slow", "slow"),  # slow asking for more than it has
            }, got
            on_task = [e for e in log if isinstance(e.data, ev.ReplyRefused) and e.stream == task]
            assert {e.data.kind for e in on_task} >= {"result", "started", "request"}  # type: ignore[union-attr]
            widening = next(r for r in refusals() if r.sender == "slow")
            assert "tool 'http_fetch'" in widening.reason

            # the log credits slow with its own output, and nothing else completed the task
            done = [e for e in log if isinstance(e.data, ev.TaskCompleted) and e.stream == task]
            assert len(done) == 1 and done[0].data.agent_id == "slow"  # type: ignore[union-attr]
            assert done[0].data.output == {"n": 11}  # type: ignore[union-attr]
            submitted = [e.data for e in log if isinstance(e.data, ev.TaskResultSubmitted)]
            assert [(s.agent_id, s.output) for s in submitted] == [("slow", {"n": 11})]
            # the forged announcements changed nothing
            assert rt.orchestrator.state.agents["slow"].constraints.tools == []
            registered = [e.data for e in log if isinstance(e.data, ev.AgentRegistered)]
            assert all(
                "http_fetch" not in r.card.get("constraints", {}).get("tools", [])
                for r in registered
            )
            assert await rt.store.verify() == [] and (await rt.store.audit())[0] == []
            for r in refusals():  # shown with pytest -s
                print(f"reply.refused {r.kind:<8} claimed={r.claimed_agent_id:<6}"
                      f" sender={r.sender:<6} {r.reason}")  # fmt: skip
            print(
                f"run {result.status}: {result.outputs}; task.completed by {done[0].data.agent_id}"
            )  # type: ignore[union-attr]
            for s in stops.values():
                s.set()
            await asyncio.gather(*serving)


def msgspec_replace_tools(card: Any, tools: list[str]) -> Any:
    return msgspec.structs.replace(
        card, constraints=msgspec.structs.replace(card.constraints, tools=tools)
    )


async def test_with_an_agents_file_only_granted_agents_register_on_nats(tmp_path: Any) -> None:
    """The operator grants quick alone, without its capability's tools: slow's announcement
    is refused and recorded, quick registers within its grant and runs its task."""
    path = tmp_path / "agents.json"
    path.write_bytes(msgspec.json.encode([Quick.card()]))
    with NatsServer(tmp_path / "nats") as server:
        opts = NatsOptions(url=server.url)
        async with NatsRuntime(opts, bus_options=FAST_BUS, grants=AgentGrants.load(path)) as rt:
            stop = asyncio.Event()
            serving = asyncio.create_task(
                serve_agents(opts, [Quick, Slow], stop, bus_options=FAST_BUS)
            )
            plan = Plan(goal="g", tasks=[PlanTask(id="a", capability="quick", inputs={"n": 1})])
            result = await rt.run(plan, timeout=20, agent_timeout=10)
            assert result.status == "completed" and result.outputs["a"] == {"n": 2}
            for _ in range(100):
                log = await rt.store.read_all(0, 10_000)
                refused = [e for e in log if isinstance(e.data, ev.ReplyRefused)]
                if refused:
                    break
                await asyncio.sleep(0.05)
            assert [(e.stream, e.data.reason) for e in refused] == [  # type: ignore[union-attr]
                ("agent-slow", "not granted: agent 'slow' is not granted")
            ]
            assert sorted(rt.orchestrator.state.agents) == ["quick"]
            stop.set()
            await serving
