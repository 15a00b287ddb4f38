"""The three cards: what a task is, what an agent answers, and what an agent can do.

All are frozen msgspec Structs, validated on decode (``decode_task_card`` and
friends raise ``DecodeError`` with the reason) and each exports a JSON Schema
(``TaskCard.json_schema()``). ``AgentCard`` converts to and from the A2A
AgentCard JSON without losing our fields (``cardbus.agents.a2a_card``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from cardbus.eventstore.errors import DecodeError
from cardbus.eventstore.events import ReviewIssue, Usage
from cardbus.eventstore.taskspec import DEFAULT_MAX_ATTEMPTS, TaskSpec

__all__ = [
    "constraint_problem",
    "AgentCard",
    "Announce",
    "Reply",
    "AgentConstraints",
    "CancelNotice",
    "CapabilitySpec",
    "Review",
    "ResultCard",
    "ResultStatus",
    "Started",
    "TaskCard",
    "WIRE_VERSION",
    "decode_agent_card",
    "decode_cancel_notice",
    "decode_reply",
    "decode_result_card",
    "decode_task_card",
    "encode",
]

#: the version of the wire format (``cardbus.bus.wire``) this code speaks: every
#: announcement says its own, and an orchestrator refuses an agent speaking another
WIRE_VERSION = 1

ResultStatus = Literal["completed", "failed", "needs_input", "rejected"]
#: a confidence is a probability: decoding anything outside 0..1 is an error
Confidence = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]


class _Card(msgspec.Struct, frozen=True, kw_only=True):
    @classmethod
    def json_schema(cls) -> dict[str, Any]:
        return msgspec.json.schema(cls)


class TaskCard(_Card, TaskSpec, frozen=True, kw_only=True, tag="task_card"):
    """One unit of work, exactly as an agent receives it.

    The task's spec (capability, goal, inputs, constraints, deps, timeout)
    is declared once in ``cardbus.eventstore.taskspec``. ``inputs`` holds the
    task's own inputs with references to its declared dependencies already
    resolved; nothing else reaches the agent. ``review`` is set when the task
    is re-run after a review, ``supplement`` when it is re-run with input it
    asked for. A revision's card carries ``previous_output``, the draft the
    review's issues are about, so the agent can make targeted edits; a
    reviewer's card carries the task's ``checklist`` (and its inputs the draft,
    the goal and the checklist). ``absent`` names the dependencies (task ids) that
    were optional and ended without an output: the inputs placed from them are left
    out (a key omitted, a list item dropped).
    """

    task_id: str
    root_id: str
    parent_id: str | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    budget_tokens: int | None = None
    attempt: int = 1
    review: list[ReviewIssue] = []
    previous_output: Any = None  # a revision: the output the review was about, to edit
    supplement: Any = None
    traceparent: str | None = None
    delivery: int = 1  # set by the transport: 2 or more when the card was redelivered
    absent: list[str] = []  # deps (optional tasks) that ended without output
    # the run's priority (``Plan.priority``): the model pacer serves a higher one first
    priority: int = 0


class ResultCard(_Card, frozen=True, kw_only=True, tag="result_card"):
    task_id: str
    attempt: int
    agent_id: str
    status: ResultStatus
    output: Any = None
    confidence: Confidence = 1.0
    needs_retry: bool = False
    notes: str = ""
    error: str | None = None
    reason: str | None = None  # rejection reason: input_schema_mismatch, out_of_capability, ...
    missing: str | None = None  # needs_input: what is missing
    supplement_capability: str | None = None  # needs_input: who could supply it
    supplement_inputs: dict[str, Any] = {}
    usage: Usage = Usage()
    duration_s: float = 0.0
    # who ran it (set by the worker): its process, and the delivery count of the card
    replica_id: str = ""
    host: str = ""
    pid: int = 0
    delivery: int = 1


class Started(_Card, frozen=True, kw_only=True, tag="started"):
    """An agent picked up a card (the orchestrator records task.started)."""

    task_id: str
    attempt: int
    agent_id: str
    replica_id: str = ""  # who runs it: the worker process, as on ResultCard
    host: str = ""
    pid: int = 0
    delivery: int = 1


class Review(msgspec.Struct, frozen=True, kw_only=True):
    """What a reviewer capability returns."""

    passed: bool
    issues: list[ReviewIssue] = []


class CapabilitySpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    description: str = ""
    input_schema: dict[str, Any] = {}
    output_schema: dict[str, Any] = {}
    tags: list[str] = []
    examples: list[str] = []


class AgentConstraints(msgspec.Struct, frozen=True, kw_only=True):
    """Limits an agent declares; task constraints are matched against ``limits``."""

    max_timeout_s: float | None = None
    max_input_bytes: int | None = None
    max_concurrency: int = 1
    limits: dict[str, Any] = {}  # e.g. {"languages": ["en", "fr"], "max_words": 2000}
    tools: list[str] = []  # tool allow-list


class AgentCard(_Card, frozen=True, kw_only=True, dict=True):
    """What an agent can do. ``dict=True`` gives each card a ``__dict__`` (no field, never
    encoded) that holds its capabilities by name, made on the first :meth:`capability`."""

    agent_id: str
    name: str
    description: str = ""
    version: str = "0.1.0"
    capabilities: list[CapabilitySpec] = []
    constraints: AgentConstraints = AgentConstraints()
    provider: str = "cardbus"
    url: str = ""

    def capability(self, name: str) -> CapabilitySpec | None:
        """The capability called ``name`` (the first, if several are), or None.

        The orchestrator asks this some 50 times a run (selection, plan checks), so the
        card keeps its capabilities in a dict, made once: the card is frozen, and its
        ``capabilities`` list is not to be changed in place once it is asked.
        """
        try:
            by_name: dict[str, CapabilitySpec] = self.__dict__["_by_name"]
        except KeyError:
            by_name = {}
            for c in self.capabilities:
                by_name.setdefault(c.name, c)
            self.__dict__["_by_name"] = by_name
        return by_name.get(name)

    def to_a2a(self, url: str | None = None, *, legacy: bool = False) -> dict[str, Any]:
        """The A2A AgentCard JSON: v1.0 (``legacy=True``: the v0.3 shape for older clients).

        Our own fields (agent id, schemas, constraints, tools) ride in the
        spec's extension slot; see ``cardbus.agents.a2a_card``.
        """
        from cardbus.agents.a2a_card import to_a2a_v03, to_a2a_v1  # it imports this module

        return to_a2a_v03(self, url) if legacy else to_a2a_v1(self, url)

    @classmethod
    def from_a2a(cls, doc: dict[str, Any] | bytes | str) -> AgentCard:
        """Read any A2A AgentCard, v0.3 or v1.0 (a dict, or its JSON text).

        Anything that is not an A2A AgentCard is a ``DecodeError``; see
        ``cardbus.agents.a2a_card.from_a2a`` for how foreign cards are read.
        """
        from cardbus.agents.a2a_card import from_a2a

        return from_a2a(doc)


class Announce(_Card, frozen=True, kw_only=True, tag="announce"):
    """An agent coming online (or leaving); the orchestrator records it as an event.

    A worker announces again every ``lease_s / 3`` (a renewal, held in the
    orchestrator's memory, never logged); one that stops announces ``online=False``.
    An agent none of whose replicas renewed within ``lease_s`` is deregistered.
    """

    card: AgentCard
    online: bool = True
    lease_s: float = 10.0
    replica_id: str = ""  # the announcing worker process (an agent may have several)
    # counts the replica's announcements, so each renewal is a message of its own (JetStream
    # drops a message whose id, the hash of its bytes, matches one it still holds)
    renewal: int = 0
    #: the wire format the agent speaks (absent: 1, the format before this field)
    wire_version: int = WIRE_VERSION


class CancelNotice(_Card, frozen=True, kw_only=True, tag="cancel_notice"):
    """The orchestrator to an agent: stop the handler of ``(task_id, attempt)``.

    Sent when the task ended while the attempt was in flight (``task.cancelled``,
    ``task.halted``): whatever the handler does next is not wanted. ``by`` is the
    ended event's actor, ``reason`` its reason. A notice for an attempt the worker
    is not running is ignored (it may have finished, or run elsewhere)."""

    task_id: str
    attempt: int
    agent_id: str
    reason: str = ""
    by: str = ""


_task_decoder = msgspec.json.Decoder(TaskCard)
_notice_decoder = msgspec.json.Decoder(CancelNotice)
_agent_decoder = msgspec.json.Decoder(AgentCard)
Reply = ResultCard | Started | Announce
_reply_decoder = msgspec.json.Decoder(Reply)
_result_decoder = msgspec.json.Decoder(ResultCard)
_encoder = msgspec.json.Encoder()


def encode(card: msgspec.Struct) -> bytes:
    return _encoder.encode(card)


def _decode(decoder: msgspec.json.Decoder[Any], data: bytes, what: str) -> Any:
    try:
        return decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise DecodeError(f"invalid {what}: {e}") from e


def decode_task_card(data: bytes) -> TaskCard:
    return _decode(_task_decoder, data, "task card")


def decode_agent_card(data: bytes) -> AgentCard:
    return _decode(_agent_decoder, data, "agent card")


def decode_result_card(data: bytes) -> ResultCard:
    return _decode(_result_decoder, data, "result card")


def decode_cancel_notice(data: bytes) -> CancelNotice:
    return _decode(_notice_decoder, data, "cancel notice")


def decode_reply(data: bytes) -> Reply:
    return _decode(_reply_decoder, data, "agent reply")


def constraint_problem(
    agent: AgentConstraints, task_constraints: dict[str, Any], timeout_s: float, input_bytes: int
) -> str | None:
    """Why an agent cannot meet a task's constraints, or None when it can.

    Each task constraint must name one of the agent's ``limits``: a list
    offered means the wanted value (or every wanted value, for a list) must be
    in it; a number offered is a maximum; anything else must be equal.
    """
    if agent.max_timeout_s is not None and not timeout_s <= agent.max_timeout_s:
        return f"timeout {timeout_s}s over the agent's {agent.max_timeout_s}s"
    if agent.max_input_bytes is not None and input_bytes > agent.max_input_bytes:
        return f"input of {input_bytes} bytes over the agent's {agent.max_input_bytes}"
    for key, wanted in task_constraints.items():
        if key not in agent.limits:
            return f"constraint {key!r} not offered by the agent"
        offered = agent.limits[key]
        if isinstance(offered, list):
            wanted_all = wanted if isinstance(wanted, list) else [wanted]
            missing = [w for w in wanted_all if w not in offered]
            if missing:
                return f"{key}={wanted!r} not in {offered!r}"
        elif _is_number(offered):
            if not _is_number(wanted) or not wanted <= offered:
                return f"{key}={wanted!r} over the agent's {offered!r}"
        elif wanted != offered:
            return f"{key}={wanted!r} != {offered!r}"
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
