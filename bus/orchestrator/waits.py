"""Deadlines of a person's word: how long an approval or a tool-call review may wait, and
what happens when it has waited that long.

A plan's ``waits`` (kept in ``run.started``) gives a :class:`~cardbus.eventstore.events.WaitPolicy`
per kind of wait (:data:`KINDS`): a deadline from the moment the wait begins, and the steps
to take, one per expiry: ``escalate`` to named approvers or a group (they alone may answer
from then on, within a new deadline), ``deny``, ``approve`` by rule, or ``fail`` the task.
For a question (``AskPerson``) ``approve`` answers with the question's default, and
``deny`` declines it (``bus.orchestrator.questions.by_default``).

Everything here is a fold and a pure decision, like the attempts' own deadlines
(``deadlines``): the wait's clock is folded from the log (``task.approval_requested``'s
``recorded_at``, then each ``task.wait_expired``), and the decider, on the clock's tick,
writes a ``task.wait_expired`` naming the step with the events that carry it out, in one
append at the stream's expected version. So a restart after a deadline passed applies the
step once (the log has it, or not yet), and a person answering as the deadline passes
either wins (the expiry is decided again on what they wrote, and finds nothing waiting)
or loses with a ``ConcurrencyError`` and is decided again on the expiry
(``answer_approval``, ``answer_review``, ``answer_question``).

After an escalation only its approvers may answer: :func:`require_approver` raises
``NotAnApprover`` for anyone else (an answer from outside the decision loop reads the
task's stream, which holds every ``task.wait_expired``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import msgspec

from cardbus.eventstore import Envelope, EventStore
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import InvalidPlan, NotAnApprover

if TYPE_CHECKING:
    from cardbus.bus.orchestrator.decisions import Decider
    from cardbus.bus.orchestrator.runstate import RunState, RunView, TaskView

__all__ = [
    "ACTIONS",
    "BY",
    "FOLDED",
    "KINDS",
    "Waiting",
    "check_expiry",
    "check_waits",
    "fold_call",
    "kind_of",
    "require_approver",
    "run_start",
]

#: the kinds of wait a policy may be given for: a task's approval, a tool call's review,
#: a question to a person
KINDS = ("approval", "review", "question")
#: what a step may do when a deadline passes
ACTIONS = ("escalate", "deny", "approve", "fail")
#: who answers when a policy does (the ``by`` of the approvals and reviews it writes)
BY = "policy:deadline"
#: the events of a task's stream folded here besides the task events (held tool calls)
FOLDED = frozenset({ev.ToolReviewRequested, ev.ToolReviewAnswered})


class Waiting(msgspec.Struct, kw_only=True):
    """A task's open wait, as folded: its kind, since when, the steps already applied,
    who may answer ([]: anyone) and when the next step is due (0: none is)."""

    kind: str
    since: float
    step: int = 0
    approvers: list[str] = []
    group: str = ""
    due: float = 0.0


def kind_of(reason: str) -> str:
    """The kind of wait an ``approval.requested`` of ``reason`` begins. A typed question
    to a person (reason ``question``, ``questions``) is a kind of its own: an approval's
    policy never answers it (granting a question answers nothing); its own policy
    answers it with its default."""
    if reason == "tool_review":
        return "review"
    return "question" if reason == "question" else "approval"


def check_waits(waits: dict[str, ev.WaitPolicy]) -> None:
    """``InvalidPlan`` for a plan's ``waits`` that could not be applied as written."""
    for kind, policy in waits.items():
        where = f"waits[{kind!r}]"
        if kind not in KINDS:
            raise InvalidPlan(f"{where}: a wait is one of {', '.join(KINDS)}")
        _seconds(f"{where}.deadline_s", policy.deadline_s)
        _group(where, policy.group, policy)
        for i, step in enumerate(policy.then, 1):
            at = f"{where}.then[{i}]"
            if step.action not in ACTIONS:
                raise InvalidPlan(f"{at}: action is one of {', '.join(ACTIONS)}")
            if step.deadline_s is not None:
                _seconds(f"{at}.deadline_s", step.deadline_s)
            _group(at, step.group, policy)
            if step.action == "escalate" and not (step.to or step.group):
                raise InvalidPlan(f"{at}: an escalation names who is asked (to, group)")
            if step.action != "escalate" and (step.to or step.group):
                raise InvalidPlan(f"{at}: only an escalation asks someone (to, group)")
            if step.action != "escalate" and i < len(policy.then):
                raise InvalidPlan(f"{at}: {step.action} ends the wait; no step may follow it")


