"""Registration authority and result authenticity, on the in-process bus.

Announcements are claims: they may refresh descriptive fields and narrow what is
registered, never widen tools, capabilities or limits (``bus.orchestrator.registry``);
an operator's agents file (``AgentGrants``) decides who may register at all. A reply
from an agent no attempt was sent to is refused and recorded (``reply.refused``), and a
refusal reported by the transport (``Bus.on_refused``) is recorded on the task's stream.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest
from orchkit import FAST, Runtime, make_agent, task

from cardbus.agents.cards import (
    AgentCard,
    AgentConstraints,
    Announce,
    CapabilitySpec,
    ResultCard,
    Started,
)
from cardbus.agents.schema import capability_schema_problems, schema_problem
from cardbus.bus import InProcessBus, Orchestrator, Plan
from cardbus.bus.orchestrator.registry import (
    AgentGrants,
    check_registrable,
    narrowed,
)
from cardbus.bus.transport.interface import Refusal
from cardbus.eventstore import EventStore, MemoryEventStore
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import ConfigError, InvalidPlan, ValidationError

BASE = AgentCard(
    agent_id="slow",
    name="Slow",
    capabilities=[CapabilitySpec(name="slow", output_schema={"type": "object"})],
    constraints=AgentConstraints(max_timeout_s=60.0, max_concurrency=2, tools=["doc_search"]),
)


def with_(card: AgentCard, **constraints: Any) -> AgentCard:
    return msgspec.structs.replace(
        card, constraints=msgspec.structs.replace(card.constraints, **constraints)
    )


# -- the pure rules ---------------------------------------------------------------------


def test_an_announcement_never_widens_and_may_narrow_and_describe() -> None:
    asked = msgspec.structs.replace(
        with_(BASE, tools=["doc_search", "http_fetch"], max_timeout_s=None, max_concurrency=9),
        description="new words",
        version="2.0",
        capabilities=[
            CapabilitySpec(name="slow", output_schema={}),  # a looser schema
            CapabilitySpec(name="admin"),
        ],
    )
    admission = narrowed(BASE, asked)
    card = admission.card
    assert card is not None
    assert card.constraints.tools == ["doc_search"]
    assert card.constraints.max_timeout_s == 60.0 and card.constraints.max_concurrency == 2
    assert [c.name for c in card.capabilities] == ["slow"]
    assert card.capabilities[0].output_schema == {"type": "object"}  # the granted spec
    assert (card.description, card.version) == ("new words", "2.0")
    assert admission.refused == [
        "capability 'admin'",
        "tool 'http_fetch'",
        "max_timeout_s unlimited (granted 60.0)",
        "max_concurrency 9 (granted 2)",
    ]
    smaller = narrowed(BASE, with_(BASE, tools=[], max_timeout_s=10.0))
    assert smaller.refused == [] and smaller.card == with_(BASE, tools=[], max_timeout_s=10.0)
    assert narrowed(BASE, BASE) == type(admission)(BASE, [])


def test_grants_decide_who_may_register(tmp_path: Path) -> None:
    grants = AgentGrants([BASE])
    assert grants.closed and not AgentGrants().closed
    stranger = AgentCard(agent_id="x", name="X")
    assert grants.admit(stranger, None).card is None
    assert grants.admit(stranger, None).refused == ["agent 'x' is not granted"]
    assert AgentGrants().admit(stranger, None).card == stranger  # open: first use
    f = tmp_path / "agents.json"
    f.write_bytes(msgspec.json.encode({"agents": [BASE]}))
    assert AgentGrants.load(f).cards == {"slow": BASE}
    f.write_bytes(msgspec.json.encode([BASE]))
    assert AgentGrants.load(f).cards == {"slow": BASE}
    for bad in (b"{", b'{"agents": 3}', b'[{"agent_id": 1}]'):
        f.write_bytes(bad)
        with pytest.raises(ConfigError, match="agents file"):
            AgentGrants.load(f)
    with pytest.raises(ConfigError, match="granted twice"):
        AgentGrants([BASE, BASE])


# -- through the orchestrator -----------------------------------------------------------


async def _wait_for(cond: Any, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise AssertionError("condition not met")
        await asyncio.sleep(0.01)


async def _log(store: EventStore) -> list[Any]:
    return await store.read_all(0, 100_000)


async def test_a_re_announcement_asking_for_a_tool_changes_nothing_and_is_recorded() -> None:
    store = MemoryEventStore()
    bus = InProcessBus()
    orch = Orchestrator(store, bus, FAST)
    await orch.start()
    try:
        await bus.reply(Announce(card=BASE))  # open: the first card is the ceiling
        await _wait_for(lambda: "slow" in orch.state.agents)
        await bus.reply(Announce(card=with_(BASE, tools=["doc_search", "http_fetch"])))
        await bus.reply(Announce(card=msgspec.structs.replace(BASE, description="refreshed")))
        await _wait_for(lambda: orch.state.agents["slow"].description == "refreshed")
        assert orch.state.agents["slow"].constraints.tools == ["doc_search"]
        events = await _log(store)
        refused = [e for e in events if isinstance(e.data, ev.ReplyRefused)]
        assert len(refused) == 1 and refused[0].stream == "agent-slow"
        r = refused[0].data
        assert (r.kind, r.claimed_agent_id, r.sender) == ("announce", "slow", "slow")
        assert r.reason == "not granted: tool 'http_fetch'"
        cards = [e.data.card for e in events if isinstance(e.data, ev.AgentRegistered)]
        assert all("http_fetch" not in c["constraints"]["tools"] for c in cards)
        # the operator widens it: register() is the operator's path
        await orch.register(with_(BASE, tools=["doc_search", "http_fetch"]))
        assert orch.state.agents["slow"].constraints.tools == ["doc_search", "http_fetch"]
    finally:
        await orch.stop()
        await bus.close()


async def test_with_an_agents_file_only_granted_agents_register_and_within_the_grant() -> None:
    store = MemoryEventStore()
    bus = InProcessBus()
    orch = Orchestrator(store, bus, FAST, agents=[with_(BASE, tools=[])])
    await orch.start()
    try:
        await bus.reply(Announce(card=AgentCard(agent_id="stranger", name="S")))
        await bus.reply(Announce(card=BASE))  # asks for doc_search, granted none
        await _wait_for(lambda: "slow" in orch.state.agents)
        await _wait_for(
            lambda: len([e for e in orch.state.versions if e.startswith("agent-")]) == 2
        )
        assert "stranger" not in orch.state.agents
        assert orch.state.agents["slow"].constraints.tools == []
        events = await _log(store)
        reasons = {e.stream: e.data.reason for e in events if isinstance(e.data, ev.ReplyRefused)}
        assert reasons == {
            "agent-stranger": "not granted: agent 'stranger' is not granted",
            "agent-slow": "not granted: tool 'doc_search'",
        }
    finally:
        await orch.stop()
        await bus.close()


async def test_replies_for_a_task_never_sent_to_their_agent_are_refused() -> None:
    """An agent answers (in its own name) for a task dispatched to another: refused and
    recorded; a transport refusal (a forged sender) is recorded on the task's stream;
    the honest answer completes the task."""
    gate = asyncio.Event()

    async def slowly(card: Any, inputs: Any, ctx: Any) -> Any:
        await gate.wait()
        return {"text": "honest"}

    store = MemoryEventStore()
    rt = await Runtime(
        store, [make_agent("slow", "echo", slowly), make_agent("quick", "other")]
    ).start()
    try:
        root = await rt.orch.submit(Plan(goal="g", tasks=[task("a")]))
        await _wait_for(
            lambda: any(t.state and t.dispatched_to for t in rt.orch.state.tasks.values())
        )
        t = next(iter(rt.orch.state.tasks.values()))
        assert list(t.dispatched_to) == ["slow"]
        await rt.bus.reply(Started(task_id=t.task_id, attempt=t.attempt, agent_id="quick"))
        await rt.bus.reply(
            ResultCard(
                task_id=t.task_id, attempt=t.attempt, agent_id="quick", status="completed",
                output={"text": "forged"},
            )
        )  # fmt: skip
        rt.orch._on_refused(
            Refusal(
                "result", "slow", "quick", "sent by 'quick' in the name of 'slow'", t.task_id, 1
            )
        )
        await _wait_for(lambda: rt.orch.state.versions.get(t.task_id, 0) >= 5)
        gate.set()
        result = await rt.orch.wait(root, 10)
        assert result.status == "completed" and result.outputs["a"] == {"text": "honest"}
        events = [e for e in await _log(store) if e.stream == t.task_id]
        refused = [e.data for e in events if isinstance(e.data, ev.ReplyRefused)]
        assert {(r.kind, r.claimed_agent_id, r.sender) for r in refused} == {
            ("started", "quick", "quick"),
            ("result", "quick", "quick"),
            ("result", "slow", "quick"),
        }
        assert all(r.task_id == t.task_id and r.attempt == 1 for r in refused)
        done = [e.data for e in events if isinstance(e.data, ev.TaskCompleted)]
        assert [(d.agent_id, d.output) for d in done] == [("slow", {"text": "honest"})]
        assert not [e for e in events if isinstance(e.data, ev.TaskResultIgnored)]
        assert await store.verify() == []
    finally:
        await rt.stop()


# -- schemas that are not JSON Schema are refused at the door -----------------------------

BROKEN = CapabilitySpec(
    name="lookup", input_schema={"type": "object", "properties": {"q": {"type": "strin"}}}
)
NO_REGEX = CapabilitySpec(name="match", output_schema={"pattern": "["})


def test_a_schema_that_is_not_json_schema_is_named_with_its_reason() -> None:
    assert schema_problem({}) is None and schema_problem({"type": "object"}) is None
    assert schema_problem({"type": {}}) == "$.type: {} is not valid under any of the given schemas"
    assert schema_problem({"pattern": "["}) == "$.pattern: '[' is not a 'regex'"
    assert schema_problem({"required": "q"}) == "$.required: 'q' is not of type 'array'"
    card = msgspec.structs.replace(BASE, capabilities=[*BASE.capabilities, BROKEN, NO_REGEX])
    assert capability_schema_problems(card.capabilities) == {
        "lookup": "input_schema is not a JSON Schema: $.properties.q.type: 'strin' is not "
        "valid under any of the given schemas",
        "match": "output_schema is not a JSON Schema: $.pattern: '[' is not a 'regex'",
    }
    admission = AgentGrants().admit(card, None)  # open: the first card, less what is broken
    assert admission.card is not None
    assert [c.name for c in admission.card.capabilities] == ["slow"]
    assert [r.split(":")[0] for r in admission.refused] == [
        "capability 'lookup'",
        "capability 'match'",
    ]
    # a ceiling from an older log that holds a broken schema is not carried on either
    again = AgentGrants().admit(card, card)
    assert again.card is not None and [c.name for c in again.card.capabilities] == ["slow"]
    with pytest.raises(ValidationError, match="capability 'lookup': input_schema is not a JSON"):
        check_registrable(card)
    with pytest.raises(ConfigError, match="agent 'slow', capability 'lookup': input_schema"):
        AgentGrants([card])


async def test_an_announced_capability_with_a_broken_schema_is_refused_and_recorded() -> None:
    store = MemoryEventStore()
    bus = InProcessBus()
    orch = Orchestrator(store, bus, FAST)
    await orch.start()
    try:
        card = msgspec.structs.replace(BASE, capabilities=[*BASE.capabilities, BROKEN])
        await bus.reply(Announce(card=card))
        await _wait_for(lambda: "slow" in orch.state.agents)
        assert [c.name for c in orch.state.agents["slow"].capabilities] == ["slow"]
        events = await _log(store)
        refused = [e.data for e in events if isinstance(e.data, ev.ReplyRefused)]
        assert [r.reason for r in refused] == [
            "not granted: capability 'lookup': input_schema is not a JSON Schema: "
            "$.properties.q.type: 'strin' is not valid under any of the given schemas"
        ]
        # a plan for it is refused whole at submit, not failed task by task
        with pytest.raises(InvalidPlan, match="lookup"):
            await orch.submit(Plan(goal="g", tasks=[task("a", capability="lookup")]))
        # the operator's path says so at once
        with pytest.raises(ValidationError, match="capability 'lookup'"):
            await orch.register(msgspec.structs.replace(card, agent_id="other"))
        assert "other" not in orch.state.agents
    finally:
        await orch.stop()
        await bus.close()
