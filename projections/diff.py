"""Two runs side by side, and the first place where they went different ways.

:func:`diff_runs` is pure over the events of two runs (``read_correlation`` of
each root): their plans, and for each task (matched by plan task id; a
subtask by its parent's and its role) the inputs, the status and output, the
agents that ran it, the models that answered, and the model and tool calls
of its last execution (a replayed call resolved to the call it replays, so a
re-run's calls show the recorded prompts and answers). The *first
divergence* is the first task, in the order the first run dispatched them,
that is missing from one run, was asked other inputs, made a call whose
request or answer differs (the first such call, by ``seq``), or ended with
another output or status; it names both runs' events.

A run's planning task is matched by its place in the run (``~plan1``), not by
its id (which holds the root's). A fork or re-run does not plan (it takes the
recorded run's plan) nor run again what a reused result's own subtasks did:
such a task, only in the recorded run, is *reused* in the copy (``reused_in``),
not a divergence.

:func:`request_diff` is the short unified diff of two requests (a model
call's messages, a tool call's arguments) that both this and the journal's
strict re-run show.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Sequence
from typing import Any

import msgspec

from cardbus.eventstore import events as ev
from cardbus.eventstore.envelope import Envelope
from cardbus.projections.replay import JournalFold, ModelCall, ToolCall

__all__ = [
    "CallView",
    "Divergence",
    "RunDiff",
    "RunView",
    "TaskPair",
    "TaskView",
    "diff_runs",
    "request_diff",
]

_encoder = msgspec.json.Encoder(order="sorted")
_DIFF_LINES = 40  # of a diff, at most
_LINE = 240  # characters of one of its lines, at most


def _json(value: Any) -> str:
    try:
        return _encoder.encode(value).decode()
    except Exception:
        return repr(value)


def _digest(value: Any) -> str:
    return "" if value is None else hashlib.sha256(_json(value).encode()).hexdigest()


def _lines(value: Any) -> list[str]:
    """A request as lines a diff reads well: each message's role, then its text line by
    line; any other field as one line of JSON."""
    if value is None:
        return []
    if not isinstance(value, dict):
        return [_json(value)[:_LINE]]
    out: list[str] = []
    for key in sorted(value):
        item = value[key]
        if key == "messages" and isinstance(item, list):
            for i, m in enumerate(item):
                if not isinstance(m, dict):
                    out.append(f"messages[{i}]: {_json(m)}"[:_LINE])
                    continue
                out.append(f"messages[{i}] {m.get('role', '')}:")
                content = m.get("content")
                if isinstance(content, str):
                    out += [f"  {line}"[:_LINE] for line in content.splitlines() or [""]]
                elif content is not None:
                    out.append(f"  {_json(content)}"[:_LINE])
                for k in sorted(set(m) - {"role", "content"}):
                    out.append(f"  {k}: {_json(m[k])}"[:_LINE])
        else:
            out.append(f"{key}: {_json(item)}"[:_LINE])
    return out


def request_diff(a: Any, b: Any, a_name: str = "recorded", b_name: str = "now") -> list[str]:
    """A short unified diff (at most 40 lines) of two requests or arguments."""
    lines = list(difflib.unified_diff(_lines(a), _lines(b), a_name, b_name, n=1, lineterm=""))
    if len(lines) > _DIFF_LINES:
        lines = [*lines[:_DIFF_LINES], f"... ({len(lines) - _DIFF_LINES} more diff lines)"]
    return lines


class CallView(msgspec.Struct, kw_only=True):
    """One model or tool call of a task's last execution."""

    kind: str  # model | tool
    seq: int
    name: str  # the model asked, or the tool
    request: Any = None  # the request (model) or arguments (tool), as the log keeps them
    request_digest: str = ""
    answer: Any = None  # the answer (model) or result (tool)
    answer_digest: str = ""
    error: str | None = None
    answered_by: str = ""  # the model that answered
    replayed_from: str | None = None
    event_id: str = ""  # its model.requested / tool.requested (else its answer)


