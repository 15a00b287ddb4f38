"""Replay: the timeline of a task (or a whole run) and all its subtasks, from the log alone.

:func:`replay` reads the events of the task's root (``read_correlation``),
links tasks to parents with ``TaskCreated.parent_id`` and folds each task's
events into a :class:`TaskNode`: its steps (time, duration until the task's
next step, agent, attempt, status after the step, and the reason of every
rejection, retry, time-out, failure, halt, cancellation and revision) and its
attempt spans (dispatch to outcome, one per agent per attempt) for a Gantt
chart. :func:`build_timeline` is the pure part, from a list of envelopes.

Given a root id, the timeline holds every task of the run plus the run's own
events (``run.*``, ``plan.*``); given a task id, that task and its subtasks. A
child run (``bus.orchestrator.child_runs``) is read with its parent
(``projections.lineage``): its tasks are beneath the task that started it, its
own ``run.*`` events among that task's steps.
A run planned from a goal also lists its planning rounds (:class:`PlanRound`:
the planning task, who proposed, the tasks proposed, refused with the errors
or accepted), so the timeline shows how the plan came to be.

What an attempt did inside (the journal, ``bus.orchestrator.journal``) is on
its span: ``AttemptSpan.calls`` lists, in order, each model call
(:class:`ModelCall`: the model, tokens, latency, the prompt and the answer as
the log keeps them), each tool call (:class:`ToolCall`: arguments, result or
error, idempotency key) and each unknown effect (:class:`EffectUnknown`, with
its decision). A call answered from the journal names the event it replays
(``replayed_from``); its prompt, arguments, answer or result are that event's
(always in the same task stream), its tokens 0: nothing was spent again.
:func:`journal_calls` builds them from one task's events.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec

from cardbus.eventstore import events as ev
from cardbus.eventstore.envelope import Envelope
from cardbus.eventstore.errors import IllegalTransition, StreamNotFound
from cardbus.eventstore.states import TaskState, transition
from cardbus.eventstore.store import EventStore
from cardbus.projections.lineage import read_tree
from cardbus.projections.tasks import event_reason
from cardbus.projections.timetravel import AsOf

__all__ = [
    "AttemptSpan",
    "Call",
    "EffectUnknown",
    "ModelCall",
    "PlanRound",
    "Step",
    "TaskNode",
    "Timeline",
    "ToolCall",
    "answer_excerpt",
    "build_timeline",
    "journal_calls",
    "one_line",
    "prompt_excerpt",
    "replay",
    "worded_inputs",
]

_STATE = {s.value: s for s in TaskState}
_TASK_TYPES = frozenset(ev.TASK_EVENT_TYPES)


class Step(msgspec.Struct, kw_only=True):
    """One event of a task (or of the run), as the timeline shows it."""

    position: int
    event_id: str
    time: float
    at: str  # ISO 8601, UTC
    type: str
    kind: str  # the tag without "task." and ".v1": "dispatched", "rejected", ...
    actor: str = ""
    attempt: int | None = None
    agent_id: str | None = None
    status: str | None = None  # the task's status after this step
    reason: str | None = None
    detail: str | None = None
    duration_s: float | None = None  # until the next step of the same task
    payload: Any = None  # what the step carried: inputs, an output, tool arguments/result, ...


class ModelCall(msgspec.Struct, kw_only=True, tag="model", tag_field="kind"):
    """One model call of an attempt (``model.requested`` .. ``model.answered``)."""

    position: int  # of its first event
    seq: int
    execution: str = ""
    attempt: int = 0
    agent_id: str = ""
    model: str = ""  # the model asked for
    provider: str = ""  # gen_ai.provider.name of the client that asked ("" if not recorded)
    response_model: str = ""  # the model that answered
    start: float
    end: float | None = None  # None: no answer recorded (the process died during the call)
    latency_s: float = 0.0
    input_tokens: int = 0  # spent by this call: 0 when replayed
    output_tokens: int = 0
    status: str = "open"  # answered | failed | replayed | open
    replayed_from: str | None = None  # the model.answered whose answer this is (no call made)
    prompt: Any = None  # the request as the log keeps it (None: only its digest)
    answer: Any = None  # the completion as the log keeps it
    request_digest: str = ""
    request_bytes: int = 0
    tools_offered: list[str] = []
    error: str | None = None
    error_type: str | None = None
    requested_event_id: str = ""
    answered_event_id: str = ""
    cost_usd: float | None = None  # as priced when recorded (None: unknown, or not live)
    # waiting for the provider's limit before it was sent (``model.queued``): queued,
    # not running; ``queued_s`` is of ``latency_s`` (the slot's wait, when it came)
    queued: bool = False
    queued_s: float = 0.0


class ToolCall(msgspec.Struct, kw_only=True, tag="tool", tag_field="kind"):
    """One tool call of an attempt (``tool.requested`` .. ``tool.called``)."""

    position: int
    seq: int = -1  # -1: not journaled (a log from before the journal)
    execution: str = ""
    attempt: int = 0
    agent_id: str = ""
    tool: str
    start: float
    end: float | None = None  # None: no result recorded
    duration_s: float = 0.0
    status: str = "open"  # ok | failed | replayed | open | unknown (named by an unknown effect)
    replayed_from: str | None = None  # the tool.called whose result this is (the tool did not run)
    idempotency_key: str = ""
    arguments: Any = None  # as the log keeps them (None: only their digest)
    result: Any = None
    error: str | None = None
    error_type: str | None = None
    arguments_digest: str = ""
    result_bytes: int = 0
    requested_event_id: str = ""
    called_event_id: str = ""
    recorded_by: str = ""  # an operator recorded it as done (its result theirs): who


class EffectUnknown(msgspec.Struct, kw_only=True, tag="effect_unknown", tag_field="kind"):
    """A tool call of an earlier attempt left without a result (``reason`` ``no_result``),
    or met again after a first difference (``after_difference``): repeated or asked about."""

    position: int
    seq: int = 0
    execution: str = ""
    attempt: int = 0
    agent_id: str = ""
    tool: str
    time: float
    decision: str = "ask"
    idempotency_key: str = ""
    requested_event_id: str = ""  # the tool.requested whose effect is unknown
    event_id: str = ""
    reason: str = "no_result"


Call = ModelCall | ToolCall | EffectUnknown


class AttemptSpan(msgspec.Struct, kw_only=True):
    """One attempt of one agent: from dispatch to its outcome (``end`` None while open)."""

    attempt: int
    agent_id: str
    start: float
    end: float | None = None
    outcome: str = "open"
    reason: str | None = None
    latency_s: float | None = None  # dispatch -> result submitted
    queued_s: float | None = None  # waiting to be dispatched: created/pending -> dispatched
    started: float | None = None  # task.started (None if the agent never said)
    run_s: float | None = None  # started -> result submitted: the agent's own time
    input_tokens: int = 0
    output_tokens: int = 0
    model: str | None = None  # the model that answered, when the result names one
    output: Any = None  # the result this attempt submitted
    received: Any = None  # the inputs the agent was sent ($dep resolved, trimmed), if kept
    replica: str | None = None  # who ran it: the worker process that answered (or started)
    deliveries: int = 1  # the card's delivery count at the end (2 or more: redelivered)
    calls: list[Call] = []  # its model calls, tool calls and unknown effects, in order


class TaskNode(msgspec.Struct, kw_only=True):
    task_id: str
    parent_id: str | None = None
    capability: str | None = None
    goal: str = ""
    status: str | None = None
    agent_id: str | None = None
    role: str = ""  # "" for a plan task, "review" or "supplement" for one the orchestrator added
    inputs: Any = None  # the task's own inputs (dependencies' outputs are not in the log)
    deps: list[str] = []
    output: Any = None  # the accepted output
    quality_met: bool = True  # False: completed with its review not passed
    open_issues: list[ev.ReviewIssue] = []  # what that review left open
    attempts: int = 0
    reason: str | None = None
    start: float = 0.0
    end: float = 0.0
    duration_s: float = 0.0
    steps: list[Step] = []
    spans: list[AttemptSpan] = []
    calls: list[Call] = []  # calls no attempt of the timeline claims (e.g. cut by --as-of)
    children: list[TaskNode] = []


class PlanRound(msgspec.Struct, kw_only=True):
    """One planning round of a goal run: a proposal and what became of it."""

    round: int
    planner_task_id: str
    agent_id: str = ""
    tasks: list[str] = []  # the proposed tasks, "id (capability)"
    # the inputs whose values are the goal's own words: plan task id -> input names
    from_goal: dict[str, list[str]] = {}
    outcome: str = "proposed"  # "refused" | "accepted" (or "proposed" while undecided)
    errors: list[str] = []
    time: float = 0.0


class Timeline(msgspec.Struct, kw_only=True):
    id: str  # what was asked for: a task id or a root id
    root_id: str
    as_of: str | None = None
    start: float = 0.0
    end: float = 0.0
    duration_s: float = 0.0
    events: int = 0
    run: list[Step] = []  # the run's own events (run.*, plan.*), when replaying a root
    tasks: list[TaskNode] = []
    planning: list[PlanRound] = []  # a goal run's planning rounds, in order

    def walk(self) -> list[tuple[int, TaskNode]]:
        """Every task node with its depth, parents before children."""
        out: list[tuple[int, TaskNode]] = []

        def visit(n: TaskNode, depth: int) -> None:
            out.append((depth, n))
            for c in n.children:
                visit(c, depth + 1)

        for t in self.tasks:
            visit(t, 0)
        return out


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _kind(tag: str) -> str:
    head, _, rest = tag.partition(".")
    name = rest.rsplit(".", 1)[0] if rest else head
    return name if head == "task" else f"{head}.{name}"


def _args(arguments: Any) -> str:
    """A tool call's arguments on one line (proposed and edited, side by side)."""
    return json.dumps(arguments, ensure_ascii=False, sort_keys=True, default=str)


