"""The MCP server's door to a tool call held for review (issue 31 item 1): ``waiting``
shows the call (tool, proposed arguments), ``review`` answers it; an edit that breaks
the tool's schema is refused naming the field, and the answer's actor is the caller."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest

pytest.importorskip("mcp")

from cardbus import Agent, AgentConstraints, Capability
from cardbus.agents.tools import Tool, ToolRegistry
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.tools.mcp_server import local_actor
from tests.cli.test_mcp_serve import call, stdio_session


class Order(msgspec.Struct):
    order: str


class Transfer(msgspec.Struct):
    amount: float


class Payer(Agent):
    agent_id = "payer"
    description = "Pays an order."
    capabilities = [Capability("pay", Order, dict, "pay an order")]
    constraints = AgentConstraints(tools=["transfer"])

    async def handle(self, task: Any, inputs: Order, ctx: Any) -> Any:
        return await ctx.tool("transfer", amount=900)


def _tools() -> ToolRegistry:
    def transfer(t: Transfer) -> dict[str, Any]:
        return {"sent": t.amount}

    return ToolRegistry([Tool.define("transfer", transfer, input_type=Transfer, review="always")])


async def _held(db: Path) -> str:
    plan = {"goal": "pay", "tasks": [{"id": "pay", "capability": "pay", "inputs": {"order": "A"}}]}
    async with (
        await SqliteEventStore.open(db, poll_interval=0.01) as store,
        EmbeddedRuntime(store, [Payer], tools=_tools()) as rt,
    ):
        root = await rt.orchestrator.submit(plan)
        while True:
            events = [e.data for e in await store.read_correlation(root)]
            if any(isinstance(e, ev.ApprovalRequested) for e in events):
                (held,) = [e for e in events if isinstance(e, ev.ToolReviewRequested)]
                return held.task_id
            await asyncio.sleep(0.02)  # polled: the log is the witness


async def test_waiting_shows_the_held_call_and_review_answers_it(tmp_path: Path) -> None:
    db = tmp_path / "mcp.db"
    task_id = await _held(db)
    async with stdio_session(tmp_path, db) as session:
        (row,) = (await call(session, "waiting"))["waiting"]
        assert row["task_id"] == task_id
        assert [(r["tool"], r["arguments"]) for r in row["reviews"]] == [
            ("transfer", {"amount": 900})
        ]
        bad = await session.call_tool(
            "review", {"task": task_id, "decision": "edit", "arguments": {"amount": "lots"}}
        )
        text = "".join(getattr(c, "text", "") for c in bad.content)
        assert bad.is_error and "amount" in text, text
        ok = await call(session, "review", task=task_id, decision="edit", arguments={"amount": 450})
        assert ok["by"] == local_actor()
    async with await SqliteEventStore.open(db) as store:
        events = [e.data for e in await store.read_stream(task_id)]
    (answered,) = [e for e in events if isinstance(e, ev.ToolReviewAnswered)]
    assert (answered.proposed, answered.arguments, answered.by) == (
        {"amount": 900},
        {"amount": 450},
        local_actor(),
    )