class TaskView(msgspec.Struct, kw_only=True):
    key: str  # the plan task id (a subtask: "<parent key>/<role>#<n>")
    task_id: str
    capability: str
    inputs: Any = None  # task ids in them named by key, so two runs compare
    status: str = "open"  # completed | failed | cancelled | open
    reason: str = ""
    output: Any = None
    agents: list[str] = []
    models: list[str] = []
    calls: list[CallView] = []
    reused_from: str | None = None  # a fork's or re-run's recorded result
    role: str = ""  # "" for a plan task; plan, review, supplement for the tasks added
    parent: str = ""  # the key of the task it is a subtask of ("": none)
    created_event_id: str = ""
    end_event_id: str = ""  # its completion or failure
    order: int = 0  # position of its first dispatch (never dispatched: after all)


class RunView(msgspec.Struct, kw_only=True):
    root_id: str
    goal: str = ""
    status: str = "open"
    plan: list[str] = []  # the plan task keys
    forked_from: str | None = None
    rerun_of: str | None = None
    offline: bool = False
    tasks: dict[str, TaskView] = {}


class TaskPair(msgspec.Struct, kw_only=True):
    key: str
    a: TaskView | None
    b: TaskView | None
    differs: list[str] = []  # inputs, agents, models, calls, output, status (none: same)
    # "A" or "B": the run that is a fork or re-run of the other and did not run this task
    # because it took the other's result (its plan, or the result of the task's parent)
    reused_in: str = ""


class Divergence(msgspec.Struct, kw_only=True):
    task: str  # the task's key
    what: str  # missing | inputs | request | answer | call_missing | output | status
    summary: str  # one line
    seq: int | None = None
    kind: str = ""  # model | tool, for a call
    event_a: str = ""  # the event of each run it is about ("" : none)
    event_b: str = ""
    diff: list[str] = []  # of the two requests, for a request that differs


class RunDiff(msgspec.Struct, kw_only=True):
    a: RunView
    b: RunView
    tasks: list[TaskPair]
    first_divergence: Divergence | None  # None: the runs did the same


def _run_view(events: Sequence[Envelope], calls: dict[str, list[ModelCall | ToolCall]]) -> RunView:
    root = events[0].correlation_id if events else ""
    view = RunView(root_id=root)
    created: dict[str, tuple[Envelope, ev.TaskCreated]] = {}
    keys: dict[str, str] = {}
    roles: dict[tuple[str, str], int] = {}
    parents: dict[str, str] = {}
    for e in events:
        data = e.data
        if e.stream == root:
            match data:
                case ev.RunStarted():
                    view.goal, view.forked_from = data.goal, data.forked_from
                    view.rerun_of, view.offline = data.rerun_of, data.offline
                case ev.RunCompleted() if data.degraded:  # without optional tasks' outputs
                    view.status = f"completed: degraded (without {', '.join(data.degraded)})"
                case ev.RunCompleted():
                    view.status = "completed"
                case ev.RunFailed() if data.cancelled:  # who cancelled it and why
                    view.status = f"cancelled: {data.detail or data.reason}"
                case ev.RunFailed():
                    view.status = f"failed: {data.reason}"
                case ev.RunHalted():
                    view.status = f"halted: {data.reason}"
                case _:
                    pass
            continue
        if isinstance(data, ev.TaskCreated) and e.stream not in created:
            created[e.stream] = (e, data)
            if data.role and data.parent_id in keys:
                parent = keys[data.parent_id]
                n = roles[(parent, data.role)] = roles.get((parent, data.role), 0) + 1
                keys[e.stream] = f"{parent}/{data.role}#{n}"
                parents[e.stream] = parent
            elif data.role and e.stream.startswith(f"{root}~"):
                # the run's own task (its planning, "<root>~plan1"): named by its place in
                # the run, as a plan task id never is (a "~" is refused in one)
                keys[e.stream] = e.stream[len(root) :]
            else:
                keys[e.stream] = data.plan_id or e.stream
    for stream, (env, data) in created.items():
        key = keys[stream]
        view.tasks[key] = TaskView(
            key=key,
            task_id=stream,
            capability=data.capability,
            inputs=_renamed(data.inputs, keys),
            role=data.role,
            parent=parents.get(stream, ""),
            created_event_id=env.event_id,
            order=1 << 62,
        )
        if not data.role:
            view.plan.append(key)
    by_stream = {t.task_id: t for t in view.tasks.values()}
    for e in events:
        found = by_stream.get(e.stream)
        if found is None:
            continue
        task, data = found, e.data
        match data:
            case ev.TaskDispatched():
                task.order = min(task.order, e.position)
                if data.agent_id not in task.agents:
                    task.agents.append(data.agent_id)
            case ev.TaskCompleted():
                task.status, task.output, task.end_event_id = "completed", data.output, e.event_id
                task.reused_from = data.reused_from
            case ev.TaskFailed():
                task.status, task.reason, task.end_event_id = "failed", data.reason, e.event_id
            case ev.TaskCancelled():
                task.status, task.end_event_id = "cancelled", e.event_id
            case _:
                pass
    for task in view.tasks.values():
        own = calls.get(task.task_id, [])
        if own:
            last = max(own, key=lambda c: c.position).execution
            own = sorted((c for c in own if c.execution == last), key=lambda c: c.seq)
        task.calls = [_call_view(c) for c in own]
        task.models = list(dict.fromkeys(c.answered_by for c in task.calls if c.answered_by))
    return view


