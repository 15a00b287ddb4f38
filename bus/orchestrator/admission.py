"""Admission: how many runs an orchestrator has in flight, and which wait their turn.

Submitting a run writes it to the log (``plan.submitted``, ``run.started``, its tasks'
``task.created``): that is the durable queue. The runs *in flight* are the first
``Policy.max_runs_in_flight`` open runs this orchestrator decides (``owns``), in the order
of their ``run.started`` in the log; the others are queued: nothing of them is
dispatched until a run ahead of them ends and they move up. So admission is derived
from the log alone (no event of its own): a restart, or another member taking the
partition over, admits exactly the same runs, in the same order.

A child run (``bus.orchestrator.child_runs``) is not counted and never queued: its
parent, admitted, waits for it.

Only the decisions wait: replies for a queued run's tasks (there are none: nothing was
sent) and events others write for it are folded as ever.
"""

from __future__ import annotations

from collections.abc import Callable

from cardbus.bus.orchestrator.runstate import RunState

__all__ = ["Admission"]


class Admission:
    def __init__(self, limit: int | None) -> None:
        """``limit``: runs in flight at most (None: every open run)."""
        self.limit = limit
        self.admitted: set[str] = set()
        self._seen = -1  # RunState.runs_changed when ``admitted`` was computed

    def update(
        self, state: RunState, owns: Callable[[str], bool] | None, force: bool = False
    ) -> set[str]:
        """Recompute (when runs started or ended since, or ``force``: the partitions held
        may have changed); the runs admitted just now."""
        if not force and state.runs_changed == self._seen:
            return set()
        self._seen = state.runs_changed
        owned = [r for r in state.open.values() if owns is None or owns(r.root_id)]
        # a child run goes in with its parent, never behind the queue its parent waited
        # in (the parent's task waits for it: queued, both would wait for ever)
        # (a parent in this log: a remote caller's lineage buys no place ahead of the queue)
        children = {r.root_id for r in owned if r.started.parent_root in state.runs}
        owned = [r for r in owned if r.root_id not in children]
        if self.limit is not None and len(owned) > self.limit:
            owned.sort(key=lambda r: r.position)  # the log's order, whoever folded it first
            owned = owned[: self.limit]
        admitted = {r.root_id for r in owned} | children
        new = admitted - self.admitted
        self.admitted = admitted
        return new

    def admits(self, root_id: str) -> bool:
        return root_id in self.admitted

    def room_for_one_more(self, state: RunState) -> bool:
        """A run submitted now is admitted for sure (fewer open runs than the limit)."""
        return self.limit is None or len(state.open) < self.limit

    def queued(self, state: RunState, owns: Callable[[str], bool] | None = None) -> list[str]:
        """The open runs waiting for admission, in the order they will be admitted."""
        self.update(state, owns, force=True)
        waiting = [
            r
            for r in state.open.values()
            if r.root_id not in self.admitted and (owns is None or owns(r.root_id))
        ]
        return [r.root_id for r in sorted(waiting, key=lambda r: r.position)]