def _detail(data: Any) -> str | None:
    match data:
        case ev.TaskCreated():
            d = f"capability {data.capability}"
            if data.goal:
                d += f": {data.goal}"
            return d
        case ev.TaskDispatched():
            d = f"to {data.agent_id}"
            if data.score:
                d += f" (score {data.score:.2f})"
            return d
        case ev.ChildRunStarted():
            return (
                f"child run {data.child_root} (attempt {data.attempt}; on parent close:"
                f" {data.parent_close})"
            )
        case ev.TaskStarted():
            d = "implied by the answer" if data.implied else ""
            return ", ".join(x for x in (d, _who(data)) if x) or None
        case ev.TaskRedelivered():
            return f"delivery {data.delivery}, now {_who(data) or 'another replica'}"
        case ev.TaskResultSubmitted():
            u = data.usage
            d = f"result {data.status}, {u.input_tokens}+{u.output_tokens} tokens"
            d += f", ran {data.duration_s * 1000:.0f}ms" if data.duration_s else ""
            return d + (f", {_who(data)}" if _who(data) else "")
        case ev.TaskCompleted() if data.reused is not None:
            r = data.reused
            origin = f"task {r.source_task_id}" if r.source_task_id else "memory"
            return (
                f"reused from long-term memory ({r.scope}, {r.key}): {origin} of run"
                f" {r.source_root_id or '?'} by {r.agent_id or '?'}, {r.age_s:.0f}s old"
            )
        case ev.TaskCompleted() if data.reused_from:
            return f"reused from {data.reused_from}"
        case ev.TaskCompleted() if not data.quality_met:
            return f"quality not met: {len(data.open_issues)} open issue(s)"
        case ev.RunResumed():
            d = f"resumed by orchestrator {data.orchestrator_id}"
            d += f" on {data.host} (pid {data.pid})" if data.host else ""
            return d + (f"; lost: {', '.join(data.lost_attempts)}" if data.lost_attempts else "")
        case ev.InputProvided():
            return f"input from {data.supplementary_task_id}"
        case ev.ApprovalGranted():
            return f"approved by {data.by}"
        case ev.WaitExpired(action="escalate"):
            who = ", ".join(data.approvers) + (f" (group {data.group})" if data.group else "")
            return f"{data.kind} deadline passed (step {data.step}): escalated to {who}"
        case ev.WaitExpired():
            return f"{data.kind} deadline passed (step {data.step}): {data.action}"
        case ev.RunPaused():
            return f"paused: {data.reason}: {data.detail} (task {data.task_id})"
        case ev.RunPauseAnswered():
            changed = f", inputs {_args(data.inputs)}" if data.inputs else ""
            note = f": {data.note}" if data.note else ""
            return f"pause answered: {data.decision} by {data.by}{changed}{note}"
        case ev.ToolRequested():
            return f"tool {data.tool} requested" + (f" (call {data.seq})" if data.seq >= 0 else "")
        case ev.ToolCalled() if data.replayed_from:
            return f"tool {data.tool} replayed from {data.replayed_from}"
        case ev.ToolCalled() if data.recorded_by:  # an operator's word, not the tool's
            return f"tool {data.tool} recorded as done by {data.recorded_by} (call {data.seq})"
        case ev.ToolCalled():
            return f"tool {data.tool}" + (f" failed: {data.error}" if data.error else "")
        case ev.ModelRequested():
            return f"model {data.model or '?'} asked (call {data.seq})"
        case ev.ModelAnswered() if data.replayed_from:
            return f"model {data.model or '?'} replayed from {data.replayed_from} (call {data.seq})"
        case ev.ModelAnswered() if data.error is not None:
            return f"model {data.model or '?'} failed: {data.error_type or data.error}"
        case ev.ModelAnswered():
            return (
                f"model {data.model or '?'} answered (call {data.seq}),"
                f" {data.input_tokens}+{data.output_tokens} tokens,"
                f" {data.latency_s * 1000:.0f}ms"
                + (f" (of which {data.queued_s:.2f}s queued)" if data.queued_s > 0 else "")
            )
        case ev.ModelQueued():
            return f"queued for the model's limit: {data.limit or data.model} (call {data.seq})"
        case ev.ModelSlotGranted():
            return f"slot of the model's limit after {data.waited_s:.2f}s queued (call {data.seq})"
        case ev.ToolEffectUnknown():
            return (
                f"tool {data.tool}: effect unknown (call {data.requested_event_id},"
                f" key {data.idempotency_key}): {data.decision}"
                + (" (made by an earlier attempt)" if data.reason == "after_difference" else "")
            )
        case ev.ToolReviewRequested():
            said = f"; the model said: {data.text}" if data.text else ""
            return f"tool {data.tool} held for review: proposed {_args(data.arguments)}{said}"
        case ev.ToolReviewAnswered() if data.decision == "edit":
            return (
                f"tool {data.tool} review: edit by {data.by}: proposed {_args(data.proposed)},"
                f" approved {_args(data.arguments)}"
            )
        case ev.ToolReviewAnswered():
            why = f": {data.reason}" if data.reason else ""
            return f"tool {data.tool} review: {data.decision} by {data.by}{why}"
        case ev.QuestionAnswered(door="deadline"):  # by the wait's policy, not a person
            given = _args(data.answer)
            return f"question answered by its deadline ({data.by}): {given} (the default)"
        case ev.QuestionAnswered():
            how = " (the default)" if data.defaulted else ""
            door = f" from the {data.door}" if data.door else ""
            return f"question answered by {data.by}{door}: {_args(data.answer)}{how}"
        case ev.RunStarted():
            d = f"goal: {data.goal}"
            if data.user or data.tenant:
                who = "/".join(x for x in (data.tenant, data.user) if x)
                d += f" (for {who})"
            if data.planning is not None:
                d += " (to plan)"
            if data.parent_root is not None:  # a child run: whose task started it
                d += (
                    f" (child of {data.parent_root}, task {data.parent_task}"
                    f" attempt {data.parent_attempt}; on parent close: {data.parent_close})"
                )
            return d + (f" (forked from {data.forked_from})" if data.forked_from else "")
        case ev.PlanProposed():
            d = f"round {data.round} by {data.agent_id or '?'}: {_proposed(data.proposal)}"
            return d + worded_inputs(data.from_goal)
        case ev.PlanAccepted():
            d = f"round {data.round}: {len(data.task_ids)} tasks created"
            return d + (f", {len(data.superseded)} superseded" if data.superseded else "")
        case ev.RunFailed() if data.detail:
            return data.detail
        case ev.RunCompleted() if data.degraded:
            return data.detail or None
    return None


