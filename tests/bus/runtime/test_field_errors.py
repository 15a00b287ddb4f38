"""Failure reasons name the field and the reason (issue 15, item 7), read back from the log."""

from __future__ import annotations

from typing import Any

import msgspec

from cardbus import Agent, Capability, EmbeddedRuntime, MemoryEventStore, TaskCard, TaskContext
from cardbus.eventstore.events import TaskFailed


class Ask(msgspec.Struct):
    text: str


class Where(msgspec.Struct):
    region: str
    zone: str | None = None


class Sloppy(Agent):
    """Answers a dict that breaks its own output type (region is an int)."""

    agent_id = "sloppy"
    capabilities = [Capability("locate", Ask, Where, "locate a text")]

    async def handle(self, task: TaskCard, inputs: Ask, ctx: TaskContext) -> Any:
        return {"region": 5, "zone": 7}


async def test_an_output_of_the_wrong_type_fails_naming_each_field() -> None:
    store = MemoryEventStore()
    async with EmbeddedRuntime(store, [Sloppy]) as rt:
        plan = {
            "goal": "locate",
            "tasks": [
                {"id": "l", "capability": "locate", "inputs": {"text": "x"}, "max_attempts": 1}
            ],
        }
        result = await rt.run(plan)
        events = await store.read_correlation(result.root_id)
    assert result.status == "failed"
    (failed,) = [e.data for e in events if isinstance(e.data, TaskFailed)]
    assert failed.reason == "output_schema_mismatch"
    assert "$.region: expected str, got int" in failed.error
    assert "$.zone: expected str or None, got int" in failed.error
