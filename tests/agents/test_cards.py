"""The three cards: frozen, validated on decode, JSON Schema, A2A round trip."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cardbus.agents.cards import (
    AgentCard,
    AgentConstraints,
    Announce,
    CapabilitySpec,
    ResultCard,
    Started,
    TaskCard,
    decode_agent_card,
    decode_reply,
    decode_result_card,
    decode_task_card,
    encode,
)
from cardbus.agents.schema import schema_errors
from cardbus.eventstore.errors import CardbusError, DecodeError
from cardbus.eventstore.events import ReviewIssue, Usage
from cardbus.eventstore.taskspec import TaskSpec

TASK = TaskCard(
    task_id="t1",
    root_id="r1",
    parent_id="p1",
    capability="research",
    goal="find facts",
    inputs={"topic": "bees", "n": 3},
    constraints={"language": "en"},
    deps=["t0"],
    timeout_s=12.5,
    max_attempts=4,
    budget_tokens=1000,
    attempt=2,
    review=[ReviewIssue(issue_type="gap", section="intro", severity="low", suggestion="more")],
    supplement={"facts": ["x"]},
    traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01",
)
RESULT = ResultCard(
    task_id="t1",
    attempt=2,
    agent_id="a1",
    status="completed",
    output={"facts": ["a", "b"]},
    confidence=0.75,
    needs_retry=True,
    notes="n",
    usage=Usage(input_tokens=10, output_tokens=5),
    duration_s=0.25,
)
CARD = AgentCard(
    agent_id="researcher-1",
    name="Researcher",
    description="Finds facts",
    version="1.2.3",
    capabilities=[
        CapabilitySpec(
            name="research",
            description="find facts about a topic",
            input_schema={"type": "object", "properties": {"topic": {"type": "string"}}},
            output_schema={"type": "object", "required": ["facts"]},
            tags=["facts", "web"],
            examples=["facts about bees"],
        ),
        CapabilitySpec(name="summarize", description="shorten a text"),
    ],
    constraints=AgentConstraints(
        max_timeout_s=60.0,
        max_input_bytes=4096,
        max_concurrency=3,
        limits={"languages": ["en", "fr"], "max_words": 2000},
        tools=["search"],
    ),
    provider="Acme",
    url="https://agents.example/researcher",
)


# -- frozen, round trip, validation on decode ------------------------------------


@pytest.mark.parametrize("card", [TASK, RESULT, CARD])
def test_cards_are_frozen(card: msgspec.Struct) -> None:
    for name in card.__struct_fields__:
        with pytest.raises(AttributeError, match="immutable"):
            setattr(card, name, getattr(card, name))


def test_round_trips() -> None:
    assert decode_task_card(encode(TASK)) == TASK
    assert decode_result_card(encode(RESULT)) == RESULT
    assert decode_agent_card(encode(CARD)) == CARD
    assert decode_reply(encode(RESULT)) == RESULT
    started = Started(task_id="t1", attempt=1, agent_id="a")
    assert decode_reply(encode(started)) == started
    announce = Announce(card=CARD, online=False)
    assert decode_reply(encode(announce)) == announce


def test_task_card_defaults() -> None:
    card = decode_task_card(b'{"type":"task_card","task_id":"t","root_id":"r","capability":"c"}')
    assert card.inputs == {} and card.deps == [] and card.attempt == 1
    assert card.timeout_s == 30.0 and card.max_attempts == 3 and card.parent_id is None


#: a TaskCard as the code before the shared task spec encoded it (a card in flight
#: between an older orchestrator and a newer agent, or the reverse)
OLDER_TASK_CARD = (
    b'{"type":"task_card","task_id":"t1","root_id":"r1","parent_id":"p1",'
    b'"capability":"research","goal":"find facts","inputs":{"topic":"bees","n":3},'
    b'"constraints":{"language":"en"},"deps":["t0"],"timeout_s":12.5,"max_attempts":4,'
    b'"budget_tokens":1000,"attempt":2,"review":[{"issue_type":"gap","section":"intro",'
    b'"severity":"low","suggestion":"more"}],"supplement":{"facts":["x"]},'
    b'"traceparent":"00-' + b"a" * 32 + b"-" + b"b" * 16 + b'-01"}'
)


def test_a_card_in_the_older_field_order_decodes_the_same() -> None:
    assert decode_task_card(OLDER_TASK_CARD) == TASK
    # fields added since, at their defaults, are all that differ
    added = {
        "checklist": [],
        "previous_output": None,
        "delivery": 1,
        "absent": [],
        "priority": 0,
    }
    assert msgspec.json.decode(encode(TASK)) == {**msgspec.json.decode(OLDER_TASK_CARD), **added}


def test_the_card_inherits_the_task_spec() -> None:
    spec = set(TaskSpec.__struct_fields__)
    assert issubclass(TaskCard, TaskSpec) and spec <= set(TaskCard.__struct_fields__)
    assert spec == {"capability", "goal", "inputs", "constraints", "deps", "timeout_s", "checklist"}


BAD_TASKS = [
    b"",
    b"not json",
    b"{",
    b"[]",
    b"null",
    b'{"type":"task_card"}',  # required fields missing
    b'{"type":"task_card","task_id":1,"root_id":"r","capability":"c"}',
    b'{"type":"task_card","task_id":"t","root_id":"r","capability":"c","inputs":[]}',
    b'{"type":"task_card","task_id":"t","root_id":"r","capability":"c","deps":"t0"}',
    b'{"type":"task_card","task_id":"t","root_id":"r","capability":"c","timeout_s":"5"}',
    b'{"type":"task_card","task_id":"t","root_id":"r","capability":"c","attempt":1.5}',
    b'{"type":"result_card","task_id":"t","root_id":"r","capability":"c"}',  # wrong tag
    b"\xff\xfe\x00",
]


@pytest.mark.parametrize("data", BAD_TASKS)
def test_bad_task_cards_are_decode_errors(data: bytes) -> None:
    with pytest.raises(DecodeError, match="invalid task card"):
        decode_task_card(data)


def _result(**over: Any) -> bytes:
    doc = msgspec.to_builtins(RESULT)
    doc.update(over)
    return msgspec.json.encode(doc)


@pytest.mark.parametrize(
    "data",
    [
        _result(confidence=1.5),
        _result(confidence=-0.01),
        _result(confidence="high"),
        _result(status="done"),  # not one of the statuses
        _result(attempt="2"),
        _result(usage={"input_tokens": "many"}),
        _result(needs_retry="yes"),
        b'{"type":"result_card"}',
        b"garbage",
    ],
)
def test_bad_result_cards_are_decode_errors(data: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_result_card(data)
    with pytest.raises(DecodeError):
        decode_reply(data)


@pytest.mark.parametrize("confidence", [0.0, 0.5, 1.0])
def test_confidence_bounds_are_inclusive(confidence: float) -> None:
    assert decode_result_card(_result(confidence=confidence)).confidence == confidence


@pytest.mark.parametrize(
    "data",
    [
        b"{}",
        b'{"agent_id":"a"}',  # no name
        b'{"agent_id":"a","name":"n","capabilities":{}}',
        b'{"agent_id":"a","name":"n","capabilities":[{"description":"no name"}]}',
        b'{"agent_id":"a","name":"n","constraints":{"max_timeout_s":"long"}}',
        b'{"agent_id":"a","name":"n","capabilities":[{"name":"c","tags":"x"}]}',
    ],
)
def test_bad_agent_cards_are_decode_errors(data: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_agent_card(data)


def test_decode_error_is_a_cardbus_error_and_keeps_the_cause() -> None:
    with pytest.raises(CardbusError) as info:
        decode_task_card(b'{"type":"task_card","task_id":1}')
    assert isinstance(info.value.__cause__, msgspec.ValidationError)


# -- JSON Schema -----------------------------------------------------------------


@pytest.mark.parametrize("cls", [TaskCard, ResultCard, AgentCard])
def test_each_card_exports_a_json_schema(cls: Any) -> None:
    schema = cls.json_schema()
    assert schema == msgspec.json.schema(cls)
    body = schema["$defs"][cls.__name__]
    assert body["type"] == "object"
    assert set(body["required"]) >= {f for f in ("task_id", "agent_id") if f in body["properties"]}
    msgspec.json.encode(schema)  # plain JSON


def test_result_schema_carries_the_confidence_range() -> None:
    prop = ResultCard.json_schema()["$defs"]["ResultCard"]["properties"]["confidence"]
    assert prop["minimum"] == 0 and prop["maximum"] == 1


@pytest.mark.parametrize("card", [TASK, RESULT, CARD])
def test_cards_fit_their_own_schema(card: Any) -> None:
    assert schema_errors(msgspec.to_builtins(card), type(card).json_schema()) == []


def test_schema_catches_an_out_of_range_confidence() -> None:
    doc = msgspec.to_builtins(RESULT) | {"confidence": 2.0}
    assert schema_errors(doc, ResultCard.json_schema())


# -- A2A -------------------------------------------------------------------------


def test_to_a2a_has_the_a2a_fields() -> None:
    doc = CARD.to_a2a()  # v1.0: the served URL in supportedInterfaces
    assert doc["name"] == "Researcher"
    assert doc["description"] == "Finds facts"
    assert doc["version"] == "1.2.3"
    assert [i["url"] for i in doc["supportedInterfaces"]] == [
        "https://agents.example/researcher"
    ] * 2
    assert {i["protocolVersion"] for i in doc["supportedInterfaces"]} == {"1.0", "0.3"}
    assert doc["provider"]["organization"] == "Acme"
    assert isinstance(doc["capabilities"], dict)
    legacy = CARD.to_a2a(legacy=True)  # v0.3, for older clients
    assert (
        legacy["protocolVersion"] == "0.3.0"
        and legacy["url"] == "https://agents.example/researcher"
    )
    assert AgentCard.from_a2a(legacy) == CARD
    assert doc["defaultInputModes"] and doc["defaultOutputModes"]
    assert [s["id"] for s in doc["skills"]] == ["research", "summarize"]
    skill = doc["skills"][0]
    assert set(skill) >= {
        "id",
        "name",
        "description",
        "tags",
        "examples",
        "inputModes",
        "outputModes",
    }
    assert skill["description"] == "find facts about a topic"
    assert skill["tags"] == ["facts", "web"]
    assert skill["examples"] == ["facts about bees"]
    assert skill["inputModes"] == ["application/json"]
    # the document is plain JSON
    assert msgspec.json.decode(msgspec.json.encode(doc)) == doc


def test_a2a_round_trip_keeps_every_field() -> None:
    assert AgentCard.from_a2a(CARD.to_a2a()) == CARD
    # also through JSON text, as it would arrive from /.well-known/agent-card.json
    assert AgentCard.from_a2a(msgspec.json.encode(CARD.to_a2a())) == CARD
    assert AgentCard.from_a2a(msgspec.json.encode(CARD.to_a2a()).decode()) == CARD


def test_a2a_round_trip_of_a_minimal_card() -> None:
    card = AgentCard(agent_id="a", name="a")
    assert AgentCard.from_a2a(card.to_a2a()) == card


FOREIGN = {
    "protocolVersion": "0.3.0",
    "name": "Recipe Agent",
    "description": "Helps with recipes",
    "url": "https://recipes.example/a2a",
    "version": "2.0.0",
    "provider": {"organization": "Foodies", "url": "https://recipes.example"},
    "capabilities": {"streaming": True},
    "defaultInputModes": ["text/plain"],
    "defaultOutputModes": ["text/plain"],
    "skills": [
        {
            "id": "find-recipe",
            "name": "Find recipe",
            "description": "Finds a recipe",
            "tags": ["cooking"],
            "examples": ["a cake without eggs"],
        }
    ],
}


def test_from_a2a_of_a_foreign_card_gives_defaults() -> None:
    card = AgentCard.from_a2a(FOREIGN)
    assert card.agent_id == "recipe-agent"  # made fit for subjects from the display name
    assert card.name == "Recipe Agent"
    assert card.version == "2.0.0"
    assert card.provider == "Foodies"
    assert card.url == "https://recipes.example/a2a"
    assert card.constraints == AgentConstraints()
    (cap,) = card.capabilities
    assert cap.name == "find-recipe"
    assert cap.description == "Finds a recipe"
    assert cap.tags == ["cooking"] and cap.examples == ["a cake without eggs"]
    # text modes: the input and output are a text field (cardbus.agents.a2a_card)
    assert cap.input_schema["properties"].keys() == {"text"}


def test_from_a2a_of_a_bare_card() -> None:
    card = AgentCard.from_a2a({"name": "bare"})
    assert card == AgentCard(agent_id="bare", name="bare", provider="")


@pytest.mark.parametrize(
    "doc",
    [
        {},
        {"description": "no name"},
        {"name": 42},
        {"name": "x", "skills": "all of them"},
        {"name": "x", "skills": [{"name": "no id"}]},
        {"name": "x", "skills": ["find"]},
        {"name": "x", "skills": [{"id": "s", "tags": "cooking"}]},
        {"name": "x", "skills": [{"id": "s", "examples": [1, 2]}]},
        {"name": "x", "provider": "Foodies"},
        {"name": "x", "version": 2},
        {"name": "x", "x-cardbus": "ours"},
        {"name": "x", "x-cardbus": {"constraints": {"max_timeout_s": "soon"}}},
        {"name": "x", "x-cardbus": {"schemas": {"s": "nope"}}, "skills": [{"id": "s"}]},
        [],
        "a string",
        None,
        b"not json",
        b"[1, 2]",
        b"",
    ],
)
def test_from_a2a_of_garbage_is_a_decode_error(doc: Any) -> None:
    with pytest.raises(DecodeError, match="A2A"):
        AgentCard.from_a2a(doc)


# -- properties -------------------------------------------------------------------

_text = st.text(max_size=12)
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=8,
)
_caps = st.builds(
    CapabilitySpec,
    name=_text.filter(bool),  # an A2A skill id is a non-empty string
    description=_text,
    input_schema=st.dictionaries(_text, _json, max_size=3),
    output_schema=st.dictionaries(_text, _json, max_size=3),
    tags=st.lists(_text, max_size=3),
    examples=st.lists(_text, max_size=2),
)
_agent_cards = st.builds(
    AgentCard,
    agent_id=_text.filter(bool),
    name=_text.filter(bool),
    description=_text,
    version=_text.filter(bool),
    capabilities=st.lists(_caps, max_size=3, unique_by=lambda c: c.name),
    constraints=st.builds(
        AgentConstraints,
        max_timeout_s=st.none() | st.floats(min_value=0, max_value=1e6),
        max_input_bytes=st.none() | st.integers(min_value=0, max_value=10**9),
        limits=st.dictionaries(_text, _json, max_size=3),
        tools=st.lists(_text, max_size=3),
    ),
    provider=_text,
    url=_text,
)


@settings(max_examples=60, deadline=None)
@given(_agent_cards)
def test_a2a_round_trip_property(card: AgentCard) -> None:
    assert AgentCard.from_a2a(card.to_a2a()) == card
    assert decode_agent_card(encode(card)) == card


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64) | _json.map(msgspec.json.encode))
def test_garbage_never_escapes_as_anything_but_decode_error(data: bytes) -> None:
    for decode in (decode_task_card, decode_result_card, decode_agent_card, decode_reply):
        try:
            decode(data)
        except DecodeError:
            pass
    try:
        AgentCard.from_a2a(data)
    except DecodeError:
        pass


@settings(max_examples=100, deadline=None)
@given(st.floats())
def test_confidence_decodes_only_inside_0_1(c: float) -> None:
    doc = msgspec.to_builtins(RESULT) | {"confidence": c}
    data = msgspec.json.encode(doc)  # NaN and inf encode as null
    if not math.isnan(c) and 0.0 <= c <= 1.0:
        assert decode_result_card(data).confidence == c
    else:
        with pytest.raises(DecodeError):
            decode_result_card(data)