def _who(data: Any) -> str:
    """Who ran an attempt, as a step shows it: "by <replica> (delivery n)"."""
    if not data.replica_id:
        return "" if data.delivery <= 1 else f"delivery {data.delivery}"
    d = f"by {data.replica_id}"
    return d + (f" (delivery {data.delivery})" if data.delivery > 1 else "")


def worded_inputs(from_goal: dict[str, list[str]]) -> str:
    """The inputs a proposal took from the goal's words, as a step says them ("" for none):
    "; taken from the goal: translate.text"."""
    names = [f"{task}.{name}" for task, inputs in from_goal.items() for name in inputs]
    return f"; taken from the goal: {', '.join(names)}" if names else ""


def _proposed(proposal: Any) -> str:
    """The tasks of a proposal as "a (cap) -> b (cap)", or what it was instead."""
    tasks = proposal.get("tasks") if isinstance(proposal, dict) else None
    if not isinstance(tasks, list):
        return "not a plan"
    names = [
        f"{t.get('id')} ({t.get('capability')})" if isinstance(t, dict) else "?" for t in tasks
    ]
    shown = " -> ".join(names[:8])
    return shown + (f" and {len(names) - 8} more" if len(names) > 8 else "") or "no tasks"


def _reason(data: Any) -> str | None:
    if isinstance(data, ev.PlanRefused):
        return f"refused (round {data.round}): " + "; ".join(data.errors)
    if isinstance(data, ev.RunFailed) and data.detail:
        return f"{data.reason}: {data.detail}"
    if isinstance(data, ev.RunCompleted) and data.degraded:  # without optional tasks' outputs
        return f"degraded: without {', '.join(data.degraded)}"
    return event_reason(data)


