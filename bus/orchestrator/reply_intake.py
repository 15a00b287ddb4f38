"""A reply or a request's record taken into a step: decided now, or held for its stream.

A part of ``Orchestrator`` (``core``: ``_step``). A reply or a ``Record`` for a stream
with an append of ours in flight (``_busy``) cannot be decided on yet: the decision
would rest on the version that append is about to change. At 1,000 runs of 200 ms
agents in flight that is the common case for a result: it arrives while its attempt's
``task.started`` is being written. Such an item is held for *that* stream
(``HeldForStream``) without being decided, and goes back to the queue when the stream's
commit settles (``Committing._commit``), to be decided once, on the state that commit
left. An item a step itself defers (``Decisions.deferred``: its stream decided on in the
same step) is held the same way once the step's commit has made the stream busy.

Before, the decider looked at such a result, deferred it to one list that every commit
emptied back into the queue, whichever streams it wrote, and the result was decided on
again, often while its stream was still busy: 1.9-2.1 result decisions per step at
1,000 in flight instead of 1 (``ReplyCounts``, printed by ``bench/step_profile.py``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from cardbus.agents.cards import ResultCard
from cardbus.bus.orchestrator.decisions import Decider
from cardbus.bus.orchestrator.intake import Intake
from cardbus.bus.orchestrator.loop_items import Record

__all__ = ["HeldForStream", "ReplyCounts", "ReplyTaking"]


@dataclass
class ReplyCounts:
    """How often results were looked at: a bench figure (``bench/step_profile.py``)."""

    results_decided: int = 0  # results handed to the decider (deferred ones included)
    results_deferred: int = 0  # of those, deferred by it (their stream decided on there)
    results_held: int = 0  # results held for a busy stream before the decider saw them


class HeldForStream:
    """Items waiting for the append in flight on their stream, by stream."""

    __slots__ = ("_by_stream",)

    def __init__(self) -> None:
        self._by_stream: dict[str, list[object]] = {}

    def hold(self, stream: str, item: object) -> None:
        self._by_stream.setdefault(stream, []).append(item)

    def release(self, streams: Iterable[str]) -> list[object]:
        """The items held for ``streams`` (whose commit settled), in arrival order."""
        out: list[object] = []
        for stream in streams:
            out.extend(self._by_stream.pop(stream, ()))
        return out

    def __len__(self) -> int:
        return sum(map(len, self._by_stream.values()))


class ReplyTaking(Intake):
    """Replies and records into a step's decider, or held (state: ``Orchestrator``)."""

    foreign_replies: deque[tuple[float, object]]
    reply_counts: ReplyCounts
    _busy: set[str]
    _held_for: HeldForStream
    _parked: list[object]
    _records: dict[str, list[Record]]

    def _take_record(self, decider: Decider, item: Record) -> None:
        if item.stream in self._busy:
            self._held_for.hold(item.stream, item)  # after the stream's append in flight
        elif decider.d.touched(item.stream):
            self._parked.append(item)  # decided on in this step: after its commit
        else:
            decider.d.add(item.stream, *item.events)
            self._records.setdefault(item.stream, []).append(item)

    def _take_reply(self, decider: Decider, item: object, handled: list[object]) -> None:
        """Decide on an agent's reply (``handled``: to settle once committed), unless
        another member owns its run or its task's stream has an append in flight."""
        if self.owns is not None and not self._reply_owned(item):
            self.foreign_replies.append((time.monotonic(), item))  # another decides it
            return
        self._alive(item)
        is_result = type(item) is ResultCard
        if getattr(item, "task_id", None) in self._busy:
            self._held_for.hold(item.task_id, item)  # type: ignore[attr-defined]
            self.reply_counts.results_held += is_result
            return
        # no advance for it (but for a completion, in the step): the reply's events
        # change the state only once appended, and their commit marks the run
        deferred = len(decider.d.deferred)
        decider.on_reply(item)  # type: ignore[arg-type]
        if is_result:
            self.reply_counts.results_decided += 1
            self.reply_counts.results_deferred += len(decider.d.deferred) > deferred
        handled.append(item)

    def _hold_deferred(self, deferred: Iterable[object]) -> None:
        """After the step's commit began: the replies it deferred wait for their stream's
        commit, or (its append settled during the step) for the next commit to end."""
        for item in deferred:
            stream = getattr(item, "task_id", "")
            if stream in self._busy:
                self._held_for.hold(stream, item)
            else:
                self._parked.append(item)
