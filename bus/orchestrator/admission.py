"""Admission: how many runs an orchestrator has in flight, and which wait their turn.

Submitting a run writes it to the log (``plan.submitted``, ``run.started``, its tasks'
``task.created``): that is the durable queue. The runs *in flight* are the first
``Policy.max_runs_in_flight`` open runs this orchestrator decides (``owns``), by their
priority (``Plan.priority``, aged: ``admission_order``) and then the order of their
``run.started`` in the log; a run in flight stays in flight. The others are queued:
nothing of them is dispatched until a run ahead of them ends and they move up. So
admission is derived from the log alone (no event of its own): a restart, or another
member taking the partition over, admits the same runs in the same order (after a
restart the places are filled afresh by that order, so a run that was in flight may
queue behind a higher priority).

A child run (``bus.orchestrator.child_runs``) is not counted and never queued: its
parent, admitted, waits for it.

Only the decisions wait: replies for a queued run's tasks (there are none: nothing was
sent) and events others write for it are folded as ever.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from cardbus.bus.orchestrator.runstate import RunState, RunView

__all__ = ["AGING_RUNS", "Admission", "admission_order"]

#: a queued run gains one priority for every AGING_RUNS runs of a higher priority started
#: after it (that could overtake it), so a stream of urgent runs never starves a low one
#: for ever; runs of its own priority or lower do not age it (they queue behind it
#: anyway). Aging is counted in the log's runs, not in seconds: the order stays
#: derivable from the log alone.
AGING_RUNS = 500


def admission_order(runs: list[RunView]) -> list[RunView]:
    """Waiting runs in the order they are admitted: the highest aged priority first, then
    the log's order (``run.started``'s position)."""
    by_position = sorted(runs, key=lambda r: r.position)
    if len({r.started.priority for r in by_position}) < 2:
        return by_position  # one priority: no run overtakes another, none ages
    aged: dict[int, float] = {}
    later: Counter[int] = Counter()  # priorities of the runs started after this one
    for run in reversed(by_position):
        own = run.started.priority
        overtaking = sum(n for p, n in later.items() if p > own)
        aged[id(run)] = own + overtaking / AGING_RUNS
        later[own] += 1
    return sorted(by_position, key=lambda r: (-aged[id(r)], r.position))


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
            # a run in flight stays in flight; the free places go by priority, then the
            # log's order (whoever folded it first)
            staying = [r for r in owned if r.root_id in self.admitted][: self.limit]
            free = self.limit - len(staying)
            if free:  # no place free: the waiting runs' order does not matter yet
                waiting = [r for r in owned if r.root_id not in self.admitted]
                staying += admission_order(waiting)[:free]
            owned = staying
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
        return [r.root_id for r in admission_order(waiting)]
