"""What one step decided: ``Decisions``.

``Decider`` (``decisions``) writes into it: the events to append per stream and the
cards to send once those appends are durable; ``Orchestrator._commit`` (``commit``,
in the order ``commit_order`` gives) appends them and sends.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, field
from typing import Any

from cardbus.agents.cards import Reply, ResultCard, TaskCard
from cardbus.eventstore import events as ev

__all__ = ["Decisions"]


@dataclass
class Decisions:
    """The events to append per stream, the cards to send once they are stored, and what
    waits for the next step (replies for a stream touched here)."""

    events: dict[str, list[ev.Event]] = field(default_factory=dict)  # stream -> new events
    sends: dict[str, list[tuple[str, TaskCard]]] = field(default_factory=dict)  # stream -> cards
    deferred: list[Reply] = field(default_factory=list)  # replies for a task already touched
    busy: Set[str] = frozenset()  # streams with an append still in flight (read only)
    unroutable: list[ResultCard] = field(default_factory=list)  # results for no known task
    origins: dict[str, ResultCard] = field(default_factory=dict)  # stream -> result it records
    # Completions decided in this step, and the streams whose decisions rest on them:
    # appended after them, in the same write, and only if they were (Append.after).
    completed: dict[str, Any] = field(default_factory=dict)  # task id -> its output
    after: dict[str, set[str]] = field(default_factory=dict)  # stream -> streams it follows

    def add(self, stream: str, *events: ev.Event) -> None:
        self.events.setdefault(stream, []).extend(events)

    def touched(self, stream: str) -> bool:
        """A stream decided on in this step, or still being written: decide nothing more."""
        return stream in self.events or stream in self.busy

    def __bool__(self) -> bool:
        return bool(self.events)
