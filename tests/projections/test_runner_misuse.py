"""Misusing the projection runner is a ConfigError naming what is allowed, never a bare builtin."""

from __future__ import annotations

import sqlite3

import pytest

from cardbus.eventstore import MemoryEventStore
from cardbus.eventstore.errors import CardbusError, ConfigError
from cardbus.projections import LoopHashes, ProjectionRunner, TaskTable


def test_a_runner_needs_a_projection() -> None:
    with pytest.raises(ConfigError, match="at least one projection"):
        ProjectionRunner(MemoryEventStore(), sqlite3.connect(":memory:"), [])


def test_duplicate_projection_names_are_refused() -> None:
    with pytest.raises(ConfigError, match="duplicate projection names"):
        ProjectionRunner(
            MemoryEventStore(), sqlite3.connect(":memory:"), [TaskTable(), TaskTable()]
        )


async def test_rebuilding_an_unknown_projection_names_the_known_ones() -> None:
    runner = ProjectionRunner.open(MemoryEventStore(), ":memory:", [TaskTable(), LoopHashes()])
    with runner, pytest.raises(ConfigError, match=r"'nope' \(known: tasks, loops\)") as info:
        await runner.rebuild(["nope"])
    assert isinstance(info.value, CardbusError) and isinstance(info.value, ValueError)
