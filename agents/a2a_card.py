"""AgentCard <-> A2A AgentCard JSON, v1.0 and v0.3, without losing cardbus's fields.

Pure functions over JSON-shaped dicts (no network, no a2a-sdk import), so the
mapping works without the ``a2a`` extra; the tests check every shape against
a2a-sdk's own models.

Export (:func:`to_a2a_v1`, :func:`to_a2a_v03`): name, description, version
and provider map one to one; ``supportedInterfaces`` names the served URL and
transport (JSON-RPC, protocol 1.0, and the same URL as 0.3 for older
clients); each capability is a skill (id and name = the capability, its
description, tags, examples, ``application/json`` in and out);
``capabilities.streaming`` says whether the server streams. What A2A has no
field for (the agent id, input/output JSON Schemas, constraints, the tool
allow-list) rides in the spec's extension slot, ``capabilities.extensions[]``,
as one extension with the URI :data:`CARDBUS_EXTENSION` and those fields as
its ``params``.

Import (:func:`from_a2a`, :func:`import_a2a`): any A2A card, v1.0
(``supportedInterfaces``) or v0.3 (``url``/``protocolVersion``), also the
older cardbus export with a top-level ``x-cardbus`` key. Skills become
capabilities; schemas, constraints and the agent id come from the cardbus
extension when present; otherwise the schemas follow the skill's modes (a
JSON mode accepts any object, text only means ``{"text": str}``) and the
agent id is the card's name made fit for NATS subjects (``"Currency Agent"``
-> ``currency-agent``). Protobuf's ``Struct`` (how a2a-sdk carries the
extension params) turns every number into a float: :func:`ints_back` turns
whole floats back into ints, so ``{"maxLength": 10}`` returns as ``10``.
"""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec

from cardbus.agents.cards import AgentCard
from cardbus.eventstore.errors import DecodeError

__all__ = [
    "A2A_JSON",
    "CARDBUS_EXTENSION",
    "TEXT_SCHEMA",
    "A2AInterface",
    "ImportedCard",
    "SkillModes",
    "agent_id_from_name",
    "from_a2a",
    "import_a2a",
    "ints_back",
    "to_a2a_v03",
    "to_a2a_v1",
]

#: the URI of cardbus's extension in ``capabilities.extensions[]``
CARDBUS_EXTENSION = "urn:cardbus:a2a:agent-card:v1"
A2A_JSON = "application/json"
#: the schema of a capability imported from a text-only skill (in and out)
TEXT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"text": {"type": "string"}},
    "required": ["text"],
}
_LEGACY_KEY = "x-cardbus"  # what AgentCard.to_a2a wrote (A2A v0.3, top-level key)


class A2AInterface(msgspec.Struct, frozen=True, kw_only=True):
    url: str
    protocol_binding: str = "JSONRPC"
    protocol_version: str = ""


class SkillModes(msgspec.Struct, frozen=True, kw_only=True):
    """What an A2A skill exchanges, as its card says (the skill's own or the card's default)."""

    name: str = ""
    input_modes: list[str] = []
    output_modes: list[str] = []

    @property
    def text_in(self) -> bool:
        """Only text goes in: the inputs are ``{"text": ...}``, sent as a text part."""
        return _text_only(self.input_modes)

    @property
    def text_out(self) -> bool:
        return _text_only(self.output_modes)


class ImportedCard(msgspec.Struct, frozen=True, kw_only=True):
    """An imported A2A card: the cardbus card, and the A2A facts it has no field for."""

    card: AgentCard
    interfaces: list[A2AInterface] = []
    streaming: bool = False
    skills: dict[str, SkillModes] = {}  # capability name -> its skill's name and modes
    cardbus: bool = False  # the card carried cardbus's extension (schemas are exact)
    security: bool = False  # the card declares security requirements
    protocol_version: str = ""


# -- export ---------------------------------------------------------------------


def _params(card: AgentCard) -> dict[str, Any]:
    params: dict[str, Any] = {
        "agent_id": card.agent_id,
        "provider": card.provider,
        "constraints": msgspec.to_builtins(card.constraints),
        "schemas": {
            c.name: {"input": c.input_schema, "output": c.output_schema} for c in card.capabilities
        },
    }
    if not card.description:  # A2A requires one: the name stands in, this keeps the truth
        params["description"] = ""
    blank = [c.name for c in card.capabilities if not c.description]
    if blank:
        params["blank_skill_descriptions"] = blank
    # always said (an old card said nothing): the id stands in for these skills' tags (A2A
    # wants tags), and only for them is it dropped again: a real tag equal to the id stays
    params["untagged_skills"] = [c.name for c in card.capabilities if not c.tags]
    return params


def _skill(c: Any) -> dict[str, Any]:
    return {
        "id": c.name,
        "name": c.name,
        "description": c.description or c.name,
        "tags": list(c.tags) or [c.name],
        "examples": list(c.examples),
        "inputModes": [A2A_JSON],
        "outputModes": [A2A_JSON],
    }


