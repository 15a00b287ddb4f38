"""``wire.publish``: the header block written in one join reaches a subscriber exactly as
``nc.publish`` sends it, and anything it cannot send the same way goes through
``nc.publish``; an append's subjects made at once are each event's own."""

from __future__ import annotations

import asyncio

import nats
import pytest

from cardbus.eventstore.nats.wire import publish


async def test_a_publish_with_headers_arrives_as_nats_py_sends_it(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        got: asyncio.Queue[nats.aio.msg.Msg] = asyncio.Queue()
        await nc.subscribe("wire.>", cb=got.put)
        await nc.flush()
        headers = {"Nats-Msg-Id": "0190-1", "Cardbus-Hash": "ab" * 32, "Other": "a b:c"}
        sent = nc.stats["out_msgs"]
        await publish(nc, "wire.fast", b"body \r\n bytes", "reply.to", headers)
        await nc.publish("wire.plain", b"body \r\n bytes", reply="reply.to", headers=headers)
        fast, plain = await got.get(), await got.get()
        assert nc.stats["out_msgs"] == sent + 2
        for msg in (fast, plain):
            assert msg.data == b"body \r\n bytes" and msg.reply == "reply.to"
        assert fast.headers == plain.headers == headers
    finally:
        await nc.close()


@pytest.mark.parametrize(
    ("subject", "headers"),
    [
        ("wire.x", {"Bad": "line\r\nInjected: yes"}),  # a line break: nats-py's own handling
        ("wire.x", None),  # no headers
    ],
)
async def test_what_cannot_go_the_short_way_goes_through_nats_py(
    nats_url: str, subject: str, headers: dict[str, str] | None
) -> None:
    nc = await nats.connect(nats_url)
    try:
        got: asyncio.Queue[nats.aio.msg.Msg] = asyncio.Queue()
        await nc.subscribe("wire.>", cb=got.put)
        await nc.flush()
        await publish(nc, subject, b"x", headers=headers)
        msg = await got.get()
        assert msg.data == b"x"
        assert "Injected" not in (msg.headers or {})  # never a header of its own
    finally:
        await nc.close()


async def test_a_subject_with_white_space_is_refused_as_nats_py_refuses_it(
    nats_url: str,
) -> None:
    nc = await nats.connect(nats_url)
    try:
        with pytest.raises(nats.errors.BadSubjectError):
            await publish(nc, "wire. x", b"x", headers={"A": "b"})
    finally:
        await nc.close()


def test_an_appends_subjects_are_each_events_subject() -> None:
    from cardbus.eventstore import events as ev
    from cardbus.eventstore.envelope import NewEvent
    from cardbus.eventstore.nats.subjects import event_subject, event_subjects

    events = [
        NewEvent(data=ev.TaskCreated(root_id="r.1", capability="c"), correlation_id="r.1"),
        NewEvent(data=ev.TaskStarted(attempt=1, agent_id="a"), correlation_id="r.1"),
        NewEvent(data=ev.TaskStarted(attempt=1, agent_id="a"), correlation_id="agent-x"),
    ]
    assert event_subjects("cardbus.evt", "task é", events, 8) == [
        event_subject("cardbus.evt", e.correlation_id, "task é", e.type, 8) for e in events
    ]
