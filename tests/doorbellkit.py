"""Counting what a NATS doorbell (``eventstore.nats.doorbell``) is asked in a test: the
follower's and the partitioned member's tests share it."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from cardbus.eventstore.nats import doorbell

__all__ = ["DoorbellCounts", "count_doorbell"]


@dataclass
class DoorbellCounts:
    arms: list[int] = field(default_factory=list)  # each arming's start position
    asked: list[str | None] = field(default_factory=list)  # the consumer of each ask again


def count_doorbell(monkeypatch: pytest.MonkeyPatch) -> DoorbellCounts:
    """Every doorbell's ``arm`` and ``again`` counted (and done) while the test runs."""
    counts = DoorbellCounts()
    arm, again = doorbell.Doorbell.arm, doorbell.Doorbell.again

    async def counted_arm(self: doorbell.Doorbell, start: int, expires: float) -> int:
        counts.arms.append(start)
        return await arm(self, start, expires)

    async def counted_again(self: doorbell.Doorbell, expires: float) -> None:
        counts.asked.append(self.consumer)
        await again(self, expires)

    monkeypatch.setattr(doorbell.Doorbell, "arm", counted_arm)
    monkeypatch.setattr(doorbell.Doorbell, "again", counted_again)
    return counts
