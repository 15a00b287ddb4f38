"""New runs made from recorded ones (fork, re-run), written to the log from outside.

Like ``cancel_run`` and ``answer_approval`` these write to the log, never to an
orchestrator: the events of the new run (``projections.fork.plan_fork``,
``projections.rerun.plan_rerun``) are appended in one ``append_many`` (one
commit on SQLite), and every orchestrator following the log folds the new run
and decides it, on the agents its ``run.started`` names. ``cardbus fork``,
``cardbus rerun`` and the web console share these steps:

* :func:`read_fork` - the fork of a task's run at an event (or, given no event,
  just before that task's result: "fork from this task");
* :func:`read_rerun` - a re-run of a recorded run (offline, or of chosen tasks);
* :func:`on_agents` - a fork's new run named to run on given agents;
* :func:`check_agents` - refuse, before anything is written, a new run one of
  whose tasks to run no given agent can take;
* :func:`write_run` - append the new run's events, each by ``actor`` (who asked).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

import msgspec

from cardbus.agents.cards import AgentCard, constraint_problem
from cardbus.eventstore import Envelope, EventStore, NewEvent, new_id
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import IdNotFound, ValidationError
from cardbus.eventstore.store import Append
from cardbus.projections import resolve_id
from cardbus.projections.fork import ForkPlan, plan_fork, point_before
from cardbus.projections.ids import read_run
from cardbus.projections.rerun import RerunPlan, plan_rerun

__all__ = ["check_agents", "on_agents", "read_fork", "read_rerun", "write_run"]

Streams = list[tuple[str, list[ev.Event]]]


async def read_fork(store: EventStore, name: str, at: str | None = None) -> ForkPlan:
    """The fork of the run of ``name`` (a task or root id, or a unique prefix) at event
    ``at`` (an event id or global position); ``at`` None: the point just before the
    task ``name``'s result (``point_before``). Nothing is written."""
    task_id = await resolve_id(store, name)
    own = await store.read_stream(task_id)
    root = own[0].correlation_id if own else task_id
    events = await store.read_correlation(root)
    if not events:
        raise IdNotFound(name)
    if at is None or not str(at).strip():
        at = point_before(events, task_id)
    return plan_fork(events, str(at).strip(), new_id())


async def read_rerun(
    store: EventStore,
    root: str,
    tasks: Collection[str] | None,
    *,
    model: str | None = None,
    agents: Sequence[str] | None = None,
) -> tuple[RerunPlan, list[Envelope]]:
    """The re-run of the recorded run ``root`` (``tasks`` None: offline) and the recorded
    run's events. Nothing is written."""
    events = await read_run(store, root)
    plan = plan_rerun(events, new_id(), tasks=tasks, model=model, agents=agents)
    return plan, events


def on_agents(plan: ForkPlan, paths: Iterable[str], agent_ids: Iterable[str]) -> ForkPlan:
    """``plan`` whose new run names the agents it runs on (selection considers only them)
    and their classes (``module:Class``, for a later fork or re-run)."""
    root, (started, *rest) = plan.streams[0]
    assert isinstance(started, ev.RunStarted)
    started = msgspec.structs.replace(
        started, agents=sorted(set(agent_ids)), agent_paths=list(paths)
    )
    return msgspec.structs.replace(plan, streams=[(root, [started, *rest]), *plan.streams[1:]])


def check_agents(streams: Streams, cards: Sequence[AgentCard]) -> None:
    """``ValidationError`` naming the first task of the new run that will run (no result
    reused) and that none of ``cards`` can take: its capability is not offered, or its
    constraints (a model asked for) are over every offering agent's. A run that names
    its agents (``run.started.agents``) is checked against those alone."""
    started = streams[0][1][0] if streams and streams[0][1] else None
    if isinstance(started, ev.RunStarted) and started.agents:
        cards = [c for c in cards if c.agent_id in set(started.agents)]
    for stream, datas in streams[1:]:
        created = datas[0]
        if (
            not isinstance(created, ev.TaskCreated)
            or created.child is not None  # a child run's: its label is no agent's capability
            or any(isinstance(d, ev.TaskCompleted) for d in datas)
        ):
            continue
        offering = [c for c in cards if c.capability(created.capability) is not None]
        if not offering:
            raise ValidationError(
                f"task {created.plan_id or stream!r} needs capability {created.capability!r},"
                f" which no agent here offers ({', '.join(c.agent_id for c in cards) or 'none'})"
            )
        problems = [
            constraint_problem(c.constraints, created.constraints, created.timeout_s, 0)
            for c in offering
        ]
        if all(problems):
            raise ValidationError(
                f"task {created.plan_id or stream!r}: no agent offering"
                f" {created.capability!r} takes it ({'; '.join(p for p in problems if p)})"
            )


async def write_run(
    store: EventStore, streams: Streams, root_id: str, causation_id: str, actor: str
) -> None:
    """Append a new run's streams (each new: expected version 0) in one ``append_many``,
    every event by ``actor``; the first refusal is raised (a store error)."""
    appends = [
        Append(
            stream,
            [
                NewEvent(data=d, correlation_id=root_id, causation_id=causation_id, actor=actor)
                for d in datas
            ],
            0,
        )
        for stream, datas in streams
    ]
    for outcome in await store.append_many(appends):
        if isinstance(outcome, Exception):
            raise outcome
