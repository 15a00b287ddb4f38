"""agents/a2a_card.py against a2a-sdk's own models (A2A v1.0 protobuf, v0.3 pydantic)."""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest
from a2a.compat.v0_3 import types as v03
from a2a.compat.v0_3.conversions import to_compat_agent_card, to_core_agent_card
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.types import AgentCard as PbAgentCard
from a2a.utils.proto_utils import validate_proto_required_fields
from google.protobuf.json_format import MessageToDict, ParseDict

from cardbus.agents.a2a_card import (
    CARDBUS_EXTENSION,
    TEXT_SCHEMA,
    agent_id_from_name,
    from_a2a,
    import_a2a,
    ints_back,
    to_a2a_v03,
    to_a2a_v1,
)
from cardbus.agents.agent import Agent, Capability
from cardbus.agents.cards import AgentCard, AgentConstraints, CapabilitySpec
from cardbus.eventstore.errors import DecodeError

SCHEMA_IN: dict[str, Any] = {
    "type": "object",
    "properties": {
        "topic": {"type": "string", "minLength": 1, "maxLength": 200},
        "n": {"type": "integer", "minimum": 0, "maximum": 10, "default": 3},
        "ratio": {"type": "number", "exclusiveMaximum": 1.5},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "mode": {"enum": ["fast", "slow", None]},
    },
    "required": ["topic"],
    "additionalProperties": False,
}
SCHEMA_OUT: dict[str, Any] = {
    "$ref": "#/$defs/Facts",
    "$defs": {"Facts": {"type": "object", "properties": {"facts": {"type": "array"}}}},
}

# every field of AgentCard, CapabilitySpec and AgentConstraints set to a non-default
FULL = AgentCard(
    agent_id="research-bot_2",
    name="Research Bot",
    description="Finds facts",
    version="2.3.4",
    capabilities=[
        CapabilitySpec(
            name="research",
            description="find facts about a topic",
            input_schema=SCHEMA_IN,
            output_schema=SCHEMA_OUT,
            tags=["facts", "web"],
            examples=["tides", "moons of Jupiter"],
        ),
        CapabilitySpec(name="bare"),  # empty description, schemas and tags
    ],
    constraints=AgentConstraints(
        max_timeout_s=45.5,
        max_input_bytes=65536,
        max_concurrency=4,
        limits={"languages": ["en", "fr"], "max_words": 2000, "temperature": 0.7},
        tools=["doc_search", "web"],
    ),
    provider="Example Org",
    url="http://127.0.0.1:9999/",
)
MINIMAL = AgentCard(agent_id="m", name="m")


def _strict_v1(doc: dict[str, Any], required: bool = True) -> PbAgentCard:
    """Parse as a2a-sdk's v1.0 AgentCard, refusing unknown fields, with every REQUIRED field."""
    pb = ParseDict(copy.deepcopy(doc), PbAgentCard(), ignore_unknown_fields=False)
    if required:
        validate_proto_required_fields(pb)
    return pb


@pytest.mark.parametrize("card", [FULL, MINIMAL], ids=["full", "minimal"])
def test_v1_export_parses_strictly_and_imports_back_equal(card: AgentCard) -> None:
    # a card without capabilities has no skills, which v1.0 requires at least one of
    pb = _strict_v1(to_a2a_v1(card), required=card is FULL)
    back = from_a2a(MessageToDict(pb))  # through protobuf: numbers became floats
    assert back == card
    # the values, not only equality: an integer stays an int (3, not 3.0)
    if card is FULL:
        schema = back.capabilities[0].input_schema
        assert type(schema["properties"]["n"]["maximum"]) is int
        assert type(back.constraints.max_concurrency) is int
        assert back.constraints.limits["temperature"] == 0.7
        assert msgspec.json.encode(back, order="sorted") == msgspec.json.encode(
            card, order="sorted"
        )


