"""InProcessBus.consume_many: one consumer entry with n slots (issue 34), as n consumers."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from cardbus.agents.cards import TaskCard
from cardbus.bus.transport.inprocess import InProcessBus
from cardbus.eventstore.errors import BusError
from cardbus.testing.bus import card

CARD_ID: contextvars.ContextVar[str] = contextvars.ContextVar("CARD_ID", default="")


async def settle() -> None:
    """Let every ready task run up to its next real wait (in process: no I/O)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def test_at_most_n_cards_run_at_once_and_the_rest_follow() -> None:
    bus = InProcessBus()
    gate = asyncio.Event()
    running: list[str] = []
    done: list[str] = []

    async def handler(c: TaskCard) -> None:
        running.append(c.task_id)
        await gate.wait()
        done.append(c.task_id)

    await bus.consume_many("a", handler, 3)
    for i in range(5):
        await bus.send_task("a", card(i))
    await settle()
    assert running == ["t0", "t1", "t2"]  # three slots: the other two wait in the inbox
    gate.set()
    await settle()
    assert sorted(done) == [f"t{i}" for i in range(5)]
    await bus.close()


async def test_cards_running_at_once_do_not_share_a_context() -> None:
    bus = InProcessBus()
    gate = asyncio.Event()
    seen: dict[str, str] = {}

    async def handler(c: TaskCard) -> None:
        CARD_ID.set(c.task_id)  # as the worker sets RUN_CLOCK per card
        await gate.wait()
        seen[c.task_id] = CARD_ID.get()

    await bus.consume_many("a", handler, 4)
    for i in range(4):
        await bus.send_task("a", card(i))
    await settle()
    gate.set()
    await settle()
    assert seen == {f"t{i}": f"t{i}" for i in range(4)}
    await bus.close()


async def test_replicas_with_slots_take_cards_in_turn() -> None:
    bus = InProcessBus()
    gate = asyncio.Event()
    taken: list[str] = []

    def replica(name: str):  # type: ignore[no-untyped-def]
        async def handler(c: TaskCard) -> None:
            taken.append(name)
            await gate.wait()

        return handler

    await bus.consume_many("a", replica("A"), 2)
    await bus.consume_many("a", replica("B"), 2)
    for i in range(4):
        await bus.send_task("a", card(i))
    await settle()
    assert taken == ["A", "B", "A", "B"]
    gate.set()
    await bus.close()


async def test_a_slot_count_below_one_is_refused() -> None:
    bus = InProcessBus()

    async def handler(c: TaskCard) -> None:
        return None

    with pytest.raises(BusError):
        await bus.consume_many("a", handler, 0)
    await bus.close()
