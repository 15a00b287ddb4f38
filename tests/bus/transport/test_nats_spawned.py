"""A task the NATS bus spawns (an agent's pull loop, a card's run, an ack) that fails says
so at once, by name, in the bus's log: not only when the task is collected, if ever.
A real nats-server (tests/conftest.py)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from cardbus.bus.transport.nats import NatsBus


async def test_a_spawned_task_that_fails_is_logged_at_once(
    nats_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    bus = await NatsBus.connect(nats_url)

    async def broken() -> None:
        raise RuntimeError("a bug in a spawned task")

    async def fine() -> None:
        await asyncio.sleep(0)

    try:
        with caplog.at_level(logging.ERROR, logger="cardbus.bus.transport.nats"):
            bus._spawn(broken(), "probe")
            bus._spawn(fine(), "quiet")
            for _ in range(3):
                await asyncio.sleep(0)
        failed = [r for r in caplog.records if r.name == "cardbus.bus.transport.nats"]
        assert [r.getMessage() for r in failed] == ["probe failed"]
        assert failed[0].exc_info is not None
        assert "a bug in a spawned task" in str(failed[0].exc_info[1])
        assert not bus._tasks  # both ended and forgotten
    finally:
        await bus.close()
