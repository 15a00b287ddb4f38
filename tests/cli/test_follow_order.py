"""``cardbus run --follow`` prints what happened in the order it happened (tools/follow.py).

The pieces of a model answer reach :class:`Follow` on the bus at once; the call's
``model.requested`` reaches it from the log, later (it is appended while the model
works). Printed as they come, the text preceded the line saying the model was
asked. These drive a real in-process bus and hand the log's steps in by hand, in
the order that showed the bug: pieces first, then the request, then the answer.
"""

from __future__ import annotations

import asyncio

from cardbus.agents.streaming import Chunk
from cardbus.bus.transport.inprocess import InProcessBus
from cardbus.eventstore import Envelope
from cardbus.eventstore import events as ev
from cardbus.tools.follow import Follow

ROOT = "root-1"


def _env(stream: str, data: ev.Event) -> Envelope:
    return Envelope(
        event_id=f"{stream}-{id(data)}",
        stream=stream,
        version=1,
        recorded_at=0.0,
        correlation_id=ROOT,
        data=data,
    )


def _asked(task: str, attempt: int = 1) -> Envelope:
    return _env(task, ev.ModelRequested(task_id=task, agent_id="a", attempt=attempt, model="m"))


def _answered(task: str, attempt: int = 1) -> Envelope:
    data = ev.ModelAnswered(task_id=task, agent_id="a", attempt=attempt, output_tokens=3)
    return _env(task, data)


def _chunk(task: str, text: str, call: int = 1, seq: int = 0, done: bool = False) -> Chunk:
    return Chunk(task, 1, ROOT, "a", call, seq, text, done)


async def _following() -> tuple[InProcessBus, Follow, list[str]]:
    out: list[str] = []
    bus = InProcessBus()
    follow = Follow(bus, write=out.append)
    follow.root_id = ROOT
    await follow.start()
    return bus, follow, out


def test_the_text_of_a_call_comes_after_the_line_that_says_it_was_asked() -> None:
    async def go() -> str:
        bus, follow, out = await _following()
        # the bus is faster than the log: two pieces before the request is seen
        await bus.publish_chunk(_chunk("t1", "Once ", seq=0))
        await bus.publish_chunk(_chunk("t1", "upon ", seq=1))
        assert "".join(out) == ""  # nothing said yet: the call is not asked in the log
        follow.step(_asked("t1"))
        await bus.publish_chunk(_chunk("t1", "a time", seq=2))
        await bus.publish_chunk(_chunk("t1", "", seq=3, done=True))
        follow.step(_answered("t1"))
        await follow.stop()
        return "".join(out)

    text = asyncio.run(go())
    assert text.splitlines() == [
        "  t1: asks its model m",
        "  t1 writes: Once upon a time",
        "  t1: the model answered (3 tokens)",
    ]


def test_a_second_call_waits_for_its_own_request() -> None:
    async def go() -> str:
        bus, follow, out = await _following()
        follow.step(_asked("t1"))
        await bus.publish_chunk(_chunk("t1", "first", call=1))
        await bus.publish_chunk(_chunk("t1", "", call=1, seq=1, done=True))
        follow.step(_answered("t1"))
        await bus.publish_chunk(_chunk("t1", "second", call=2))  # before its request
        follow.step(_asked("t1"))
        follow.step(_answered("t1"))
        await follow.stop()
        return "".join(out)

    assert asyncio.run(go()).splitlines() == [
        "  t1: asks its model m",
        "  t1 writes: first",
        "  t1: the model answered (3 tokens)",
        "  t1: asks its model m",
        "  t1 writes: second",
        "  t1: the model answered (3 tokens)",
    ]


def test_pieces_of_two_tasks_never_share_a_line() -> None:
    async def go() -> str:
        bus, follow, out = await _following()
        follow.step(_asked("t1"))
        follow.step(_asked("t2"))
        await bus.publish_chunk(_chunk("t1", "a1 ", seq=0))
        await bus.publish_chunk(_chunk("t2", "b1 ", seq=0))
        await bus.publish_chunk(_chunk("t1", "a2", seq=1))
        await bus.publish_chunk(_chunk("t3", "never asked"))  # held: its request never seen
        await follow.stop()
        return "".join(out)

    lines = asyncio.run(go()).splitlines()
    assert lines == [
        "  t1: asks its model m",
        "  t2: asks its model m",
        "  t1 writes: a1 ",
        "  t2 writes: b1 ",
        "  t1 writes: a2",
    ]
    # a task's text, whole, is its writes: lines joined in order
    t1 = "".join(line.split(" writes: ", 1)[1] for line in lines if line.startswith("  t1 writes"))
    assert t1 == "a1 a2"


def test_other_attempts_and_other_runs_are_apart() -> None:
    async def go() -> str:
        bus, follow, out = await _following()
        follow.step(_asked("t1", attempt=1))
        await bus.publish_chunk(Chunk("t1", 2, ROOT, "a", 1, 0, "retry"))  # attempt 2: held
        await bus.publish_chunk(Chunk("t1", 1, "other-root", "a", 1, 0, "theirs"))
        follow.step(_asked("t1", attempt=2))
        await follow.stop()
        return "".join(out)

    assert asyncio.run(go()).splitlines() == [
        "  t1: asks its model m",
        "  t1: asks its model m",
        "  t1 writes: retry",
    ]
