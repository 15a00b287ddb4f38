"""A run with its child runs, read from the log: the tree replay, traces and the console show.

A child run (``bus.orchestrator.child_runs``) has a root of its own: its events carry
its own root as their correlation id, and its ``run.started`` names its parent run,
task and attempt. The parent's task names each child it started
(``task.child_started``). :func:`read_tree` reads a run's events and those of every
run below it, in log order; :func:`child_roots` finds the children in a run's events.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cardbus.eventstore import events as ev
from cardbus.eventstore.envelope import Envelope
from cardbus.eventstore.store import EventStore

__all__ = ["MAX_TREE_RUNS", "child_roots", "read_tree", "tree_order"]

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


def tree_order(rows: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """Rows of runs (``proj_runs``: ``root_id``, ``parent_root``) as a tree: each child
    right after its parent (when its parent is among the rows), with its depth; the
    rows' own order otherwise."""
    by_root = {r["root_id"]: r for r in rows}
    below: dict[str, list[dict[str, Any]]] = {}
    tops: list[dict[str, Any]] = []
    for r in rows:
        parent = r.get("parent_root")
        if parent is not None and parent in by_root and parent != r["root_id"]:
            below.setdefault(parent, []).append(r)
        else:
            tops.append(r)
    out: list[tuple[int, dict[str, Any]]] = []
    seen: set[str] = set()

    def visit(r: dict[str, Any], depth: int) -> None:
        if r["root_id"] in seen:  # a cycle is bad data: each row once
            return
        seen.add(r["root_id"])
        out.append((depth, r))
        for c in sorted(below.get(r["root_id"], []), key=lambda c: c.get("started_at") or 0):
            visit(c, depth + 1)

    for r in tops:
        visit(r, 0)
    out.extend((0, r) for r in rows if r["root_id"] not in seen)
    return out
