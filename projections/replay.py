"""Replay: the timeline of a task (or a whole run) and all its subtasks, from the log alone.

:func:`replay` reads the events of the task's root (``read_correlation``),
links tasks to parents with ``TaskCreated.parent_id`` and folds each task's
events into a :class:`TaskNode`: its steps (time, duration until the task's
next step, agent, attempt, status after the step, and the reason of every
rejection, retry, time-out, failure, halt, cancellation and revision) and its
attempt spans (dispatch to outcome, one per agent per attempt) for a Gantt
chart. :func:`build_timeline` is the pure part, from a list of envelopes.

Given a root id, the timeline holds every task of the run plus the run's own
events (``run.*``, ``plan.*``); given a task id, that task and its subtasks.
A run planned from a goal also lists its planning rounds (:class:`PlanRound`:
the planning task, who proposed, the tasks proposed, refused with the errors
or accepted), so the timeline shows how the plan came to be.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec

from cardbus.eventstore import events as ev
from cardbus.eventstore.envelope import Envelope
from cardbus.eventstore.errors import IllegalTransition, StreamNotFound
from cardbus.eventstore.states import TaskState, transition
from cardbus.eventstore.store import EventStore
from cardbus.projections.tasks import event_reason
from cardbus.projections.timetravel import AsOf

__all__ = [
    "AttemptSpan",
    "PlanRound",
    "Step",
    "TaskNode",
    "Timeline",
    "build_timeline",
    "replay",
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
    replica: str | None = None  # who ran it: the worker process that answered (or started)
    deliveries: int = 1  # the card's delivery count at the end (2 or more: redelivered)


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
    children: list[TaskNode] = []


class PlanRound(msgspec.Struct, kw_only=True):
    """One planning round of a goal run: a proposal and what became of it."""

    round: int
    planner_task_id: str
    agent_id: str = ""
    tasks: list[str] = []  # the proposed tasks, "id (capability)"
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
        case ev.ToolRequested():
            return f"tool {data.tool} requested"
        case ev.ToolCalled():
            return f"tool {data.tool}" + (f" failed: {data.error}" if data.error else "")
        case ev.RunStarted():
            d = f"goal: {data.goal}"
            if data.planning is not None:
                d += " (to plan)"
            return d + (f" (forked from {data.forked_from})" if data.forked_from else "")
        case ev.PlanProposed():
            return f"round {data.round} by {data.agent_id or '?'}: {_proposed(data.proposal)}"
        case ev.PlanAccepted():
            d = f"round {data.round}: {len(data.task_ids)} tasks created"
            return d + (f", {len(data.superseded)} superseded" if data.superseded else "")
        case ev.RunFailed() if data.detail:
            return data.detail
    return None


def _who(data: Any) -> str:
    """Who ran an attempt, as a step shows it: "by <replica> (delivery n)"."""
    if not data.replica_id:
        return "" if data.delivery <= 1 else f"delivery {data.delivery}"
    d = f"by {data.replica_id}"
    return d + (f" (delivery {data.delivery})" if data.delivery > 1 else "")


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
    return event_reason(data)


def _step(env: Envelope) -> Step:
    data = env.data
    tag = env.type
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
        reason=_reason(data),
        detail=_detail(data),
        payload=_payload(data),
    )


def _payload(data: Any) -> Any:
    """The data a step carried, for the collapsed detail of replay --json and the HTML."""
    match data:
        case ev.TaskCreated():
            return {"inputs": data.inputs, "deps": list(data.deps)}
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
        case ev.ToolRequested():
            return {"arguments": data.arguments}
        case ev.ToolCalled():
            return {"arguments": data.arguments, "result": data.result, "error": data.error}
    return None


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
    node = TaskNode(task_id=task_id, steps=[], spans=[], children=[])
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
                span = AttemptSpan(attempt=data.attempt, agent_id=data.agent_id, start=t)
                if pending_since is not None:
                    span.queued_s = t - pending_since
                open_spans[data.agent_id] = span
                node.spans.append(span)
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
    for env in events:
        if type(env.data) in _TASK_TYPES:
            by_task.setdefault(env.stream, []).append(env)
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
        parent = nodes.get(n.parent_id) if n.parent_id else None
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
    events = await store.read_correlation(root_id)
    if as_of is not None:
        events = [e for e in events if as_of.includes(e)]
    if not events or (root_id != id and not any(e.stream == id for e in events)):
        if as_of is not None and (own or events):
            raise StreamNotFound(f"{id} (as of {as_of.describe()})")
        raise StreamNotFound(id)
    return build_timeline(events, id, root_id, as_of.describe() if as_of else None)


def to_json(timeline: Timeline) -> bytes:
    return msgspec.json.encode(timeline)
