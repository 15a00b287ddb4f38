"""Random bytes on every NATS subject the bus reads: each is counted, logged as one line
(no traceback) and dead-lettered with its reason, and the decision loop goes on.

Measured before: random bytes left 47 tracebacks in the orchestrator's log.
A real nats-server (tests/conftest.py), loopback only.
"""

from __future__ import annotations

import asyncio
import logging
import random

import msgspec
import pytest
from natsprocs import FAST_BUS, Quick, until
from natsserver import NatsServer
from test_nats_bad_messages import dead_letters

from cardbus.bus.orchestrator.plan import Plan, PlanTask
from cardbus.bus.runtime.nats import NatsRuntime, serve_agents
from cardbus.eventstore.nats.connection import NatsOptions


def garbage(rng: random.Random) -> list[bytes]:
    """Random bytes, and JSON that is almost a reply (wrong types, deep, huge ids)."""
    out = [rng.randbytes(rng.randint(0, 300)) for _ in range(12)]
    out += [
        b"",
        b"null",
        b"[" * 5000 + b"]" * 5000,
        b'{"type": "result_card"}',
        b'{"type": "result_card", "task_id": 1, "attempt": "x", "agent_id": [], "status": "?"}',
        b'{"type": "started", "task_id": "t", "attempt": 1, "agent_id": "quick"}',
        msgspec.json.encode({"type": "announce", "card": {"agent_id": "quick" * 200, "name": "n"}}),
        msgspec.json.encode({"type": "announce", "card": {"agent_id": 5, "name": None}}),
        msgspec.json.encode(
            {
                "type": "result_card",
                "task_id": "t",
                "attempt": 1,
                "agent_id": "quick",
                "status": "completed",
                "usage": {"input_tokens": 2**64},
            }
        ),
    ]
    return out


async def test_random_bytes_on_every_subject_never_stop_the_loop(
    nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    url = nats_server.url
    rng = random.Random(14)
    stop, ready = asyncio.Event(), asyncio.Event()
    serving = asyncio.create_task(
        serve_agents(NatsOptions(url=url), [Quick], stop, bus_options=FAST_BUS, ready=ready)
    )
    sent = {"inbox": 0, "reply": 0, "announce": 0, "request": 0}
    try:
        await asyncio.wait_for(ready.wait(), 10)
        with caplog.at_level(logging.INFO):
            async with NatsRuntime(NatsOptions(url=url), bus_options=FAST_BUS) as rt:
                raw = rt.bus
                for data in garbage(rng):
                    await raw.send_raw("quick", data)
                    await raw.reply_raw(data, "cardbus.reply.quick.t")
                    await raw.reply_raw(data, "cardbus.announce.quick")
                    await raw.nc.publish("cardbus.req.quick", data)
                    sent = {k: v + 1 for k, v in sent.items()}
                ok = Plan(
                    goal="after garbage",
                    tasks=[PlanTask(id="a", capability="quick", inputs={"n": 1})],
                )
                done = await rt.run(ok, timeout=30, agent_timeout=10)
                assert done.status == "completed" and done.outputs["a"] == {"n": 2}
                replies = sent["reply"] + sent["announce"]
                await until(
                    lambda: len(rt.orchestrator.bad_messages) >= replies,
                    what="the bad replies to be counted",
                )
                counted = len(rt.orchestrator.bad_messages)
    finally:
        stop.set()
        await serving
    # every reply and announcement is counted, the valid-looking ones too (a result for an
    # unknown task, an announcement in another's name or with an id over MAX_ID_CHARS)
    assert counted >= sent["reply"] + sent["announce"], counted
    tracebacks = [r for r in caplog.records if r.exc_info and r.name.startswith("cardbus")]
    assert tracebacks == [], [r.getMessage() for r in tracebacks][:5]
    bad_lines = [r for r in caplog.records if "bad message" in r.getMessage()]
    assert all("\n" not in r.getMessage() for r in bad_lines)
    letters = await dead_letters(url)
    assert all(reason for _, reason, _ in letters)  # each says why
    inbox = [s for s, _, _ in letters if s == "cardbus.agent.quick"]
    assert len(inbox) == sent["inbox"]