def _renamed(value: Any, keys: dict[str, str]) -> Any:
    if isinstance(value, str):
        return keys.get(value, value)
    if isinstance(value, list):
        return [_renamed(v, keys) for v in value]
    if isinstance(value, dict):
        return {k: _renamed(v, keys) for k, v in value.items()}
    return value


def _call_view(c: ModelCall | ToolCall) -> CallView:
    if isinstance(c, ModelCall):
        answer = c.answer
        return CallView(
            kind="model",
            seq=c.seq,
            name=c.model,
            request=c.prompt,
            request_digest=c.request_digest,
            answer=answer,
            answer_digest=_digest(answer),
            error=c.error,
            answered_by=c.response_model or (answer or {}).get("model", "")
            if isinstance(answer, dict)
            else c.response_model,
            replayed_from=c.replayed_from,
            event_id=c.requested_event_id or c.answered_event_id,
        )
    return CallView(
        kind="tool",
        seq=c.seq,
        name=c.tool,
        request=c.arguments,
        request_digest=c.arguments_digest,
        answer=c.result,
        answer_digest=_digest(c.result),
        error=c.error,
        replayed_from=c.replayed_from,
        event_id=c.requested_event_id or c.called_event_id,
    )


def _calls(events: Sequence[Envelope]) -> dict[str, list[ModelCall | ToolCall]]:
    """Each task's model and tool calls, replays resolved (across both runs: a re-run
    replays the recorded run's answers)."""
    fold = JournalFold()
    out: dict[str, list[ModelCall | ToolCall]] = {}
    seen: set[str] = set()
    for env in sorted(events, key=lambda e: e.position):
        if env.event_id in seen:
            continue
        seen.add(env.event_id)
        call = fold.apply(env)
        if isinstance(call, (ModelCall, ToolCall)):
            calls = out.setdefault(env.stream, [])
            if not any(c is call for c in calls):
                calls.append(call)
    return out


def diff_runs(events_a: Sequence[Envelope], events_b: Sequence[Envelope]) -> RunDiff:
    """Run A and run B side by side, and where they first diverge."""
    calls = _calls([*events_a, *events_b])
    a, b = _run_view(events_a, calls), _run_view(events_b, calls)
    keys = sorted(a.tasks, key=lambda k: (a.tasks[k].order, a.plan.index(k) if k in a.plan else 0))
    keys += [k for k in sorted(b.tasks, key=lambda k: b.tasks[k].order) if k not in a.tasks]
    pairs: list[TaskPair] = []
    first: Divergence | None = None
    for key in keys:
        ta, tb = a.tasks.get(key), b.tasks.get(key)
        pair = TaskPair(key=key, a=ta, b=tb)
        pair.reused_in = _reused_in(a, b, key)
        found = None if pair.reused_in else _compare(pair)
        pairs.append(pair)
        if first is None and found is not None:
            first = found
    return RunDiff(a=a, b=b, tasks=pairs, first_divergence=first)


def _reused_in(a: RunView, b: RunView, key: str) -> str:
    """ "A" or "B" when that run did not run ``key`` because it took the other run's result:
    it is a fork or re-run of the other with the same plan, and ``key`` is the other's
    planning (the copy's plan is that plan) or a subtask of a task whose result the copy
    reused (its parent's output already holds what the subtask did). "": it did not."""
    for copy, source, name in ((b, a, "B"), (a, b, "A")):
        task = source.tasks.get(key)
        if task is None or key in copy.tasks or source.root_id not in _sources(copy):
            continue
        if copy.plan != source.plan:
            return ""
        if task.role and not task.parent:  # the run's own task: its planning
            return name
        parent = task.parent
        while parent:
            mine = copy.tasks.get(parent)
            if mine is not None and mine.reused_from is not None:
                return name
            parent = source.tasks[parent].parent if parent in source.tasks else ""
    return ""


