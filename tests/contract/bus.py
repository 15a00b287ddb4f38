"""The ``Bus`` contract (``cardbus.bus.transport.interface``) as one abstract test class.

``BusContract`` needs a ``bus`` fixture: a fresh bus per test, closed afterwards,
that has, besides the interface:

* ``max_deliver``: how often a card is handed to a failing handler (3 is quick);
* ``send_raw(agent_id, data)`` and ``reply_raw(data)``: put raw bytes where a
  card or a reply would go, so the bad-bytes test can send garbage.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest

from cardbus.agents.cards import AgentCard, Announce, Reply, ResultCard, Started, TaskCard
from cardbus.bus.transport.interface import Bus

__all__ = ["BusContract", "card", "until"]


def card(i: int, **kw: Any) -> TaskCard:
    return TaskCard(task_id=f"t{i}", root_id="r", capability="c", inputs={"i": i}, **kw)


async def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "timed out waiting"
        await asyncio.sleep(0.01)


async def collect(bus: Bus, n: int, timeout: float = 10.0) -> list[Reply]:
    out: list[Reply] = []

    async def take() -> None:
        async for r in bus.replies():
            out.append(r)
            if len(out) == n:
                return

    await asyncio.wait_for(take(), timeout)
    return out


class BusContract:
    """The ``Bus`` contract as tests: subclass it and provide a ``bus`` fixture.

    The fixture yields a fresh bus per test (closed after it) with
    ``max_deliver=3`` and redelivery fast enough that a failed card comes back
    within a second or two.
    """

    pytestmark = pytest.mark.asyncio

    async def test_each_card_goes_to_one_replica(self, bus: Bus) -> None:
        seen: list[tuple[int, str]] = []

        def replica(name: str) -> Callable[[TaskCard], Awaitable[None]]:
            async def handle(c: TaskCard) -> None:
                seen.append((c.inputs["i"], name))
                await asyncio.sleep(0.01)

            return handle

        await bus.consume("a", replica("one"))
        await bus.consume("a", replica("two"))
        for i in range(20):
            await bus.send_task("a", card(i))
        await until(lambda: len(seen) >= 20)
        await asyncio.sleep(0.3)  # nothing more arrives
        assert sorted(i for i, _ in seen) == list(range(20))
        assert {name for _, name in seen} == {"one", "two"}  # work is shared

    async def test_cards_reach_only_their_agent(self, bus: Bus) -> None:
        got: dict[str, list[str]] = {"a": [], "b": []}

        async def on_a(c: TaskCard) -> None:
            got["a"].append(c.task_id)

        async def on_b(c: TaskCard) -> None:
            got["b"].append(c.task_id)

        await bus.consume("a", on_a)
        await bus.consume("b", on_b)
        await bus.send_task("a", card(1))
        await bus.send_task("b", card(2))
        await until(lambda: len(got["a"]) + len(got["b"]) == 2)
        assert got == {"a": ["t1"], "b": ["t2"]}

    async def test_a_card_sent_before_anyone_consumes_waits(self, bus: Bus) -> None:
        got: list[TaskCard] = []

        async def on_card(c: TaskCard) -> None:
            got.append(c)

        sent = card(7, traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
        await bus.send_task("late", sent)
        await bus.consume("late", on_card)
        await until(lambda: len(got) == 1)
        assert got == [sent]  # the whole card, trace context included

    async def test_a_failing_handler_gets_the_card_again(self, bus: Bus) -> None:
        calls: Counter[str] = Counter()
        done: list[str] = []

        async def flaky(c: TaskCard) -> None:
            calls[c.task_id] += 1
            if calls[c.task_id] == 1:
                raise RuntimeError("first try fails")
            done.append(c.task_id)

        await bus.consume("a", flaky)
        for i in range(3):
            await bus.send_task("a", card(i))
        await until(lambda: len(done) == 3)
        assert sorted(done) == ["t0", "t1", "t2"]
        assert all(n == 2 for n in calls.values())

    async def test_a_card_that_always_fails_is_reported_not_redelivered_forever(
        self, bus: Bus
    ) -> None:
        bad: list[tuple[str, str]] = []
        bus.on_bad_message = lambda subject, data, reason: bad.append((subject, reason))
        calls: list[str] = []

        async def broken(c: TaskCard) -> None:
            calls.append(c.task_id)
            raise RuntimeError("always")

        await bus.consume("a", broken)
        await bus.send_task("a", card(1))
        await until(lambda: len(bad) == 1)
        await asyncio.sleep(0.3)
        max_deliver = bus.max_deliver  # type: ignore[attr-defined]
        assert len(calls) == max_deliver
        assert "cardbus.agent.a" in bad[0][0]
        assert "always" in bad[0][1]

    async def test_replies_arrive_in_order(self, bus: Bus) -> None:
        sent: list[Reply] = []
        for i in range(30):
            sent.append(Started(task_id=f"t{i}", attempt=1, agent_id="a"))
            sent.append(
                ResultCard(task_id=f"t{i}", attempt=1, agent_id="a", status="completed", output=i)
            )
        sent.append(Announce(card=AgentCard(agent_id="a", name="A")))
        for r in sent:
            await bus.reply(r)
        assert await collect(bus, len(sent)) == sent

    async def test_bad_bytes_are_reported_and_the_bus_goes_on(self, bus: Bus) -> None:
        bad: list[tuple[str, bytes, str]] = []

        async def report(subject: str, data: bytes, reason: str) -> None:
            bad.append((subject, data, reason))

        bus.on_bad_message = report
        got: list[TaskCard] = []

        async def on_card(c: TaskCard) -> None:
            got.append(c)

        await bus.consume("a", on_card)
        await bus.send_raw("a", b"\xff not a card")  # type: ignore[attr-defined]
        await bus.send_raw("a", b'{"type": "task_card", "task_id": 5}')  # type: ignore[attr-defined]
        await bus.reply_raw(b"{{{")  # type: ignore[attr-defined]
        await bus.send_task("a", card(1))
        good = ResultCard(task_id="t1", attempt=1, agent_id="a", status="completed")
        await bus.reply(good)
        assert await collect(bus, 1) == [good]
        await until(lambda: len(got) == 1 and len(bad) == 3)
        assert got == [card(1)]
        subjects = sorted(s for s, _, _ in bad)
        assert subjects[0].startswith("cardbus.agent.a") and subjects[1].startswith(
            "cardbus.agent.a"
        )
        assert subjects[2].startswith("cardbus.reply")
        assert {d for _, d, _ in bad} == {
            b"\xff not a card",
            b'{"type": "task_card", "task_id": 5}',
            b"{{{",
        }
        assert all(reason for _, _, reason in bad)

    async def test_closed_bus_refuses_to_send(self, bus: Bus) -> None:
        await bus.close()
        from cardbus.eventstore.errors import BusError

        with pytest.raises(BusError):
            await bus.send_task("a", card(1))
        with contextlib.suppress(Exception):
            await bus.close()  # closing twice is fine

    async def test_agent_requests_reach_the_server_and_come_back(self, bus: Bus) -> None:
        from cardbus.agents.requests import AgentRequest, AgentResponse
        from cardbus.eventstore.errors import BusError

        req = AgentRequest(
            request_id="r1", task_id="t", attempt=1, agent_id="a", kind="tool", target="echo"
        )
        with pytest.raises(BusError):  # nobody serves yet
            await bus.request(req, timeout=0.5)
        seen: list[AgentRequest] = []

        async def serve(r: AgentRequest) -> AgentResponse:
            seen.append(r)
            if r.target == "slow":
                await asyncio.sleep(5)
            if r.target == "bug":
                raise RuntimeError("bug")
            return AgentResponse(request_id=r.request_id, ok=True, result={"echo": r.args})

        await bus.serve_requests(serve)
        asked = msgspec.structs.replace(req, args={"q": [1, "x", None]})
        answer = await bus.request(asked)
        assert answer.ok and answer.result == {"echo": {"q": [1, "x", None]}}
        assert seen == [asked]
        with pytest.raises(BusError, match="no answer"):
            await bus.request(msgspec.structs.replace(req, target="slow"), timeout=0.2)
        with pytest.raises(BusError, match="bug"):
            await bus.request(msgspec.structs.replace(req, target="bug"))
        await bus.close()
        with pytest.raises(BusError):
            await bus.request(req)

    async def test_cancel_notices_reach_only_their_agent(self, bus: Bus) -> None:
        from cardbus.agents.cards import CancelNotice

        heard: dict[str, list[CancelNotice]] = {"a": [], "a2": [], "b": []}
        await bus.watch_cancels("a", heard["a"].append)
        await bus.watch_cancels("a", heard["a2"].append)  # another replica of agent a
        await bus.watch_cancels("b", heard["b"].append)
        notice = CancelNotice(task_id="t1", attempt=2, agent_id="a", reason="why", by="ops")
        await bus.cancel_attempt(notice)
        await until(lambda: len(heard["a"]) == len(heard["a2"]) == 1)
        await bus.cancel_attempt(msgspec.structs.replace(notice, agent_id="b", task_id="t2"))
        await until(lambda: len(heard["b"]) == 1)
        # every replica of a hears its notice, as sent; b only its own
        assert heard["a"] == heard["a2"] == [notice]
        assert [n.task_id for n in heard["b"]] == ["t2"]
