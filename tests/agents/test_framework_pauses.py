"""Framework pauses become cardbus pauses (issue 31 item 5): a pydantic-ai tool that
requires approval and an OpenAI Agents SDK tool with ``needs_approval`` hold the call as
a cardbus review; the runtime is closed (a restart), the person answers from the log,
and the next attempt replays the journal up to the held call and runs it as they said.

Real parts: pydantic-ai (its ``FunctionModel``) and the Agents SDK (its OpenAI
Responses model against the loopback OpenAI-compatible stub), an ``EmbeddedRuntime``
on a SQLite file closed and opened again between the pause and the answer.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest
from agents import Agent as SDKAgent
from agents import OpenAIChatCompletionsModel, function_tool
from openai import AsyncOpenAI
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import ExternalToolset

from cardbus.agents import Agent, TaskCard
from cardbus.agents.frameworks import openai_agents_agent, pydantic_ai_agent
from cardbus.agents.frameworks.pauses import NOBODY
from cardbus.agents.tools import Tool, ToolRegistry
from cardbus.bus.orchestrator import Policy
from cardbus.bus.orchestrator.reviews import ReviewRefused, answer_review, open_reviews
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import events as ev
from cardbus.eventstore.sqlite import SqliteEventStore
from tests.agents.openai_stub import OpenAIStub, Reply

PLAN = {
    "plan_id": "pay-order",
    "goal": "pay",
    "tasks": [{"id": "p", "capability": "pay", "inputs": {"prompt": "Pay order A-1"}}],
}

RAN: list[float] = []  # the amounts the transfer tool ran with
SEEN: list[Any] = []  # what the model got back for the transfer call


def _model(calls: list[int]) -> FunctionModel:
    """transfer(900) with a sentence, then a text answer naming what the tool answered."""

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.append(len(messages))
        returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if not returns:
            return ModelResponse(
                parts=[TextPart("Paying 900 now."), ToolCallPart("transfer", {"amount": 900})]
            )
        SEEN.append(returns[-1].content)
        return ModelResponse(parts=[TextPart(f"done: {returns[-1].content}")])

    return FunctionModel(answer, model_name="scripted")


def pydantic_payer(calls: list[int]) -> type[Agent]:
    inner = PydanticAgent(_model(calls), name="payer", output_type=str)

    @inner.tool_plain(requires_approval=True)
    def transfer(amount: float) -> dict[str, float]:
        """Send money."""
        RAN.append(amount)
        return {"sent": amount}

    return pydantic_ai_agent(inner, capability="pay")


async def _until(store: Any, root: str) -> list[Any]:
    deadline = asyncio.get_running_loop().time() + 60
    while True:
        events = [e.data for e in await store.read_correlation(root)]
        if any(isinstance(e, ev.ApprovalRequested) and e.reason == "tool_review" for e in events):
            return events
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not held: {[type(e).__name__ for e in events]}")
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("decision", ["edit", "refuse"])
async def test_a_pydantic_ai_approval_is_a_review_that_survives_a_restart(
    tmp_path: Path, decision: str
) -> None:
    RAN.clear()
    SEEN.clear()
    calls: list[int] = []
    path = tmp_path / "log.db"
    async with (
        await SqliteEventStore.open(path, poll_interval=0.01) as store,
        EmbeddedRuntime(store, [pydantic_payer(calls)], Policy()) as rt,
    ):
        root = await rt.orchestrator.submit(PLAN)
        events = await _until(store, root)
    assert RAN == [] and calls == [1]  # held: the tool did not run
    (asked,) = [e for e in events if isinstance(e, ev.ToolReviewRequested)]
    assert (asked.tool, asked.arguments, asked.text) == (
        "transfer",
        {"amount": 900},
        "Paying 900 now.",
    )
    assert asked.schema["properties"]["amount"]["type"] == "number"
    calls.clear()
    async with (
        await SqliteEventStore.open(path, poll_interval=0.01) as store,
        EmbeddedRuntime(store, [pydantic_payer(calls)], Policy()) as rt,
    ):
        with pytest.raises(ReviewRefused, match="amount"):
            await answer_review(
                store, asked.task_id, "edit", by="ada", arguments={"amount": "lots"}
            )
        assert [r.tool for r in await open_reviews(store, asked.task_id)] == ["transfer"]
        if decision == "edit":
            await answer_review(store, asked.task_id, "edit", by="ada", arguments={"amount": 450})
        else:
            await answer_review(store, asked.task_id, "refuse", by="ada", reason="over the limit")
        done = await rt.orchestrator.wait(root, timeout=60)
        events = [e.data for e in await store.read_correlation(root)]
    assert done.status == "completed", done
    assert calls == [3]  # the first answer replayed from the journal; one live call after
    (answered,) = [e for e in events if isinstance(e, ev.ToolReviewAnswered)]
    assert (answered.proposed, answered.by) == ({"amount": 900}, "ada")
    if decision == "edit":
        assert RAN == [450]
        assert SEEN == [{"sent": 450.0}]
        (called,) = [e for e in events if isinstance(e, ev.ToolCalled)]
        assert (called.arguments, called.result, called.local) == (
            {"amount": 450},
            {"sent": 450.0},
            True,
        )
    else:
        assert RAN == []
        assert "over the limit" in str(SEEN[-1]) and "ada" in str(SEEN[-1])


def sdk_payer(stub: OpenAIStub) -> type[Agent]:
    @function_tool(needs_approval=True)
    def transfer(amount: float) -> dict[str, float]:
        """Send money."""
        RAN.append(amount)
        return {"sent": amount}

    client = AsyncOpenAI(base_url=stub.url, api_key="k", max_retries=0)
    inner = SDKAgent(
        name="payer",
        instructions="Pay the order with the transfer tool.",
        tools=[transfer],
        model=OpenAIChatCompletionsModel(model="stub-model", openai_client=client),
    )
    return openai_agents_agent(inner, capability="pay")


@pytest.mark.parametrize("decision", ["edit", "refuse"])
async def test_an_agents_sdk_needs_approval_is_a_review_that_survives_a_restart(
    tmp_path: Path, decision: str
) -> None:
    RAN.clear()
    path = tmp_path / "log.db"
    with OpenAIStub() as stub:
        stub.script(
            Reply(content="Paying 900 now.", tool_calls=[("transfer", {"amount": 900})]),
            Reply(content="paid"),
        )
        async with (
            await SqliteEventStore.open(path, poll_interval=0.01) as store,
            EmbeddedRuntime(store, [sdk_payer(stub)], Policy()) as rt,
        ):
            root = await rt.orchestrator.submit(PLAN)
            events = await _until(store, root)
        assert RAN == [] and len(stub.bodies()) == 1  # held: the tool did not run
        (asked,) = [e for e in events if isinstance(e, ev.ToolReviewRequested)]
        assert (asked.tool, asked.arguments) == ("transfer", {"amount": 900})
        assert asked.text == "Paying 900 now."
        async with (
            await SqliteEventStore.open(path, poll_interval=0.01) as store,
            EmbeddedRuntime(store, [sdk_payer(stub)], Policy()) as rt,
        ):
            with pytest.raises(ReviewRefused, match="amount"):
                await answer_review(
                    store, asked.task_id, "edit", by="ada", arguments={"amount": "lots"}
                )
            if decision == "edit":
                await answer_review(
                    store, asked.task_id, "edit", by="ada", arguments={"amount": 450}
                )
            else:
                await answer_review(
                    store, asked.task_id, "refuse", by="ada", reason="over the limit"
                )
            done = await rt.orchestrator.wait(root, timeout=60)
            events = [e.data for e in await store.read_correlation(root)]
        bodies = stub.bodies()
    assert done.status == "completed", done
    assert len(bodies) == 2  # the first answer replayed from the journal; one live call
    (tool_answer,) = [m for m in bodies[-1]["messages"] if m["role"] == "tool"]
    (answered,) = [e for e in events if isinstance(e, ev.ToolReviewAnswered)]
    assert (answered.proposed, answered.by) == ({"amount": 900}, "ada")
    if decision == "edit":
        assert RAN == [450]
        assert "450" in tool_answer["content"]
        (called,) = [e for e in events if isinstance(e, ev.ToolCalled)]
        assert (called.arguments, called.local) == ({"amount": 450}, True)
    else:
        assert RAN == []
        assert tool_answer["content"].startswith("a person (ada) refused this call")
        assert "over the limit" in tool_answer["content"]


async def test_without_a_bus_a_call_that_needs_approval_is_refused_never_run() -> None:
    RAN.clear()
    SEEN.clear()
    task = TaskCard(task_id="t", root_id="t", capability="pay", inputs={"prompt": "Pay A-1"})
    result = await pydantic_payer([]).run(task)
    assert result.status == "completed", result
    assert RAN == []
    assert SEEN == [NOBODY]  # the model got the refusal as the tool's answer


class Term(msgspec.Struct):
    term: str


LOOKED_UP: list[str] = []


def _look_up(args: Term) -> dict[str, str]:
    LOOKED_UP.append(args.term)
    return {"term": args.term, "meaning": f"what {args.term} means"}


@pytest.mark.parametrize("review", ["never", "always"])
async def test_a_pydantic_ai_call_executed_externally_is_made_by_the_runtime_tool(
    tmp_path: Path, review: str
) -> None:
    """An ``ExternalToolset`` tool the runtime serves: its deferred call is ``ctx.tool``
    (journaled by the orchestrator, under the runtime tool's own review policy)."""
    LOOKED_UP.clear()
    SEEN.clear()

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if not returns:
            return ModelResponse(parts=[ToolCallPart("glossary", {"term": "tide"})])
        SEEN.append(returns[-1].content)
        return ModelResponse(parts=[TextPart("explained")])

    external = ExternalToolset(
        [
            ToolDefinition(
                name="glossary",
                parameters_json_schema={
                    "type": "object",
                    "properties": {"term": {"type": "string"}},
                    "required": ["term"],
                },
            )
        ]
    )
    inner = PydanticAgent(FunctionModel(answer), name="explainer", toolsets=[external])
    explainer = pydantic_ai_agent(inner, capability="explain", tools_allowed=["glossary"])
    tools = ToolRegistry([Tool.define("glossary", _look_up, Term, review=review)])  # type: ignore[arg-type]
    plan = {
        "plan_id": "external",
        "goal": "explain",
        "tasks": [{"id": "e", "capability": "explain", "inputs": {"prompt": "tide"}}],
    }
    async with (
        await SqliteEventStore.open(tmp_path / "log.db", poll_interval=0.01) as store,
        EmbeddedRuntime(store, [explainer], Policy(), tools=tools) as rt,
    ):
        root = await rt.orchestrator.submit(plan)
        if review == "always":
            events = await _until(store, root)
            assert LOOKED_UP == []
            (asked,) = [e for e in events if isinstance(e, ev.ToolReviewRequested)]
            await answer_review(store, asked.task_id, "approve", by="ada")
        done = await rt.orchestrator.wait(root, timeout=60)
        events = [e.data for e in await store.read_correlation(root)]
    assert done.status == "completed", done
    assert LOOKED_UP == ["tide"]
    assert SEEN == [{"term": "tide", "meaning": "what tide means"}]
    (called,) = [e for e in events if isinstance(e, ev.ToolCalled) and not e.replayed_from]
    assert (called.tool, called.local) == ("glossary", False)
