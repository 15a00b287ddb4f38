"""Child runs, the orchestrator's side: start a child-run task's child, follow it, close it.

A plan task with a ``child`` (``bus.orchestrator.children``) is not dispatched to an
agent. Its attempt starts a run of its own on the same log, decided like any
other: the decision writes the child's ``run.started`` (its lineage: the parent
run, task and attempt, and its ``parent_close``) and its tasks' ``task.created``,
and on the parent task ``task.child_started`` naming the child, appended only if
the child's ``run.started`` was (``Decisions.after``): no parent ever names a child
that is not in the log. The child's root id is drawn from the task and attempt
(:func:`child_root_id`), so a decision made again after a race names the same child.

While the child runs, the parent task is ``running``:

* the child completes: the task completes with the child's outputs (by the child's
  plan task ids), through the task's review if it has one;
* the child fails: the attempt fails (``child_run_failed``, retried by the task's
  retry policy: a new attempt is a new child run); cancelled or halted, the task
  fails for good (``child_run_cancelled``, ``child_run_halted``);
* the attempt's deadline (the task's ``timeout_s`` from the child's start) passes:
  the attempt times out and is retried.

When the attempt that started a child ends without it (the parent task or run was
cancelled, halted, timed out), the child's ``parent_close`` applies, decided on
the child's side each time it is looked at: ``terminate`` cancels its live tasks
(``task.cancelled``, reason ``parent_closed``); ``request_cancel`` cancels those not
in flight and lets the attempts in flight finish; ``abandon`` leaves it alone.
Its ``run.failed`` then says cancelled, as a cancelled run's does.

The parent's budgets bound the child: the child's spending is folded into its
parents' ledgers too (``RunState._fold_budgets``) and each model call and dispatch
of the child is checked against them (``Budgets``, scopes ``parent:<scope>``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import msgspec

from cardbus.bus.orchestrator.children import ChildSpec, child_plan, lineage_of
from cardbus.bus.orchestrator.submission import run_creation
from cardbus.eventstore import TaskState
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import InvalidPlan

if TYPE_CHECKING:
    from cardbus.bus.orchestrator.decisions import Decider, Decisions
    from cardbus.bus.orchestrator.dispatch import Dispatching
    from cardbus.bus.orchestrator.runstate import RunState, RunView, TaskView

__all__ = [
    "child_root_id",
    "close_orphaned",
    "drop_decided",
    "follow",
    "related_roots",
    "spec_of",
    "start",
]

S = TaskState
_IN_FLIGHT = (S.DISPATCHED, S.RUNNING)


def child_root_id(
    task_id: str,
    attempt: int,
    parent_root: str = "",
    place: Callable[[str], int] | None = None,
) -> str:
    """The root id of the child run of ``task_id``'s ``attempt``: the same whoever decides
    it, so a decision made again names the child the first one wrote (UUID-shaped).

    ``place`` (members sharing the runs by partitions: a root's partition): the first
    id drawn whose partition is ``parent_root``'s, so the member that decides the parent
    decides the child and folds its end (about as many draws as partitions)."""
    for n in range(_PLACE_TRIES):
        salt = f"\0{n}" if n else ""
        h = hashlib.sha256(f"child-run\0{task_id}\0{attempt}{salt}".encode()).hexdigest()
        root = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
        if place is None or place(root) == place(parent_root):
            return root
    raise InvalidPlan(f"no child root id in the partition of {parent_root} ({_PLACE_TRIES} drawn)")


_PLACE_TRIES = 1 << 16  # ids drawn for one in the parent's partition (p = 1 / partitions)


def spec_of(created: ev.TaskCreated) -> ChildSpec:
    """The task's child spec as its ``task.created`` keeps it (``InvalidPlan`` if broken)."""
    try:
        return msgspec.convert(created.child, ChildSpec)
    except (msgspec.ValidationError, TypeError) as e:
        raise InvalidPlan(f"child spec unusable: {e}") from e


def start(d: Dispatching, run: RunView, task: TaskView) -> None:
    """Instead of a dispatch: the next attempt starts its child run (decided, not written)."""
    attempt = task.attempt + 1
    try:
        child_root = child_root_id(task.task_id, attempt, run.root_id, d.place)
        spec = spec_of(task.created)
        if child_root not in d.state.runs and not d.d.touched(child_root):
            inputs = d.card_for(task, attempt).inputs  # its declared deps' outputs resolved
            creation = _creation(d, run, task, attempt, spec, inputs, child_root)
            for stream, data in creation:
                d.d.add(stream, data)
            # on the parent only if the child's run.started is written (Decisions.after)
            d.d.after.setdefault(task.task_id, set()).add(child_root)
    except InvalidPlan as e:  # its inputs made a plan no run can start with
        d._fail(task, "child_plan_invalid", str(e)[:2000])
        return
    deadline = d.now + task.created.timeout_s
    d.d.add(
        task.task_id,
        ev.ChildRunStarted(
            attempt=attempt,
            child_root=child_root,
            deadline=deadline,
            parent_close=spec.parent_close,
        ),
    )


def _creation(
    d: Dispatching,
    run: RunView,
    task: TaskView,
    attempt: int,
    spec: ChildSpec,
    inputs: dict[str, object],
    child_root: str,
) -> list[tuple[str, ev.Event]]:
    plan = child_plan(spec, inputs, task.created.goal or task.created.capability)
    name = f"{task.created.plan_id or task.task_id}~{child_root[-12:]}"
    started = run.started
    creation = run_creation(
        plan,
        name,
        child_root,
        d.policy,
        started.agents,  # the parent's agents: a department works with what the run has
        started.agent_paths,
        d.event_limit,
        lineage_of(run.root_id, task.task_id, attempt, spec),
    )
    first = creation[0][1]
    assert isinstance(first, ev.RunStarted)
    child_started = msgspec.structs.replace(
        first,
        user=first.user or started.user,  # whose memory: the parent's unless it says
        tenant=first.tenant or started.tenant,
    )
    return [(child_root, child_started), *creation[1:]]


def drop_decided(d: Decisions, parent_root: str) -> None:
    """The child runs decided in this step for ``parent_root``'s tasks, taken back (the
    parent halts in the same step: a child created now would only be closed at once)."""
    roots = {
        stream
        for stream, events in d.events.items()
        if isinstance(events[0], ev.RunStarted) and events[0].parent_root == parent_root
    }
    for stream, events in list(d.events.items()):
        first = events[0]
        if stream in roots or (isinstance(first, ev.TaskCreated) and first.root_id in roots):
            del d.events[stream]


def follow(d: Decider, run: RunView, task: TaskView) -> None:
    """A running child-run task: settled by its child's end, or timed out at its deadline."""
    if task.child_end is None:  # still running (or not folded yet)
        if task.child_deadline and d.now >= task.child_deadline:
            d.d.add(
                task.task_id,
                ev.TaskTimedOut(
                    attempt=task.attempt,
                    agent_id="",
                    deadline=task.child_deadline,
                    reason="deadline",
                ),
            )
            d._fail_attempt(
                task, "timeout", f"child run {task.child_root} did not end by the deadline"
            )
        return
    finished, outputs, said = task.child_end
    detail = f"child run {task.child_root}: {said or finished}"
    if finished == "completed":
        d._deliver(task, "", outputs, 1.0)
    elif finished == "failed":
        d._fail_attempt(task, "child_run_failed", detail[:2000])
    else:  # cancelled or halted: another attempt would be stopped again
        d._fail(task, f"child_run_{finished}", detail[:2000])


def close_orphaned(d: Decider, run: RunView) -> None:
    """A child run whose parent attempt ended without it: its ``parent_close`` applied to
    its live tasks (decided here, on the child's side, each time it is looked at)."""
    lineage = run.started
    if lineage.parent_task is None or lineage.parent_close == "abandon":
        return
    parent = d.state.tasks.get(lineage.parent_task)
    if parent is None:
        return  # not folded here: nothing known of its end
    attempt = lineage.parent_attempt or 0
    if not parent.terminal and (
        parent.attempt < attempt  # its task.child_started is not folded (or written) yet
        or (
            parent.attempt == attempt
            and parent.child_root == run.root_id
            and attempt not in parent.settled
        )
    ):
        return  # still the attempt it works for
    ended = parent.state.value if parent.state else "gone"
    if not parent.terminal:
        ended = f"attempt {attempt} ended ({ended})"
    note = f"parent task {parent.task_id} {ended}; parent_close {lineage.parent_close}"
    terminate = lineage.parent_close == "terminate"
    for task_id in run.tasks:
        task = d.state.tasks.get(task_id)
        if task is None or task.terminal or d.d.touched(task_id):
            continue
        if not terminate and task.state in _IN_FLIGHT:
            continue  # request_cancel: the attempt in flight finishes
        d.d.add(task_id, ev.TaskCancelled(reason="parent_closed", whole_run=True, note=note[:500]))


def related_roots(state: RunState, roots: Iterable[str]) -> set[str]:
    """Open runs to look at because runs ``roots`` changed: the parent of a child (its
    task goes on when the child ends) and the children of a parent (their
    ``parent_close`` applies when the attempt that started them ends)."""
    out: set[str] = set()
    for root in roots:
        run = state.runs.get(root)
        if run is None:
            continue
        parent = run.started.parent_root
        if parent is not None and parent in state.open:
            out.add(parent)
        out.update(c for c in run.children if c in state.open)
    return out
