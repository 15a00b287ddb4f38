"""An agent that imports nothing from cardbus (``examples/foreign_agent/agent.py``: raw
nats-py, written against the published wire format) on a real nats-server: it passes
every clause of ``cardbus agent check``, serves a plan's task run by ``cardbus
orchestrator`` (replayed and verified after), loses no card on a slow link, and when it
misbehaves (answers in another
agent's name, publishes outside its permissions, speaks another wire version) it is
refused and the log says so."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from agentprocs import REPO, AgentProcess, cardbus, clauses
from natsprocs import FAST_BUS
from natsserver import NatsServer
from slowlink import SlowLink

from cardbus.agents.cards import AgentCard, Announce, CapabilitySpec
from cardbus.bus.conformance import CLAUSES
from cardbus.bus.orchestrator.plan import Plan, PlanTask
from cardbus.bus.runtime.nats import NatsRuntime
from cardbus.bus.transport.nats import INBOX_STREAM, consumer_name
from cardbus.eventstore import Envelope
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import ValidationError
from cardbus.eventstore.nats.connection import NatsOptions
from cardbus.tools.cmd_nats import authorization_config

AGENT = REPO / "examples" / "foreign_agent" / "agent.py"


def foreign_agent(tmp: Path, url: str, *args: str, name: str = "foreign") -> AgentProcess:
    """The foreign agent, as a subprocess."""
    return AgentProcess([sys.executable, str(AGENT), "--nats", url, *args], tmp, name)


def test_the_agent_imports_nothing_from_cardbus() -> None:
    source = AGENT.read_text()
    assert not re.search(r"^\s*(from|import)\s+cardbus", source, re.M)
    assert re.search(r"^import nats$", source, re.M)


def test_the_raw_nats_agent_passes_the_kit_and_serves_a_plan(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    url = nats_server.url
    agent = foreign_agent(tmp_path, url, "--agent", "upper", "--lease", "1.5")
    try:
        agent.wait_for("connected")  # it waits for the streams: the kit makes them
        check = cardbus("agent", "check", "--nats", url, "--agent", "upper", cwd=tmp_path)
        assert check.returncode == 0, check.stdout + check.stderr
        outcomes = clauses(check.stdout)
        assert sorted(outcomes) == sorted(CLAUSES), check.stdout
        # it makes no model call: the journal's clause is the only one not exercised
        assert {c for c, o in outcomes.items() if o != "PASS"} == {"journal"}, check.stdout
        assert outcomes["journal"] == "NOT EXERCISED"

        plan = {
            "goal": "shout",
            "tasks": [{"id": "up", "capability": "text.upper", "inputs": {"text": "hi there"}}],
        }
        (tmp_path / "plan.json").write_text(json.dumps(plan))
        run = cardbus(
            "orchestrator", "--nats", url, "--plan", "plan.json", "--json", "--timeout", "60",
            cwd=tmp_path,
        )  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
        result = json.loads(run.stdout.strip().splitlines()[-1])
        assert result["status"] == "completed"
        assert result["outputs"]["up"] == {"text": "HI THERE"}
        replay = cardbus("replay", result["root_id"], "--store", url, cwd=tmp_path)
        assert replay.returncode == 0, replay.stdout + replay.stderr
        assert re.search(r"result_submitted +#1 upper +result completed", replay.stdout), (
            replay.stdout
        )
        assert "text.upper up-" in replay.stdout and "completed  agent upper" in replay.stdout
        verify = cardbus("verify", "--store", url, cwd=tmp_path)
        assert verify.returncode == 0, verify.stdout + verify.stderr
    finally:
        agent.stop()


def test_no_card_is_lost_on_a_slow_link(tmp_path: Path, nats_server: NatsServer) -> None:
    """0.4 s from its server each way, a round trip (0.8 s) past its own fetch timeout
    (0.5 s): a card that arrives after a fetch gave up waits in its pull subscription for
    the next fetch (nats-py keeps one subscription for every fetch), so every card is
    answered at its first delivery. (Each card is late, the first one to a pull waiting on
    the server as the others to one that finds it waiting: three cards show both, and
    every round trip costs the test 0.8 s.)"""
    url = nats_server.url
    with SlowLink(nats_server.port, delay_s=0.4) as link:
        agent = foreign_agent(tmp_path, link.url, "--agent", "upper", "--lease", "3")
        try:
            agent.wait_for("connected", timeout=60)
            check = cardbus(
                "agent", "check", "--nats", url, "--agent", "upper", "--timeout", "25",
                cwd=tmp_path,
            )  # fmt: skip
            assert check.returncode == 0, check.stdout + check.stderr + agent.output()
            tasks = [
                {"id": f"u{i}", "capability": "text.upper", "inputs": {"text": f"card {i}"}}
                for i in range(3)
            ]
            (tmp_path / "plan.json").write_text(json.dumps({"goal": "far", "tasks": tasks}))
            run = cardbus(
                "orchestrator", "--nats", url, "--plan", "plan.json", "--json",
                "--timeout", "120", cwd=tmp_path,
            )  # fmt: skip
        finally:
            agent.stop()
        assert link.connections >= 1
    assert run.returncode == 0, run.stdout + run.stderr + agent.output()
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["outputs"] == {f"u{i}": {"text": f"CARD {i}"} for i in range(3)}
    tail = cardbus("tail", "--store", url, "--json", "-n", "1000", cwd=tmp_path)
    assert tail.returncode == 0, tail.stdout + tail.stderr
    events = [json.loads(line) for line in tail.stdout.splitlines() if line.strip()]
    answered = [
        e["data"]
        for e in events
        if e["correlation_id"] == result["root_id"]
        and e["data"]["type"] == "task.result_submitted.v1"
    ]
    # each card answered once, at its first attempt and its first delivery: none was lost
    assert sorted((a["attempt"], a["delivery"]) for a in answered) == [(1, 1)] * 3, answered


@pytest.mark.parametrize(
    ("misbehaviour", "failed", "said"),
    [
        (("--answer-as", "someone"), {"take", "reject", "identity"}, "in the name of 'someone'"),
        (("--wire-version", "2"), {"announce"}, "wire version 2, not 1"),
    ],
    ids=["another-name", "another-wire-version"],
)
def test_the_kit_fails_an_agent_that_breaks_the_contract(
    tmp_path: Path,
    nats_server: NatsServer,
    misbehaviour: tuple[str, str],
    failed: set[str],
    said: str,
) -> None:
    url = nats_server.url
    agent = foreign_agent(tmp_path, url, "--agent", "upper", *misbehaviour)
    try:
        agent.wait_for("connected")
        check = cardbus(
            "agent", "check", "--nats", url, "--agent", "upper", "--timeout", "3", cwd=tmp_path
        )
    finally:
        agent.stop()
    assert check.returncode == 1, check.stdout + check.stderr
    outcomes = clauses(check.stdout)
    assert {c for c, o in outcomes.items() if o == "FAIL"} == failed, check.stdout
    assert said in check.stdout
    assert check.stdout.strip().endswith(f"FAILED: {len(failed)} clause(s)")


def test_the_kit_fails_a_model_call_not_journaled(tmp_path: Path, nats_server: NatsServer) -> None:
    """An agent that calls its model without journaling the call, and reports the tokens
    in its result: the journal's clause fails, and says which task."""
    from tests.agents.openai_stub import OpenAIStub

    url = nats_server.url
    with OpenAIStub() as stub:
        stub.script("forty-two", "forty-two")
        args = ("--agent", "asker", "--llm", stub.url, "--no-journal")
        agent = foreign_agent(tmp_path, url, *args)
        try:
            agent.wait_for("connected")
            check = cardbus(
                "agent", "check", "--nats", url, "--agent", "asker", "--capability", "text.ask",
                cwd=tmp_path,
            )  # fmt: skip
        finally:
            agent.stop()
    assert check.returncode == 1, check.stdout + check.stderr + agent.output()
    outcomes = clauses(check.stdout)
    assert {c for c, o in outcomes.items() if o == "FAIL"} == {"journal"}, check.stdout
    assert re.search(r"FAIL +journal +check-\S+-take reported 18 model tokens", check.stdout)
    assert len(stub.requests) == 2  # it did call the model: the calls the log lacks