def _step(env: Envelope) -> Step:
    data = env.data
    tag = env.type
    reason = _reason(data)
    if isinstance(data, ev.TaskCancelled) and env.actor:
        reason = f"{reason} (by {env.actor})"  # an operator's action: who did it
    return Step(
        position=env.position,
        event_id=env.event_id,
        time=env.recorded_at,
        at=_iso(env.recorded_at),
        type=tag,
        kind=_kind(tag),
        actor=env.actor,
        attempt=getattr(data, "attempt", None),
        agent_id=getattr(data, "agent_id", None),
        reason=reason,
        detail=_detail(data),
        payload=_payload(data),
    )


def _payload(data: Any) -> Any:
    """The data a step carried, for the collapsed detail of replay --json and the HTML."""
    match data:
        case ev.TaskCreated():
            return {"inputs": data.inputs, "deps": list(data.deps)}
        case ev.TaskDispatched() if data.inputs_digest:
            # what the agent received ($dep resolved, trimmed); None when too big to keep
            return {
                "received": data.inputs,
                "inputs_digest": data.inputs_digest,
                "inputs_bytes": data.inputs_bytes,
            }
        case ev.TaskResultSubmitted():
            return {"status": data.status, "output": data.output, "error": data.error}
        case ev.TaskCompleted() if not data.quality_met:
            issues = msgspec.to_builtins(data.open_issues)
            return {"output": data.output, "quality_met": False, "open_issues": issues}
        case ev.TaskCompleted() | ev.InputProvided():
            return {"output": data.output}
        case ev.ApprovalRequested() if data.proposed_output is not None:
            return {"proposed_output": data.proposed_output}
        case ev.RevisionRequested():
            issues = msgspec.to_builtins(data.issues)
            return {
                "round": data.round,
                "reviewer_task_id": data.reviewer_task_id,
                "issues": issues,
            }
        case ev.QuestionAnswered():
            return {"answer": data.answer, "by": data.by, "door": data.door}
        case ev.ToolRequested():
            return {"arguments": data.arguments}
        case ev.ToolCalled():
            return {"arguments": data.arguments, "result": data.result, "error": data.error}
        case ev.ModelRequested():
            return {"request": data.request}
        case ev.ModelAnswered() if data.replayed_from is None:
            return {"answer": data.answer, "error": data.error}
    return None


