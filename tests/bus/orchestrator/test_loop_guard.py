"""The orchestrator's readers read again after a failure (``bus.orchestrator.loop_guard``):
a reply reader that raised once (a bug in a transport, as uvloop's timer handle in the
NATS reply acks was) does not leave the orchestrator deaf to every later reply."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from orchkit import FAST, make_agent, plan, task

from cardbus.agents.cards import Reply
from cardbus.bus import InProcessBus, Orchestrator
from cardbus.bus.runtime.worker import AgentWorker
from cardbus.eventstore import SqliteEventStore, StoreClosed


class _RepliesThatBreakOnce(InProcessBus):
    """The first reading of the replies hands on one reply, then raises."""

    def __init__(self) -> None:
        super().__init__()
        self.readings = 0

    async def replies(self) -> AsyncIterator[Reply]:
        self.readings += 1
        first = self.readings == 1
        async for reply in super().replies():
            yield reply
            if first:
                raise RuntimeError("a bug in the transport")


async def test_replies_are_read_again_after_the_reader_raised(
    store: SqliteEventStore, caplog: pytest.LogCaptureFixture
) -> None:
    bus = _RepliesThatBreakOnce()
    orch = Orchestrator(store, bus, FAST)
    worker = AgentWorker(bus, make_agent("a"))
    await orch.start()
    try:
        await orch.register(worker.agent.card())
        await worker.start()
        with caplog.at_level(logging.ERROR, logger="cardbus.bus.orchestrator.loop_guard"):
            root = await orch.submit(plan(task("one"), task("two", deps=["one"])))
            result = await orch.wait(root, 15)
        assert result.status == "completed", result
        assert bus.readings == 2
        assert "orchestrator-replies failed" in caplog.text
        assert "a bug in the transport" in caplog.text
    finally:
        await worker.stop()
        await orch.stop()
        await bus.close()


async def test_a_closed_store_ends_the_log_reader_with_one_warning(
    db_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A store closed under a running orchestrator will not open again: its log reader
    ends, said once, instead of failing again each second until the orchestrator stops."""
    store = await SqliteEventStore.open(db_path, poll_interval=0.01)
    bus = InProcessBus()
    orch = Orchestrator(store, bus, FAST)
    with caplog.at_level(logging.WARNING, logger="cardbus.bus.orchestrator.loop_guard"):
        await orch.start()
        try:
            reader = next(t for t in orch._loops if t.get_name() == "orchestrator-log")
            await store.close()
            await asyncio.wait_for(reader, 5)
            await asyncio.sleep(1.5)  # past the pause after which a failure is read again
        finally:
            await orch.stop()
            await bus.close()
    said = [r for r in caplog.records if r.name == "cardbus.bus.orchestrator.loop_guard"]
    assert [(r.levelno, r.getMessage().split(":")[0]) for r in said] == [
        (logging.WARNING, "orchestrator-log ended")
    ], [r.getMessage() for r in said]
    with pytest.raises(StoreClosed):  # what the reader met
        await store.read_all(0, 10)
