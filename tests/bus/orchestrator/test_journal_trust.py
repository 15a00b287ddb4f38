"""The journal verifies before it trusts (issue 30, item 2): a recorded answer edited in
the SQLite file is never replayed; the task fails ``journal_tampered`` naming the position.

Real parts: an ``EmbeddedRuntime`` on a SQLite file, the OpenAI-compatible stub on
loopback answering ``OpenAIChatLLM``. The "kill" is the first runtime closed while its
handler waits after what is to be edited was recorded (three model answers, or a tool's
result); the edit is an ``UPDATE`` of the event's body with ``sqlite3``, as an attacker
with the file would.
"""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest

from cardbus.agents import Agent, Capability, TaskCard, TaskContext
from cardbus.agents.cards import AgentConstraints
from cardbus.agents.llm import OpenAIChatLLM
from cardbus.agents.tools import Tool, ToolRegistry
from cardbus.bus.orchestrator import Policy, RetryPolicy
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import events as ev
from cardbus.eventstore.sqlite import SqliteEventStore
from tests.agents.openai_stub import OpenAIStub, Reply

FORGED = "FORGED ANSWER"
HANG = asyncio.Event()  # set: the handler waits (for ever) before its fourth call


class Q(msgspec.Struct):
    q: str


class A(msgspec.Struct):
    answer: str


class SixCalls(Agent):
    """Six model calls, each asking about the answer before it."""

    agent_id = "six"
    capabilities: ClassVar = [Capability("ask", Q, A)]

    async def handle(self, task: TaskCard, inputs: Q, ctx: TaskContext) -> A:
        texts: list[str] = []
        for i in range(6):
            if i == 3 and HANG.is_set():
                await asyncio.Event().wait()  # the process "dies" here
            about = texts[-1] if texts else inputs.q
            texts.append((await ctx.llm.chat([{"role": "user", "content": f"{i}: {about}"}])).text)
        return A(answer="|".join(texts))


def _policy() -> Policy:
    return Policy(retry=RetryPolicy(max_attempts=3, initial_interval_s=0.01, jitter=0.0))


PLAN = {
    "plan_id": "journal-trust",
    "goal": "ask six times",
    "tasks": [{"id": "t", "capability": "ask", "inputs": {"q": "tides"}}],
}


async def _until(store: SqliteEventStore, root: str, done: Any) -> list[Any]:
    for _ in range(3000):  # up to a minute; the log is the witness
        events = [e.data for e in await store.read_correlation(root)]
        if done(events):
            return events
        await asyncio.sleep(0.02)
    raise AssertionError(f"not reached: {[type(e).__name__ for e in events]}")


def _answered(events: list[Any]) -> list[ev.ModelAnswered]:
    return [e for e in events if isinstance(e, ev.ModelAnswered) and e.answer is not None]


def _forge(db: Path, position: int, recompute_digest: bool) -> None:
    """Change the recorded answer's text; with ``recompute_digest`` its ``answer_digest``
    too (so only the event's hash gives it away). The stored hash is left as it was."""
    con = sqlite3.connect(db)
    try:
        (body,) = con.execute("SELECT body FROM events WHERE position = ?", (position,)).fetchone()
        doc = msgspec.json.decode(body)
        doc["data"]["answer"]["text"] = FORGED
        if recompute_digest:
            answer = msgspec.json.encode(doc["data"]["answer"], order="sorted")
            doc["data"]["answer_digest"] = hashlib.sha256(answer).hexdigest()
        con.execute(
            "UPDATE events SET body = ? WHERE position = ?", (msgspec.json.encode(doc), position)
        )
        con.commit()
    finally:
        con.close()