# -- the journal: what an attempt asked models and tools ------------------------------


def _tokens(n: int) -> int:
    return n if isinstance(n, int) and n > 0 else 0


def journal_calls(events: Sequence[Envelope]) -> list[Call]:
    """The model calls, tool calls and unknown effects of one task's events, in order.

    A live call pairs its request and its answer (by execution and ``seq``); a
    replayed one takes its prompt, arguments, answer or result from the event
    it names (``replayed_from``), which comes before it in the same stream.
    """
    fold = JournalFold()
    for env in events:
        fold.apply(env)
    return fold.calls


class JournalFold:
    """:func:`journal_calls` one event at a time (live tracing follows the log with it)."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.models: dict[tuple[str, int], ModelCall] = {}  # open, by (execution, seq)
        self.by_answer: dict[str, ModelCall] = {}  # model.answered event id -> its call
        self.tools: dict[tuple[str, Any], ToolCall] = {}  # open tool calls
        self.by_called: dict[str, ToolCall] = {}  # tool.called event id -> its call
        self.by_requested: dict[str, ToolCall] = {}  # tool.requested event id -> its call

    def apply(self, env: Envelope) -> Call | None:
        """Fold one event; the call it opened, answered or is (None: not a journal event)."""
        data, t = env.data, env.recorded_at
        match data:
            case ev.ModelRequested():
                call = ModelCall(
                    position=env.position,
                    seq=data.seq,
                    execution=data.execution,
                    attempt=data.attempt,
                    agent_id=data.agent_id,
                    model=data.model,
                    provider=data.provider,
                    start=t,
                    prompt=data.request,
                    request_digest=data.request_digest,
                    request_bytes=data.request_bytes,
                    tools_offered=list(data.tools_offered),
                    requested_event_id=env.event_id,
                )
                self.models[(data.execution, data.seq)] = call
                self.calls.append(call)
                return call
            case ev.ModelAnswered():
                found = self.models.pop((data.execution, data.seq), None)
                if found is None or data.replayed_from is not None:
                    found = ModelCall(
                        position=env.position,
                        seq=data.seq,
                        execution=data.execution,
                        attempt=data.attempt,
                        agent_id=data.agent_id,
                        model=data.model,
                        start=t,
                        request_digest=data.request_digest,
                    )
                    self.calls.append(found)
                call = found
                call.end = t
                call.answered_event_id = env.event_id
                call.response_model = data.model
                call.latency_s = data.latency_s
                call.input_tokens = _tokens(data.input_tokens)
                call.output_tokens = _tokens(data.output_tokens)
                call.error, call.error_type = data.error, data.error_type
                call.queued, call.queued_s = False, data.queued_s or call.queued_s
                if data.replayed_from is not None:
                    call.status, call.replayed_from = "replayed", data.replayed_from
                    source = self.by_answer.get(data.replayed_from)
                    if source is not None:
                        call.model = source.model or call.model
                        call.provider = source.provider or call.provider
                        call.prompt, call.answer = source.prompt, source.answer
                        call.request_bytes = source.request_bytes
                        call.tools_offered = list(source.tools_offered)
                        call.error, call.error_type = source.error, source.error_type
                else:
                    call.answer = data.answer
                    call.status = "answered" if data.error is None else "failed"
                    call.cost_usd = data.cost_usd
                self.by_answer[env.event_id] = call
                return call
            case ev.ModelQueued() | ev.ModelSlotGranted():
                waiting = self.models.get((data.execution, data.seq))
                if waiting is None:
                    return None
                waiting.queued = isinstance(data, ev.ModelQueued)
                if isinstance(data, ev.ModelSlotGranted):
                    waiting.queued_s = data.waited_s
                return waiting
            case ev.ToolRequested():
                tool = ToolCall(
                    position=env.position,
                    seq=data.seq,
                    execution=data.execution,
                    attempt=data.attempt,
                    agent_id=data.agent_id,
                    tool=data.tool,
                    start=t,
                    # a first call's key is its tool.requested's id
                    idempotency_key=data.idempotency_key
                    or (env.event_id if data.execution else ""),
                    arguments=data.arguments,
                    arguments_digest=data.arguments_digest,
                    requested_event_id=env.event_id,
                )
                self.tools[_tool_key(data)] = tool
                self.by_requested[env.event_id] = tool
                self.calls.append(tool)
                return tool
            case ev.ToolCalled():
                open_call = self.tools.pop(_tool_key(data), None)
                if open_call is None or data.replayed_from is not None:
                    open_call = ToolCall(
                        position=env.position,
                        seq=data.seq,
                        execution=data.execution,
                        attempt=data.attempt,
                        agent_id=data.agent_id,
                        tool=data.tool,
                        start=t,
                        arguments=data.arguments,
                        arguments_digest=data.arguments_digest,
                    )
                    self.calls.append(open_call)
                tool = open_call
                tool.end = t
                tool.called_event_id = env.event_id
                tool.duration_s = data.duration_s
                tool.idempotency_key = data.idempotency_key or tool.idempotency_key
                tool.result_bytes = data.result_bytes
                tool.recorded_by = data.recorded_by
                if data.replayed_from is not None:
                    tool.status, tool.replayed_from = "replayed", data.replayed_from
                    done = self.by_called.get(data.replayed_from)
                    if done is not None:
                        tool.arguments = done.arguments
                        tool.result, tool.error = done.result, done.error
                        tool.error_type = done.error_type
                else:
                    tool.result, tool.error, tool.error_type = (
                        data.result,
                        data.error,
                        data.error_type,
                    )
                    tool.arguments = (
                        data.arguments if data.arguments is not None else tool.arguments
                    )
                    tool.status = "ok" if data.error is None else "failed"
                self.by_called[env.event_id] = tool
                return tool
            case ev.ToolEffectUnknown():
                named = self.by_requested.get(data.requested_event_id)
                if named is not None and named.status == "open":
                    named.status = "unknown"
                effect = EffectUnknown(
                    position=env.position,
                    seq=data.seq,
                    execution=data.execution,
                    attempt=data.attempt,
                    agent_id=data.agent_id,
                    tool=data.tool,
                    time=t,
                    decision=data.decision,
                    idempotency_key=data.idempotency_key,
                    requested_event_id=data.requested_event_id,
                    event_id=env.event_id,
                    reason=data.reason,
                )
                self.calls.append(effect)
                return effect
            case _:
                return None


def _tool_key(data: ev.ToolRequested | ev.ToolCalled) -> tuple[str, Any]:
    """How a tool call's result finds its request: by the journal's coordinates, or (a log
    from before the journal) by the request id."""
    if data.execution:
        return (data.execution, data.seq)
    return ("", data.request_id)


def _attach(node: TaskNode, calls: list[Call]) -> None:
    """Each call under the attempt span of its agent and attempt (else on the node)."""
    spans = {(s.attempt, s.agent_id): s for s in node.spans}
    for call in calls:
        span = spans.get((call.attempt, call.agent_id))
        (span.calls if span is not None else node.calls).append(call)


def one_line(value: Any, limit: int = 60) -> str:
    """``value`` (text, or as JSON) on one line of at most ``limit`` characters."""
    try:
        text = value if isinstance(value, str) else msgspec.json.encode(value).decode()
    except (TypeError, ValueError):
        text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def prompt_excerpt(call: ModelCall, limit: int = 60) -> str:
    """The prompt on one line: the last message's text (or the bare prompt)."""
    request = call.prompt
    if request is None:
        digest = call.request_digest[:12]
        return f"(not kept: sha256 {digest}, {call.request_bytes} bytes)"
    if isinstance(request, dict):
        messages = request.get("messages")
        if isinstance(messages, list) and messages:
            last = messages[-1]
            if isinstance(last, dict) and isinstance(last.get("content"), str):
                return one_line(last["content"], limit)
        if isinstance(request.get("prompt"), str):
            return one_line(request["prompt"], limit)
    return one_line(request, limit)


