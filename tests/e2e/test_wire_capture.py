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

SUBJECTS = ("cardbus.agent.>", "cardbus.reply.>", "cardbus.announce.>", "cardbus.req.>")


async def test_every_message_of_a_demo_run_matches_its_schema(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    url = nats_server.url
    captured: list[Msg] = []
    responses: list[Msg] = []
    asked: set[str] = set()  # the reply subjects of the agents' requests

    async def on_msg(msg: Msg) -> None:
        captured.append(msg)
        if msg.subject.startswith("cardbus.req.") and msg.reply:
            asked.add(msg.reply)

    async def on_inbox(msg: Msg) -> None:
        if msg.subject in asked:
            responses.append(msg)

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
        out, _ = await asyncio.wait_for(demo.communicate(), 240)
        assert demo.returncode == 0, out.decode()
        await nc.flush()
    finally:
        await nc.close()

    validators = {n: jsonschema.Draft202012Validator(wire.schema(n)) for n in wire.SCHEMA_NAMES}
    seen: collections.Counter[str] = collections.Counter()
    for msg in captured:
        doc = json.loads(msg.data)
        kind = msg.subject.split(".")[1]
        name = {"agent": "task_card", "announce": "announce", "req": "agent_request"}.get(
            kind, "reply"
        )
        validators[name].validate(doc)
        seen[doc["type"]] += 1
        if name == "reply":  # and as what it says it is
            validators[doc["type"]].validate(doc)
        if name == "agent_request":
            seen[doc["kind"]] += 1
            args = doc["kind"].replace(".", "_") + "_args"
            if args in validators:
                validators[args].validate(doc["args"])
    for msg in responses:
        validators["agent_response"].validate(json.loads(msg.data))
    # the whole run went by: cards, both replies, announcements, requests and their answers,
    # the journal's model calls among them
    assert seen["task_card"] >= 5 and seen["result_card"] >= 5, seen
    # (a Started goes out only for a handler slower than started_after_s: validated when it
    # comes, not counted on; tests/bus/test_wire.py validates one the code encodes)
    assert seen["announce"] >= 5 and seen["agent_request"] >= 2, seen
    assert seen["model.request"] >= 1 and seen["model.answer"] >= 1, seen
    assert len(responses) == seen["agent_request"], (len(responses), seen)
