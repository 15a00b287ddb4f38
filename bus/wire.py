"""The wire format on NATS, published for agents in any language: JSON Schemas and the contract.

Every schema here is generated at run time from the msgspec types the bus encodes and
decodes (``msgspec.json.schema``), so a schema cannot say anything the code does not:
change a card's field and its schema changes with it. ``cardbus schema`` prints them
(``cardbus schema task_card``; ``--out DIR`` writes one ``<name>.schema.json`` each).

Messages (by schema name):

==========================  =============================================================
``task_card``               a card as an agent receives it on ``cardbus.agent.<agent>``
``started``                 "I took it": ``cardbus.reply.<agent>.<task>[.<partition>]``
``result_card``             the answer (``completed``, ``failed``, ``needs_input``,
                            ``rejected``), on the same subject
``announce``                the agent online (its ``agent_card``, lease, wire version) or
                            leaving, on ``cardbus.announce.<agent>``
``reply``                   any of the three above (what the orchestrator decodes)
``cancel_notice``           the orchestrator to an agent: stop the handler of an attempt
                            whose task was cancelled or halted, on ``cardbus.cancel.<agent>``
``chunk``                   a piece of a model answer as it is written, on
                            ``cardbus.chunk.<agent>.<root>`` (optional, only while a
                            run is watched: ``cardbus.watching``)
``agent_card``              what an agent can do (inside ``announce``)
``agent_request``           an agent's request on ``cardbus.req.<agent>`` (core NATS
                            request/reply), answered by an ``agent_response``
``model_request_args``      ``args`` of a ``model.request`` (the journal, before a call)
``model_answer_args``       ``args`` of a ``model.answer`` (after it)
``tool_begin_args``         ``args`` of a ``tool.begin`` (a tool the agent runs itself)
``tool_end_args``           ``args`` of a ``tool.end``
==========================  =============================================================

:func:`contract` is the rest of the wire, as data: subjects, streams, the inbox
consumer's settings, headers, acks, and the NATS permissions an agent's user needs
(``cardbus schema contract``), read from the transport's own constants.

The wire version (``WIRE_VERSION``) is in every announcement (``Announce.wire_version``;
absent means 1). An orchestrator registers only agents speaking its own version: an
agent announcing another is refused with one ``reply.refused`` event (and one log line)
and is sent no card. A new optional field does not change the version; a field removed
or given another meaning does.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import msgspec

from cardbus.agents.cards import (
    WIRE_VERSION,
    AgentCard,
    Announce,
    CancelNotice,
    Reply,
    ResultCard,
    Started,
    TaskCard,
)
from cardbus.agents.requests import AgentRequest, AgentResponse
from cardbus.agents.streaming import Chunk
from cardbus.bus.transport import nats as wire_nats
from cardbus.bus.transport.nats_chunks import CHUNK_PREFIX, WATCHING_SUBJECT
from cardbus.eventstore.errors import ValidationError

__all__ = [
    "SCHEMA_NAMES",
    "WIRE_VERSION",
    "ModelAnswerArgs",
    "ModelRequestArgs",
    "ToolBeginArgs",
    "ToolEndArgs",
    "contract",
    "schema",
    "schemas",
    "write_schemas",
]

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


class ModelRequestArgs(msgspec.Struct, frozen=True, kw_only=True):
    """``args`` of a ``model.request``: what the agent is about to ask its model.

    ``request`` is the call as JSON (its ``model`` key names the model; the request's
    ``target`` names it too). The orchestrator records ``model.requested`` and answers
    ``{"call": id}`` (go live) or ``{"replay": answer, "source": event id}`` (a retry
    asking the same thing at the same place: use the recorded answer, call nothing)."""

    request: dict[str, Any]
    digest: str = ""  # the agent's sha256 of the request (the orchestrator computes its own)
    replay: bool = True  # False: never answer from the journal
    # the endpoint's gen_ai.provider.name (beside the request, not in it: the digest is the
    # ask's alone); "" when the agent does not know it; recorded on model.requested
    provider: str = ""


class ModelAnswerArgs(msgspec.Struct, frozen=True, kw_only=True):
    """``args`` of a ``model.answer``: the answer of a live call (or its error), recorded
    as ``model.answered`` before the agent uses it. ``answer`` is a JSON object; its
    ``input_tokens``, ``output_tokens`` and ``model`` keys are the log's usage figures."""

    call: str = ""
    answer: dict[str, Any] | None = None
    error: str | None = None
    error_type: str | None = None
    latency_s: float = 0.0
    #: seconds of ``latency_s`` spent waiting for the provider's limit, not in the model
    queued_s: float = 0.0


