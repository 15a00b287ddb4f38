"""Whether a commit's runs are decided on again once it is settled: not for a start alone.

A part of ``Orchestrator`` (``core``, ``commit``). After each commit the decision loop
looks again at the runs it wrote to (``Changed``), for two reasons:

* what was written may let a run go on: a task cancelled or failed can end its run, a
  retry can be dispatched, a child's end moves its parent;
* a step that ran while the commit was in flight passed over its streams: they were
  busy (``Decisions.busy``, ``Decisions.touched``), so a deadline, a halt, a pause or a
  run's end that came meanwhile waits for the next look at the run.

A commit whose stored events on a stream are all ``task.started`` (an agent's ``Started``
reply, the only write of its own on a model-like agent's path: 200 ms agents, one write
in three) has neither reason on that stream, unless a step passed over it. Folded, a
start moves the attempt to running and its deadline to the start plus the task's limit
(``deadlines``), and that new deadline wakes the loop by itself (``RunState._wake``); the
other decisions that read whether an attempt started (a deadline's reason, the resend of
untaken cards) are woken by their own items (``DUE``, ``RESEND``), never by this look. So
such a stream's run is looked at again only if a step passed over the stream while it
was busy.

The passes are noted by ``NotedBusy``, the busy set a ``Decider`` reads: each read that
finds a stream busy (every ``touched`` and every ``in d.busy``) notes it. A decider made
before an await reads a copy of the busy streams, which may hold a stream whose commit
settled (and was looked at) meanwhile: a pass over that one asks for a look at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Set
from typing import cast

from cardbus.bus.orchestrator.decided import Decisions
from cardbus.eventstore import events as ev

__all__ = ["NotedBusy", "looked_again", "started_only"]


class NotedBusy(Set[str]):
    """The busy streams a decider reads (``seen``: the live set or a copy of it), noting
    in ``passed`` each one found there while its append is still in flight (in ``live``),
    and calling ``late`` for one whose append settled since the copy was taken."""

    __slots__ = ("_late", "_live", "_seen", "passed")

    def __init__(
        self, seen: Set[str], live: Set[str], passed: set[str], late: Callable[[str], None]
    ) -> None:
        self._seen = seen
        self._live = live
        self.passed = passed
        self._late = late

    def __contains__(self, stream: object) -> bool:
        if stream not in self._seen:
            return False
        if stream in self._live:
            self.passed.add(cast(str, stream))
        else:
            self._late(cast(str, stream))
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(self._seen)

    def __len__(self) -> int:
        return len(self._seen)


def started_only(d: Decisions, stored: list[str]) -> set[str]:
    """The ``stored`` streams whose decided events are all ``task.started``."""
    return {s for s in stored if all(type(e) is ev.TaskStarted for e in d.events[s])}


def looked_again(streams: list[str], quiet: set[str], passed: set[str]) -> list[str]:
    """Of a settled commit's ``streams``, those whose runs are decided on again: all but
    the ``quiet`` ones no step passed over. Forgets the passes over ``streams``."""
    again = [s for s in streams if s not in quiet or s in passed]
    passed.difference_update(streams)
    return again
