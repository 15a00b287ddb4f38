"""AgentWorker on the in-process bus: announce, Started then result, idempotency, redelivery.

Most tests build the worker with ``started_after_s=0`` so ``Started`` is always
sent (the handler has not finished at the first look); the two
``started_after`` tests pin the default behaviour without relying on timing.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from cardbus.agents import Agent, Announce, Capability, ResultCard, Started, TaskCard, TaskContext
from cardbus.agents.cards import AgentCard, CapabilitySpec, Reply
from cardbus.bus.runtime.worker import AgentWorker
from cardbus.bus.transport.inprocess import InProcessBus
from cardbus.eventstore.errors import ConfigError


class EchoIn(msgspec.Struct, frozen=True):
    text: str


class EchoOut(msgspec.Struct, frozen=True):
    text: str


class Counting(Agent):
    agent_id = "counting"
    description = "Echoes text and counts how often it ran."
    capabilities = [Capability("echo", EchoIn, EchoOut, "echo a text")]
    calls: list[tuple[str, int]] = []

    async def handle(self, task: TaskCard, inputs: EchoIn, ctx: TaskContext) -> EchoOut:
        type(self).calls.append((task.task_id, task.attempt))
        await asyncio.sleep(0.01)
        return EchoOut(text=inputs.text.upper())


def card(task_id: str = "t1", attempt: int = 1, **over: Any) -> TaskCard:
    fields: dict[str, Any] = {
        "task_id": task_id,
        "root_id": "r1",
        "capability": "echo",
        "inputs": {"text": "hi"},
        "attempt": attempt,
    }
    fields.update(over)
    return TaskCard(**fields)


@pytest.fixture
async def bus() -> AsyncIterator[InProcessBus]:
    Counting.calls = []
    b = InProcessBus(max_deliver=3)
    yield b
    await b.close()


async def take(replies: AsyncIterator[Reply], n: int, timeout: float = 2.0) -> list[Reply]:
    out: list[Reply] = []

    async def collect() -> None:
        async for r in replies:
            out.append(r)
            if len(out) == n:
                return

    await asyncio.wait_for(collect(), timeout)
    return out


async def nothing_more(replies: AsyncIterator[Reply], wait: float = 0.1) -> None:
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(anext(replies), wait)


async def test_announces_then_replies_started_then_result(bus: InProcessBus) -> None:
    worker = AgentWorker(bus, Counting, started_after_s=0)
    replies = bus.replies()
    await worker.start()
    (announce,) = await take(replies, 1)
    assert isinstance(announce, Announce)
    assert announce.online and announce.card == Counting.card()

    await bus.send_task("counting", card())
    started, result = await take(replies, 2)
    who = {"replica_id": worker.replica_id, "host": worker.host, "pid": os.getpid()}
    assert started == Started(task_id="t1", attempt=1, agent_id="counting", **who)
    assert isinstance(result, ResultCard)
    assert result.status == "completed" and result.output == {"text": "HI"}
    assert (result.task_id, result.attempt, result.agent_id) == ("t1", 1, "counting")
    assert (result.replica_id, result.pid, result.delivery) == (worker.replica_id, os.getpid(), 1)
    assert worker.handled == 1
    await worker.stop()
    (offline,) = await take(replies, 1)  # stopping: the replica says it goes
    assert isinstance(offline, Announce) and not offline.online
    assert offline.replica_id == worker.replica_id == announce.replica_id


async def test_renews_its_lease_every_third_of_it(bus: InProcessBus) -> None:
    worker = AgentWorker(bus, Counting, lease_s=0.3)
    replies = bus.replies()
    await worker.start()
    first, second, third = await take(replies, 3)
    assert all(
        isinstance(a, Announce) and a.online and a.lease_s == 0.3 for a in (first, second, third)
    )
    await worker.stop(announce=False)


async def test_a_handler_that_ended_leaves_no_cancel_check_to_wake_the_worker(
    bus: InProcessBus,
) -> None:
    # the attempt.live round was a task's sleep: an idle worker woke once more,
    # cancel_check_s after its last card began; the last handler ending now cancels it
    worker = AgentWorker(bus, Counting, lease_s=0, started_after_s=1.0, cancel_check_s=5.0)
    replies = bus.replies()
    await worker.start()
    await take(replies, 1)  # the announcement
    await bus.send_task("counting", card())
    (result,) = await take(replies, 1)
    assert isinstance(result, ResultCard) and result.status == "completed"
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("cancels-")]
    assert getattr(worker, "_check_at", None) is None  # no timer either
    await worker.stop(announce=False)


class SlowRenewals(InProcessBus):
    """A bus whose lease renewals wait in it until let go (a renewal on its way)."""

    def __init__(self) -> None:
        super().__init__()
        self.let_go = asyncio.Event()
        self.waiting = asyncio.Event()

    async def reply(self, message: Reply) -> None:
        if isinstance(message, Announce) and message.online and message.renewal > 1:
            self.waiting.set()
            await self.let_go.wait()
        await super().reply(message)


async def test_a_renewal_on_its_way_goes_out_before_the_offline_announcement() -> None:
    # another worker keeps the round (and its task) going: the renewal held in the bus is
    # sent, and the stopping worker's offline announcement only after it
    bus = SlowRenewals()
    worker = AgentWorker(bus, Counting, lease_s=0.3)
    other = AgentWorker(bus, Gated, lease_s=0.3)
    replies = bus.replies()
    try:
        await worker.start()
        await other.start()
        await asyncio.wait_for(bus.waiting.wait(), 2)  # the first renewal, held in the bus
        stopping = asyncio.ensure_future(worker.stop())
        await asyncio.sleep(0.05)
        assert not stopping.done()  # it waits for the renewal on its way
        bus.let_go.set()
        await asyncio.wait_for(stopping, 2)
        said = [a for a in await take(replies, 6) if a.card.agent_id == "counting"]  # type: ignore[union-attr]
        assert [(a.online, a.renewal) for a in said] == [  # type: ignore[union-attr]
            (True, 1),
            (True, 2),
            (False, 3),
        ]
        await other.stop(announce=False)
    finally:
        await bus.close()


class Gated(Agent):
    """Answers only once its gate opens: running as long as the test wants."""

    agent_id = "gated"
    description = "Echoes text when let."
    capabilities = [Capability("echo", EchoIn, EchoOut, "echo a text")]
    gate = asyncio.Event()

    async def handle(self, task: TaskCard, inputs: EchoIn, ctx: TaskContext) -> EchoOut:
        await type(self).gate.wait()
        return EchoOut(text=inputs.text)


async def test_an_answer_within_started_after_needs_no_started(bus: InProcessBus) -> None:
    Gated.gate = asyncio.Event()
    Gated.gate.set()  # answers at once
    replies = bus.replies()
    await AgentWorker(bus, Gated, started_after_s=30).start()
    await take(replies, 1)
    await bus.send_task("gated", card())
    (result,) = await take(replies, 1)
    assert isinstance(result, ResultCard) and result.status == "completed"
    await nothing_more(replies)


async def test_a_handler_still_running_after_started_after_sends_started(
    bus: InProcessBus,
) -> None:
    Gated.gate = asyncio.Event()
    replies = bus.replies()
    worker = AgentWorker(bus, Gated, started_after_s=0.001)
    await worker.start()
    await take(replies, 1)
    await bus.send_task("gated", card())
    (started,) = await take(replies, 1)  # while the handler is still waiting on its gate
    assert (started.task_id, started.attempt, started.agent_id) == ("t1", 1, "gated")
    assert isinstance(started, Started) and started.replica_id == worker.replica_id
    Gated.gate.set()
    (result,) = await take(replies, 1)
    assert isinstance(result, ResultCard) and result.output == {"text": "hi"}


async def test_rejection_and_failure_travel_as_result_cards(bus: InProcessBus) -> None:
    replies = bus.replies()
    await AgentWorker(bus, Counting, started_after_s=0).start()
    await take(replies, 1)
    await bus.send_task("counting", card("t1", capability="translate"))
    await bus.send_task("counting", card("t2", inputs={"text": 5}))
    got = [r for r in await take(replies, 4) if isinstance(r, ResultCard)]
    assert [(r.task_id, r.status, r.reason) for r in got] == [
        ("t1", "rejected", "out_of_capability"),
        ("t2", "rejected", "input_schema_mismatch"),
    ]
    assert Counting.calls == []


async def test_a_redelivered_card_is_answered_from_cache(bus: InProcessBus) -> None:
    worker = AgentWorker(bus, Counting, started_after_s=0)
    replies = bus.replies()
    await worker.start()
    await take(replies, 1)

    await bus.send_task("counting", card())
    _, first = await take(replies, 2)
    await bus.send_task("counting", card())  # the same (task_id, attempt) again
    (again,) = await take(replies, 1)  # no second Started: only the answer
    assert again == first
    assert Counting.calls == [("t1", 1)]
    assert worker.handled == 1

    await bus.send_task("counting", card(attempt=2))  # a new attempt does run
    started, second = await take(replies, 2)
    assert isinstance(started, Started) and started.attempt == 2
    assert isinstance(second, ResultCard) and second.attempt == 2
    assert Counting.calls == [("t1", 1), ("t1", 2)]
    await nothing_more(replies)


async def test_concurrent_duplicates_run_once(bus: InProcessBus) -> None:
    worker = AgentWorker(bus, Counting, concurrency=3, started_after_s=0)
    replies = bus.replies()
    await worker.start()
    await take(replies, 1)
    for _ in range(3):  # three replicas pick up the same card at the same time
        await bus.send_task("counting", card())
    got = await take(replies, 4)
    results = [r for r in got if isinstance(r, ResultCard)]
    assert len(results) == 3 and len({msgspec.json.encode(r) for r in results}) == 1
    assert sum(isinstance(r, Started) for r in got) == 1
    assert Counting.calls == [("t1", 1)]


class FlakyReplyBus(InProcessBus):
    """A bus whose first ``fail`` result replies raise, like a broken connection."""

    def __init__(self, fail: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.fail = fail

    async def reply(self, message: Reply) -> None:
        if isinstance(message, ResultCard) and self.fail > 0:
            self.fail -= 1
            raise ConnectionError("reply lost")
        await super().reply(message)


async def test_a_failing_consumer_gets_the_card_again_and_the_cached_answer() -> None:
    Counting.calls = []
    bus = FlakyReplyBus(fail=2, max_deliver=5)
    try:
        replies = bus.replies()
        await AgentWorker(bus, Counting, started_after_s=0).start()
        await take(replies, 1)
        await bus.send_task("counting", card())
        started, result = await take(replies, 2)
        assert isinstance(started, Started)
        assert isinstance(result, ResultCard) and result.status == "completed"
        assert Counting.calls == [("t1", 1)]  # redelivered twice, run once
    finally:
        await bus.close()


async def test_a_raising_handler_is_redelivered_up_to_max_deliver(bus: InProcessBus) -> None:
    bad: list[tuple[str, bytes, str]] = []
    seen: list[TaskCard] = []
    gave_up = asyncio.Event()

    async def handler(c: TaskCard) -> None:
        seen.append(c)
        raise RuntimeError("handler bug")

    async def on_bad(subject: str, data: bytes, reason: str) -> None:
        bad.append((subject, data, reason))
        gave_up.set()

    bus.on_bad_message = on_bad
    await bus.consume("flaky", handler)
    await bus.send_task("flaky", card())
    await asyncio.wait_for(gave_up.wait(), 2)
    assert len(seen) == bus.max_deliver == 3
    # the same card each time, but for its delivery count (the worker reports it)
    assert [c.delivery for c in seen] == [1, 2, 3]
    assert all(msgspec.structs.replace(c, delivery=1) == card() for c in seen)
    ((subject, data, reason),) = bad
    assert data == msgspec.json.encode(card())
    assert subject == "cardbus.agent.flaky"
    assert "3 times" in reason and "handler bug" in reason

    # the consumer survived: the next card is handled
    ok = asyncio.Event()

    async def good(c: TaskCard) -> None:
        ok.set()

    await bus.consume("fine", good)
    await bus.send_task("fine", card("t2"))
    await asyncio.wait_for(ok.wait(), 2)


@pytest.mark.parametrize(
    "data",
    [b"", b"garbage", b"{}", b'{"type":"task_card","task_id":1}', b"\xff\x00", b"[1,2,3]"],
)
async def test_malformed_bytes_reach_on_bad_message(bus: InProcessBus, data: bytes) -> None:
    bad: list[tuple[str, bytes, str]] = []
    bus.on_bad_message = lambda subject, raw, reason: bad.append((subject, raw, reason))
    worker = AgentWorker(bus, Counting, started_after_s=0)
    replies = bus.replies()
    await worker.start()
    await take(replies, 1)

    await bus.send_raw("counting", data)
    await bus.send_task("counting", card())  # the worker goes on with good cards
    started, result = await take(replies, 2)
    assert isinstance(started, Started)
    assert isinstance(result, ResultCard) and result.status == "completed"
    ((subject, raw, reason),) = bad
    assert subject == "cardbus.agent.counting"
    assert raw == data
    assert "invalid task card" in reason
    assert Counting.calls == [("t1", 1)]


async def test_malformed_reply_bytes_reach_on_bad_message(bus: InProcessBus) -> None:
    bad: list[str] = []
    bus.on_bad_message = lambda subject, raw, reason: bad.append(subject)
    replies = bus.replies()
    await bus.reply_raw(b"not a reply")
    await bus.reply(Started(task_id="t", attempt=1, agent_id="a"))
    (r,) = await take(replies, 1)
    assert isinstance(r, Started)
    assert bad == ["cardbus.reply"]


async def test_a_duplicate_waiting_on_an_abandoned_run_gets_an_error_not_a_cancel() -> None:
    """The first delivery's run is cancelled mid-way; the duplicate waiting on it must
    see an ordinary exception (so its consumer redelivers), not CancelledError."""
    from cardbus.eventstore.errors import BusError

    class Hanging(Agent):
        agent_id = "hanging"
        description = "never answers"
        capabilities = [Capability("echo", EchoIn, EchoOut, "echo")]

        async def handle(self, task: TaskCard, inputs: EchoIn, ctx: TaskContext) -> EchoOut:
            await asyncio.sleep(60)
            raise AssertionError("unreachable")

    b = InProcessBus()
    try:
        worker = AgentWorker(b, Hanging)
        first = asyncio.ensure_future(worker._on_card(card()))
        await asyncio.sleep(0.05)  # the first delivery is running the handler
        duplicate = asyncio.ensure_future(worker._on_card(card()))
        await asyncio.sleep(0.05)  # the duplicate waits on the same run
        first.cancel()
        with pytest.raises(BusError):
            await asyncio.wait_for(duplicate, 2)
        assert not duplicate.cancelled()
    finally:
        await b.close()


class GatedAtOnce(Gated):
    started_after_s = 0.0


class GatedLate(Gated):
    started_after_s = 30.0


async def test_the_agents_own_started_after_is_the_one_its_worker_keeps(
    bus: InProcessBus,
) -> None:
    # the class says 0: reported started at once, though the worker's default waits 30 s
    Gated.gate = asyncio.Event()
    replies = bus.replies()
    await AgentWorker(bus, GatedAtOnce, started_after_s=30).start()
    await take(replies, 1)
    await bus.send_task("gated", card())
    (started,) = await take(replies, 1)  # while the handler still waits on its gate
    assert isinstance(started, Started)
    Gated.gate.set()
    (result,) = await take(replies, 1)
    assert isinstance(result, ResultCard) and result.status == "completed"


async def test_an_agent_that_says_30_s_is_not_reported_started_at_the_workers_default(
    bus: InProcessBus,
) -> None:
    Gated.gate = asyncio.Event()
    replies = bus.replies()
    await AgentWorker(bus, GatedLate, started_after_s=0.001).start()
    await take(replies, 1)
    await bus.send_task("gated", card())
    # the handler runs 0.2 s: past the worker's 0.001 s, well within the agent's 30 s
    asyncio.get_running_loop().call_later(0.2, Gated.gate.set)
    (first,) = await take(replies, 1)
    assert isinstance(first, ResultCard) and first.status == "completed"
    await nothing_more(replies)


@pytest.mark.parametrize("bad", [-1, "soon", True, float("nan")])
def test_a_started_after_that_is_not_a_duration_is_a_config_error(
    bus: InProcessBus, bad: Any
) -> None:
    class Odd(Gated):
        started_after_s = bad

    with pytest.raises(ConfigError, match="started_after_s must be a number >= 0"):
        AgentWorker(bus, Odd)


async def test_a_card_whose_schema_is_not_json_schema_stops_the_worker_at_start(
    bus: InProcessBus,
) -> None:
    """A card written by hand (or imported) with a schema that is not a JSON Schema: the
    orchestrator would leave the capability out; the worker says so before announcing."""

    class HandWritten(Counting):
        agent_id = "hand-written"

        @classmethod
        def card(cls) -> AgentCard:
            spec = CapabilitySpec(name="echo", input_schema={"type": "object", "required": "text"})
            return msgspec.structs.replace(super().card(), capabilities=[spec])

    replies = bus.replies()
    with pytest.raises(ConfigError, match="capability 'echo': input_schema is not a JSON Schema"):
        await AgentWorker(bus, HandWritten).start()
    await nothing_more(replies)  # nothing announced
