"""A run with its child runs, read from the log: the tree replay, traces and the console show.

A child run (``bus.orchestrator.child_runs``) has a root of its own: its events carry
its own root as their correlation id, and its ``run.started`` names its parent run,
task and attempt. The parent's task names each child it started
(``task.child_started``). :func:`read_tree` reads a run's events and those of every
run below it, in log order; :func:`child_roots` finds the children in a run's events.
"""

from __future__ import annotations

from collections.abc import Iterable

from cardbus.eventstore import events as ev
from cardbus.eventstore.envelope import Envelope
from cardbus.eventstore.store import EventStore

__all__ = ["MAX_TREE_RUNS", "child_roots", "read_tree"]

#: the most runs one tree is read with (a runaway of children is cut there, not followed)
MAX_TREE_RUNS = 1000


def child_roots(events: Iterable[Envelope]) -> list[str]:
    """The child runs the tasks of these events started, in the order they started."""
    return list(
        dict.fromkeys(
            str(e.data.child_root) for e in events if isinstance(e.data, ev.ChildRunStarted)
        )
    )


async def read_tree(store: EventStore, root_id: str) -> list[Envelope]:
    """The events of run ``root_id`` and of every run below it, by position."""
    seen = {root_id}
    events = list(await store.read_correlation(root_id))
    todo = child_roots(events)
    while todo and len(seen) < MAX_TREE_RUNS:
        root = todo.pop(0)
        if root in seen:
            continue
        seen.add(root)
        more = await store.read_correlation(root)
        events.extend(more)
        todo.extend(child_roots(more))
    events.sort(key=lambda e: e.position)
    return events
