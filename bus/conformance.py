"""The conformance kit: drive a running agent, in any language, through the wire contract.

``await check_agent(options, "upper")`` (``cardbus agent check --agent upper``) plays
the orchestrator's part against a real nats-server and an agent already running on it,
and judges what the agent sends against the published wire format (``cardbus.bus.wire``):

==============  =========================================================================
``announce``    it announces itself on ``cardbus.announce.<agent>``, in this wire version,
                with a card naming it and its capabilities
``liveness``    it renews the announcement (same replica) within its lease
``take``        a card it can take (its first capability, or ``capability``) is answered
                with a valid ``result_card`` for that task and attempt, ``completed``
``ack``         that card is acked once answered (nothing left pending in its inbox)
``reject``      a card for a capability it does not offer is answered ``rejected``, with
                a reason
``redelivery``  the same card again (same task id and attempt, delivery 2) is answered
                with the same result, not a different one
``partition``   a card whose header ``Cardbus-Partition`` names a partition is answered
                on ``cardbus.reply.<agent>.<task>.<partition>``
``identity``    everything it sent named itself, on its own subjects, and matched its schema
``journal``     each model call it made was journaled: a ``model.request`` before it and a
                ``model.answer`` after, with valid arguments, that answer before the
                result that used it, and no result reporting model tokens for a task
                with no call journaled ("not exercised" when it made none: a call made
                and neither journaled nor reported is beyond what the wire shows)
==============  =========================================================================

The kit answers the agent's requests itself (``cardbus.req.<agent>``: a model call is
told to go live and its answer is taken; any other request is refused as unavailable),
so run it where no orchestrator serves the agent. It listens with core NATS
subscriptions to ``cardbus.announce.<agent>``, ``cardbus.reply.<agent>.>`` and
``cardbus.req.<agent>``: its NATS user needs to subscribe there (the operator's, or a
server without authorization). The cards it sends stay in ``CARDBUS_REPLIES`` for an
orchestrator that starts later: it records them as replies to tasks it does not know.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import jsonschema
import msgspec
from nats.aio.msg import Msg

from cardbus.agents.cards import WIRE_VERSION, Announce, ResultCard, Started, TaskCard, encode
from cardbus.agents.requests import AgentRequest, AgentResponse
from cardbus.bus.transport.interface import Refusal
from cardbus.bus.transport.nats import (
    ANNOUNCE_PREFIX,
    INBOX_STREAM,
    MSG_ID_HEADER,
    PARTITION_HEADER,
    REPLY_PREFIX,
    REQUEST_PREFIX,
    NatsBus,
    NatsOptions,
    consumer_name,
    inbox_subject,
    sender_problem,
)
from cardbus.bus.wire import schema
from cardbus.eventstore.ids import new_id
from cardbus.eventstore.nats import encode_token

__all__ = ["CLAUSES", "CheckReport", "Clause", "check_agent", "sample_inputs"]

Outcome = Literal["pass", "fail", "not exercised"]
CLAUSES = (
    "announce",
    "liveness",
    "take",
    "ack",
    "reject",
    "redelivery",
    "partition",
    "identity",
    "journal",
)
#: the partition the ``partition`` clause's card names (any digits would do)
PARTITION = "7"
#: a capability no agent offers: the card the agent must reject
UNKNOWN_CAPABILITY = "cardbus.conformance.no-such-capability"
_JOURNAL_KINDS = {"model.request", "model.answer", "tool.begin", "tool.end"}


@dataclass(frozen=True)
class Clause:
    name: str
    outcome: Outcome
    detail: str = ""


@dataclass
class CheckReport:
    agent_id: str
    clauses: list[Clause] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """No clause failed (a clause not exercised is no failure)."""
        return all(c.outcome != "fail" for c in self.clauses)

    def as_json(self) -> dict[str, Any]:
        return {
            "agent_id": self.agent_id,
            "wire_version": WIRE_VERSION,
            "passed": self.passed,
            "clauses": [
                {"name": c.name, "outcome": c.outcome, "detail": c.detail} for c in self.clauses
            ],
        }

    def lines(self) -> list[str]:
        width = max(len(n) for n in CLAUSES)
        out = [f"conformance of agent {self.agent_id!r} (wire version {WIRE_VERSION})"]
        for c in self.clauses:
            out.append(f"  {c.outcome.upper():<14} {c.name:<{width}}  {c.detail}".rstrip())
        failed = sum(c.outcome == "fail" for c in self.clauses)
        out.append("passed" if not failed else f"FAILED: {failed} clause(s)")
        return out


def sample_inputs(input_schema: dict[str, Any]) -> dict[str, Any]:
    """Inputs that a capability's input schema accepts, for its required properties: a
    string ``"conformance"``, numbers 1, true, empty lists and objects."""
    doc = input_schema
    ref = doc.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        doc = doc.get("$defs", {}).get(ref.rsplit("/", 1)[1], {})
    props = doc.get("properties", {})
    required = doc.get("required", [])
    samples = {"integer": 1, "number": 1, "boolean": True, "array": [], "object": {}}
    out: dict[str, Any] = {}
    for name in required:
        kind = props.get(name, {}).get("type")
        out[name] = samples.get(kind, "conformance") if isinstance(kind, str) else "conformance"
    return out


@dataclass
class _Seen:
    subject: str
    data: bytes
    at: float


class _Listener:
    """What the agent sends, as it arrives, checked against the schemas as it comes."""

    def __init__(self, agent_id: str) -> None:
        self.agent_id = agent_id
        self.announcements: list[tuple[_Seen, Announce]] = []
        self.replies: list[tuple[_Seen, ResultCard | Started]] = []
        self.requests: list[AgentRequest] = []
        self.requested_at: list[float] = []  # when the kit answered each of ``requests``
        self.problems: list[str] = []
        self.changed = asyncio.Event()
        self.validators = {
            n: jsonschema.Draft202012Validator(schema(n))
            for n in ("announce", "reply", "agent_request")
        }

    def _valid(self, name: str, seen: _Seen) -> Any:
        try:
            doc = json.loads(seen.data)
        except ValueError as e:
            self.problems.append(f"not JSON on {seen.subject}: {e}")
            return None
        errors = sorted(self.validators[name].iter_errors(doc), key=lambda e: list(e.path))
        if errors:
            where = "/".join(str(p) for p in errors[0].absolute_path) or "(top)"
            self.problems.append(
                f"{name} on {seen.subject} does not match its schema at {where}: "
                f"{errors[0].message}"
            )
            return None
        return doc

    async def on_reply(self, msg: Msg) -> None:
        seen = _Seen(msg.subject, msg.data, time.monotonic())
        kind = "announce" if msg.subject.startswith(ANNOUNCE_PREFIX + ".") else "reply"
        if self._valid(kind, seen) is not None:
            try:
                reply = msgspec.json.decode(msg.data, type=Announce | ResultCard | Started)
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                self.problems.append(f"{kind} on {msg.subject}: {e}")
            else:
                refused = sender_problem(msg.subject, reply)
                if refused is not None:
                    self.problems.append(f"{refused.kind} on {msg.subject}: {refused.reason}")
                elif isinstance(reply, Announce):
                    self.announcements.append((seen, reply))
                else:
                    self.replies.append((seen, reply))
        self.changed.set()

    async def on_request(self, msg: Msg) -> None:
        doc = self._valid("agent_request", _Seen(msg.subject, msg.data, time.monotonic()))
        if doc is not None and doc.get("kind") in _JOURNAL_KINDS:
            name = str(doc["kind"]).replace(".", "_") + "_args"
            errors = list(jsonschema.Draft202012Validator(schema(name)).iter_errors(doc["args"]))
            if errors:
                self.problems.append(f"{doc['kind']} args: {errors[0].message}")

    def on_refused(self, refusal: Refusal) -> None:
        self.problems.append(f"{refusal.kind} on {refusal.subject}: {refusal.reason}")

    async def until(self, found: Callable[[], Any], timeout: float) -> Any:
        """``found()`` once it is truthy, or None after ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            result = found()
            if result:
                return result
            left = deadline - loop.time()
            if left <= 0:
                return None
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), left)
            except TimeoutError:
                pass


