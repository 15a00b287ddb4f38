"""Time travel: any projection as it was at a global position or a moment.

``AsOf.parse("1234")`` is a position; ``AsOf.parse("2026-11-29T23:40:00Z")``
(any ISO 8601 form; a naive one is UTC) is a moment. :func:`build_as_of`
folds the events up to that point into a throw-away in-memory SQLite model
and returns its runner, whose ``conn`` the projections' query methods read.
A moment selects the events *recorded* at or before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import msgspec

from cardbus.eventstore.envelope import Envelope
from cardbus.eventstore.errors import ValidationError
from cardbus.eventstore.store import EventStore
from cardbus.projections.base import Projection
from cardbus.projections.runner import ProjectionRunner

__all__ = ["AsOf", "build_as_of"]


class AsOf(msgspec.Struct, frozen=True):
    """A point in the log: ``position`` (global) or ``timestamp`` (unix seconds)."""

    position: int | None = None
    timestamp: float | None = None

    @classmethod
    def parse(cls, text: str) -> AsOf:
        text = text.strip()
        if text.isdigit():
            return cls(position=int(text))
        try:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise ValidationError(
                f"--as-of must be a position (an integer) or an ISO 8601 time, not {text!r}"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return cls(timestamp=moment.timestamp())

    def includes(self, env: Envelope) -> bool:
        if self.position is not None and env.position > self.position:
            return False
        return not (self.timestamp is not None and env.recorded_at > self.timestamp)

    def describe(self) -> str:
        if self.position is not None:
            return f"position {self.position}"
        assert self.timestamp is not None
        return datetime.fromtimestamp(self.timestamp, UTC).isoformat()


async def build_as_of(
    store: EventStore, as_of: AsOf, projections: Sequence[Projection] | None = None
) -> ProjectionRunner:
    """A runner over a fresh in-memory model folded up to ``as_of``; close it when done."""
    runner = ProjectionRunner.open(store, ":memory:", projections)
    await runner.catch_up(until_position=as_of.position, until_time=as_of.timestamp)
    return runner
