"""Sender identity on the NATS bus: a reply, announcement or request names the agent of its
subject, or it is refused (dead-lettered, reported to ``on_refused``, never handed on)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from cardbus.agents.cards import AgentCard, Announce, ResultCard, Started, encode
from cardbus.agents.requests import AgentRequest, AgentResponse
from cardbus.bus.transport.interface import Refusal
from cardbus.bus.transport.nats import (
    NatsBus,
    agent_permissions,
    reply_subject,
    sender_problem,
)


def result(agent: str = "slow", task: str = "t1") -> ResultCard:
    return ResultCard(task_id=task, attempt=1, agent_id=agent, status="completed", output=1)


def test_reply_subjects_name_the_sender_first_and_permissions_follow() -> None:
    assert reply_subject(result("slow", "t.1")) == "cardbus.reply.slow.t_2e1"
    assert reply_subject(Started(task_id="t", attempt=1, agent_id="a b")) == "cardbus.reply.a_20b.t"
    assert reply_subject(Announce(card=AgentCard(agent_id="q", name="Q"))) == "cardbus.announce.q"
    publish = agent_permissions("quick")["publish"]
    assert "cardbus.reply.quick.>" in publish and "cardbus.reply.>" not in publish


@pytest.mark.parametrize(
    ("subject", "message", "reason"),
    [
        ("cardbus.reply.quick.t1", result("slow"), "sent by 'quick' in the name of 'slow'"),
        (
            "cardbus.reply.quick.t1",
            Started(task_id="t1", attempt=1, agent_id="slow"),
            "sent by 'quick' in the name of 'slow'",
        ),
        ("cardbus.reply.slow.t2", result("slow"), "the subject is for task 't2'"),
        ("cardbus.reply.t1", result("slow"), "names no sender"),
        ("cardbus.reply.slow.t1.x", result("slow"), "names no sender"),
        (
            "cardbus.reply.quick.t1",
            Announce(card=AgentCard(agent_id="quick", name="Q")),
            "an announcement on a reply subject",
        ),
        (
            "cardbus.announce.quick",
            Announce(card=AgentCard(agent_id="slow", name="S")),
            "sent by 'quick' in the name of 'slow'",
        ),
        ("cardbus.announce.slow", result("slow"), "a result reply on the announcement subject"),
    ],
)
def test_a_message_for_another_sender_is_refused_with_both_names(
    subject: str, message: Any, reason: str
) -> None:
    refusal = sender_problem(subject, message)
    assert refusal is not None and reason in refusal.reason, refusal
    claimed = message.card.agent_id if isinstance(message, Announce) else message.agent_id
    assert refusal.claimed == claimed and refusal.subject == subject


def test_a_message_from_its_own_sender_passes() -> None:
    for m in (result("slow"), Started(task_id="t1", attempt=1, agent_id="slow")):
        assert sender_problem(reply_subject(m), m) is None
    a = Announce(card=AgentCard(agent_id="r.1", name="R"))
    assert sender_problem(reply_subject(a), a) is None


async def test_forged_replies_and_requests_never_reach_the_orchestrator(nats_url: str) -> None:
    orch = await NatsBus.connect(nats_url, fetch_wait=0.5)
    agent = await NatsBus.connect(nats_url)
    refused: list[Refusal] = []
    bad: list[str] = []
    orch.on_refused = refused.append
    orch.on_bad_message = lambda s, d, r: bad.append(r)
    try:
        forged = result("slow")
        await agent.reply_raw(encode(forged), "cardbus.reply.quick.t1")  # quick, as slow
        await agent.reply_raw(
            encode(Announce(card=AgentCard(agent_id="slow", name="S"))), "cardbus.reply.quick.x"
        )
        honest = result("slow")
        await agent.reply(honest)  # on cardbus.reply.slow.t1
        got = []
        async for r in orch.replies():
            got.append(r)
            break
        assert got == [honest]
        await _until(lambda: len(refused) == 2)
        assert [(r.kind, r.claimed, r.sender) for r in refused] == [
            ("result", "slow", "quick"),
            ("announce", "slow", "quick"),
        ]
        assert refused[0].task_id == "t1" and refused[0].attempt == 1
        assert any("result refused: sent by 'quick'" in b for b in bad)  # dead-lettered too

        async def serve(r: AgentRequest) -> AgentResponse:
            return AgentResponse(request_id=r.request_id, ok=True, result="served")

        await orch.serve_requests(serve)
        ask = AgentRequest(request_id="r1", task_id="t1", attempt=1, agent_id="slow", kind="tool")
        assert (await agent.request(ask, timeout=5)).result == "served"
        reply = await agent.nc.request("cardbus.req.quick", encode_request(ask), timeout=5)
        from cardbus.agents.requests import decode_response

        answer = decode_response(reply.data)
        assert not answer.ok and answer.error_type == "access_denied"
        assert "sent by 'quick' in the name of 'slow'" in (answer.error or "")
        await _until(lambda: len(refused) == 3)
        assert (refused[2].kind, refused[2].claimed, refused[2].sender) == (
            "request",
            "slow",
            "quick",
        )
    finally:
        await agent.close()
        await orch.close()


def encode_request(req: AgentRequest) -> bytes:
    from cardbus.agents import requests as rq

    return rq.encode(req)


async def _until(cond: Any, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise AssertionError("condition not met")
        await asyncio.sleep(0.02)


async def test_a_repeated_announcement_is_delivered_again(nats_url: str) -> None:
    """A lease renewal is the same bytes again: JetStream's dedup must not drop it."""
    orch = await NatsBus.connect(nats_url, fetch_wait=0.5)
    agent = await NatsBus.connect(nats_url)
    try:
        renewal = Announce(card=AgentCard(agent_id="a", name="A"), replica_id="r1")
        for _ in range(3):
            await agent.reply(renewal)
        got: list[Any] = []

        async def collect() -> None:
            async for r in orch.replies():
                got.append(r)
                if len(got) == 3:
                    return

        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(collect(), 5)
        assert got == [renewal] * 3
    finally:
        await agent.close()
        await orch.close()
