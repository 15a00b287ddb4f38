"""Fork from a point: the events that start a new run whose history is taken from an old one.

:func:`plan_fork` is pure: from the events of a run (``read_correlation``) and
an event of that run (the fork point), it computes the events of a new root:

* ``RunStarted`` copied, with ``forked_from = "<old root>@<event id>"`` and the
  new task ids (of a run planned from a goal: the tasks its ``plan.accepted``
  events named by the fork point, so the fork does not plan again; forked
  before any acceptance, it does);
* for every plan task of the run (``RunStarted.task_ids``), its ``TaskCreated``
  copied under a new id (``forked_from`` = the fork point's event id; ``deps``
  and ``$dep`` references in the inputs renamed to the new ids);
* for every plan task completed at or before the fork point, a
  ``TaskCompleted`` with the same output and ``reused_from`` = the original
  completion's event id: that result is reused, not recomputed.

Every other task starts again from ``pending``, and the orchestrator, started
on the same log, carries the run on with the agents it has now (a task that
needs a subtask - a review, missing input - creates a new one). Subtasks of
the old run are not copied. Writing the events and running them is the
caller's part (``cardbus fork``, ``bus.orchestrator.forks``).

"Fork from a task" (the console): :func:`point_before` is the fork point just
before the task's result, so it and what came after run again, and
:func:`override_task` changes what the forked copy of it asks (its inputs, its
model) before it runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from cardbus.eventstore import events as ev
from cardbus.eventstore.envelope import Envelope
from cardbus.eventstore.errors import ValidationError

__all__ = ["ForkPlan", "fork_task_id", "override_task", "plan_fork", "point_before"]


class ForkPlan(msgspec.Struct, kw_only=True):
    root_id: str  # the new root
    source_root_id: str
    at_event_id: str
    at_position: int
    forked_from: str  # "<old root>@<event id>"
    ids: dict[str, str]  # old task id -> new task id
    reused: list[str]  # new task ids completed with a reused result
    rerun: list[str]  # new task ids that start again
    streams: list[tuple[str, list[ev.Event]]]  # in append order, each a new stream


def fork_task_id(old_task_id: str, old_root: str, new_root: str) -> str:
    """The orchestrator names plan tasks ``<plan id>-<root[-12:]>``; keep that shape."""
    suffix = old_root[-12:]
    if old_task_id.endswith("-" + suffix):
        return old_task_id[: -len(suffix)] + new_root[-12:]
    return f"{old_task_id}~{new_root[-12:]}"


def _rename(value: Any, ids: dict[str, str]) -> Any:
    if isinstance(value, str):
        return ids.get(value, value)
    if isinstance(value, list):
        return [_rename(v, ids) for v in value]
    if isinstance(value, dict):
        return {k: _rename(v, ids) for k, v in value.items()}
    return value


def plan_fork(events: Sequence[Envelope], at: str, new_root_id: str) -> ForkPlan:
    """The new run's events; ``at`` is an event id of the run (or its global position)."""
    point = next((e for e in events if e.event_id == at), None)
    if point is None and at.isdigit():
        point = next((e for e in events if e.position == int(at)), None)
    if point is None:
        raise ValidationError(f"event {at!r} is not an event of this run")
    root = point.correlation_id
    started = next(
        (e for e in events if e.stream == root and isinstance(e.data, ev.RunStarted)), None
    )
    if started is None or not isinstance(started.data, ev.RunStarted):
        raise ValidationError(f"run {root!r} has no run.started event: nothing to fork")
    run = started.data
    created: dict[str, ev.TaskCreated] = {}
    completed: dict[str, Envelope] = {}
    for e in events:
        if e.stream in created or isinstance(e.data, ev.TaskCreated):
            if isinstance(e.data, ev.TaskCreated) and e.stream not in created:
                created[e.stream] = e.data
            elif isinstance(e.data, ev.TaskCompleted) and e.position <= point.position:
                completed[e.stream] = e
    # a run planned from a goal: the tasks its plans accepted by then (plan.accepted)
    accepted: list[str] = list(run.task_ids)
    for e in events:
        data = e.data
        if e.stream == root and isinstance(data, ev.PlanAccepted) and e.position <= point.position:
            accepted = [t for t in accepted if t not in set(data.superseded)]
            accepted += list(data.task_ids.values())
    plan_tasks = [t for t in accepted if t in created]
    ids = {t: fork_task_id(t, root, new_root_id) for t in plan_tasks}
    streams: list[tuple[str, list[ev.Event]]] = [
        (
            new_root_id,
            [
                msgspec.structs.replace(
                    run,
                    task_ids=[ids[t] for t in plan_tasks],
                    forked_from=f"{root}@{point.event_id}",
                )
            ],
        )
    ]
    reused, rerun = [], []
    for old in plan_tasks:
        c = created[old]
        new_created = msgspec.structs.replace(
            c,
            root_id=new_root_id,
            parent_id=None,
            deps=[ids.get(d, d) for d in c.deps],
            inputs=_rename(c.inputs, ids),
            forked_from=point.event_id,
        )
        datas: list[ev.Event] = [new_created]
        done = completed.get(old)
        if done is not None and isinstance(done.data, ev.TaskCompleted):
            datas.append(msgspec.structs.replace(done.data, reused_from=done.event_id))
            reused.append(ids[old])
        else:
            rerun.append(ids[old])
        streams.append((ids[old], datas))
    return ForkPlan(
        root_id=new_root_id,
        source_root_id=root,
        at_event_id=point.event_id,
        at_position=point.position,
        forked_from=f"{root}@{point.event_id}",
        ids=ids,
        reused=reused,
        rerun=rerun,
        streams=streams,
    )


