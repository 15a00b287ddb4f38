"""The published JSON Schemas (``cardbus schema``) hold for every message a cardbus Python
agent and orchestrator send: a whole demo run on a real nats-server, captured on the wire
with core NATS subscriptions, each message validated with ``jsonschema``."""

from __future__ import annotations

import asyncio
import collections
import json
import sys
from pathlib import Path

import jsonschema
import nats
from nats.aio.msg import Msg
from natsserver import NatsServer

from cardbus.bus import wire

SUBJECTS = (
    "cardbus.agent.>",
    "cardbus.reply.>",
    "cardbus.announce.>",
    "cardbus.req.>",
    "cardbus.cancel.>",  # none in a demo run (nothing is cancelled); validated if one comes
)


async def test_every_message_of_a_demo_run_matches_its_schema(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    url = nats_server.url
    captured: list[Msg] = []
    inboxes: list[Msg] = []  # every reply to a request; the agents' are picked out after

    async def on_msg(msg: Msg) -> None:
        captured.append(msg)

    async def on_inbox(msg: Msg) -> None:
        # (each subscription's callbacks run in a task of their own: an answer may be taken
        # here before its request is taken by on_msg, so nothing is matched while capturing)
        inboxes.append(msg)

    nc = await nats.connect(url)
    try:
        for subject in SUBJECTS:
            await nc.subscribe(subject, cb=on_msg)
        await nc.subscribe("_INBOX.>", cb=on_inbox)
        await nc.flush()
        demo = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "cardbus.tools",
            "demo",
            "--nats",
            url,
            "--parallel",
            cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            out, _ = await asyncio.wait_for(demo.communicate(), 240)
        finally:
            if demo.returncode is None:  # timed out: the test reaps what it started
                demo.kill()
                await demo.wait()
        assert demo.returncode == 0, out.decode()
        await nc.flush()  # what the server sent before this is in the subscriptions' queues
    finally:
        await nc.drain()  # and every callback has taken it: nothing captured is dropped

    validators = {n: jsonschema.Draft202012Validator(wire.schema(n)) for n in wire.SCHEMA_NAMES}
    seen: collections.Counter[str] = collections.Counter()
    for msg in captured:
        doc = json.loads(msg.data)
        kind = msg.subject.split(".")[1]
        name = {
            "agent": "task_card",
            "announce": "announce",
            "req": "agent_request",
            "cancel": "cancel_notice",
        }.get(kind, "reply")
        validators[name].validate(doc)
        seen[doc["type"]] += 1
        if name == "reply":  # and as what it says it is
            validators[doc["type"]].validate(doc)
        if name == "agent_request":
            seen[doc["kind"]] += 1
            args = doc["kind"].replace(".", "_") + "_args"
            if args in validators:
                validators[args].validate(doc["args"])
    asked = [m.reply for m in captured if m.subject.startswith("cardbus.req.") and m.reply]
    responses = [m for m in inboxes if m.subject in set(asked)]
    for msg in responses:
        validators["agent_response"].validate(json.loads(msg.data))
    # the whole run went by: cards, both replies, announcements, requests and their answers,
    # the journal's model calls among them
    assert seen["task_card"] >= 5 and seen["result_card"] >= 5, seen
    # (a Started goes out only for a handler slower than started_after_s: validated when it
    # comes, not counted on; tests/bus/test_wire.py validates one the code encodes)
    assert seen["announce"] >= 5 and seen["agent_request"] >= 2, seen
    assert seen["model.request"] >= 1 and seen["model.answer"] >= 1, seen
    # every request asked on a reply subject of its own, and was answered there
    assert len(set(asked)) == len(asked) == seen["agent_request"], (asked, seen)
    assert {m.subject for m in responses} == set(asked), (len(responses), seen)