def _sources(run: RunView) -> set[str]:
    """The root the run was forked or re-run from (``forked_from`` is ``root@event``)."""
    return {r.split("@", 1)[0] for r in (run.rerun_of, run.forked_from) if r}


def _compare(pair: TaskPair) -> Divergence | None:
    """Fill ``pair.differs``; return the pair's first divergence (None: the same)."""
    a, b, key = pair.a, pair.b, pair.key
    if a is None or b is None:
        pair.differs = ["missing"]
        which = "B" if a is None else "A"
        return Divergence(
            task=key,
            what="missing",
            summary=f"task {key} is only in run {which}",
            event_a=a.created_event_id if a else "",
            event_b=b.created_event_id if b else "",
        )
    found: list[Divergence] = []
    if (a.capability, a.inputs) != (b.capability, b.inputs):
        pair.differs.append("inputs")
        found.append(
            Divergence(
                task=key,
                what="inputs",
                summary=f"task {key} was asked other inputs",
                event_a=a.created_event_id,
                event_b=b.created_event_id,
                diff=request_diff(a.inputs, b.inputs, "A", "B"),
            )
        )
    reused = a.reused_from is not None or b.reused_from is not None
    if not reused:  # a reused result ran nowhere: its agents and calls are the original's
        if a.agents != b.agents:
            pair.differs.append("agents")
        if a.models != b.models:
            pair.differs.append("models")
        call = _first_call_difference(key, a.calls, b.calls)
        if call is not None:
            pair.differs.append("calls")
            found.append(call)
    if _json(a.output) != _json(b.output):
        pair.differs.append("output")
        found.append(
            Divergence(
                task=key,
                what="output",
                summary=f"task {key} ended with another output",
                event_a=a.end_event_id,
                event_b=b.end_event_id,
                diff=request_diff(a.output, b.output, "A", "B"),
            )
        )
    if (a.status, a.reason) != (b.status, b.reason):
        pair.differs.append("status")
        found.append(
            Divergence(
                task=key,
                what="status",
                summary=f"task {key}: {a.status} {a.reason}".rstrip()
                + f" in A, {b.status} {b.reason}".rstrip()
                + " in B",
                event_a=a.end_event_id,
                event_b=b.end_event_id,
            )
        )
    return found[0] if found else None


def _first_call_difference(
    key: str, calls_a: list[CallView], calls_b: list[CallView]
) -> Divergence | None:
    for i in range(max(len(calls_a), len(calls_b))):
        ca = calls_a[i] if i < len(calls_a) else None
        cb = calls_b[i] if i < len(calls_b) else None
        if ca is None or cb is None:
            one = ca or cb
            assert one is not None
            return Divergence(
                task=key,
                what="call_missing",
                summary=f"task {key}: {one.kind} call #{one.seq} ({one.name}) is only in run"
                f" {'A' if cb is None else 'B'}",
                seq=one.seq,
                kind=one.kind,
                event_a=ca.event_id if ca else "",
                event_b=cb.event_id if cb else "",
            )
        if (ca.kind, ca.name, ca.request_digest) != (cb.kind, cb.name, cb.request_digest):
            named = ca.name if ca.name == cb.name else f"{ca.name} / {cb.name}"
            return Divergence(
                task=key,
                what="request",
                summary=f"task {key}: {ca.kind} call #{ca.seq} ({named}) asked something else",
                seq=ca.seq,
                kind=ca.kind,
                event_a=ca.event_id,
                event_b=cb.event_id,
                diff=request_diff(ca.request, cb.request, "A", "B"),
            )
        if (ca.answer_digest, ca.error) != (cb.answer_digest, cb.error):
            return Divergence(
                task=key,
                what="answer",
                summary=f"task {key}: {ca.kind} call #{ca.seq} ({ca.name}) was answered"
                " differently",
                seq=ca.seq,
                kind=ca.kind,
                event_a=ca.event_id,
                event_b=cb.event_id,
                diff=request_diff(ca.answer, cb.answer, "A", "B"),
            )
    return None