def answer_excerpt(call: ModelCall, limit: int = 60) -> str:
    """The answer on one line: its text, else the tools it called, else the error."""
    if call.error is not None:
        return one_line(f"error {call.error_type or ''}: {call.error}", limit)
    answer = call.answer
    if answer is None:
        return "(not kept)" if call.status != "open" else "(no answer recorded)"
    if isinstance(answer, dict):
        text = answer.get("text")
        if isinstance(text, str) and text:
            return one_line(text, limit)
        called = answer.get("tool_calls")
        if isinstance(called, list) and called:
            names = [
                str(c.get("name") or c.get("function", {}).get("name") or "?")
                for c in called
                if isinstance(c, dict)
            ]
            return one_line("tool calls: " + ", ".join(names), limit)
    return one_line(answer, limit)


_CLOSE_ALL = {
    ev.RevisionRequested: "revision",
    ev.TaskRetryScheduled: "retry",
    ev.TaskFailed: "failed",
    ev.TaskHalted: "halted",
    ev.TaskCancelled: "cancelled",
    ev.TaskNeedsInput: "needs_input",
    ev.ApprovalRequested: "awaiting_approval",
}


def _fold_task(task_id: str, events: list[Envelope]) -> TaskNode:
    node = TaskNode(task_id=task_id, steps=[], spans=[], calls=[], children=[])
    state: TaskState | None = None
    open_spans: dict[str, AttemptSpan] = {}
    pending_since: float | None = None  # when the task last became ready for dispatch
    for env in events:
        data = env.data
        step = _step(env)
        if type(data) in _TASK_TYPES:
            try:
                state = transition(state, data)
            except IllegalTransition as e:
                step.reason = f"illegal transition: {e}"
            step.status = state.value if state else None
        node.steps.append(step)
        if step.reason:
            node.reason = step.reason
        t = env.recorded_at
        match data:
            case ev.TaskCreated():
                node.parent_id = data.parent_id
                node.capability = data.capability
                node.goal = data.goal
                node.inputs, node.deps, node.role = data.inputs, list(data.deps), data.role
            case ev.TaskDispatched():
                node.attempts = max(node.attempts, data.attempt)
                node.agent_id = data.agent_id
                span = AttemptSpan(
                    attempt=data.attempt, agent_id=data.agent_id, start=t, received=data.inputs
                )
                if pending_since is not None:
                    span.queued_s = t - pending_since
                open_spans[data.agent_id] = span
                node.spans.append(span)
            case ev.ChildRunStarted():  # an attempt run by a child run, no agent
                node.attempts = max(node.attempts, data.attempt)
            case ev.TaskStarted() | ev.TaskRedelivered():
                s = open_spans.get(data.agent_id)
                if s is not None and s.started is None:
                    s.started = t
                if s is not None:
                    s.replica = data.replica_id or s.replica
                    s.deliveries = max(s.deliveries, data.delivery)
            case ev.TaskResultSubmitted():
                s = open_spans.get(data.agent_id)
                if s is not None:
                    s.replica = data.replica_id or s.replica
                    s.deliveries = max(s.deliveries, data.delivery)
                    if s.started is None:  # no Started came: the answer implies the start
                        s.started = t
                if s is not None and s.latency_s is None:
                    s.latency_s = t - s.start
                    s.run_s = None if s.started is None else t - s.started
                    s.input_tokens = data.usage.input_tokens
                    s.output_tokens = data.usage.output_tokens
                    s.model = getattr(data.usage, "model", None) or None
                    s.output = data.output
            case ev.TaskCompleted():
                node.agent_id = data.agent_id
                node.output = data.output
                node.reason = None
                node.quality_met = data.quality_met
                node.open_issues = list(data.open_issues)
                for agent, s in open_spans.items():
                    s.end, s.outcome = t, ("completed" if agent == data.agent_id else "superseded")
                open_spans.clear()
            case ev.TaskRejected() | ev.TaskTimedOut():
                s = open_spans.pop(data.agent_id, None)
                if s is not None:
                    s.end = t
                    s.outcome = "rejected" if isinstance(data, ev.TaskRejected) else "timed_out"
                    s.reason = step.reason
            case _:
                outcome = _CLOSE_ALL.get(type(data))
                if outcome is not None:
                    for s in open_spans.values():
                        s.end, s.outcome, s.reason = t, outcome, step.reason
                    open_spans.clear()
        if state in (TaskState.PENDING, TaskState.NEEDS_REVISION):
            pending_since = t if pending_since is None else pending_since
        elif state is not None:
            pending_since = None
    _attach(node, journal_calls(events))
    for a, b in itertools.pairwise(node.steps):
        a.duration_s = b.time - a.time
    node.status = state.value if state else None
    if node.steps:
        node.start = node.steps[0].time
        node.end = node.steps[-1].time
        node.duration_s = node.end - node.start
    return node