class _Kit:
    def __init__(self, bus: NatsBus, agent_id: str, timeout: float) -> None:
        self.bus = bus
        self.agent_id = agent_id
        self.timeout = timeout
        self.listen = _Listener(agent_id)
        self.run_id = new_id()

    async def serve(self, req: AgentRequest) -> AgentResponse:
        """The orchestrator's answers, as far as a model call needs them."""
        # (answered after this: whatever the agent sends once it has the answer comes later)
        self.listen.requests.append(req)
        self.listen.requested_at.append(time.monotonic())
        self.listen.changed.set()
        result: Any
        if req.kind == "model.request":
            result = {"call": new_id()}
        elif req.kind in ("model.answer", "tool.end"):
            result = {"recorded": True}
        elif req.kind == "tool.begin":
            result = {"key": new_id()}
        else:
            return AgentResponse(
                request_id=req.request_id,
                ok=False,
                error=f"the conformance kit serves no {req.kind} requests",
                error_type="unavailable",
            )
        return AgentResponse(request_id=req.request_id, ok=True, result=result)

    def card(self, name: str, capability: str, inputs: dict[str, Any]) -> TaskCard:
        return TaskCard(
            task_id=f"check-{self.run_id}-{name}",
            root_id=f"check-{self.run_id}",
            capability=capability,
            inputs=inputs,
            timeout_s=self.timeout,
        )

    def result_of(self, card: TaskCard, after: int = 0) -> ResultCard | None:
        for _, reply in self.listen.replies[after:]:
            if isinstance(reply, ResultCard) and reply.task_id == card.task_id:
                return reply
        return None

    def subject_of(self, result: ResultCard) -> str:
        return next(seen.subject for seen, r in self.listen.replies if r is result)

    async def answer(
        self, card: TaskCard, partition: str | None = None
    ) -> tuple[ResultCard | None, int]:
        """Send ``card`` (with a ``Cardbus-Partition`` header, when given); its result
        (None: none in time), and where to look for the next."""
        mark = len(self.listen.replies)
        if partition is None:
            await self.bus.send_task(self.agent_id, card)
        else:  # as a partitioned orchestrator member sends it
            data = encode(card)
            headers = {
                MSG_ID_HEADER: hashlib.blake2b(data, digest_size=16).hexdigest(),
                PARTITION_HEADER: partition,
            }
            js = self.bus.nc.jetstream()
            await js.publish(inbox_subject(self.agent_id), data, headers=headers)
        result = await self.listen.until(lambda: self.result_of(card, mark), self.timeout)
        return result, len(self.listen.replies)

    async def inbox_settled(self) -> str:
        """ "" once the agent's inbox consumer has nothing delivered and unacked nor waiting."""
        js = self.bus.nc.jetstream()
        durable = consumer_name(self.agent_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(self.timeout, 10.0)
        last = "its consumer was never seen"
        while loop.time() < deadline:
            try:
                info = await js.consumer_info(INBOX_STREAM, durable)
            except Exception as e:  # not created (yet): the agent never consumed
                last = f"no consumer {durable}: {e!r}"
            else:
                pending, unacked = info.num_pending or 0, info.num_ack_pending or 0
                if not pending and not unacked:
                    return ""
                last = f"{unacked} card(s) delivered and not acked, {pending} waiting"
            await asyncio.sleep(0.1)
        return last


def _announce_clause(ann: Announce) -> Clause:
    if ann.wire_version != WIRE_VERSION:
        return Clause("announce", "fail", f"wire version {ann.wire_version}, not {WIRE_VERSION}")
    if not ann.online or not ann.card.capabilities:
        return Clause("announce", "fail", "announced offline, or with no capability")
    caps = ", ".join(c.name for c in ann.card.capabilities)
    return Clause("announce", "pass", f"wire v{ann.wire_version}, capabilities: {caps}")


def _take_clause(
    take: TaskCard, result: ResultCard | None, agent_id: str, timeout: float
) -> Clause:
    if result is None:
        return Clause("take", "fail", f"no result for {take.task_id} in {timeout:g}s")
    if (result.attempt, result.agent_id) != (take.attempt, agent_id):
        return Clause("take", "fail", f"result for attempt {result.attempt} by {result.agent_id}")
    if result.status != "completed":
        why = result.reason or result.error or ""
        return Clause("take", "fail", f"{take.capability}: {result.status} {why}".rstrip())
    return Clause("take", "pass", f"{take.capability}: completed")


def _reject_clause(rejected: ResultCard | None) -> Clause:
    if rejected is None:
        return Clause("reject", "fail", f"no answer to a card for {UNKNOWN_CAPABILITY!r}")
    if rejected.status != "rejected" or not rejected.reason:
        return Clause("reject", "fail", f"answered {rejected.status}, reason {rejected.reason!r}")
    return Clause("reject", "pass", f"rejected: {rejected.reason}")


def _redelivery_clause(first: ResultCard, again: ResultCard | None) -> Clause:
    if again is None:
        return Clause("redelivery", "fail", "no answer to the redelivered card")
    same = (first.status, first.output, first.reason, first.attempt) == (
        again.status,
        again.output,
        again.reason,
        again.attempt,
    )
    if not same:
        return Clause("redelivery", "fail", f"another answer: {again.status} {again.output!r}")
    return Clause("redelivery", "pass", "the same answer")


async def check_agent(
    options: NatsOptions | str,
    agent_id: str,
    *,
    capability: str | None = None,
    inputs: dict[str, Any] | None = None,
    timeout: float = 30.0,
) -> CheckReport:
    """Drive the agent ``agent_id`` running on the NATS server of ``options`` through every
    clause (``CLAUSES``); the report says pass, fail or not exercised for each."""
    bus = await NatsBus.connect(options, name="cardbus-agent-check")
    kit = _Kit(bus, agent_id, timeout)
    report = CheckReport(agent_id)
    add = report.clauses.append
    listen = kit.listen
    bus.on_refused = listen.on_refused
    t = encode_token(agent_id)
    nc = bus.nc
    subs = [
        await nc.subscribe(f"{ANNOUNCE_PREFIX}.{t}", cb=listen.on_reply),
        await nc.subscribe(f"{REPLY_PREFIX}.{t}.>", cb=listen.on_reply),
        await nc.subscribe(f"{REQUEST_PREFIX}.{t}", cb=listen.on_request),
    ]
    try:
        await bus.serve_requests(kit.serve)
        await nc.flush()

        # announce (a renewal comes within a third of the lease: wait a lease at most)
        first = await listen.until(lambda: listen.announcements, timeout)
        if not first:
            add(Clause("announce", "fail", f"no announcement on cardbus.announce.{t}"))
            for name in CLAUSES[1:]:  # nothing to send cards to
                add(Clause(name, "not exercised", "the agent never announced itself"))
            return report
        seen, ann = first[0]
        add(_announce_clause(ann))

        renewal = asyncio.ensure_future(_liveness(listen, seen, ann, timeout))
        first_cap = ann.card.capabilities[0].name if ann.card.capabilities else ""
        cap_name = capability or first_cap
        spec = ann.card.capability(cap_name)
        if inputs is None:
            inputs = sample_inputs(spec.input_schema if spec else {})

        take = kit.card("take", cap_name, inputs)
        result, _ = await kit.answer(take)
        add(_take_clause(take, result, agent_id, timeout))
        if result is not None:
            unsettled = await kit.inbox_settled()
            add(Clause("ack", "fail", unsettled) if unsettled else Clause("ack", "pass", "acked"))
        else:
            add(Clause("ack", "not exercised", "no card answered"))

        refuse = kit.card("reject", UNKNOWN_CAPABILITY, {})
        rejected, _ = await kit.answer(refuse)
        add(_reject_clause(rejected))

        if result is None:
            add(Clause("redelivery", "not exercised", "no first answer to compare with"))
        else:
            again, _ = await kit.answer(msgspec.structs.replace(take, delivery=2))
            add(_redelivery_clause(result, again))

        if result is None:
            add(Clause("partition", "not exercised", "no card answered"))
        else:
            placed = kit.card("partition", cap_name, inputs)
            answered, _ = await kit.answer(placed, partition=PARTITION)
            if answered is None:
                add(Clause("partition", "fail", "no answer to a card naming its partition"))
            elif not (on := kit.subject_of(answered)).endswith(f".{PARTITION}"):
                add(Clause("partition", "fail", f"answered on {on}, not .{PARTITION}"))
            else:
                add(Clause("partition", "pass", f"answered on .<task>.{PARTITION}"))

        add(await renewal)
        add(_journal_clause(listen))
        if listen.problems:
            shown = "; ".join(listen.problems[:3])
            add(Clause("identity", "fail", f"{len(listen.problems)} problem(s): {shown}"))
        else:
            add(Clause("identity", "pass", "every message named it, on its subjects, valid"))
        report.clauses.sort(key=lambda c: CLAUSES.index(c.name))
        return report
    finally:
        for sub in subs:
            try:
                await sub.unsubscribe()
            except Exception:  # (closing anyway)
                pass
        await bus.close()  # (and its connection, which it opened)


async def _liveness(listen: _Listener, seen: _Seen, first: Announce, timeout: float) -> Clause:
    if not first.lease_s > 0:
        return Clause("liveness", "fail", f"lease_s {first.lease_s}: never renewed")

    def renewed() -> bool:
        return any(
            s.at > seen.at and a.replica_id == first.replica_id and a.online
            for s, a in listen.announcements
        )

    if await listen.until(renewed, max(first.lease_s, 1.0) + min(timeout, 5.0)):
        return Clause("liveness", "pass", f"renewed within its lease ({first.lease_s:g}s)")
    return Clause("liveness", "fail", f"no renewal within its lease ({first.lease_s:g}s)")


def _journal_clause(listen: _Listener) -> Clause:
    requests = listen.requests
    asked = [r for r in requests if r.kind == "model.request"]
    results = [(seen.at, r) for seen, r in listen.replies if isinstance(r, ResultCard)]
    unjournaled = [
        r
        for _, r in results
        if r.usage.input_tokens + r.usage.output_tokens > 0
        and not any(a.task_id == r.task_id and a.attempt == r.attempt for a in asked)
    ]
    if unjournaled:
        first = unjournaled[0]
        tokens = first.usage.input_tokens + first.usage.output_tokens
        return Clause(
            "journal", "fail", f"{first.task_id} reported {tokens} model tokens, no call journaled"
        )
    if not asked:
        return Clause("journal", "not exercised", "it made no model call")
    answered = {(r.execution, r.seq) for r in requests if r.kind == "model.answer"}
    missing = [r for r in asked if (r.execution, r.seq) not in answered or not r.execution]
    if missing:
        return Clause("journal", "fail", f"{len(missing)} model call(s) without a model.answer")
    for req, at in zip(requests, listen.requested_at, strict=True):
        if req.kind != "model.answer":
            continue
        place = (req.task_id, req.attempt)
        used = [t for t, res in results if (res.task_id, res.attempt) == place]
        if used and min(used) < at:
            return Clause(
                "journal", "fail", f"{req.task_id}: its result came before its model.answer"
            )
    return Clause("journal", "pass", f"{len(asked)} model call(s) journaled")
