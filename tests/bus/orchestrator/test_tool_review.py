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
from cardbus.bus.runtime.nats import NatsRuntime
from cardbus.eventstore import CardbusError
from cardbus.eventstore import events as ev
from cardbus.eventstore.nats.connection import NatsOptions
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


async def _until(store: Any, root: str, done: Any) -> list[Any]:
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


# -- several calls of one turn: held together, answered together or one by one ----------

TURN = [("transfer", {"amount": 900}), ("transfer", {"amount": 100}), ("transfer", {"amount": 700})]


@pytest.mark.parametrize("where", ["registry", "agent"])
@pytest.mark.parametrize("how", ["one by one", "together"])
async def test_the_held_calls_of_one_turn_wait_together(
    tmp_path: Path, how: str, where: str
) -> None:
    """The model proposes three transfers in one turn, two of them over 500: the one
    under the limit runs, both held calls are in the log before the attempt ends, and the
    task runs again only once both are answered (each on its own, or all alike)."""
    RAN.clear()
    agent, tools = _served(where)
    with OpenAIStub() as stub:
        stub.script(
            Reply(content="Three transfers.", tool_calls=TURN), json.dumps({"answer": "done"})
        )
        llm = OpenAIChatLLM(stub.url, "stub-model", max_retries=0)
        async with (
            await SqliteEventStore.open(tmp_path / "log.db", poll_interval=0.01) as store,
            EmbeddedRuntime(store, [agent], Policy(), llm=llm, tools=tools) as rt,
        ):
            root = await rt.orchestrator.submit(PLAN)
            events = await _until(store, root, _asked)
            asked = [e for e in events if isinstance(e, ev.ToolReviewRequested)]
            assert sorted(a.arguments["amount"] for a in asked) == [700, 900]
            task_id = asked[0].task_id
            held = await open_reviews(store, task_id)
            assert len(held) == 2
            with pytest.raises(CardbusError, match=r"2 tool calls .* wait; name one or all"):
                await answer_review(store, task_id, "approve", by="ada")
            if how == "together":
                answered = await answer_review(store, task_id, "approve", by="ada", call="all")
                assert len(answered) == 2
            else:
                big = next(r for r in held if r.arguments == {"amount": 900})
                small = next(r for r in held if r.arguments == {"amount": 700})
                await answer_review(store, task_id, "approve", by="ada", call=big.call[:10])
                # one answered, one open: the task still waits
                assert [r.call for r in await open_reviews(store, task_id)] == [small.call]
                await answer_review(
                    store, task_id, "refuse", by="bob", call=small.call, reason="no"
                )
            done = await rt.orchestrator.wait(root, timeout=60)
            events = [e.data for e in await store.read_correlation(root)]
        messages = stub.bodies()[-1]["messages"]
    assert done.status == "completed", done
    granted = [e for e in events if isinstance(e, ev.ApprovalGranted)]
    assert len(granted) == 1  # the task ran again once, when no call was left open
    answers = [m["content"] for m in messages if m["role"] == "tool"]
    assert len(answers) == 3
    if how == "together":
        assert sorted(RAN) == [100, 700, 900]  # each once: 100 before the pause, kept
    else:
        assert sorted(RAN) == [100, 900]
        assert "bob" in answers[2] and "no" in answers[2]  # the model gets the refusal


# -- on NATS: the pause is in the log, a new member resumes it -----------------------------


@pytest.mark.parametrize("where", ["registry", "agent"])
async def test_a_reviewed_call_pauses_on_nats_and_a_new_member_runs_it_edited(
    nats_url: str, where: str
) -> None:
    RAN.clear()
    agent, tools = _served(where)
    with OpenAIStub() as stub:
        stub.script(
            Reply(content="Paying 900 now.", tool_calls=[("transfer", {"amount": 900})]),
            json.dumps({"answer": "done"}),
        )
        llm = OpenAIChatLLM(stub.url, "stub-model", max_retries=0)

        def member() -> NatsRuntime:
            return NatsRuntime(NatsOptions(url=nats_url), [agent], llm=llm, tools=tools)

        async with member() as rt:
            root = await rt.orchestrator.submit({**PLAN, "plan_id": "pay-on-nats"})
            events = await _until(rt.store, root, _asked)
        assert RAN == []  # held, and that member is gone
        [asked] = [e for e in events if isinstance(e, ev.ToolReviewRequested)]
        async with member() as rt:
            await answer_review(
                rt.store, asked.task_id, "edit", by="ada", arguments={"amount": 450}
            )
            done = await rt.orchestrator.wait(root, timeout=60)
            events = [e.data for e in await rt.store.read_correlation(root)]
        last = stub.bodies()[-1]["messages"][-1]
    assert done.status == "completed", done
    assert RAN == [450]
    assert json.loads(last["content"]) == {"sent": 450}
    [answered] = [e for e in events if isinstance(e, ev.ToolReviewAnswered)]
    assert (answered.proposed, answered.arguments, answered.by) == (
        {"amount": 900},
        {"amount": 450},
        "ada",
    )
