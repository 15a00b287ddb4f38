"""The orchestrator's side of the journal: model and tool calls recorded, and replayed.

Each model call an agent makes through ``ctx.llm`` and each ``ctx.tool`` call
is a numbered step (``seq``) of one handler run (an ``execution``: one
delivery of one card; ``agents.journal``). This module records them on the
task's stream and answers a later execution from them:

* a model call: ``model.requested`` before it goes out, ``model.answered``
  (or its typed error) when the agent reports the answer, before the handler
  sees it;
* a tool call (the orchestrator makes it): ``tool.requested`` before the
  effect, ``tool.called`` after, with an idempotency key (the first
  ``tool.requested``'s event id) handed to the tool (``current_idempotency_key``).

**Replay.** A new execution of a task (a retry, a redelivery, a resumption
after a restart) is answered from the *reference*: the calls of the latest
earlier execution, in order, with what that one replayed resolved to the
originals (and, if it never went live, the rest of its own reference). While
the new execution asks at ``seq`` exactly what the reference asked there (the
same request digest, the same tool and argument digest), it gets the recorded
answer: ``model.answered`` / ``tool.called`` naming the event replayed
(``replayed_from``), tokens 0, no call made. From the first call that differs,
or that was never answered, it goes live, and stays live. Errors are not
replayed (a timed-out model or a failed tool is asked again). When an attempt
failed *because of* the model's answer (``MODEL_CAUSED`` reasons), the next
one asks the model again from that attempt's last model call.

**Verified before trusted.** A recorded answer or result is replayed only if the log
vouches for it: its event's hash and its stream's chain (the store's own ``verify``) and
its digest (``journal_trust``). If not, the orchestrator fails the task
``journal_tampered`` (a ``task.failed`` naming the stream and position) and the call is
refused (``JournalTampered`` in the agent): nothing of the edited content reaches a
handler.

**Budgets bound the call.** A live model call of a run with caps is let through with the
``max_tokens`` its reservation assumed (``Budgets.check_request``): ``model.requested``
records it, the go-ahead carries it, and the agent's model client sends it. An answer
past it is recorded as ``overrun_tokens``.

**Unknown effects.** A reference step with ``tool.requested`` and no
``tool.called`` (the process died during the call), or with a result the log
did not keep: a tool declared idempotent (``ToolSpec.idempotent``) is called
again with the same key (``tool.effect_unknown`` decision ``repeat``); any
other is not: ``tool.effect_unknown`` decision ``ask``, the agent gets
``EffectUnknown``, and the orchestrator asks for an approval naming the call.
Approved, the next attempt repeats it (with the same key); recorded as done by
an operator (``bus.orchestrator.effects``: a ``tool.called`` with
``recorded_by``), the next attempt replays that result; denied, the task is
cancelled. Each call keeps its place: an asked call stands in its execution as
the recorded one, and a call repeated with its recorded key is no difference,
so the parallel calls of one turn keep their keys and the completed ones replay.

**After a first difference** a call goes live, but one that an earlier
execution recorded (the same tool and argument digest, matched in order, each
recorded key once: ``_TaskJournal.recorded_call``) reuses its key, as an unknown
effect (``tool.effect_unknown`` reason ``after_difference``): repeated if the
tool is idempotent or an operator approved, else asked. With replay off, calls
are made fresh.

**Origins: re-running a recorded run** (``cardbus rerun``). A task whose
``task.created`` names an ``origin`` (the task of a recorded run it re-runs) has
the origin's effective steps (what its last execution amounted to, replays
resolved) as the reference of its first execution: it is answered from the
recorded run while it asks the same. With ``replay_strict`` (an offline re-run)
nothing goes live: a call the reference does not answer (another request at that
``seq``, a call past the recorded ones, a recorded call that failed or whose
content the log did not keep) is refused with ``replay_diverged``
(``ReplayDiverged`` in the agent; the task fails, not retried), the message naming
the task, the call and a short unified diff of the recorded and the new request
(messages, arguments). A recorded tool error is replayed as it was. Both come
from the log (``task.created``), so a restarted orchestrator answers the same.

State is a cache of the log: per task, loaded from its stream when first
needed and brought up to date when a new execution starts; a restarted
orchestrator rebuilds it the same way. At most ``_CACHED_TASKS`` tasks are kept.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from cardbus.agents.requests import AgentRequest
from cardbus.agents.tools import ToolError, ToolRegistry, held_for_review
from cardbus.bus.orchestrator.journal_trust import StreamTrust
from cardbus.bus.orchestrator.reviews import Review, fold_review
from cardbus.eventstore import events as ev
from cardbus.eventstore.envelope import Envelope
from cardbus.eventstore.errors import AccessDenied, ValidationError

if TYPE_CHECKING:
    from cardbus.bus.orchestrator.access import AccessPolicy
    from cardbus.bus.orchestrator.budget import Budgets
    from cardbus.eventstore.store import EventStore

__all__ = ["MODEL_CAUSED", "BadJournalRequest", "CallOutcome", "Journal", "call_digest"]

log = logging.getLogger(__name__)

#: failure reasons of an attempt that the model's answer caused: the next attempt asks the
#: model again from that attempt's last model call instead of replaying into the failure
MODEL_CAUSED = frozenset(
    {
        "llm_bad_output",
        "output_schema_mismatch",
        "llm_max_turns",
        "llm_max_tool_calls",
        "llm_token_limit",
    }
)

_CACHED_TASKS = 1024
_encoder = msgspec.json.Encoder(order="sorted")

Record = Callable[[str, list[ev.Event]], Awaitable[Any]]


class BadJournalRequest(ValidationError):
    """A journal request whose arguments are not what the protocol says."""


@dataclass(frozen=True, slots=True)
class CallOutcome:
    """What the broker answers: a result, or an error and its type."""

    result: Any = None
    error: str | None = None
    error_type: str | None = None


def _json(value: Any) -> bytes:
    try:
        return _encoder.encode(value)
    except Exception:
        return repr(value).encode()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_NULL_DIGEST = _sha(b"null")


def call_digest(tool: str, arguments_digest: str) -> str:
    """A tool call's identity in the journal: the tool and its arguments' digest."""
    return _sha(f"{tool}\0{arguments_digest}".encode())


def _held_step(data: ev.ToolReviewRequested, event_id: str) -> _Step:
    return _Step(
        "tool",
        data.seq,
        data.call,
        requested_id=event_id,
        tool=data.tool,
        execution=data.execution,
        attempt=data.attempt,
        agent=data.agent_id,
        held=True,
    )


@dataclass(slots=True)
class _Step:
    """One recorded call of an execution (resolved: a replayed step is its source)."""

    kind: str  # model | tool
    seq: int
    digest: str
    requested_id: str = ""
    answered_id: str = ""  # model.answered / tool.called event id ("": none yet)
    answer: Any = None
    has_answer: bool = False  # the answer (or result) is kept whole in the log
    error: str | None = None
    error_type: str | None = None
    tool: str = ""
    key: str = ""  # a tool call's idempotency key
    repeat_ok: bool = False  # an operator approved repeating this unknown effect
    request: Any = None  # what was asked, kept only in an origin's journal (for the diff)
    # where the answer is recorded, and its digest: checked before it is replayed
    stream: str = ""
    position: int = 0
    content_digest: str = ""  # answer_digest / result_digest
    redacted: bool = False  # the answer kept is the redact hook's: its digest is not
    bound: int | None = None  # the max_tokens a live model call was sent with (a budget's)
    # a tool call's place and maker (its tool.requested): where an operator's word lands
    execution: str = ""
    attempt: int = 0
    agent: str = ""
    arguments_digest: str = ""
    # a proposed call held for a person's review (``reviews``): its place in the turn,
    # nothing ran; ``requested_id`` is its tool.review_requested (the key it runs with)
    held: bool = False


@dataclass(slots=True)
class _Execution:
    attempt: int
    steps: dict[int, _Step] = field(default_factory=dict)
    diverged: bool = False  # it made a live call: its reference no longer applies
    log_end: int = 0  # the task stream's last position folded when it began (what it trusts)
    reference: list[_Step] | None = None  # None: not worked out yet
    claimed: set[str] = field(default_factory=set)  # recorded keys its calls took up
    first_difference: int | None = None  # the seq of its first live call, if known

    def differs(self, seq: int) -> None:
        """A call at ``seq`` was made live: the reference no longer applies from there."""
        self.diverged = True
        if self.first_difference is None or seq < self.first_difference:
            self.first_difference = seq

    def aligned(self, seq: int) -> bool:
        """Whether a call at ``seq`` is still answered from the reference: no difference
        before it (a parallel sibling's, later in the same turn, does not count)."""
        return not self.diverged or (
            self.first_difference is not None and seq < self.first_difference
        )


class _TaskJournal:
    """The journal of one task, folded from its stream."""

    def __init__(self, keep_requests: bool = False) -> None:
        self.keep_requests = keep_requests  # an origin's: the diff of a divergence shows them
        self.origin: str | None = None  # the recorded task this one re-runs (task.created)
        self.strict = False  # nothing goes live: a call the origin did not make is refused
        self.origin_steps: list[_Step] = []  # the reference of the first execution
        self.version = 0  # the last version folded from the log
        self.executions: dict[str, _Execution] = {}  # in order of first appearance
        self.answered: dict[str, _Step] = {}  # answer event id -> the (original) step
        self.requested: dict[str, _Step] = {}  # tool.requested event id -> step
        self.asked: list[_Step] = []  # unknown effects waiting for an approval
        self.reviews: dict[str, Review] = {}  # proposed tool calls held for a person's word
        self.model_failed: set[int] = set()  # attempts that failed because of the model
        self.seen: set[str] = set()  # event ids folded
        self.trust = StreamTrust()  # what the log vouched for (checked before a replay)
        self.failed = False  # a replay found the log tampered with: the task is failed

    # -- folding ------------------------------------------------------------------

    def fold(self, env: Envelope) -> None:
        if env.version > self.version:
            self.version = env.version
        self.trust.saw(env)
        if env.event_id in self.seen:
            return
        self.seen.add(env.event_id)
        data = env.data
        fold_review(self.reviews, env.data)
        match data:
            case ev.ToolReviewRequested() if data.execution:
                # the held call keeps its place: a later attempt meets it there, answered,
                # and its siblings of the same turn still replay from the record
                run = self._execution(data.execution, data.attempt)
                run.steps.setdefault(data.seq, _held_step(data, env.event_id))
            case ev.TaskCreated():
                self.origin, self.strict = data.origin, data.replay_strict
            case ev.ModelRequested():
                run = self._execution(data.execution, data.attempt)
                run.steps[data.seq] = _Step(
                    "model",
                    data.seq,
                    data.request_digest,
                    requested_id=env.event_id,
                    request=data.request if self.keep_requests else None,
                    bound=data.max_tokens,
                )
                run.differs(data.seq)
            case ev.ModelAnswered(replayed_from=str(source)):
                run = self._execution(data.execution, data.attempt)
                original = self.answered.get(source)
                if original is not None:
                    run.steps[data.seq] = original
            case ev.ModelAnswered():
                run = self._execution(data.execution, data.attempt)
                step = run.steps.get(data.seq)
                if step is None:
                    step = run.steps[data.seq] = _Step("model", data.seq, data.request_digest)
                    run.differs(data.seq)
                step.answered_id = env.event_id
                step.answer = data.answer
                step.has_answer = data.error is None and data.answer is not None
                step.error, step.error_type = data.error, data.error_type
                step.stream, step.position = env.stream, env.position
                step.content_digest, step.redacted = data.answer_digest, data.redacted
                self.answered[env.event_id] = step
            case ev.ToolRequested() if data.execution:
                run = self._execution(data.execution, data.attempt)
                step = _Step(
                    "tool",
                    data.seq,
                    call_digest(data.tool, data.arguments_digest),
                    requested_id=env.event_id,
                    tool=data.tool,
                    key=data.idempotency_key or env.event_id,
                    request=data.arguments if self.keep_requests else None,
                    execution=data.execution,
                    attempt=data.attempt,
                    agent=data.agent_id,
                    arguments_digest=data.arguments_digest,
                )
                run.steps[data.seq] = step
                # a call made with a recorded key repeats that call (an unknown effect):
                # not a difference; a sibling of its turn still replays from the reference
                if not data.idempotency_key:
                    run.differs(data.seq)
                self.requested[env.event_id] = step
            case ev.ToolCalled(replayed_from=str(source)) if data.execution:
                run = self._execution(data.execution, data.attempt)
                original = self.answered.get(source)
                if original is not None:
                    run.steps[data.seq] = original
            case ev.ToolCalled() if data.execution:
                run = self._execution(data.execution, data.attempt)
                step = run.steps.get(data.seq)
                if step is None:  # its tool.requested is missing: a log written by hand
                    return
                step.answered_id = env.event_id
                step.answer = data.result
                # a result is kept whole when inline (a result of None is "null": one not
                # kept, its digest says so, is not replayed as None)
                step.has_answer = data.error is None and (
                    data.result is not None
                    or (data.result_bytes <= 4 and data.result_digest in ("", _NULL_DIGEST))
                )
                step.error, step.error_type = data.error, data.error_type
                step.stream, step.position = env.stream, env.position
                step.content_digest = data.result_digest
                self.answered[env.event_id] = step
                # its effect is known now (the tool's late answer, or an operator's word
                # that it happened): replayed from here, never asked about or repeated
                self.asked = [s for s in self.asked if s is not step]
                step.repeat_ok = False
            case ev.ToolEffectUnknown():
                step = self.requested.get(data.requested_event_id)
                if step is None:
                    return
                if data.execution:  # its place in this execution is the recorded call's
                    self._execution(data.execution, data.attempt).steps[data.seq] = step
                if data.decision == "ask" and not any(s is step for s in self.asked):
                    self.asked.append(step)
            case ev.ApprovalGranted():
                for step in self.asked:
                    step.repeat_ok = True
                self.asked.clear()
            case ev.TaskRetryScheduled():
                if data.reason.split(":", 1)[0] in MODEL_CAUSED:
                    self.model_failed.add(data.attempt - 1)
            case ev.TaskFailed():
                if data.reason in MODEL_CAUSED:
                    self.model_failed.add(data.attempts)
            case _:
                pass

    def proposing_text(self, execution: str, seq: int) -> str:
        """The model's words in the answer that proposed the tool call at ``seq``."""
        run = self.executions.get(execution)
        steps = sorted(run.steps.items()) if run else []
        model = [st for n, st in steps if n < seq and st.kind == "model" and st.has_answer]
        answer = model[-1].answer if model else None
        text = answer.get("text") if isinstance(answer, dict) else None
        return text if isinstance(text, str) else ""

    def _execution(self, execution: str, attempt: int) -> _Execution:
        run = self.executions.get(execution)
        if run is None:
            run = self.executions[execution] = _Execution(attempt)
        return run

    # -- the reference ------------------------------------------------------------

    def effective(self, execution: str, trim: bool = True) -> list[_Step]:
        """What ``execution`` amounts to, seq by seq: its own steps (replays resolved to
        their originals), then, if it never went live, the rest of its reference.
        ``trim``: without the model call an attempt failed because of (asked again)."""
        run = self.executions[execution]
        own: list[_Step] = []
        while len(own) in run.steps:
            own.append(run.steps[len(own)])
        steps = list(own)
        if not run.diverged:
            steps += self.reference(execution)[len(own) :]
        later = [r for r in self.executions.values() if r.attempt > run.attempt]
        if trim and run.attempt in self.model_failed and not any(r.steps for r in later):
            models = [i for i, s in enumerate(own) if s.kind == "model"]
            if models:  # ask the model again from the call whose answer failed it
                steps = steps[: models[-1]]
        return steps

    def reference(self, execution: str) -> list[_Step]:
        """The steps ``execution`` is answered from: the effective steps of the latest
        execution before it (for the first: its origin's, if it has one)."""
        run = self.executions[execution]
        if run.reference is None:
            order = list(self.executions)
            at = order.index(execution)
            run.reference = self.effective(order[at - 1]) if at > 0 else list(self.origin_steps)
        return run.reference

    def last_effective(self) -> list[_Step]:
        """What the task's last execution amounted to (as an origin: nothing trimmed)."""
        return self.effective(list(self.executions)[-1], trim=False) if self.executions else []

    def recorded_call(self, execution: str, agent: str, digest: str) -> _Step | None:
        """A tool call an earlier execution recorded with call digest ``digest`` (the same
        tool, the same arguments) that ``execution`` has not met yet, claimed for it: its
        latest state, by key, in the order first made. Earlier: of an earlier attempt, or
        of the same attempt and agent (a redelivery); not a fan-out's sibling. A call that
        failed is not an effect to keep (it is asked again, as on the reference)."""
        run = self.executions[execution]
        used = run.claimed | {s.key for s in run.steps.values() if s.kind == "tool"}
        latest: dict[str, _Step] = {}
        for step in self.requested.values():
            if step.execution != execution and (
                step.attempt < run.attempt or (step.attempt == run.attempt and step.agent == agent)
            ):
                latest[step.key] = step
        for key, step in latest.items():
            failed = bool(step.answered_id) and step.error is not None
            if key not in used and step.digest == digest and not failed:
                run.claimed.add(key)
                return step
        return None


class Journal:
    """Records and replays the model and tool calls of tasks; used by ``RequestBroker``."""

    def __init__(
        self,
        store: EventStore | None,
        record: Record,
        tools: ToolRegistry,
        policy: AccessPolicy,
        replay_allowed: Callable[[str], bool] = lambda task_id: True,
        folded_version: Callable[[str], int] = lambda task_id: 0,
    ) -> None:
        """``folded_version``: the task stream's version the orchestrator has folded; a
        journal behind it reads the rest of the stream before deciding (another writer's
        events: a call recorded by another orchestrator, a retry, an approval)."""
        self.folded_version = folded_version
        self.store = store
        self.record = record
        self.tools = tools
        self.policy = policy
        self.replay_allowed = replay_allowed
        self._tasks: OrderedDict[str, _TaskJournal] = OrderedDict()
        #: budgets checked before a live model call, and the prices of answers (None: none)
        self.budgets: Budgets | None = None
        #: model.requested writes in flight, by (task, execution, seq): answers wait for them
        self._pending: dict[tuple[str, str, int], asyncio.Future[list[str]]] = {}

    # -- the task's journal, from the log ------------------------------------------

    async def _journal(self, task_id: str, execution: str, attempt: int) -> _TaskJournal:
        """The task's journal, up to date with the log when ``execution`` is new."""
        journal = self._tasks.get(task_id)
        if journal is None:
            journal = self._tasks[task_id] = _TaskJournal()
            while len(self._tasks) > _CACHED_TASKS:
                self._tasks.popitem(last=False)
        else:
            self._tasks.move_to_end(task_id)
        if self.store is not None and (
            execution not in journal.executions or self.folded_version(task_id) > journal.version
        ):  # what was decided since: failures, approvals, another writer's calls
            envs = await self.store.read_stream(task_id, journal.version + 1)
            if journal.version == 0 and envs:
                await self._with_origin(journal, envs[0])
            for env in envs:
                journal.fold(env)
        if execution not in journal.executions:  # a new handler run
            run = journal._execution(execution, attempt)
            run.log_end = journal.trust.ends.get(task_id, 0)
            if not journal.strict and not self.replay_allowed(task_id):
                run.reference = []
        return journal

    async def _with_origin(self, journal: _TaskJournal, first: Envelope, depth: int = 0) -> None:
        """A re-run's task (its ``task.created`` names an origin): the origin's calls are its
        first execution's reference, and their answers known to its fold (replays name them).
        An origin that is itself a re-run's task is read the same way (up to 8 deep)."""
        data = first.data
        if not isinstance(data, ev.TaskCreated) or not data.origin or self.store is None:
            return
        source = _TaskJournal(keep_requests=True)
        envs = await self.store.read_stream(data.origin)
        if envs and depth < 8:
            await self._with_origin(source, envs[0], depth + 1)
        for env in envs:
            source.fold(env)
        journal.answered.update(source.answered)
        journal.origin_steps = source.last_effective()
        journal.trust.adopt(source.trust)

    async def _write(
        self, journal: _TaskJournal | None, task_id: str, events: list[ev.Event]
    ) -> list[str]:
        """Record ``events`` (durable on return), fold them, and return their event ids."""
        stored = await self.record(task_id, events)
        envs = [e for e in stored or () if isinstance(e, Envelope)]
        # a call not journaled still moves the task's journal on (no read of it later)
        journal = journal or self._tasks.get(task_id)
        for env in envs if journal is not None else ():
            journal.fold(env)  # type: ignore[union-attr]
        return [env.event_id for env in envs]

    # -- model calls ------------------------------------------------------------------

    async def model_request(self, req: AgentRequest) -> CallOutcome:
        request, replay = req.args.get("request"), req.args.get("replay", True)
        if not isinstance(request, dict) or req.seq < 0 or not req.execution:
            raise BadJournalRequest("model.request needs a request object, seq and execution")
        digest = _sha(_json(request))
        journal = await self._journal(req.task_id, req.execution, req.attempt)
        run = journal.executions[req.execution]
        known = run.steps.get(req.seq)
        if known is not None and known.has_answer:  # asked again (a resent request)
            if untrusted := await self._untrusted(req, journal, known):
                return untrusted
            return CallOutcome(result={"replay": known.answer, "source": known.answered_id})
        ref = journal.reference(req.execution)
        if (replay is not False or journal.strict) and not run.diverged and req.seq < len(ref):
            step = ref[req.seq]
            # what follows is decided on the record: the log must vouch for it first
            if untrusted := await self._untrusted(req, journal, step):
                return untrusted
            if step.kind == "model" and step.digest == digest and step.has_answer:
                await self._write(
                    journal,
                    req.task_id,
                    [
                        ev.ModelAnswered(
                            task_id=req.task_id,
                            agent_id=req.agent_id,
                            attempt=req.attempt,
                            execution=req.execution,
                            seq=req.seq,
                            request_digest=digest,
                            model=str((step.answer or {}).get("model") or req.target)
                            if isinstance(step.answer, dict)
                            else req.target,
                            replayed_from=step.answered_id,
                        )
                    ],
                )
                return CallOutcome(result={"replay": step.answer, "source": step.answered_id})
        if journal.strict:  # an offline re-run: nothing goes live
            return _diverged(req, journal, ref, "model", digest, request)
        kept, size = self._content("model.request", request)
        key = f"{req.task_id}|{req.execution}|{req.seq}"
        reserved, reserved_usd, refusal, on_budget, bound = (
            self.budgets.check_request(req.task_id, req.agent_id, key, req.target, request, size)
            if self.budgets is not None
            else (0, None, None, "fail", None)
        )
        if refusal is not None:  # never sent: the refusal is recorded, the agent told why
            from cardbus.bus.orchestrator.budget import refused_event

            refused = refused_event(
                refusal,
                task_id=req.task_id,
                agent_id=req.agent_id,
                attempt=req.attempt,
                action="model_call",
                decision=on_budget,
                model=req.target,
                execution=req.execution,
                seq=req.seq,
            )
            await self._write(journal, req.task_id, [refused])
            message = f"budget exceeded, model call not sent: {refusal.reason}"
            return CallOutcome(error=message, error_type="budget_exceeded")
        tools = request.get("tools")
        offered = (
            [
                str(t.get("function", {}).get("name") or t.get("name") or "")
                for t in tools
                if isinstance(t, dict)
            ]
            if isinstance(tools, list)
            else []
        )
        # The request need not be durable before the call (a model call has no effect;
        # the answer must be before the handler sees it): it is written while the model
        # works, and ``model_answer`` waits for it first, which keeps the two in order.
        journal.executions[req.execution].diverged = True
        write = self._write(
            journal,
            req.task_id,
            [
                ev.ModelRequested(
                    task_id=req.task_id,
                    agent_id=req.agent_id,
                    attempt=req.attempt,
                    execution=req.execution,
                    seq=req.seq,
                    model=req.target,
                    request=kept,
                    request_digest=digest,
                    request_bytes=size,
                    tools_offered=offered,
                    reserved_tokens=reserved,
                    reserved_usd=None if reserved_usd is None else round(reserved_usd, 10),
                    max_tokens=bound,
                    provider=str(req.args.get("provider") or ""),
                )
            ],
        )
        pending = asyncio.ensure_future(write)
        if self.budgets is not None:  # folded (or failed): the log's hold replaces this one
            pending.add_done_callback(functools.partial(_release, self.budgets, key))
        pending.add_done_callback(_retrieve)
        self._pending[(req.task_id, req.execution, req.seq)] = pending
        if len(self._pending) > 4096:  # answers that never came (their agent died)
            self._pending = {k: f for k, f in self._pending.items() if not f.done()}
        # the go-ahead carries the output bound the budget reserved: the call is sent with it
        return CallOutcome(
            result={"call": ""} if bound is None else {"call": "", "max_tokens": bound}
        )

    async def model_queue(self, req: AgentRequest) -> CallOutcome:
        """A live call waits for its provider's limit (``phase`` queued), or got its slot
        (granted): ``model.queued`` / ``model.slot_granted``, which stop and restart the
        attempt's run time (``limit_waits``)."""
        a = req.args
        if req.seq < 0 or not req.execution or a.get("phase") not in ("queued", "granted"):
            raise BadJournalRequest("model.queue needs seq, execution and a phase")
        journal = await self._journal(req.task_id, req.execution, req.attempt)
        pending = self._pending.get((req.task_id, req.execution, req.seq))
        if pending is not None:
            await asyncio.shield(pending)  # its model.requested first
        event: ev.Event
        if a["phase"] == "queued":
            event = ev.ModelQueued(
                task_id=req.task_id,
                agent_id=req.agent_id,
                attempt=req.attempt,
                execution=req.execution,
                seq=req.seq,
                model=req.target,
                limit=str(a.get("limit") or "")[:300],
                max_wait_s=_seconds(a.get("max_wait_s")),
            )
        else:
            event = ev.ModelSlotGranted(
                task_id=req.task_id,
                agent_id=req.agent_id,
                attempt=req.attempt,
                execution=req.execution,
                seq=req.seq,
                waited_s=_seconds(a.get("waited_s")),
            )
        await self._write(journal, req.task_id, [event])
        return CallOutcome(result={"recorded": True})

    async def model_answer(self, req: AgentRequest) -> CallOutcome:
        a = req.args
        if req.seq < 0 or not req.execution:
            raise BadJournalRequest("model.answer needs seq and execution")
        journal = await self._journal(req.task_id, req.execution, req.attempt)
        pending = self._pending.pop((req.task_id, req.execution, req.seq), None)
        if pending is not None:
            await pending  # its request first (a failure to write it fails this answer)
        step = journal.executions[req.execution].steps.get(req.seq)
        error = a.get("error")
        answer = a.get("answer")
        if error is None and not isinstance(answer, dict):
            raise BadJournalRequest("model.answer needs an answer object or an error")
        latency = a.get("latency_s", 0.0)
        latency = float(latency) if isinstance(latency, (int, float)) else 0.0
        if error is not None:
            event = ev.ModelAnswered(
                task_id=req.task_id,
                agent_id=req.agent_id,
                attempt=req.attempt,
                execution=req.execution,
                seq=req.seq,
                request_digest=step.digest if step else "",
                model=req.target,
                latency_s=round(latency, 6),
                error=str(error)[:2000],
                error_type=str(a.get("error_type") or "error")[:200],
            )
        else:
            assert isinstance(answer, dict)
            kept, size = self._content("model.answer", answer)
            redacted = kept is not None and self.policy.redact is not None
            output = _tokens(answer.get("output_tokens"))
            # an endpoint that ignored the max_tokens a budget sent: recorded, and counted
            overrun = max(0, output - step.bound) if step is not None and step.bound else 0
            if overrun:
                log.warning(
                    "task %s: model call #%d answered %d output tokens past its max_tokens %d",
                    req.task_id,
                    req.seq,
                    overrun,
                    step.bound if step is not None else 0,
                )
            event = ev.ModelAnswered(
                task_id=req.task_id,
                agent_id=req.agent_id,
                attempt=req.attempt,
                execution=req.execution,
                seq=req.seq,
                request_digest=step.digest if step else "",
                model=str(answer.get("model") or req.target),
                answer=kept,
                answer_digest=_sha(_json(answer)),
                answer_bytes=size,
                input_tokens=_tokens(answer.get("input_tokens")),
                output_tokens=output,
                latency_s=round(latency, 6),
                cost_usd=self._cost(answer, req.target),
                redacted=redacted,
                overrun_tokens=overrun,
                queued_s=_seconds(a.get("queued_s")),
            )
        await self._write(journal, req.task_id, [event])
        return CallOutcome(result={"recorded": True})

    async def _untrusted(
        self, req: AgentRequest, journal: _TaskJournal, step: _Step
    ) -> CallOutcome | None:
        """None when the log vouches for what a call is about to be decided on: the task's
        stream as it was when the execution began (and a re-run's origins), by their
        events' hashes and chains, then ``step``'s answer by its digest (``journal_trust``);
        else the task is failed ``journal_tampered`` and the call refused, naming the
        stream and position."""
        trust = journal.trust
        run = journal.executions.get(req.execution)
        end = max(run.log_end if run else 0, step.position if step.stream == req.task_id else 0)
        problem = await trust.check(self.store, req.task_id, end)
        for stream, stream_end in list(trust.ends.items()):  # a re-run's origins
            if not problem and stream != req.task_id:
                problem = await trust.check(self.store, stream, stream_end)
        problem = problem or _digest_problem(step)
        if not problem:
            return None
        message = (
            f"journal_tampered: call #{req.seq} of task {req.task_id} would be decided on a"
            f" record the log cannot vouch for: {problem}"
        )[:2000]
        if not journal.failed:  # the first call to find it fails the task; the rest are told
            journal.failed = True
            journal.trust.tampered = journal.trust.tampered or problem
            log.error("%s", message)
            failed = ev.TaskFailed(reason="journal_tampered", error=message, attempts=req.attempt)
            await self._write(journal, req.task_id, [failed])
        return CallOutcome(error=message, error_type="journal_tampered")

    def _cost(self, answer: dict[str, Any], asked: str) -> float | None:
        """What an answer cost at the orchestrator's prices (the model that answered, else
        the one asked for); None without prices or a price."""
        if self.budgets is None:
            return None
        prices = self.budgets.prices
        tokens_in = _tokens(answer.get("input_tokens"))
        tokens_out = _tokens(answer.get("output_tokens"))
        for model in (str(answer.get("model") or ""), asked):
            cost = prices.cost(model, tokens_in, tokens_out) if model else None
            if cost is not None:
                return round(cost, 10)
        return None

    def _content(self, kind: str, value: Any) -> tuple[Any, int]:
        """What the log keeps of a prompt or an answer (whole, redacted, or nothing but
        its size), per the access policy; and its size in bytes."""
        size = len(_json(value))
        if self.policy.model_content == "digest" or size > self.policy.max_model_bytes:
            return None, size
        redact = self.policy.redact
        if redact is None:
            return value, size
        try:
            return redact(kind, value), size
        except Exception:  # a broken hook must not leak what it was meant to hide
            log.exception("redaction hook failed on %s: recorded as digest only", kind)
            return None, size

    # -- tool calls ---------------------------------------------------------------------

    async def tool(self, req: AgentRequest) -> CallOutcome:
        """A registry tool call: answered from the journal, or made live and recorded; a
        call its tool's review policy holds waits for a person's word first (``reviews``)."""
        tool = self.tools.get(req.target)
        reviewed = ""  # the call digest of the proposal a person answered
        if tool is not None and held_for_review(tool, req.args):
            reviewed = call_digest(req.target, _sha(_json(req.args)))
            args, held = await self._reviewed(req, req.args, tool.spec.input_schema)
            if held is not None:
                return held
            req = msgspec.structs.replace(req, args=args)
        arg_digest = _sha(_json(req.args))

        async def live(journal: _TaskJournal | None, key: str) -> CallOutcome:
            return await self._tool_live(req, journal, arg_digest, key)

        idempotent = tool is not None and tool.spec.idempotent
        return await self._tool_step(req, req.args, idempotent, live, lambda r: r, reviewed)

    async def _reviewed(
        self, req: AgentRequest, args: dict[str, Any], schema: dict[str, Any]
    ) -> tuple[dict[str, Any], CallOutcome | None]:
        """A call held for review: the arguments it runs with (a person's edit, or those
        proposed), or the outcome that answers it instead (it waits; it was refused)."""
        if not req.execution or req.seq < 0:  # not journaled (an old agent): nothing to hold
            return args, None
        journal = await self._journal(req.task_id, req.execution, req.attempt)
        call = call_digest(req.target, _sha(_json(args)))
        review = journal.reviews.get(call)
        if review is None or not review.decision:
            if review is None:  # asked once; a later attempt meets the same question
                asked = ev.ToolReviewRequested(
                    task_id=req.task_id,
                    agent_id=req.agent_id,
                    tool=req.target,
                    call=call,
                    arguments=args,
                    schema=schema,
                    text=journal.proposing_text(req.execution, req.seq),
                    attempt=req.attempt,
                    execution=req.execution,
                    seq=req.seq,
                )
                await self._write(journal, req.task_id, [asked])
            message = (
                f"{req.target} (call {call[:12]}) waits for a person's review: cardbus"
                f" review {req.task_id} approve | edit --args JSON | refuse --reason TEXT"
            )
            return args, CallOutcome(error=message, error_type="tool_review")
        if review.decision == "refuse":  # the model's to act on, as a tool's answer
            held_at = next(
                (
                    st
                    for r in journal.executions.values()
                    for st in r.steps.values()
                    if st.held and st.digest == call
                ),
                None,
            )
            if held_at is not None:  # its place in this execution too (nothing ran)
                run = journal.executions[req.execution]
                run.steps.setdefault(req.seq, held_at)
            why = f"a person ({review.by}) refused this call: {review.reason}"
            return args, CallOutcome(error=why, error_type="tool_error")
        edited = review.runs_with
        return (edited if isinstance(edited, dict) else args), None

    async def tool_begin(self, req: AgentRequest) -> CallOutcome:
        """A tool the agent runs itself (``ctx.journal.tool_call``), before it runs: the
        recorded result (``{"replay": result}``), or ``{"key": key}`` once its
        ``tool.requested`` is durable (the agent then runs it and sends ``tool.end``)."""
        args = req.args.get("arguments")
        if not isinstance(args, dict) or req.seq < 0 or not req.execution:
            raise BadJournalRequest("tool.begin needs arguments (an object), seq and execution")
        proposed = args
        reviewed = ""
        if req.args.get("review") is True:  # the worker's tool's policy holds the call
            reviewed = call_digest(req.target, _sha(_json(args)))
            schema = req.args.get("schema")
            args, held = await self._reviewed(req, args, schema if isinstance(schema, dict) else {})
            if held is not None:
                return held
        arg_digest = _sha(_json(args))
        edited = {"arguments": args} if args is not proposed else {}

        async def begin(journal: _TaskJournal | None, key: str) -> CallOutcome:
            requested = self._requested(req, args, arg_digest, key, local=True)
            ids = await self._write(journal, req.task_id, [requested])
            key = key or (ids[0] if ids else req.request_id)
            return CallOutcome(result={"key": key, **edited})

        def replayed(result: Any) -> Any:
            return {"replay": result}

        idempotent = req.args.get("idempotent") is True
        return await self._tool_step(req, args, idempotent, begin, replayed, reviewed)

    async def tool_end(self, req: AgentRequest) -> CallOutcome:
        """A tool the agent ran itself, after: its result or error, recorded."""
        a = req.args
        args = a.get("arguments")
        key = a.get("key")
        if not isinstance(args, dict) or not isinstance(key, str) or req.seq < 0:
            raise BadJournalRequest("tool.end needs arguments, key and seq")
        journal = await self._journal(req.task_id, req.execution, req.attempt)
        error = a.get("error")
        result = None if error is not None else a.get("result")
        size = 0 if error is not None else inline_size(result)
        duration = a.get("duration_s", 0.0)
        called = ev.ToolCalled(
            task_id=req.task_id,
            agent_id=req.agent_id,
            tool=req.target,
            arguments=args if inline_size(args) <= self.policy.max_inline_bytes else None,
            result=result if self.policy.arguments == "full" else None,
            error=None if error is None else str(error)[:2000],
            duration_s=round(float(duration), 6) if isinstance(duration, (int, float)) else 0.0,
            attempt=req.attempt,
            error_type=None if error is None else str(a.get("error_type") or "tool_error"),
            arguments_digest=_sha(_json(args)),
            result_digest="" if error is not None else _sha(_json(result)),
            result_bytes=size,
            request_id=req.request_id,
            execution=req.execution,
            seq=req.seq,
            idempotency_key=key,
            local=True,
        )
        await self._write(journal, req.task_id, [called])
        return CallOutcome(result={"recorded": True})

    async def _tool_step(
        self,
        req: AgentRequest,
        args: dict[str, Any],
        idempotent: bool,
        live: Callable[[_TaskJournal | None, str], Awaitable[CallOutcome]],
        replayed: Callable[[Any], Any],
        reviewed: str = "",
    ) -> CallOutcome:
        """A tool call at its place in the journal: replayed, made live (``live(journal,
        key)``, key "" for a new call), or, its effect unknown, repeated or refused.
        ``reviewed``: the call digest of the proposal a person approved (the arguments
        may be their edit)."""
        arg_digest = _sha(_json(args))
        if not req.execution or req.seq < 0:  # not journaled (an old agent): made live
            return await live(None, "")
        journal = await self._journal(req.task_id, req.execution, req.attempt)
        run = journal.executions[req.execution]
        ref = journal.reference(req.execution)
        if journal.strict:  # an offline re-run: answered from the origin, or refused
            digest = call_digest(req.target, arg_digest)
            return await self._tool_strict(req, journal, ref, digest, arg_digest, replayed)
        digest = call_digest(req.target, arg_digest)
        step = ref[req.seq] if run.aligned(req.seq) and req.seq < len(ref) else None
        if reviewed and step is not None and step.held and step.digest == reviewed:
            # the held call met at its place, approved: made now, keyed by its review (not
            # a difference: nothing ran there, and its siblings of the turn still replay)
            return await live(journal, step.requested_id)
        if step is not None and (untrusted := await self._untrusted(req, journal, step)):
            return untrusted  # replayed, repeated or asked about: decided on the record
        if (
            step is None
            or step.kind != "tool"
            or step.digest != digest
            or (step.answered_id and step.error is not None)  # a failed call is asked again
        ):
            run.differs(req.seq)  # a difference: live from here
            # after it, a call an earlier execution recorded keeps its key (never repeated
            # silently); with replay off, every call is made fresh
            known = (
                journal.recorded_call(req.execution, req.agent_id, digest)
                if self.replay_allowed(req.task_id)
                else None
            )
            if known is None:
                return await live(journal, "")
            step = known
            if untrusted := await self._untrusted(req, journal, step):
                return untrusted  # its key and result are taken from the record: vouched
        elif step.answered_id and step.has_answer and not step.repeat_ok:
            replay = _replayed_tool_call(req, step, arg_digest)
            await self._write(journal, req.task_id, [replay])
            return CallOutcome(result=replayed(step.answer))
        # requested and never answered (or its result not kept): its effect is unknown;
        # or recorded by an earlier execution and met again after a first difference
        reason = "after_difference" if step.answered_id and step.has_answer else "no_result"
        decision = "repeat" if idempotent or step.repeat_ok else "ask"
        unknown = ev.ToolEffectUnknown(
            task_id=req.task_id,
            agent_id=req.agent_id,
            tool=req.target,
            requested_event_id=step.requested_id,
            idempotency_key=step.key,
            attempt=req.attempt,
            execution=req.execution,
            seq=req.seq,
            decision=decision,
            reason=reason,
        )
        await self._write(journal, req.task_id, [unknown])
        if decision == "repeat":
            return await live(journal, step.key)
        why = (
            "an earlier attempt made this call (the same arguments) and this one differs before it"
            if reason == "after_difference"
            else "the process died during it"
        )
        message = (
            f"the effect of {req.target} (call {step.requested_id}, key {step.key}) is unknown:"
            f" {why} and the tool is not idempotent; approve the task to call it again with"
            " that key, record it as done with its result (cardbus approve TASK --done"
            " --result JSON), or deny it"
        )
        return CallOutcome(error=message, error_type="effect_unknown")

    async def _tool_strict(
        self,
        req: AgentRequest,
        journal: _TaskJournal,
        ref: list[_Step],
        digest: str,
        arg_digest: str,
        replayed: Callable[[Any], Any],
    ) -> CallOutcome:
        """A tool call of a strict re-run: the recorded result (or error), else refused."""
        step = ref[req.seq] if req.seq < len(ref) else None
        if step is not None and (untrusted := await self._untrusted(req, journal, step)):
            return untrusted
        answered = step is not None and bool(step.answered_id)
        if step is None or step.kind != "tool" or step.digest != digest or not answered:
            return _diverged(req, journal, ref, "tool", digest, req.args)
        if step.error is None and not step.has_answer:
            return _diverged(req, journal, ref, "tool", digest, req.args)
        result = None if step.error is not None else step.answer
        await self._write(journal, req.task_id, [_replayed_tool_call(req, step, arg_digest)])
        if step.error is not None:
            return CallOutcome(error=step.error, error_type=step.error_type)
        return CallOutcome(result=replayed(result))

    def _requested(
        self, req: AgentRequest, args: dict[str, Any], arg_digest: str, key: str, local: bool
    ) -> ev.ToolRequested:
        policy = self.policy
        inline = policy.arguments == "full" and inline_size(args) <= policy.max_inline_bytes
        return ev.ToolRequested(
            task_id=req.task_id,
            agent_id=req.agent_id,
            tool=req.target,
            request_id=req.request_id,
            arguments=args if inline else None,
            arguments_digest=arg_digest,
            attempt=req.attempt,
            execution=req.execution,
            seq=req.seq,
            idempotency_key=key,
            local=local,
        )

    async def _tool_live(
        self, req: AgentRequest, journal: _TaskJournal | None, arg_digest: str, key: str
    ) -> CallOutcome:
        start = time.monotonic()
        args = req.args
        policy = self.policy
        inline_args = policy.arguments == "full" and inline_size(args) <= policy.max_inline_bytes
        # invariant 2: the call is in the log before its side effect can happen
        requested = self._requested(req, args, arg_digest, key, local=False)
        ids = await self._write(journal, req.task_id, [requested])
        key = key or (ids[0] if ids else req.request_id)
        result: Any = None
        error: str | None = None
        error_type: str | None = None
        extra: list[ev.Event] = []
        try:
            outcome = await self.tools.call(req.target, args, idempotency_key=key)
            result = outcome.result
        except AccessDenied as e:  # the tool's own allow-list (e.g. a host)
            error, error_type = str(e), "access_denied"
            extra.append(
                ev.AccessRefused(
                    task_id=req.task_id,
                    agent_id=req.agent_id,
                    action="tool",
                    target=req.target,
                    reason=str(e),
                    attempt=req.attempt,
                )
            )
        except ToolError as e:
            error, error_type = str(e), e.error_type
        size = 0 if error else inline_size(result)
        tool = self.tools.get(req.target)
        # a result is kept whole up to the tool's own size limit (its journal replays it)
        keep = policy.arguments == "full" and size <= max(
            policy.max_inline_bytes, tool.spec.max_result_bytes if tool else 0
        )
        called = ev.ToolCalled(
            task_id=req.task_id,
            agent_id=req.agent_id,
            tool=req.target,
            arguments=args if inline_args else None,
            result=result if keep else None,
            error=error,
            duration_s=round(time.monotonic() - start, 6),
            attempt=req.attempt,
            error_type=error_type,
            arguments_digest=arg_digest,
            result_digest="" if error else _sha(_json(result)),
            result_bytes=size,
            request_id=req.request_id,
            execution=req.execution,
            seq=req.seq,
            idempotency_key=key,
        )
        await self._write(journal, req.task_id, [called, *extra])
        if error is not None:
            return CallOutcome(error=error, error_type=error_type)
        return CallOutcome(result=result)


def _diverged(
    req: AgentRequest,
    journal: _TaskJournal,
    ref: list[_Step],
    kind: str,
    digest: str,
    asked: Any,
) -> CallOutcome:
    """Refuse a call of a strict re-run that the recorded run did not make (``replay_diverged``),
    saying which call, why, and the difference from the recorded request."""
    from cardbus.projections.diff import request_diff as _unified

    what = f"{kind} call #{req.seq}" + (f" ({req.target})" if req.target else "")
    head = f"task {req.task_id} (a re-run of {journal.origin or 'nothing recorded'}): {what}"
    step = ref[req.seq] if req.seq < len(ref) else None
    if step is None:
        why = f"the recorded run made {len(ref)} call(s) in this task, no call #{req.seq}"
        diff = _unified(None, asked)
    elif step.kind != kind:
        why = f"the recorded call #{req.seq} was a {step.kind} call" + (
            f" ({step.tool})" if step.tool else ""
        )
        diff = _unified(None, asked)
    elif step.digest != digest:
        why = "the request differs from the recorded one"
        if step.request is None:
            why += " (the recorded request was kept as a digest only)"
        diff = _unified(step.request, asked)
    elif step.error is not None:
        why = f"the recorded call failed ({step.error_type}: {step.error}), nothing to replay"
        diff = []
    else:
        why = "the recorded call has no answer the log kept, nothing to replay"
        diff = []
    message = "\n".join([f"{head}: {why}", *diff])
    return CallOutcome(error=message, error_type="replay_diverged")


def _digest_problem(step: _Step) -> str:
    """What is wrong with a recorded answer's content against its digest ("" nothing; a
    redacted answer, or one recorded with no digest, has nothing to check against)."""
    if not step.has_answer or step.redacted or not step.content_digest:
        return ""
    if _sha(_json(step.answer)) == step.content_digest:
        return ""
    what = "answer" if step.kind == "model" else "result"
    return (
        f"stream {step.stream} position {step.position}: the {what} does not match its"
        " digest (edited)"
    )


def _release(budgets: Budgets, key: str, future: asyncio.Future[Any]) -> None:
    budgets.release(key)


def _replayed_tool_call(req: AgentRequest, step: _Step, arg_digest: str) -> ev.ToolCalled:
    """The ``tool.called`` of a call answered from the journal: it names the call it
    replays and carries its result's digest and size (or its error), not the result."""
    data = b"" if step.error is not None else _json(step.answer)
    return ev.ToolCalled(
        task_id=req.task_id,
        agent_id=req.agent_id,
        tool=req.target,
        attempt=req.attempt,
        arguments_digest=arg_digest,
        result_digest=_sha(data) if data else "",
        result_bytes=len(data),
        error=step.error,
        error_type=step.error_type,
        request_id=req.request_id,
        execution=req.execution,
        seq=req.seq,
        idempotency_key=step.key,
        replayed_from=step.answered_id,
    )


def _retrieve(future: asyncio.Future[Any]) -> None:
    """A write nobody awaited (its answer never came: the agent died) logs its error."""
    if not future.cancelled() and future.exception() is not None:
        log.warning("a model.requested was not recorded: %r", future.exception())


def inline_size(value: Any) -> int:
    """The size of ``value`` as JSON (huge when it cannot be encoded: never inline)."""
    try:
        return len(msgspec.json.encode(value))
    except Exception:
        return 1 << 62


def _tokens(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _seconds(value: Any) -> float:
    """A non-negative number of seconds from an agent's request (anything else: 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return 0.0
    return round(max(0.0, float(value)), 6)