def test_v1_export_fields() -> None:
    pb = _strict_v1(to_a2a_v1(FULL, "http://10.0.0.1:8000/", streaming=True))
    assert [(i.url, i.protocol_binding, i.protocol_version) for i in pb.supported_interfaces] == [
        ("http://10.0.0.1:8000/", "JSONRPC", "1.0"),
        ("http://10.0.0.1:8000/", "JSONRPC", "0.3"),
    ]
    assert pb.capabilities.streaming is True
    assert pb.provider.organization == "Example Org"
    assert pb.provider.url == "http://10.0.0.1:8000/"
    skill = pb.skills[0]
    assert (skill.id, skill.name, list(skill.tags)) == ("research", "research", ["facts", "web"])
    assert list(skill.input_modes) == ["application/json"]
    assert list(skill.examples) == ["tides", "moons of Jupiter"]
    (ext,) = pb.capabilities.extensions
    assert ext.uri == CARDBUS_EXTENSION
    params = MessageToDict(ext.params)
    assert params["agent_id"] == "research-bot_2"
    assert ints_back(params["schemas"]["research"]["input"]) == SCHEMA_IN
    assert params["constraints"]["tools"] == ["doc_search", "web"]


def test_served_card_through_the_sdk_keeps_schemas_and_both_shapes() -> None:
    # what a2a-sdk's card route serves (v1.0 merged with the v0.3 compat fields)
    served = agent_card_to_dict(_strict_v1(to_a2a_v1(FULL)))
    assert served["protocolVersion"] == "0.3"  # the v0.3 compat fields are there
    assert served["url"] == FULL.url
    assert from_a2a(served) == FULL


def test_v03_export_parses_with_the_sdk_v03_model_and_imports_back() -> None:
    doc = to_a2a_v03(FULL)
    model = v03.AgentCard.model_validate(doc)
    assert model.protocol_version == "0.3.0" and model.url == FULL.url
    assert from_a2a(model.model_dump(by_alias=True, exclude_none=True)) == FULL
    core = to_core_agent_card(model)  # the SDK's own v0.3 -> v1.0 conversion
    assert from_a2a(MessageToDict(core)) == FULL


def test_v1_to_v03_via_the_sdk() -> None:
    compat = to_compat_agent_card(_strict_v1(to_a2a_v1(FULL)))
    assert from_a2a(compat.model_dump(by_alias=True, exclude_none=True)) == FULL


def test_agent_class_card_round_trip() -> None:
    class In(msgspec.Struct):
        x: int

    class Out(msgspec.Struct):
        y: list[float]

    class A(Agent):
        agent_id = "adder"
        capabilities = [Capability("add", In, Out, "adds")]

    card = A.card()
    assert from_a2a(MessageToDict(_strict_v1(to_a2a_v1(card, "http://h:1/")))).capabilities == (
        card.capabilities
    )


def test_legacy_cardbus_export_still_imports() -> None:
    legacy = {
        "protocolVersion": "0.3.0",
        "name": "Old",
        "url": "http://h/",
        "skills": [{"id": "s", "name": "s", "description": "d", "tags": []}],
        "x-cardbus": {
            "agent_id": "old",
            "constraints": {"max_concurrency": 2},
            "schemas": {"s": {"input": {"type": "object"}, "output": {}}},
        },
    }
    card = from_a2a(legacy)
    assert card.agent_id == "old"
    assert card.capabilities[0].input_schema == {"type": "object"}
    assert card.constraints.max_concurrency == 2


# -- foreign cards ----------------------------------------------------------------

