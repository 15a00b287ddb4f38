"""The MCP server's door to a typed question (issue 31 item 2): ``waiting`` shows the
question with the answer's JSON Schema, ``answer_question`` answers it; an answer that
does not fit is refused naming the field (the question stays open), and the answer's
actor is the caller."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from cardbus.agents.demo import Payer
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.tools.mcp_server import local_actor
from tests.cli.test_mcp_serve import call, stdio_session


async def _asked(db: Path) -> tuple[str, str]:
    plan = {
        "goal": "pay",
        "tasks": [{"id": "pay", "capability": "pay", "inputs": {"payee": "Ada"}}],
    }
    async with (
        await SqliteEventStore.open(db, poll_interval=0.01) as store,
        EmbeddedRuntime(store, [Payer]) as rt,
    ):
        root = await rt.orchestrator.submit(plan)
        while True:
            for e in await store.read_correlation(root):
                if isinstance(e.data, ev.ApprovalRequested) and e.data.reason == "question":
                    return root, e.stream
            await asyncio.sleep(0.02)  # polled: the log is the witness


async def test_waiting_shows_the_question_and_answer_question_answers_it(tmp_path: Path) -> None:
    db = tmp_path / "mcp.db"
    root, q_task = await _asked(db)
    async with stdio_session(tmp_path, db) as session:
        (row,) = (await call(session, "waiting"))["waiting"]
        assert row["task_id"] == q_task and row["answers"] == ["answer", "deny"]
        schema = row["question"]["schema"]
        assert schema["properties"]["currency"]["enum"] == ["EUR", "USD"]
        bad = await session.call_tool(
            "answer_question", {"task": root, "answer": {"amount": "lots", "currency": "EUR"}}
        )
        text = "".join(getattr(c, "text", "") for c in bad.content)
        assert bad.is_error and "'amount'" in text, text
        assert [r["task_id"] for r in (await call(session, "waiting"))["waiting"]] == [q_task]
        ok = await call(
            session, "answer_question", task=root, answer={"amount": 8, "currency": "USD"}
        )
        assert ok["by"] == local_actor() and ok["task_id"] == q_task
    async with await SqliteEventStore.open(db) as store:
        events = await store.read_stream(q_task)
    (answered,) = [e for e in events if isinstance(e.data, ev.QuestionAnswered)]
    assert (answered.actor, answered.data.door) == (local_actor(), "mcp")
    assert answered.data.answer == {"amount": 8, "currency": "USD"}
