"""Re-run a recorded run: the events that start it again as a new run.

:func:`plan_rerun` is pure: from the events of a run (``read_correlation``) it
computes the events of a new root, as :func:`~cardbus.projections.fork.plan_fork`
does at the run's last event, with these differences:

* ``RunStarted.rerun_of`` names the recorded root (``forked_from`` stays empty),
  ``offline`` says whether it is answered from the log alone, and ``agents`` /
  ``agent_paths`` are the agents it runs with;
* **offline** (``tasks`` None): every plan task runs again, and its
  ``task.created`` names its recorded task as ``origin`` with ``replay_strict``:
  the journal answers each model and tool call from the recorded one, and
  refuses (``replay_diverged``) a call that differs; a child-run task that completed
  keeps its result (its child run is not run again: ``bus.orchestrator.child_runs``);
* **live** (``tasks`` given): the chosen tasks and every task that depends on
  them run again (with ``model``, if given, as the chosen tasks'
  ``constraints.model``); every other task completed in the recorded run keeps
  its result (``reused_from``), as in a fork.

Writing the events and running them is the caller's part (``cardbus rerun``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence

import msgspec

from cardbus.eventstore import events as ev
from cardbus.eventstore.envelope import Envelope
from cardbus.eventstore.errors import ValidationError
from cardbus.projections.fork import ForkPlan, plan_fork

__all__ = ["RerunPlan", "plan_rerun", "recorded_model"]


class RerunPlan(msgspec.Struct, kw_only=True):
    root_id: str  # the new root
    source_root_id: str
    offline: bool
    ids: dict[str, str]  # recorded task id -> new task id
    rerun: list[str]  # new task ids that run again
    reused: list[str]  # new task ids completed with a recorded result
    agent_paths: list[str]  # the recorded run's agents, by import path
    streams: list[tuple[str, list[ev.Event]]]  # in append order, each a new stream


def recorded_model(events: Sequence[Envelope]) -> str:
    """The model the recorded run's requests named most (its endpoint's default, as a
    rule): an offline re-run's model has that name, so its requests are the same."""
    names = Counter(
        e.data.model for e in events if isinstance(e.data, ev.ModelRequested) and e.data.model
    )
    return names.most_common(1)[0][0] if names else ""


def plan_rerun(
    events: Sequence[Envelope],
    new_root_id: str,
    *,
    tasks: Collection[str] | None = None,
    model: str | None = None,
    agents: Sequence[str] | None = None,
) -> RerunPlan:
    """The new run's events; ``tasks`` (plan task ids or task ids) None: offline.

    ``agents``: the agent ids the new run may select (None: the recorded run's).
    """
    if not events:
        raise ValidationError("no events: nothing to re-run")
    root = events[0].correlation_id
    last = max((e for e in events if e.correlation_id == root), key=lambda e: e.position)
    fork = plan_fork(events, last.event_id, new_root_id)
    started = next(d for d in fork.streams[0][1] if isinstance(d, ev.RunStarted))
    created = {
        old: next(d for d in datas if isinstance(d, ev.TaskCreated))
        for old, (_, datas) in zip(fork.ids, fork.streams[1:], strict=True)
    }
    offline = tasks is None
    again: set[str] = set(created) if offline else _chosen(created, tasks or ())
    if offline:  # a child run's result is kept: its run is no journal to answer from
        again -= {t for t, c in created.items() if c.child is not None and _completed(fork, t)}
    if not offline:  # what depends on a task run again runs again (its inputs change)
        recorded = {new: old for old, new in fork.ids.items()}  # the copies name new ids
        grew = True
        while grew:
            new = {
                t
                for t, c in created.items()
                if t not in again and {recorded.get(d, d) for d in c.deps} & again
            }
            grew = bool(new)
            again |= new
    streams: list[tuple[str, list[ev.Event]]] = [
        (
            new_root_id,
            [
                msgspec.structs.replace(
                    started,
                    forked_from=None,
                    rerun_of=root,
                    offline=offline,
                    agents=started.agents if agents is None else sorted(set(agents)),
                )
            ],
        )
    ]
    reused: list[str] = []
    rerun: list[str] = []
    chosen = set() if offline else _chosen(created, tasks or ())
    for (old, new_id), (_, datas) in zip(fork.ids.items(), fork.streams[1:], strict=True):
        task = msgspec.structs.replace(created[old], forked_from=None)
        if old in again:
            if offline:
                task = msgspec.structs.replace(task, origin=old, replay_strict=True)
            elif model and old in chosen:
                task = msgspec.structs.replace(
                    task, constraints={**task.constraints, "model": model}
                )
            streams.append((new_id, [task]))
            rerun.append(new_id)
            continue
        done = [d for d in datas if isinstance(d, ev.TaskCompleted)]
        streams.append((new_id, [task, *done]))
        (reused if done else rerun).append(new_id)
    return RerunPlan(
        root_id=new_root_id,
        source_root_id=root,
        offline=offline,
        ids=dict(fork.ids),
        rerun=rerun,
        reused=reused,
        agent_paths=list(started.agent_paths),
        streams=streams,
    )


def _completed(fork: ForkPlan, old: str) -> bool:
    """The recorded task completed (its copy in the fork reuses the result)."""
    new = fork.ids[old]
    return any(
        isinstance(d, ev.TaskCompleted) for s, datas in fork.streams if s == new for d in datas
    )


def _chosen(created: dict[str, ev.TaskCreated], wanted: Collection[str]) -> set[str]:
    """The recorded tasks named by plan task id, task id or a unique prefix of one."""
    out: set[str] = set()
    for name in wanted:
        hits = [t for t, c in created.items() if name in (t, c.plan_id)]
        hits = hits or [t for t in created if t.startswith(name)]
        if len(hits) != 1:
            known = ", ".join(sorted(str(c.plan_id or t) for t, c in created.items()))
            raise ValidationError(
                f"task {name!r} is {'ambiguous' if hits else 'not a task'} of the run"
                f" (its tasks: {known})"
            )
        out.add(hits[0])
    return out
