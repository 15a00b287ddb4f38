"""The published wire format (``cardbus.bus.wire``): schemas generated from the types on the
wire, the contract, the journal's request arguments, and the wire version rule."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jsonschema
import msgspec
import pytest
from click.testing import CliRunner

from cardbus.agents.cards import (
    WIRE_VERSION,
    AgentCard,
    Announce,
    CancelNotice,
    CapabilitySpec,
    ResultCard,
    Started,
    TaskCard,
    encode,
)
from cardbus.agents.journal import TaskJournal
from cardbus.agents.requests import AgentRequest, AgentResponse, TaskServices
from cardbus.bus import wire
from cardbus.bus.orchestrator.registry import AgentGrants
from cardbus.bus.transport.nats import agent_permissions
from cardbus.eventstore.errors import ValidationError
from cardbus.eventstore.events import ReviewIssue
from cardbus.tools.cli import cli

CARD = AgentCard(agent_id="upper", name="Upper", capabilities=[CapabilitySpec(name="text.upper")])


def valid(name: str, message: bytes | dict[str, Any]) -> None:
    doc = json.loads(message) if isinstance(message, bytes) else message
    jsonschema.Draft202012Validator(wire.schema(name)).validate(doc)


def invalid(name: str, doc: dict[str, Any]) -> str:
    with pytest.raises(jsonschema.ValidationError) as caught:
        jsonschema.Draft202012Validator(wire.schema(name)).validate(doc)
    return caught.value.message


def test_every_schema_is_a_valid_json_schema_with_its_version() -> None:
    for name, doc in wire.schemas().items():
        jsonschema.Draft202012Validator.check_schema(doc)
        assert doc["$id"] == f"urn:cardbus:wire:{WIRE_VERSION}:{name}"


def test_messages_the_code_encodes_are_valid_and_wrong_ones_are_not() -> None:
    card = TaskCard(
        task_id="t1",
        root_id="r1",
        capability="text.upper",
        inputs={"text": "hi"},
        review=[ReviewIssue(issue_type="length", section="all", severity="low", suggestion="more")],
    )
    valid("task_card", encode(card))
    valid("started", encode(Started(task_id="t1", attempt=1, agent_id="upper")))
    result = ResultCard(task_id="t1", attempt=1, agent_id="upper", status="completed", output=1)
    valid("result_card", encode(result))
    valid("reply", encode(result))
    announce = Announce(card=CARD, replica_id="h-1")
    valid("announce", encode(announce))
    notice = CancelNotice(task_id="t1", attempt=1, agent_id="upper", reason="r", by="ann")
    valid("cancel_notice", encode(notice))
    assert json.loads(encode(announce))["wire_version"] == WIRE_VERSION
    request = AgentRequest(request_id="q", task_id="t1", attempt=1, agent_id="a", kind="tool")
    valid("agent_request", msgspec.json.encode(request))
    valid("agent_response", msgspec.json.encode(AgentResponse(request_id="q", ok=True)))
    # what the decoder refuses, the schema refuses
    bad = json.loads(encode(result)) | {"status": "done"}
    assert "'done' is not one of" in invalid("result_card", bad)
    assert "'attempt' is a required property" in invalid(
        "started", {"type": "started", "task_id": "t1", "agent_id": "a"}
    )
    assert invalid("result_card", json.loads(encode(result)) | {"confidence": 2})
    with pytest.raises(ValidationError, match="no wire schema 'nope'"):
        wire.schema("nope")


def test_the_contract_is_read_from_the_transport() -> None:
    c = wire.contract()
    assert c["wire_version"] == WIRE_VERSION
    mine = agent_permissions("AGENTID")
    assert c["agent_permissions"]["publish"] == [
        p.replace("AGENTID", "<agent>") for p in mine["publish"]
    ]
    assert c["inbox_consumer"]["durable_name"] == "agent-<agent>"
    assert c["subjects"]["reply"]["subject"] == "cardbus.reply.<agent>.<task>"
    assert c["subjects"]["cancel"]["subject"] == "cardbus.cancel.<agent>"
    assert c["agent_permissions"]["subscribe"] == [
        "_INBOX.<agent>.>",
        "cardbus.cancel.<agent>",
        "cardbus.watching",
    ]
    assert set(c["headers"]) == {"Nats-Msg-Id", "traceparent", "Cardbus-Partition"}


class _Recorder:
    """The orchestrator's side of a journaled call, as far as the agent sees it."""

    def __init__(self) -> None:
        self.sent: list[AgentRequest] = []

    async def __call__(self, req: AgentRequest) -> AgentResponse:
        self.sent.append(req)
        result: dict[str, Any] = {"recorded": True}
        if req.kind == "model.request":
            result = {"call": "c1"}
        elif req.kind == "tool.begin":
            result = {"key": "k1"}
        return AgentResponse(request_id=req.request_id, ok=True, result=result)


