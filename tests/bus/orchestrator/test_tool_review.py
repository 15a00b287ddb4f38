"""A proposed tool call held for a person's review (issue 31 item 1).

The stub model proposes ``transfer(amount=900)``; the tool's policy reviews amounts over
500. The attempt pauses (``tool.review_requested``, the task ``awaiting_approval``) and
the tool does not run; the runtime is left and the SQLite file opened again (the pause
is in the log); a person approves with ``amount=450`` (an edit that breaks the schema is
refused naming the field, the review staying open), or refuses with a reason. The tool
runs once with 450 and the model sees its result, or the model gets the refusal as the
tool's answer; either way the task completes.

Real parts: an ``EmbeddedRuntime`` on a SQLite file, the OpenAI-compatible stub on
loopback, a real ``ToolRegistry``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from cardbus.agents.llm import OpenAIChatLLM
from cardbus.agents.llm_agent import LLMAgent
from cardbus.agents.tools import Tool, ToolRegistry
from cardbus.bus.orchestrator import Policy
from cardbus.bus.orchestrator.reviews import ReviewRefused, answer_review, open_reviews
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import events as ev
from cardbus.eventstore.sqlite import SqliteEventStore
from tests.agents.openai_stub import OpenAIStub, Reply


class Order(msgspec.Struct, frozen=True):
    order: str


class Paid(msgspec.Struct, frozen=True):
    answer: str


class Transfer(msgspec.Struct, frozen=True):
    amount: float


class Payer(LLMAgent):
    agent_id = "payer"
    description = "Pays an order."
    capability = "pay"
    input_type = Order
    output_type = Paid
    instructions = "Pay the order with the transfer tool."
    tools = ["transfer"]


RAN: list[float] = []  # the amounts the transfer tool ran with


def _transfer(t: Transfer) -> dict[str, Any]:
    RAN.append(t.amount)
    return {"sent": t.amount}


def _over_500(args: dict[str, Any]) -> bool:
    return float(args.get("amount", 0)) > 500


TRANSFER = Tool.define("transfer", _transfer, input_type=Transfer, review=_over_500)


class OwnPayer(Payer):
    """The same agent bringing its tool: its worker runs it (``tool.begin``/``tool.end``)."""

    agent_id = "own-payer"
    tools = [TRANSFER]


def _served(where: str) -> tuple[type[LLMAgent], ToolRegistry | None]:
    if where == "agent":
        return OwnPayer, None
    return Payer, ToolRegistry([TRANSFER])


PLAN = {
    "plan_id": "pay-order",
    "goal": "pay",
    "tasks": [{"id": "p", "capability": "pay", "inputs": {"order": "A-1"}}],
}


async def _until(store: SqliteEventStore, root: str, done: Any) -> list[Any]:
    deadline = asyncio.get_running_loop().time() + 60
    while True:
        events = [e.data for e in await store.read_correlation(root)]
        if done(events):
            return events
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not reached: {[type(e).__name__ for e in events]}")
        await asyncio.sleep(0.02)


def _asked(events: list[Any]) -> bool:
    return any(isinstance(e, ev.ApprovalRequested) and e.reason == "tool_review" for e in events)


@pytest.mark.parametrize("where", ["registry", "agent"])
@pytest.mark.parametrize("decision", ["edit", "refuse"])
async def test_a_reviewed_call_pauses_survives_a_restart_and_runs_as_the_person_said(
    tmp_path: Path, decision: str, where: str
) -> None:
    RAN.clear()
    ran = RAN
    agent, tools = _served(where)
    path = tmp_path / "log.db"
    with OpenAIStub() as stub:
        stub.script(
            Reply(content="Paying 900 now.", tool_calls=[("transfer", {"amount": 900})]),
            json.dumps({"answer": "done"}),
        )
        llm = OpenAIChatLLM(stub.url, "stub-model", max_retries=0)
        async with (
            await SqliteEventStore.open(path, poll_interval=0.01) as store,
            EmbeddedRuntime(store, [agent], Policy(), llm=llm, tools=tools) as rt,
        ):
            root = await rt.orchestrator.submit(PLAN)
            events = await _until(store, root, _asked)
        assert ran == []  # held: nothing ran before a person's word
        asked = [e for e in events if isinstance(e, ev.ToolReviewRequested)]
        assert [(a.tool, a.arguments, a.text) for a in asked] == [
            ("transfer", {"amount": 900}, "Paying 900 now.")
        ]
        task_id = asked[0].task_id
        async with (
            await SqliteEventStore.open(path, poll_interval=0.01) as store,
            EmbeddedRuntime(store, [agent], Policy(), llm=llm, tools=tools) as rt,
        ):
            with pytest.raises(ReviewRefused, match="amount"):
                await answer_review(store, task_id, "edit", by="ada", arguments={"amount": "lots"})
            assert [r.tool for r in await open_reviews(store, task_id)] == ["transfer"]
            if decision == "edit":
                await answer_review(store, task_id, "edit", by="ada", arguments={"amount": 450})
            else:
                await answer_review(store, task_id, "refuse", by="ada", reason="over the limit")
            done = await rt.orchestrator.wait(root, timeout=60)
            events = [e.data for e in await store.read_correlation(root)]
        last = stub.bodies()[-1]["messages"][-1]
    assert done.status == "completed", done
    answered = [e for e in events if isinstance(e, ev.ToolReviewAnswered)]
    assert len(answered) == 1 and answered[0].by == "ada"
    assert answered[0].proposed == {"amount": 900}
    assert last["role"] == "tool"
    if decision == "edit":
        assert ran == [450]  # once, with the edited amount
        assert answered[0].arguments == {"amount": 450}
        assert json.loads(last["content"]) == {"sent": 450}
        requested = [e for e in events if isinstance(e, ev.ToolRequested)]
        assert [(r.arguments, r.local) for r in requested] == [({"amount": 450}, where == "agent")]
    else:
        assert ran == []
        assert "over the limit" in last["content"] and "ada" in last["content"]