@pytest.mark.parametrize("recompute_digest", [False, True], ids=["stale-digest", "digest-redone"])
async def test_an_edited_answer_is_not_replayed_and_the_task_fails_naming_it(
    tmp_path: Path, recompute_digest: bool
) -> None:
    db = tmp_path / "log.db"
    with OpenAIStub() as stub:
        stub.responder = lambda body: Reply(content=f"answer {len(stub.requests)}")
        llm = OpenAIChatLLM(stub.url, "stub-model")
        HANG.set()
        async with (
            await SqliteEventStore.open(db, poll_interval=0.01) as store,
            EmbeddedRuntime(store, [SixCalls], _policy(), llm=llm) as rt,
        ):
            root = await rt.orchestrator.submit(PLAN)
            first = _answered(await _until(store, root, lambda es: len(_answered(es)) == 3))
        HANG.clear()
        async with await SqliteEventStore.open(db) as store:
            victim = next(
                e
                for e in await store.read_correlation(root)
                if isinstance(e.data, ev.ModelAnswered) and e.data.seq == 0
            )
            before = await store.last_position()
        assert first[0].answer["text"] == "answer 1"
        _forge(db, victim.position, recompute_digest)
        sent_before = len(stub.requests)

        async with (
            await SqliteEventStore.open(db, poll_interval=0.01) as store,
            EmbeddedRuntime(store, [SixCalls], _policy(), llm=llm) as rt,
        ):
            done = await rt.orchestrator.wait(root, timeout=60)
            after = [e for e in await store.read_correlation(root) if e.position > before]
            problems = await store.verify(victim.stream)
        sent_after = stub.bodies()[sent_before:]

    assert done.status == "failed", done
    (failed,) = [e.data for e in after if isinstance(e.data, ev.TaskFailed)]
    assert failed.reason == "journal_tampered"
    assert f"stream {victim.stream} position {victim.position}" in failed.error
    assert "does not match its hash (edited)" in failed.error
    # what verify says is what the journal said
    assert [p.position for p in problems] == [victim.position]
    # nothing derived from the forged text anywhere: no replay of it, no model call after
    # it, no output, nothing written after the edit
    assert not [e for e in after if isinstance(e.data, ev.ModelAnswered)]
    assert FORGED not in msgspec.json.encode(sent_after).decode()
    assert FORGED not in msgspec.json.encode([e.data for e in after]).decode()
    assert FORGED not in msgspec.json.encode(done).decode()


def _rehash_from(db: Path, stream: str, position: int) -> None:
    """Redo the stored hash of the event at ``position`` and the chain of its stream after
    it (each later event's ``prev_hash`` and hash): what an attacker who knows the
    format does, so that the stream's own chain checks."""
    con = sqlite3.connect(db)
    try:
        rows = con.execute(
            "SELECT position, body FROM events WHERE stream = ? AND position >= ?"
            " ORDER BY position",
            (stream, position),
        ).fetchall()
        prev = ""
        for at, body in rows:
            if prev:
                doc = msgspec.json.decode(body)
                doc["prev_hash"] = prev
                body = msgspec.json.encode(doc)
            prev = hashlib.sha256(body).hexdigest()
            con.execute("UPDATE events SET body = ?, hash = ? WHERE position = ?", (body, prev, at))
        con.commit()
    finally:
        con.close()


async def test_an_answer_rehashed_after_its_edit_is_caught_by_its_digest(tmp_path: Path) -> None:
    """The edited answer's hash and the rest of its stream's chain are redone: the
    stream's chain checks, so only the answer's digest gives it away."""
    db = tmp_path / "log.db"
    with OpenAIStub() as stub:
        stub.responder = lambda body: Reply(content=f"answer {len(stub.requests)}")
        llm = OpenAIChatLLM(stub.url, "stub-model")
        HANG.set()
        async with (
            await SqliteEventStore.open(db, poll_interval=0.01) as store,
            EmbeddedRuntime(store, [SixCalls], _policy(), llm=llm) as rt,
        ):
            root = await rt.orchestrator.submit(PLAN)
            await _until(store, root, lambda es: len(_answered(es)) == 3)
        HANG.clear()
        async with await SqliteEventStore.open(db) as store:
            victim = next(
                e
                for e in await store.read_correlation(root)
                if isinstance(e.data, ev.ModelAnswered) and e.data.seq == 0
            )
            before = await store.last_position()
        task = victim.stream
        _forge(db, victim.position, recompute_digest=False)
        _rehash_from(db, task, victim.position)

        async with (
            await SqliteEventStore.open(db, poll_interval=0.01) as store,
            EmbeddedRuntime(store, [SixCalls], _policy(), llm=llm) as rt,
        ):
            done = await rt.orchestrator.wait(root, timeout=60)
            after = [e for e in await store.read_correlation(root) if e.position > before]
            chain = await store.verify(task)

    assert chain == []  # the stream's own chain cannot tell
    assert done.status == "failed", done
    (failed,) = [e.data for e in after if isinstance(e.data, ev.TaskFailed)]
    assert failed.reason == "journal_tampered"
    assert f"position {victim.position}: the answer does not match its digest" in failed.error
    assert FORGED not in msgspec.json.encode([e.data for e in after]).decode()
    assert FORGED not in msgspec.json.encode(done).decode()