def point_before(events: Sequence[Envelope], task_id: str) -> str:
    """The fork point "from task ``task_id``": the run's last event before the task's
    result (``task.completed``), so the task runs again and what it completed before
    is reused; a task that never completed: the run's last event. An event id."""
    own = [e for e in events if e.stream == task_id]
    if not own:
        raise ValidationError(f"{task_id!r} is not a task of this run")
    root = own[0].correlation_id
    done = next((e.position for e in own if isinstance(e.data, ev.TaskCompleted)), None)
    run = [e for e in events if e.correlation_id == root]
    before = [e for e in run if done is None or e.position < done]
    return max(before, key=lambda e: e.position).event_id


def override_task(
    plan: ForkPlan,
    task_id: str,
    *,
    inputs: dict[str, Any] | None = None,
    model: str | None = None,
) -> ForkPlan:
    """``plan`` whose copy of ``task_id`` (a task of the old run, or its plan task id)
    asks with ``inputs`` in place of its own and ``model`` as its ``constraints.model``.

    ``ValidationError`` when the task is not a plan task of the fork, or its result is
    reused at this fork point (an override would change nothing: fork earlier).
    """
    new = plan.ids.get(task_id)
    if new is None:  # a plan task id ("write"), as the plan names it
        named = [
            plan.ids[old]
            for old in plan.ids
            if old.removesuffix("-" + plan.source_root_id[-12:]) == task_id
        ]
        new = named[0] if len(named) == 1 else None
    if new is None:
        raise ValidationError(
            f"{task_id!r} is not a plan task of run {plan.source_root_id} (a subtask is made"
            " again by the orchestrator: override its parent)"
        )
    if new in plan.reused:
        raise ValidationError(
            f"task {task_id!r} completed before the fork point, so its result is reused:"
            " fork at an event before its result to run it again"
        )
    if inputs is not None and not isinstance(inputs, dict):
        raise ValidationError("the inputs override must be a JSON object")
    streams = []
    for stream, datas in plan.streams:
        if stream == new:
            created = datas[0]
            assert isinstance(created, ev.TaskCreated)
            changes: dict[str, Any] = {}
            if inputs is not None:
                changes["inputs"] = _rename(inputs, plan.ids)
            if model:
                changes["constraints"] = {**created.constraints, "model": model}
            datas = [msgspec.structs.replace(created, **changes), *datas[1:]]
        streams.append((stream, datas))
    return msgspec.structs.replace(plan, streams=streams)
