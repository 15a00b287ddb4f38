"""Malformed and oversized messages on every cardbus subject: a clear error or a failure
event, a dead letter with the reason, never a crash and never a silent loss."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from natsprocs import FAST_BUS, N, Quick, read_log, until
from natsserver import NatsServer

from cardbus.agents import Agent, Capability
from cardbus.agents.cards import TaskCard
from cardbus.bus.orchestrator.plan import Plan, PlanTask
from cardbus.bus.runtime.nats import NatsRuntime, serve_agents
from cardbus.bus.transport.nats import DEAD_STREAM, REASON_HEADER, SUBJECT_HEADER, NatsBus, header
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import DecodeError, PayloadTooLarge
from cardbus.eventstore.nats import NatsEventStore
from cardbus.eventstore.nats.connection import NatsOptions

BIG = 2 * 1024 * 1024  # over the bus's 1 MiB limit, under the test server's max_payload


class Big(msgspec.Struct):
    blob: str


class Huge(Agent):
    agent_id = "huge"
    description = "answers with two megabytes"
    capabilities = [Capability("huge", N, Big, "too much")]

    async def handle(self, task, inputs, ctx):  # type: ignore[no-untyped-def]
        return Big(blob="x" * BIG)


async def dead_letters(url: str) -> list[tuple[str, str, int]]:
    """(original subject, reason, size) of every dead letter."""
    nc = await NatsOptions(url=url).connect("dead-reader")
    try:
        sub = await nc.jetstream().pull_subscribe("cardbus.dead.>", stream=DEAD_STREAM)
        out = []
        try:
            while True:
                for m in await sub.fetch(100, timeout=0.5):
                    out.append(
                        (
                            header(m, SUBJECT_HEADER) or "",
                            header(m, REASON_HEADER) or "",
                            len(m.data),
                        )
                    )
        except TimeoutError:
            return out
    finally:
        await nc.close()


async def test_bad_messages_on_inbox_and_reply_subjects(nats_server: NatsServer) -> None:
    url = nats_server.url
    stop, ready = asyncio.Event(), asyncio.Event()
    serving = asyncio.create_task(
        serve_agents(NatsOptions(url=url), [Quick, Huge], stop, bus_options=FAST_BUS, ready=ready)
    )
    try:
        await asyncio.wait_for(ready.wait(), 10)
        async with NatsRuntime(NatsOptions(url=url), bus_options=FAST_BUS) as rt:
            raw = rt.bus
            await raw.send_raw("quick", b"\x00\x01 not json")  # malformed card
            await raw.send_raw("quick", b'{"type": "task_card"}')  # well-formed, invalid
            await raw.send_raw("quick", b"[" * 10 + b" " * BIG)  # oversized card
            await raw.reply_raw(b"}{", "cardbus.reply.nobody")  # malformed reply
            await raw.reply_raw(b" " * BIG, "cardbus.reply.nobody")  # oversized reply
            # an oversized card is refused when sent, with a typed error
            with pytest.raises(PayloadTooLarge):
                big_card = TaskCard(task_id="t", root_id="r", capability="quick", goal="x" * BIG)
                await raw.send_task("quick", big_card)

            # the bus goes on: a run still completes
            ok = Plan(goal="after", tasks=[PlanTask(id="a", capability="quick", inputs={"n": 1})])
            done = await rt.run(ok, timeout=20, agent_timeout=10)
            assert done.status == "completed" and done.outputs["a"] == {"n": 2}

            # a result too large for the bus becomes a failure event with the reason
            huge = Plan(
                goal="too big",
                tasks=[PlanTask(id="h", capability="huge", inputs={"n": 1}, max_attempts=1)],
            )
            failed = await rt.run(huge, timeout=20, agent_timeout=10)
            assert failed.status == "failed"

            await until(lambda: len(rt.orchestrator.bad_messages) >= 2, what="bad replies")
            reported = rt.orchestrator.bad_messages
            assert all(subject == "cardbus.reply.nobody" for subject, _ in reported[:2])
            assert any("too large" in reason for _, reason in reported)
    finally:
        stop.set()
        await serving
    events = await read_log(url)
    results = [
        e.data
        for e in events
        if e.correlation_id == failed.root_id and isinstance(e.data, ev.TaskResultSubmitted)
    ]
    assert results and results[0].status == "failed"
    assert "too large" in (results[0].error or "")
    assert any(
        isinstance(e.data, ev.TaskFailed) for e in events if e.correlation_id == failed.root_id
    )

    letters = await dead_letters(url)
    by_subject = sorted((s, r) for s, r, _ in letters)
    inbox = [r for s, r in by_subject if s == "cardbus.agent.quick"]
    replies = [r for s, r in by_subject if s == "cardbus.reply.nobody"]
    assert len(inbox) == 3 and len(replies) == 2, by_subject
    assert sum("too large" in r for r in inbox) == 1
    assert sum("too large" in r for r in replies) == 1
    assert all(r for r in inbox + replies)  # every one says why


async def test_a_malformed_message_on_the_event_subjects_is_a_clear_error(
    nats_server: NatsServer,
) -> None:
    """Only the orchestrator may publish there (see the permissions); if garbage gets in
    anyway, reading the log says exactly where, and verify reports it."""
    url = nats_server.url
    store = await NatsEventStore.connect(url)
    try:
        await store.nc.jetstream().publish(
            "cardbus.evt.t1.r1.x", b"garbage", stream="CARDBUS_EVENTS"
        )
        with pytest.raises(DecodeError, match="malformed"):
            await store.read_all(0, 10)
        problems = await store.verify()
        assert [(p.stream, p.position) for p in problems] == [("t1", 1)]
        assert "undecodable" in problems[0].problem
        # an orchestrator refuses to start on a log it cannot read, with that error
        with pytest.raises(DecodeError):
            async with NatsRuntime(NatsOptions(url=url)):
                pass
    finally:
        await store.close()


async def test_oversized_publish_beyond_the_server_limit_is_a_typed_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    server = NatsServer(tmp_path / "small", max_payload=64 * 1024).start()
    try:
        bus = await NatsBus.connect(server.url, **FAST_BUS)
        try:
            with pytest.raises(PayloadTooLarge):
                await bus.send_raw("quick", b"x" * (100 * 1024))
        finally:
            await bus.close()
    finally:
        server.stop()


async def test_a_card_no_replica_acks_is_dead_lettered_and_removed(
    nats_server: NatsServer,
) -> None:
    """Replicas that crash on a card (here: pulls never acked) exhaust max_deliver; the
    orchestrator's bus reports the card, dead-letters it and removes it from the inbox."""
    url = nats_server.url
    orch = await NatsBus.connect(url, fetch_wait=0.5)
    agent = await NatsBus.connect(url, ack_wait=0.5, max_deliver=2, fetch_wait=0.5)
    bad: list[tuple[str, str]] = []
    orch.on_bad_message = lambda subject, data, reason: bad.append((subject, reason))
    replies = orch.replies()
    pump = asyncio.ensure_future(anext(replies))  # the orchestrator reads replies
    try:
        await agent.consume("crashy", lambda c: asyncio.sleep(0))  # creates the consumer
        await agent.close()  # ... and the replica goes away before any card
        await until(lambda: orch._reading_replies, what="the orchestrator to listen")
        await orch.send_task("crashy", TaskCard(task_id="t", root_id="r", capability="c"))
        js = orch.nc.jetstream()
        sub = await js.pull_subscribe_bind(durable="agent-crashy", stream="CARDBUS_INBOX")
        for _ in range(2):  # two replicas take it and die without a word
            [msg] = await sub.fetch(1, timeout=5)
            assert msg.metadata.num_delivered in (1, 2)
        # a replica still pulling makes the server find the card spent (and advise so)
        with pytest.raises(TimeoutError):
            await sub.fetch(1, timeout=2)
        await until(lambda: bad, timeout=10, what="the card to be reported")
        assert bad[0][0] == "cardbus.agent.crashy"
        assert "delivered 2 times" in bad[0][1]
        info = await js.stream_info("CARDBUS_INBOX")
        assert info.state.messages == 0  # not left in the work queue
        letters = await dead_letters(url)
        assert [(s, "delivered 2 times" in r) for s, r, _ in letters] == [
            ("cardbus.agent.crashy", True)
        ]
    finally:
        pump.cancel()
        await orch.close()