class PayThenAsk(Agent):
    """A tool call, then a model call about its result (where the first attempt dies)."""

    agent_id = "payer"
    capabilities: ClassVar = [Capability("pay", Q, A)]
    constraints = AgentConstraints(tools=["charge"])

    async def handle(self, task: TaskCard, inputs: Q, ctx: TaskContext) -> A:
        paid = await ctx.tool("charge", amount=5)
        if HANG.is_set():
            await asyncio.Event().wait()  # the process "dies" here
        said = await ctx.llm.chat([{"role": "user", "content": f"paid: {paid}"}])
        return A(answer=f"{paid}|{said.text}")


CHARGES: list[int] = []


def _charge(args: dict[str, Any]) -> dict[str, Any]:
    CHARGES.append(args["amount"])
    return {"charged": args["amount"], "note": "paid"}


@pytest.mark.parametrize("edit", ["result", "error"])
async def test_an_edited_tool_result_is_not_replayed_nor_its_call_repeated(
    tmp_path: Path, edit: str
) -> None:
    """``result``: the recorded result changed (it would be replayed); ``error``: the call
    made to look failed (a failed call is asked again: the charge would be repeated)."""
    db = tmp_path / "log.db"
    CHARGES.clear()
    tools = ToolRegistry([Tool.define("charge", _charge)])
    plan = {**PLAN, "plan_id": "journal-trust-tool"}
    plan["tasks"] = [{"id": "p", "capability": "pay", "inputs": {"q": "bill"}}]
    with OpenAIStub() as stub:
        llm = OpenAIChatLLM(stub.url, "stub-model")
        HANG.set()
        async with (
            await SqliteEventStore.open(db, poll_interval=0.01) as store,
            EmbeddedRuntime(store, [PayThenAsk], _policy(), llm=llm, tools=tools) as rt,
        ):
            root = await rt.orchestrator.submit(plan)
            await _until(store, root, lambda es: any(isinstance(e, ev.ToolCalled) for e in es))
        HANG.clear()
        async with await SqliteEventStore.open(db) as store:
            victim = next(
                e for e in await store.read_correlation(root) if isinstance(e.data, ev.ToolCalled)
            )
            before = await store.last_position()
        con = sqlite3.connect(db)
        (body,) = con.execute("SELECT body FROM events WHERE position = ?", (victim.position,))
        doc = msgspec.json.decode(body[0])
        if edit == "result":
            doc["data"]["result"]["note"] = FORGED
        else:
            doc["data"].update(error=FORGED, error_type="tool_error", result=None)
        con.execute(
            "UPDATE events SET body = ? WHERE position = ?",
            (msgspec.json.encode(doc), victim.position),
        )
        con.commit()
        con.close()

        async with (
            await SqliteEventStore.open(db, poll_interval=0.01) as store,
            EmbeddedRuntime(store, [PayThenAsk], _policy(), llm=llm, tools=tools) as rt,
        ):
            done = await rt.orchestrator.wait(root, timeout=60)
            after = [e for e in await store.read_correlation(root) if e.position > before]
        sent = stub.bodies()

    assert done.status == "failed", done
    (failed,) = [e.data for e in after if isinstance(e.data, ev.TaskFailed)]
    assert failed.reason == "journal_tampered"
    assert f"stream {victim.stream} position {victim.position}" in failed.error
    assert CHARGES == [5]  # not charged again either: the task failed, nothing went live
    assert sent == []  # no model call was made with the forged result
    assert FORGED not in msgspec.json.encode([e.data for e in after]).decode()
    assert FORGED not in msgspec.json.encode(done).decode()