def _extension(card: AgentCard) -> dict[str, Any]:
    return {
        "uri": CARDBUS_EXTENSION,
        "description": "cardbus: agent id, input/output JSON Schemas, constraints, tools",
        "required": False,
        "params": _params(card),
    }


def to_a2a_v1(
    card: AgentCard,
    url: str | None = None,
    *,
    streaming: bool = True,
    transport: str = "JSONRPC",
    legacy_interface: bool = True,
    provider_url: str | None = None,
) -> dict[str, Any]:
    """The A2A v1.0 AgentCard JSON (camelCase, as ``MessageToDict`` writes it).

    ``url`` is where the agent is served (default ``card.url``);
    ``legacy_interface`` also lists that URL with protocol 0.3 for older clients.
    """
    url = url if url is not None else card.url
    interfaces = [{"url": url, "protocolBinding": transport, "protocolVersion": "1.0"}]
    if legacy_interface:
        interfaces.append({"url": url, "protocolBinding": transport, "protocolVersion": "0.3"})
    return {
        "name": card.name,
        "description": card.description or card.name,
        "supportedInterfaces": interfaces,
        "provider": {"organization": card.provider or "cardbus", "url": provider_url or url},
        "version": card.version,
        "capabilities": {
            "streaming": streaming,
            "pushNotifications": False,
            "extensions": [_extension(card)],
        },
        "defaultInputModes": [A2A_JSON],
        "defaultOutputModes": [A2A_JSON],
        "skills": [_skill(c) for c in card.capabilities],
    }


def to_a2a_v03(
    card: AgentCard,
    url: str | None = None,
    *,
    streaming: bool = True,
    transport: str = "JSONRPC",
    provider_url: str | None = None,
) -> dict[str, Any]:
    """The same card in the A2A v0.3 shape (``url``, ``protocolVersion``, ...)."""
    url = url if url is not None else card.url
    return {
        "protocolVersion": "0.3.0",
        "name": card.name,
        "description": card.description or card.name,
        "url": url,
        "preferredTransport": transport,
        "version": card.version,
        "provider": {"organization": card.provider or "cardbus", "url": provider_url or url},
        "capabilities": {
            "streaming": streaming,
            "pushNotifications": False,
            "extensions": [_extension(card)],
        },
        "defaultInputModes": [A2A_JSON],
        "defaultOutputModes": [A2A_JSON],
        "skills": [_skill(c) for c in card.capabilities],
    }


# -- import ---------------------------------------------------------------------


def ints_back(value: Any) -> Any:
    """``value`` with every whole, finite float turned back into an int, recursively.

    Protobuf's ``Struct``/``Value`` (what a2a-sdk's models use for JSON
    objects: extension params, data parts, metadata) keeps numbers as
    doubles, so an int comes back as ``3.0``; JSON Schema and msgspec tell
    ``3`` and ``3.0`` apart (an ``integer`` field refuses ``3.0``). Only
    magnitudes up to 2**53 are exact doubles; beyond that protobuf has
    already lost the digits.
    """
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer() and abs(value) <= 2**53:
            return int(value)
        return value
    if isinstance(value, dict):
        return {k: ints_back(v) for k, v in value.items()}
    if isinstance(value, list):
        return [ints_back(v) for v in value]
    return value


def agent_id_from_name(name: str) -> str:
    """An agent id fit for NATS subjects: ``"Currency Agent"`` -> ``currency-agent``."""
    slug = re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-_")
    return slug[:64].rstrip("-_") or "a2a-agent"


def _text_only(modes: list[str]) -> bool:
    return bool(modes) and all(m == "text" or m.lower().startswith("text/") for m in modes)


def _schema_for(modes: list[str], text: bool) -> dict[str, Any]:
    return dict(TEXT_SCHEMA) if text and modes else {}