def _seconds(where: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise InvalidPlan(f"{where} must be a number of seconds > 0, got {value!r}")


def _group(where: str, group: str, policy: ev.WaitPolicy) -> None:
    if group and group not in policy.groups:
        raise InvalidPlan(f"{where}: group {group!r} is not in the policy's groups")


def _members(policy: ev.WaitPolicy, to: list[str], group: str) -> list[str]:
    return list(dict.fromkeys([*to, *policy.groups.get(group, [])]))


# -- the fold ---------------------------------------------------------------------------


def requested(
    state: RunState, task: TaskView, run: RunView | None, env: Envelope, data: ev.Event
) -> None:
    """A wait begins (``approval.requested``): its clock starts, if its kind has a policy."""
    assert isinstance(data, ev.ApprovalRequested)
    kind = kind_of(data.reason)
    policy = run.started.waits.get(kind) if run is not None else None
    if policy is None:
        task.wait = Waiting(kind=kind, since=env.recorded_at)
        return
    due = env.recorded_at + policy.deadline_s if policy.then else 0.0
    task.wait = Waiting(
        kind=kind,
        since=env.recorded_at,
        approvers=_members(policy, policy.to, policy.group),
        group=policy.group,
        due=due,
    )
    if due:
        state._wake(due, task.created.root_id)


def expired(
    state: RunState, task: TaskView, run: RunView | None, env: Envelope, data: ev.Event
) -> None:
    """A step applied: an escalation names the new approvers and the next deadline (if a
    step is left to take); the other steps end the wait with the events that follow."""
    assert isinstance(data, ev.WaitExpired)
    wait = task.wait or Waiting(kind=data.kind, since=env.recorded_at)
    wait.step = max(wait.step, data.step)
    wait.due = 0.0
    if data.action == "escalate":
        wait.approvers, wait.group = list(data.approvers), data.group
        policy = run.started.waits.get(data.kind) if run is not None else None
        if policy is not None and wait.step < len(policy.then) and data.next_deadline:
            wait.due = data.next_deadline
            state._wake(wait.due, task.created.root_id)
    task.wait = wait


def fold_call(state: RunState, env: Envelope) -> None:
    """A tool call held for review, or its answer: the calls a policy answers on expiry."""
    task = state.tasks.get(env.stream)
    if task is None:
        return
    data = env.data
    if isinstance(data, ev.ToolReviewRequested):
        if data.call not in task.held:
            task.held = {**task.held, data.call: (data.tool, data.arguments)}
    elif isinstance(data, ev.ToolReviewAnswered) and data.call in task.held:
        task.held = {c: v for c, v in task.held.items() if c != data.call}


# -- the decision -----------------------------------------------------------------------


def check_expiry(decider: Decider, run: RunView, task: TaskView) -> None:
    """A task awaiting a person's word: apply its policy's next step if its deadline passed."""
    wait = task.wait
    if wait is None or not wait.due or wait.due > decider.now:
        return
    policy = run.started.waits.get(wait.kind)
    if policy is None or wait.step >= len(policy.then):
        return
    step = policy.then[wait.step]
    number = wait.step + 1
    what = f"no answer to the {wait.kind} by its deadline (step {number}: {step.action})"
    note = step.note or what
    expiry = ev.WaitExpired(
        kind=wait.kind, step=number, action=step.action, deadline=wait.due, note=note
    )
    out: list[ev.Event] = []
    match step.action:
        case "escalate":
            seconds = step.deadline_s if step.deadline_s is not None else policy.deadline_s
            expiry = msgspec.structs.replace(
                expiry,
                approvers=_members(policy, step.to, step.group),
                group=step.group,
                next_deadline=decider.now + seconds,
            )
        case "approve" if wait.kind == "question":
            # here, not at the top: questions folds with runstate, which folds with us
            from cardbus.bus.orchestrator.questions import by_default

            out.extend(by_default(task, note))
        case "approve" | "deny" if wait.kind == "review":
            out.extend(_answer_calls(task, step.action, note))
            out.append(ev.ApprovalGranted(by=BY, resume="pending", note=f"review: {note}"))
        case "approve":
            resume = "running" if task.has_proposal else "pending"
            out.append(ev.ApprovalGranted(by=BY, resume=resume, note=note))
        case "deny":
            out.append(ev.ApprovalDenied(by=BY, note=note))
        case _:  # fail
            out.append(ev.TaskFailed(reason="wait_expired", error=note, attempts=task.attempt))
    decider.d.add(task.task_id, expiry, *out)


def _answer_calls(task: TaskView, action: str, note: str) -> list[ev.Event]:
    """The policy's word on every held call: approved as proposed, or refused with
    ``note`` as the reason (the model gets it as the tool's answer, as a person's)."""
    decision = "approve" if action == "approve" else "refuse"
    return [
        ev.ToolReviewAnswered(
            task_id=task.task_id,
            tool=tool,
            call=call,
            decision=decision,
            by=BY,
            proposed=arguments,
            reason=note if decision == "refuse" else "",
        )
        for call, (tool, arguments) in task.held.items()
    ]


async def run_start(store: EventStore, root_id: str, task_id: str) -> list[Envelope]:
    """The ``run.started`` of a task's run (its wait policies), to fold before the task's
    stream when answering from outside the decision loop; [] for a task of no run."""
    if root_id == task_id:
        return []
    first = (await store.read_stream(root_id))[:1]
    return [e for e in first if isinstance(e.data, ev.RunStarted)]


def require_approver(task: TaskView, by: str) -> None:
    """``NotAnApprover`` unless ``by`` may answer the task's wait now."""
    wait = task.wait
    if wait is not None and wait.approvers and by not in wait.approvers:
        raise NotAnApprover(task.task_id, by, wait.approvers)