def _refusals(envs: list[Envelope]) -> list[ev.ReplyRefused]:
    return [e.data for e in envs if isinstance(e.data, ev.ReplyRefused)]


async def _lease_is(rt: NatsRuntime, agent_id: str, *, live: bool) -> None:
    """Once the orchestrator holds (or no longer holds) a live lease of ``agent_id``."""
    deadline = time.monotonic() + 30
    while rt.orchestrator.leases.live(agent_id, time.time()) != live:
        assert time.monotonic() < deadline, f"{agent_id}'s lease never became live={live}"
        await asyncio.sleep(0.05)


async def test_another_identity_or_subject_is_refused_and_recorded(tmp_path: Path) -> None:
    """With the documented per-agent permissions: a result naming another agent, on its own
    subject, is refused and recorded as ``reply.refused``; a result on another agent's
    subject never leaves the server (a permissions violation) and records nothing."""
    config = authorization_config(["upper", "other"], "pw")
    with NatsServer(tmp_path / "nats", extra_config=config) as server:
        url = server.url
        orch = NatsOptions(url=url, user="orchestrator", password="pw")
        as_upper = ("--agent", "upper", "--user", "agent-upper", "--password", "pw")
        async with NatsRuntime(orch, bus_options=FAST_BUS) as rt:
            seen: asyncio.Queue[Envelope] = asyncio.Queue()
            rt.orchestrator.observers.append(seen.put_nowait)
            plan = Plan(
                goal="forge",
                tasks=[PlanTask(id="t", capability="text.upper", inputs={"text": "x"})],
            )

            async def refused() -> ev.ReplyRefused:
                while True:
                    env = await seen.get()
                    if isinstance(env.data, ev.ReplyRefused):
                        return env.data

            # 1. a result in another agent's name, on its own subject
            agent = foreign_agent(tmp_path, url, *as_upper, "--answer-as", "other", name="forger")
            try:
                await rt.wait_for_capabilities(["text.upper"], 20)
                root = await rt.submit(plan)
                refusal = await asyncio.wait_for(refused(), 30)
            finally:
                agent.stop()
            assert (refusal.kind, refusal.sender, refusal.claimed_agent_id) == (
                "result",
                "upper",
                "other",
            )
            assert refusal.reason == "sent by 'upper' in the name of 'other'"
            events = await rt.store.read_correlation(root)
            assert not any(isinstance(e.data, ev.TaskCompleted) for e in events)

            # 2. a result on another agent's subject: the server refuses the publish. The
            # orchestrator has folded the forger's leave, then this one's lease: a plan
            # submitted in between would fail at once (upper: no live lease)
            await _lease_is(rt, "upper", live=False)
            agent = foreign_agent(tmp_path, url, *as_upper, "--reply-as", "other", name="outside")
            try:
                agent.wait_for("serving")
                await _lease_is(rt, "upper", live=True)
                other = await rt.submit(msgspec.structs.replace(plan, goal="outside"))
                agent.wait_for("cannot answer", 30)  # its answer never left
            finally:
                agent.stop()
            said = agent.output().lower()
            assert 'permissions violation for publish to "cardbus.reply.other.' in said, said
            assert "cardbus.reply.other." in server.log_tail(200)  # the server's record
            for run in (root, other):
                events = await rt.store.read_correlation(run)
                assert not any(isinstance(e.data, ev.TaskCompleted) for e in events)
            assert _refusals(await rt.store.read_correlation(other)) == []