def test_the_journal_sends_the_arguments_its_schemas_publish() -> None:
    """The journal builds its requests' args as dicts: each kind's args are checked here
    against its schema, key by key (no key the schema does not name), so they cannot
    drift apart."""
    recorder = _Recorder()
    services = TaskServices()
    services.task = TaskCard(task_id="t1", root_id="r1", capability="c")
    services.agent_id = "a"
    services.requester = recorder
    journal = TaskJournal(services)

    async def answer() -> dict[str, Any]:
        return {"text": "ok", "input_tokens": 3, "output_tokens": 1, "model": "m"}

    async def failing() -> dict[str, Any]:
        raise RuntimeError("model down")

    async def tool(key: str) -> Any:
        return {"done": key}

    async def scenario() -> None:
        await journal.call({"model": "m", "messages": []}, answer)
        with pytest.raises(RuntimeError):
            await journal.call({"model": "m", "messages": []}, failing)
        await journal.tool_call("search", {"q": "x"}, tool)

    asyncio.run(scenario())
    kinds = [r.kind for r in recorder.sent]
    assert kinds == [
        "model.request",
        "model.answer",
        "model.request",
        "model.answer",
        "tool.begin",
        "tool.end",
    ]
    for req in recorder.sent:
        name = req.kind.replace(".", "_") + "_args"
        valid(name, req.args)
        properties = wire.schema(name)["$defs"]
        (struct,) = (d for d in properties.values() if "properties" in d and d.get("title"))
        assert set(req.args) <= set(struct["properties"]), (req.kind, req.args)
        valid("agent_request", msgspec.json.encode(req))


def test_an_announcement_in_another_wire_version_registers_nothing() -> None:
    open_grants = AgentGrants()
    refused = open_grants.admit(CARD, None, WIRE_VERSION + 1)
    assert refused.card is None
    assert refused.refused == [f"wire version {WIRE_VERSION + 1} (this orchestrator speaks 1)"]
    assert open_grants.admit(CARD, None, WIRE_VERSION).card == CARD
    # an announcement without the field is version 1 (agents before it)
    raw = json.loads(encode(Announce(card=CARD)))
    del raw["wire_version"]
    assert msgspec.json.decode(json.dumps(raw), type=Announce).wire_version == 1


def test_cardbus_schema_prints_and_writes_them(tmp_path: Any) -> None:
    runner = CliRunner()
    listed = runner.invoke(cli, ["schema"])
    assert listed.exit_code == 0 and "task_card" in listed.output and "contract" in listed.output
    one = runner.invoke(cli, ["schema", "result_card"])
    assert one.exit_code == 0 and json.loads(one.output) == wire.schema("result_card")
    written = runner.invoke(cli, ["schema", "--out", str(tmp_path / "s")])
    assert written.exit_code == 0
    files = sorted(p.name for p in (tmp_path / "s").iterdir())
    assert files == sorted([f"{n}.schema.json" for n in wire.SCHEMA_NAMES] + ["contract.json"])
    on_disk = json.loads((tmp_path / "s" / "announce.schema.json").read_text())
    assert on_disk == wire.schema("announce")
    as_json = json.loads(runner.invoke(cli, ["schema", "--json"]).output)
    assert as_json == {"wire_version": 1, "schemas": [*wire.SCHEMA_NAMES, "contract"]}
    wrong = runner.invoke(cli, ["schema", "nope"])
    assert wrong.exit_code == 1 and "no wire schema 'nope'" in wrong.output