FOREIGN_V1: dict[str, Any] = {
    "name": "Currency Agent",
    "description": "Converts currencies",
    "version": "1.0.0",
    "supportedInterfaces": [
        {"url": "http://x:10000/a2a", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
        {"url": "http://x:10001/", "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0"},
    ],
    "provider": {"organization": "Acme", "url": "https://acme.example"},
    "capabilities": {"streaming": True, "pushNotifications": True},
    "securitySchemes": {"bearer": {"httpAuthSecurityScheme": {"scheme": "bearer"}}},
    "securityRequirements": [{"schemes": {"bearer": {"list": []}}}],
    "defaultInputModes": ["text/plain"],
    "defaultOutputModes": ["text/plain", "application/json"],
    "skills": [
        {
            "id": "convert_currency",
            "name": "Currency Exchange Rates Tool",
            "description": "Helps with exchange values between currencies",
            "tags": ["currency"],
            "examples": ["What is exchange rate between USD and GBP?"],
        },
        {
            "id": "chart",
            "name": "Chart",
            "description": "A chart",
            "tags": ["chart"],
            "inputModes": ["application/json"],
            "outputModes": ["image/png"],
        },
    ],
}


def test_foreign_v1_card_imports_with_names_modes_streaming_and_interfaces() -> None:
    _strict_v1(FOREIGN_V1)  # the sample is a valid v1.0 card
    imported = import_a2a(FOREIGN_V1)
    card = imported.card
    assert card.agent_id == "currency-agent"
    assert card.provider == "Acme"
    assert card.url == "http://x:10000/a2a"
    conv, chart = card.capabilities
    assert conv.name == "convert_currency" and conv.input_schema == TEXT_SCHEMA
    assert conv.output_schema == {}  # JSON out accepted: anything
    assert chart.input_schema == {} and chart.output_schema == {}
    assert imported.skills["convert_currency"].name == "Currency Exchange Rates Tool"
    assert imported.skills["convert_currency"].input_modes == ["text/plain"]
    assert imported.skills["chart"].output_modes == ["image/png"]
    assert imported.streaming is True and imported.security is True
    assert [i.protocol_binding for i in imported.interfaces] == ["JSONRPC", "HTTP+JSON"]
    assert not imported.cardbus


def test_foreign_v03_card_imports() -> None:
    doc = {
        "protocolVersion": "0.3.0",
        "name": "Hello World Agent",
        "description": "Just a hello world agent",
        "url": "http://localhost:9999/",
        "preferredTransport": "JSONRPC",
        "additionalInterfaces": [{"url": "http://localhost:9998/", "transport": "GRPC"}],
        "version": "1.0.0",
        "capabilities": {"streaming": True},
        "defaultInputModes": ["text"],
        "defaultOutputModes": ["text"],
        "skills": [
            {
                "id": "hello_world",
                "name": "Returns hello world",
                "description": "just returns hello world",
                "tags": ["hello world"],
                "examples": ["hi", "hello world"],
            }
        ],
    }
    v03.AgentCard.model_validate(doc)  # a valid v0.3 card
    imported = import_a2a(doc)
    assert imported.card.agent_id == "hello-world-agent"
    assert imported.card.capabilities[0].input_schema == TEXT_SCHEMA
    assert imported.skills["hello_world"].name == "Returns hello world"
    assert [(i.url, i.protocol_binding) for i in imported.interfaces] == [
        ("http://localhost:9999/", "JSONRPC"),
        ("http://localhost:9998/", "GRPC"),
    ]
    assert imported.protocol_version == "0.3.0"


@pytest.mark.parametrize(
    ("name", "agent_id"),
    [("Currency Agent", "currency-agent"), ("a.b*c>d", "a-b-c-d"), ("  ", "a2a-agent")],
)
def test_agent_id_fits_nats_subjects(name: str, agent_id: str) -> None:
    assert agent_id_from_name(name) == agent_id


def test_ints_back() -> None:
    assert ints_back({"a": [1.0, 2.5, {"b": -0.0}], "c": float("inf")}) == {
        "a": [1, 2.5, {"b": 0}],
        "c": float("inf"),
    }
    assert type(ints_back(1.0)) is int and type(ints_back(2.0**60)) is float


@pytest.mark.parametrize(
    "doc",
    [
        "not json",
        [],
        {},
        {"name": ""},
        {"name": "x", "skills": {}},
        {"name": "x", "skills": [{"name": "no id"}]},
        {"name": "x", "skills": [{"id": "s", "tags": "t"}]},
        {"name": "x", "provider": "p"},
        {"name": "x", "capabilities": {"extensions": [{"uri": CARDBUS_EXTENSION, "params": 1}]}},
    ],
)
def test_garbage_is_a_decode_error(doc: Any) -> None:
    with pytest.raises(DecodeError):
        import_a2a(doc)