class ToolBeginArgs(msgspec.Struct, frozen=True, kw_only=True):
    """``args`` of a ``tool.begin``: a tool the agent runs itself, recorded before it runs.
    The answer is ``{"key": idempotency key}`` (run it) or ``{"replay": result}``."""

    arguments: dict[str, Any]
    idempotent: bool = False


class ToolEndArgs(msgspec.Struct, frozen=True, kw_only=True):
    """``args`` of a ``tool.end``: that tool's result or error, recorded after it ran."""

    arguments: dict[str, Any]
    key: str
    result: Any = None
    error: str | None = None
    error_type: str | None = None
    duration_s: float = 0.0


_TYPES: dict[str, Any] = {
    "task_card": TaskCard,
    "started": Started,
    "result_card": ResultCard,
    "announce": Announce,
    "reply": Reply,
    "cancel_notice": CancelNotice,
    "chunk": Chunk,
    "agent_card": AgentCard,
    "agent_request": AgentRequest,
    "agent_response": AgentResponse,
    "model_request_args": ModelRequestArgs,
    "model_answer_args": ModelAnswerArgs,
    "tool_begin_args": ToolBeginArgs,
    "tool_end_args": ToolEndArgs,
}
#: every schema's name, in the order ``cardbus schema`` lists them
SCHEMA_NAMES: tuple[str, ...] = tuple(_TYPES)


