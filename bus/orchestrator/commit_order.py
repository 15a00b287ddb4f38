"""One decision, one write: in what order a step's decided events go to the log.

A step's decisions (``Decisions.events``: stream -> its new events) are appended
with one ``append_many``: one SQLite transaction, one JetStream atomic batch with
one acknowledgement. Inside that one write, ``Append.after`` keeps the two
promises the orchestrator used to keep by writing in turns:

* a stream a decision creates (a review or a supplementary task: its first event
  is ``task.created``) goes first, and the parent that names it goes after it, so
  the log never has a parent pointing at a child that does not exist; if the
  child is refused, the parent is not written either (its reply is decided again
  as the child's refusal says, see ``blocked``);
* what rests on a completion of this step goes after it (``Decisions.after``).

A child that already exists (``ConcurrencyError`` on its creation: an earlier try,
or another orchestrator, created it) does not hold its parent back: what it held
back is written in a second ``append_many`` (``again``), the only case in which a
decision takes two writes.

Pure functions over ``Decisions`` and the outcomes: no store, no state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from cardbus.bus.orchestrator.decisions import Decisions
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import ConcurrencyError, PrerequisiteNotStored

__all__ = ["Write", "again", "blocked", "plan_write"]


@dataclass(frozen=True, slots=True)
class Write:
    """The streams of one ``append_many``, in order, and whom each follows (by index)."""

    streams: list[str]
    after: list[tuple[int, ...]]
    needs: dict[str, set[str]] = field(default_factory=dict)  # stream -> streams it follows
    children: dict[str, list[str]] = field(default_factory=dict)  # parent -> created with it

    def is_child(self, stream: str) -> bool:
        return any(stream in kids for kids in self.children.values())


def plan_write(d: Decisions, streams: Sequence[str]) -> Write:
    """Every stream of ``streams`` whose prerequisites are decided with it, ordered so
    each comes after what it follows; a stream following one not decided is dropped
    (decided again)."""
    children: dict[str, list[str]] = {}
    for s in streams:
        first = d.events[s][0]
        if isinstance(first, ev.TaskCreated) and first.parent_id:
            children.setdefault(first.parent_id, []).append(s)
    needs = {s: set(d.after.get(s, ())) | set(children.get(s, ())) for s in streams}
    return _ordered(list(streams), needs, children)


def blocked(write: Write, outcomes: Mapping[str, BaseException | None]) -> dict[str, BaseException]:
    """Parents not written because a child they create was refused -> that refusal."""
    out: dict[str, BaseException] = {}
    for parent, kids in write.children.items():
        for kid in kids:
            error = outcomes.get(kid)
            if error is not None and not isinstance(error, ConcurrencyError):
                out[parent] = error
                break
    return out


def again(write: Write, outcomes: Mapping[str, BaseException | None]) -> Write | None:
    """What only a child that already exists held back, as a second write (None: nothing).

    A stream refused as ``PrerequisiteNotStored`` is written again when each of its
    prerequisites is stored, is such a child, or is written again with it.
    """
    held = blocked(write, outcomes)
    candidates = [
        s
        for s in write.streams
        if isinstance(outcomes.get(s), PrerequisiteNotStored) and s not in held
    ]
    if not candidates:
        return None
    existing = {
        kid
        for kids in write.children.values()
        for kid in kids
        if isinstance(outcomes.get(kid), ConcurrencyError)
    }
    needs = {
        s: {p for p in write.needs.get(s, ()) if outcomes.get(p) is not None and p not in existing}
        for s in candidates
    }
    second = _ordered(candidates, needs, {})
    return second if second.streams else None


def _ordered(
    streams: list[str], needs: dict[str, set[str]], children: dict[str, list[str]]
) -> Write:
    """``streams`` in their order, each moved after what it needs (a stable topological
    order); those needing a stream not among them, or in a cycle, are dropped."""
    kept = set(streams)
    while True:  # what lacks a prerequisite is dropped, and so is what follows it
        lacking = {s for s in kept if not needs.get(s, set()) <= kept}
        if not lacking:
            break
        kept -= lacking
    order: list[str] = []
    placed: set[str] = set()
    todo = [s for s in streams if s in kept]
    while todo:
        ready = [s for s in todo if needs.get(s, set()) <= placed]
        if not ready:
            break  # a cycle (no decision makes one): what is left is not written
        order.extend(ready)
        placed.update(ready)
        todo = [s for s in todo if s not in placed]
    index = {s: i for i, s in enumerate(order)}
    after = [tuple(sorted(index[p] for p in needs.get(s, ()))) for s in order]
    return Write(order, after, {s: needs.get(s, set()) for s in order}, children)