async def test_an_unknown_wire_version_is_refused_once_and_sent_no_card(
    tmp_path: Path, nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    url = nats_server.url
    async with NatsRuntime(NatsOptions(url=url), bus_options=FAST_BUS) as rt:
        announcements: list[bytes] = []

        async def heard(msg: Any) -> None:
            announcements.append(msg.data)

        await rt.bus.nc.subscribe("cardbus.announce.upper", cb=heard)
        agent = foreign_agent(
            tmp_path, url, "--agent", "upper", "--wire-version", "2", "--lease", "0.9"
        )
        try:
            agent.wait_for("serving")
            # its announcement and two renewals after it are on the wire
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while len(announcements) < 3 and loop.time() < deadline:
                await asyncio.sleep(0.05)
            assert len(announcements) >= 3
            assert all(json.loads(a)["wire_version"] == 2 for a in announcements)
            # an announcement after them: once it is registered, the orchestrator has read
            # every one before it (replies are taken in the order of the stream)
            marker = AgentCard(
                agent_id="marker", name="m", capabilities=[CapabilitySpec(name="mark")]
            )
            await rt.bus.reply(Announce(card=marker, lease_s=0))
            await rt.wait_for_capabilities(["mark"], 20)
            # a plan for what it offers: no agent registered offers it, nothing is sent
            plan = Plan(goal="x", tasks=[PlanTask(id="t", capability="text.upper")])
            with pytest.raises(ValidationError, match=r"text\.upper"):
                await rt.orchestrator.submit(plan)
        finally:
            agent.stop()
        lines = [
            r.getMessage() for r in caplog.records if "announcement of upper" in r.getMessage()
        ]
        assert lines == [
            "announcement of upper: not granted: wire version 2 (this orchestrator speaks 1)"
        ]
        refusals = _refusals(await rt.store.read_stream("agent-upper"))
        assert [(r.kind, r.claimed_agent_id, r.reason) for r in refusals] == [
            ("announce", "upper", "not granted: wire version 2 (this orchestrator speaks 1)")
        ]
        assert "upper" not in rt.orchestrator.state.agents
        info = await rt.bus._js.consumer_info(INBOX_STREAM, consumer_name("upper"))
        assert info.delivered.stream_seq == 0 and info.num_pending == 0  # no card, ever


def test_its_model_calls_are_journaled_like_a_python_agents(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    """With a model (the loopback OpenAI stub), the foreign agent journals its call with
    ``model.request`` / ``model.answer``: the kit's journal clause passes, and a plan's run
    has the call in its log (``model.requested``, ``model.answered`` with the stub's usage)."""
    from tests.agents.openai_stub import OpenAIStub

    url = nats_server.url
    with OpenAIStub() as stub:
        stub.script("forty-two", "forty-two", "forty-two")
        agent = foreign_agent(tmp_path, url, "--agent", "asker", "--llm", stub.url)
        try:
            agent.wait_for("connected")
            check = cardbus(
                "agent", "check", "--nats", url, "--agent", "asker", "--capability", "text.ask",
                "--inputs", '{"question": "the answer?"}', cwd=tmp_path,
            )  # fmt: skip
            assert check.returncode == 0, check.stdout + check.stderr + agent.output()
            assert clauses(check.stdout) == dict.fromkeys(CLAUSES, "PASS"), check.stdout
            assert "2 model call(s) journaled" in check.stdout
            # one call for each card it took (the take and the partition clauses'), none
            # for the redelivered card
            assert len(stub.requests) == 2

            plan = {
                "goal": "ask",
                "tasks": [{"id": "q", "capability": "text.ask", "inputs": {"question": "why?"}}],
            }
            (tmp_path / "plan.json").write_text(json.dumps(plan))
            run = cardbus(
                "orchestrator", "--nats", url, "--plan", "plan.json", "--json", cwd=tmp_path
            )
        finally:
            agent.stop()
    assert run.returncode == 0, run.stdout + run.stderr + agent.output()
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["outputs"]["q"] == {"answer": "forty-two"}

    async def calls() -> list[Any]:
        async with NatsRuntime(NatsOptions(url=url), bus_options=FAST_BUS) as rt:
            events = await rt.store.read_correlation(result["root_id"])
        return [e.data for e in events if isinstance(e.data, ev.ModelRequested | ev.ModelAnswered)]

    journaled = asyncio.run(calls())
    assert [type(c).__name__ for c in journaled] == ["ModelRequested", "ModelAnswered"]
    answered = journaled[1]
    assert (answered.agent_id, answered.input_tokens, answered.output_tokens) == ("asker", 11, 7)
    assert answered.answer is not None and answered.answer["text"] == "forty-two"