def schema(name: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the message called ``name`` (``SCHEMA_NAMES``)."""
    try:
        type_ = _TYPES[name]
    except KeyError:
        known = ", ".join(SCHEMA_NAMES)
        raise ValidationError(f"no wire schema {name!r} (known: {known})") from None
    generated = msgspec.json.schema(type_)
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "$id": f"urn:cardbus:wire:{WIRE_VERSION}:{name}",
        "title": f"cardbus wire v{WIRE_VERSION}: {name}",
        **generated,
    }


def schemas() -> dict[str, dict[str, Any]]:
    """Every schema by name."""
    return {name: schema(name) for name in SCHEMA_NAMES}


def write_schemas(directory: str | Path) -> list[Path]:
    """Write ``<name>.schema.json`` for every schema, and ``contract.json``; the paths."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    docs = {**schemas(), "contract": contract()}
    for name, doc in docs.items():
        path = out / (f"{name}.schema.json" if name != "contract" else "contract.json")
        path.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n", encoding="utf-8")
        written.append(path)
    return written


_PLACEHOLDER = "AGENTID"  # an agent id whose subject token is itself: replaced by <agent>


def _templated(value: Any) -> Any:
    text = json.dumps(value).replace(_PLACEHOLDER, "<agent>")
    return json.loads(text)


def _bus_default(option: str) -> Any:
    return inspect.signature(wire_nats.NatsBus.__init__).parameters[option].default


def contract() -> dict[str, Any]:
    """The wire beyond the message bodies, as data, from the transport's constants."""
    n = wire_nats
    ack_wait, max_deliver = _bus_default("ack_wait"), _bus_default("max_deliver")
    return {
        "wire_version": WIRE_VERSION,
        "encoding": "one JSON object (UTF-8) per NATS message; unknown fields are ignored",
        "ids_in_subjects": (
            "an id is one subject token: A-Z a-z 0-9 - as they are, every other byte of its"
            " UTF-8 form _ and two lowercase hex digits (r1.a -> r1_2ea); empty: _"
        ),
        "streams": {
            n.INBOX_STREAM: {"subjects": [f"{n.INBOX_PREFIX}.>"], "retention": "workqueue"},
            n.REPLY_STREAM: {
                "subjects": [f"{n.REPLY_PREFIX}.>", f"{n.ANNOUNCE_PREFIX}.>"],
                "retention": "interest",
            },
            n.DEAD_STREAM: {"subjects": [f"{n.DEAD_PREFIX}.>"], "retention": "limits"},
        },
        "subjects": {
            "inbox": {
                "subject": f"{n.INBOX_PREFIX}.<agent>",
                "direction": "orchestrator -> agent (JetStream, pull consumer)",
                "schema": "task_card",
            },
            "reply": {
                "subject": f"{n.REPLY_PREFIX}.<agent>.<task>",
                "subject_with_partition": f"{n.REPLY_PREFIX}.<agent>.<task>.<partition>",
                "direction": "agent -> orchestrator (JetStream publish)",
                "schema": ["started", "result_card"],
            },
            "announce": {
                "subject": f"{n.ANNOUNCE_PREFIX}.<agent>",
                "direction": "agent -> orchestrator (JetStream publish)",
                "schema": "announce",
            },
            "request": {
                "subject": f"{n.REQUEST_PREFIX}.<agent>",
                "direction": "agent -> orchestrator (core NATS request/reply, not persisted)",
                "schema": "agent_request",
                "answer_schema": "agent_response",
                "error_header": n.ERROR_HEADER,
            },
            "cancel": {
                "subject": f"{n.CANCEL_PREFIX}.<agent>",
                "direction": (
                    "orchestrator -> agent (core NATS publish, at most once: every replica"
                    " hears it; ask attempt.live on the request subject to be sure)"
                ),
                "schema": "cancel_notice",
            },
            "chunk": {
                "subject": f"{CHUNK_PREFIX}.<agent>.<root>",
                "direction": (
                    "agent -> watchers (core NATS publish, optional: only while a watcher"
                    f" says on {WATCHING_SUBJECT} that it watches the run; never stored)"
                ),
                "schema": "chunk",
            },
            "dead": {
                "subject": f"{n.DEAD_PREFIX}.<kind>",
                "direction": "anyone -> operators (the original bytes, with two headers)",
                "headers": [n.REASON_HEADER, n.SUBJECT_HEADER],
            },
        },
        "inbox_consumer": _templated(
            {
                "stream": n.INBOX_STREAM,
                "durable_name": n.consumer_name(_PLACEHOLDER),
                "filter_subject": n.inbox_subject(_PLACEHOLDER),
                "deliver_policy": "all",
                "ack_policy": "explicit",
                "ack_wait_s": ack_wait,
                "max_deliver": max_deliver,
                "backoff_s": [ack_wait * 2**i for i in range(min(max_deliver - 1, 6))],
            }
        ),
        "headers": {
            n.MSG_ID_HEADER: (
                "the message's id for JetStream's duplicate window: on a card, a digest of"
                " its bytes; an agent sets one on each started/result (never on an"
                " announcement, repeated byte for byte to renew its lease)"
            ),
            n.TRACE_HEADER: (
                "W3C trace context of the card; the card's traceparent field wins; an"
                " agent's replies and requests carry its card's"
            ),
            n.PARTITION_HEADER: (
                "on a card: its run's partition (digits); the agent's replies to that card"
                " go to cardbus.reply.<agent>.<task>.<partition>"
            ),
        },
        "card_fields_not_headers": {
            "attempt": "the card's attempt (a retry is a new attempt, a new card)",
            "deadline": "timeout_s: seconds the orchestrator waits from dispatch",
            "delivery": "JetStream's delivery count (message metadata), 2+ on a redelivery",
        },
        "acks": {
            "+ACK": "the card is answered (send the result first, then ack)",
            "-NAK": "give it back now (or after a delay): another replica may take it",
            "+WPI": "in progress: resets ack_wait while a long handler works",
            "+TERM": "never again (a card the agent cannot decode: dead-letter it first)",
            "no ack within ack_wait": (
                "redelivered (to any replica); after max_deliver deliveries the card is"
                " dead-lettered on cardbus.dead.agent and removed"
            ),
        },
        "idempotence": (
            "an agent answers a card again with the same result when it sees the same"
            " (task_id, attempt) again (a redelivery), without running it twice"
        ),
        "identity": (
            "the subject names the sender: a reply, announcement or request naming another"
            " agent than its subject is refused (reply.refused in the log, dead-lettered)"
        ),
        "agent_permissions": _templated(n.agent_permissions(_PLACEHOLDER)),
        "agent_inbox_prefix": _templated(n.agent_inbox_prefix(_PLACEHOLDER)),
    }