def _strs(value: Any, what: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{what} must be a list of strings")
    return list(value)


def _interfaces(doc: dict[str, Any]) -> tuple[list[A2AInterface], str]:
    if "supportedInterfaces" in doc:
        out = []
        for i in doc.get("supportedInterfaces") or []:
            out.append(
                A2AInterface(
                    url=str(i.get("url") or ""),
                    protocol_binding=str(i.get("protocolBinding") or "JSONRPC"),
                    protocol_version=str(i.get("protocolVersion") or ""),
                )
            )
        versions = [i.protocol_version for i in out if i.protocol_version]
        return out, max(versions, default="1.0")
    version = str(doc.get("protocolVersion") or "0.3.0")
    out = []
    if doc.get("url"):
        out.append(
            A2AInterface(
                url=str(doc["url"]),
                protocol_binding=str(doc.get("preferredTransport") or "JSONRPC"),
                protocol_version=version,
            )
        )
    for i in doc.get("additionalInterfaces") or []:
        out.append(
            A2AInterface(
                url=str(i.get("url") or ""),
                protocol_binding=str(i.get("transport") or "JSONRPC"),
                protocol_version=version,
            )
        )
    return out, version


def _cardbus_params(doc: dict[str, Any]) -> dict[str, Any] | None:
    caps = doc.get("capabilities") or {}
    if not isinstance(caps, dict):
        raise TypeError("capabilities must be an object")
    for ext in caps.get("extensions") or []:
        if isinstance(ext, dict) and ext.get("uri") == CARDBUS_EXTENSION:
            params = ext.get("params") or {}
            if not isinstance(params, dict):
                raise TypeError("the cardbus extension's params must be an object")
            return ints_back(params)
    legacy = doc.get(_LEGACY_KEY)
    if legacy is None:
        return None
    if not isinstance(legacy, dict):
        raise TypeError(f"{_LEGACY_KEY} must be an object")
    return ints_back(legacy)


def import_a2a(doc: dict[str, Any] | bytes | str) -> ImportedCard:
    """Read any A2A AgentCard (v1.0 or v0.3; a dict or its JSON text).

    Anything that is not an A2A card, or whose fields have the wrong types, is
    a ``DecodeError`` naming the problem.
    """
    try:
        if isinstance(doc, (bytes, str)):
            doc = msgspec.json.decode(doc)
        if not isinstance(doc, dict):
            raise TypeError(f"expected a JSON object, got {type(doc).__name__}")
        name = doc["name"]
        if not isinstance(name, str) or not name:
            raise TypeError("name must be a non-empty string")
        params = _cardbus_params(doc)
        ours = params is not None
        params = params or {}
        schemas = params.get("schemas") or {}
        blank = set(params.get("blank_skill_descriptions") or [])
        untagged = params.get("untagged_skills")
        default_in = _strs(doc.get("defaultInputModes"), "defaultInputModes")
        default_out = _strs(doc.get("defaultOutputModes"), "defaultOutputModes")
        skills = doc.get("skills", [])
        if skills is None:
            skills = []
        if not isinstance(skills, list):
            raise TypeError(f"skills must be a list, got {type(skills).__name__}")
        caps: list[dict[str, Any]] = []
        modes: dict[str, SkillModes] = {}
        for s in skills:
            sid = s["id"]
            if not isinstance(sid, str) or not sid:
                raise TypeError("a skill id must be a non-empty string")
            m = SkillModes(
                name=str(s.get("name") or sid),
                input_modes=_strs(s.get("inputModes"), "inputModes") or default_in,
                output_modes=_strs(s.get("outputModes"), "outputModes") or default_out,
            )
            modes[sid] = m
            own = schemas.get(sid)
            if own is not None:
                input_schema, output_schema = own.get("input") or {}, own.get("output") or {}
            else:
                input_schema = _schema_for(m.input_modes, m.text_in)
                output_schema = _schema_for(m.output_modes, m.text_out)
            caps.append(
                {
                    "name": sid,
                    "description": "" if sid in blank else (s.get("description") or ""),
                    "tags": _strs(s.get("tags"), "tags"),
                    "examples": _strs(s.get("examples"), "examples"),
                    "input_schema": input_schema,
                    "output_schema": output_schema,
                }
            )
            # export stands the id in for an empty tag list (a card of before said nothing)
            stood_in = sid in untagged if isinstance(untagged, list) else True
            if ours and caps[-1]["tags"] == [sid] and stood_in:
                caps[-1]["tags"] = []
        interfaces, version = _interfaces(doc)
        provider = doc.get("provider") or {}
        if not isinstance(provider, dict):
            raise TypeError("provider must be an object")
        description = doc.get("description") or ""
        if "description" in params:
            description = params["description"]
        agent_id = params.get("agent_id") or agent_id_from_name(name)
        fields: dict[str, Any] = {
            "agent_id": agent_id,
            "name": name,
            "description": description,
            "version": doc.get("version") or "0.1.0",
            "capabilities": caps,
            "constraints": params.get("constraints") or {},
            "provider": params.get("provider", provider.get("organization") or ""),
            "url": next((i.url for i in interfaces if i.url), ""),
        }
        card = msgspec.convert(fields, AgentCard)  # convert: every field is type-checked
        capabilities = doc.get("capabilities") or {}
        return ImportedCard(
            card=card,
            interfaces=interfaces,
            streaming=bool(capabilities.get("streaming")),
            skills=modes,
            cardbus=ours,
            security=bool(doc.get("securityRequirements") or doc.get("security")),
            protocol_version=version,
        )
    except (
        KeyError,
        TypeError,
        AttributeError,
        msgspec.ValidationError,
        msgspec.DecodeError,
    ) as e:
        raise DecodeError(f"not an A2A AgentCard: {e!r}") from e


def from_a2a(doc: dict[str, Any] | bytes | str) -> AgentCard:
    """The cardbus ``AgentCard`` of any A2A card (see :func:`import_a2a`)."""
    return import_a2a(doc).card