def build_timeline(
    events: Sequence[Envelope], id: str, root_id: str, as_of: str | None = None
) -> Timeline:
    """The timeline of ``id`` (a task or the root) from its root's events, in position order."""
    by_task: dict[str, list[Envelope]] = {}
    run: list[Step] = []
    # a child run below this one (read_tree): its root -> the parent task that started it
    started_by = {
        e.stream: str(e.data.parent_task)
        for e in events
        if isinstance(e.data, ev.RunStarted) and e.data.parent_task and e.stream != root_id
    }
    task_root: dict[str, str] = {}  # task -> its run's root
    for env in events:
        if type(env.data) in _TASK_TYPES:
            by_task.setdefault(env.stream, []).append(env)
            task_root.setdefault(env.stream, env.correlation_id)
        elif env.stream in started_by and started_by[env.stream] in by_task:
            # a child run's own events go with the task that started it (its run.started
            # follows that task's creation: a child starts when its parent task runs)
            by_task[started_by[env.stream]].append(env)
        else:
            owner = getattr(env.data, "task_id", None)
            if isinstance(owner, str) and owner in by_task:
                by_task[owner].append(env)  # tool calls, memory reads, ... of a task
            else:
                run.append(_step(env))
    nodes = {tid: _fold_task(tid, evs) for tid, evs in by_task.items()}
    rounds = _rounds([e for e in events if e.stream == root_id])
    tops: list[TaskNode] = []
    for n in nodes.values():
        parent_id = n.parent_id or started_by.get(task_root.get(n.task_id, ""))
        parent = nodes.get(parent_id) if parent_id else None  # a child run's under its task
        if parent is not None and parent is not n:
            parent.children.append(n)
        else:
            tops.append(n)
    for n in nodes.values():
        n.children.sort(key=lambda c: (c.start, c.task_id))
    tops.sort(key=lambda c: (c.start, c.task_id))
    if id in nodes:
        chosen = [nodes[id]]
        run = []
    else:
        chosen = tops
    for a, b in itertools.pairwise(run):
        a.duration_s = b.time - a.time
    times = [s.time for s in run]

    def collect(n: TaskNode) -> None:
        times.extend(s.time for s in n.steps)
        for c in n.children:
            collect(c)

    for n in chosen:
        collect(n)
    count = len(times)
    start, end = (min(times), max(times)) if times else (0.0, 0.0)
    return Timeline(
        id=id,
        root_id=root_id,
        as_of=as_of,
        start=start,
        end=end,
        duration_s=end - start,
        events=count,
        run=run,
        tasks=chosen,
        planning=rounds if id == root_id else [],
    )


def _rounds(root_events: Sequence[Envelope]) -> list[PlanRound]:
    rounds: dict[int, PlanRound] = {}
    for env in root_events:
        data = env.data
        if isinstance(data, ev.PlanProposed):
            tasks = data.proposal.get("tasks") if isinstance(data.proposal, dict) else None
            rounds[data.round] = PlanRound(
                round=data.round,
                planner_task_id=data.planner_task_id,
                agent_id=data.agent_id,
                tasks=[
                    f"{t.get('id')} ({t.get('capability')})" if isinstance(t, dict) else "?"
                    for t in (tasks if isinstance(tasks, list) else [])
                ],
                from_goal={k: list(v) for k, v in data.from_goal.items()},
                time=env.recorded_at,
            )
        elif isinstance(data, ev.PlanRefused) and data.round in rounds:
            rounds[data.round].outcome = "refused"
            rounds[data.round].errors = list(data.errors)
        elif isinstance(data, ev.PlanAccepted) and data.round in rounds:
            rounds[data.round].outcome = "accepted"
    return [rounds[r] for r in sorted(rounds)]


async def replay(store: EventStore, id: str, as_of: AsOf | None = None) -> Timeline:
    """The timeline of a task id or a root id; ``StreamNotFound`` if the log has neither."""
    own = await store.read_stream(id)
    root_id = own[0].correlation_id if own else id
    events = await read_tree(store, root_id)  # with its child runs' (projections.lineage)
    if as_of is not None:
        events = [e for e in events if as_of.includes(e)]
    if not events or (root_id != id and not any(e.stream == id for e in events)):
        if as_of is not None and (own or events):
            raise StreamNotFound(f"{id} (as of {as_of.describe()})")
        raise StreamNotFound(id)
    timeline = build_timeline(events, id, root_id, as_of.describe() if as_of else None)
    # a re-run's replayed calls: their prompts and answers are in the recorded run's
    # streams (imported here: replay_origin builds on this module's fold)
    from cardbus.projections.replay_origin import fill_timeline_replays

    await fill_timeline_replays(store, timeline.tasks, events)
    return timeline


def to_json(timeline: Timeline) -> bytes:
    return msgspec.json.encode(timeline)
