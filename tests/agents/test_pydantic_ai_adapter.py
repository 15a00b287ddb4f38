"""A pydantic-ai agent as a cardbus agent: its card, its run as a task of a plan, and its
model requests and tool calls in the journal (recorded; replayed on a retry).

Real parts: pydantic-ai itself (its ``TestModel`` and ``FunctionModel``, and its
OpenAI model against the loopback OpenAI-compatible stub), an ``EmbeddedRuntime`` on
a SQLite file, a real ``ToolRegistry``. Nothing of pydantic-ai is mocked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pydantic
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.providers.openai import OpenAIProvider

from cardbus.agents import Agent, Capability, TaskCard, TaskContext
from cardbus.agents.frameworks import PydanticAIAgent, pydantic_ai_agent
from cardbus.agents.tools import Tool, ToolRegistry
from cardbus.bus.orchestrator import Policy, RetryPolicy
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import events as ev
from cardbus.eventstore.sqlite import SqliteEventStore
from tests.agents.openai_stub import OpenAIStub, Reply


class Topic(msgspec.Struct):
    topic: str


class TermArgs(msgspec.Struct):
    term: str


class Term(pydantic.BaseModel):
    term: str


class Explanation(pydantic.BaseModel):
    term: str
    sentence: str


class Topics(Agent):
    """The plain cardbus agent the framework agent depends on."""

    agent_id = "topics"
    capabilities: ClassVar = [Capability("topic", Topic, TermArgs)]

    async def handle(self, task: TaskCard, inputs: Topic, ctx: TaskContext) -> TermArgs:
        return TermArgs(term=inputs.topic.lower())


def _glossary(args: TermArgs) -> dict[str, str]:
    return {"term": args.term, "meaning": f"what {args.term} means"}


GLOSSARY = Tool.define("glossary", _glossary, TermArgs, description="What a term means.")

NOTES_FAIL = {"left": 0}
NOTES: list[str] = []


def _with_note_tool(agent: PydanticAgent[Any, Any]) -> None:
    @agent.tool_plain
    def note(text: str) -> dict[str, str]:
        """Keep a note (fails while NOTES_FAIL says so)."""
        if NOTES_FAIL["left"] > 0:
            NOTES_FAIL["left"] -= 1
            raise RuntimeError("the note book is locked")
        NOTES.append(text)
        return {"kept": text}


def _plan(plan_id: str) -> dict[str, Any]:
    return {
        "plan_id": plan_id,
        "goal": "explain a term",
        "tasks": [
            {"id": "pick", "capability": "topic", "inputs": {"topic": "Tide"}},
            {
                "id": "explain",
                "capability": "explain",
                "deps": ["pick"],
                "inputs": {"term": {"$dep": "pick", "path": "term"}},
            },
        ],
    }


def _policy() -> Policy:
    return Policy(retry=RetryPolicy(max_attempts=3, initial_interval_s=0.01, jitter=0.0))


async def _run(tmp_path: Path, agents: list[type[Agent]], plan: dict[str, Any]) -> tuple[Any, list]:
    async with (
        await SqliteEventStore.open(tmp_path / "log.db", poll_interval=0.01) as store,
        EmbeddedRuntime(store, agents, _policy(), tools=ToolRegistry([GLOSSARY])) as rt,
    ):
        result = await rt.run(plan)
        events = [e.data for e in await store.read_correlation(result.root_id)]
    return result, events


def _results(events: list[Any]) -> list[ev.TaskResultSubmitted]:
    return [
        e for e in events if isinstance(e, ev.TaskResultSubmitted) and e.agent_id == "explainer"
    ]


def _scripted(calls: list[int]) -> FunctionModel:
    """glossary, then note, then the final answer; ``calls`` counts the live requests."""

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.append(len(messages))
        turn = sum(1 for m in messages if isinstance(m, ModelResponse))
        if turn == 0:
            return ModelResponse(parts=[ToolCallPart("glossary", {"term": "tide"})])
        if turn == 1:
            return ModelResponse(parts=[ToolCallPart("note", {"text": "looked up"})])
        return ModelResponse(
            parts=[
                ToolCallPart(
                    info.output_tools[0].name, {"term": "tide", "sentence": "The sea rises."}
                )
            ]
        )

    return FunctionModel(answer, model_name="scripted")


def test_the_card_is_derived_from_the_agent() -> None:
    inner = PydanticAgent(
        TestModel(), output_type=Explanation, name="Explainer", instructions="Explain a term."
    )
    cls = pydantic_ai_agent(
        inner, capability="explain", input_type=Term, tools_allowed=["glossary"]
    )
    card = cls.card()
    assert (card.agent_id, card.name, card.description) == (
        "explainer",
        "Explainer",
        "Explain a term.",
    )
    (cap,) = card.capabilities
    assert cap.name == "explain"
    assert cap.input_schema["properties"] == {"term": {"title": "Term", "type": "string"}}
    assert set(cap.output_schema["properties"]) == {"term", "sentence"}
    assert card.constraints.tools == ["glossary"]
    # the default input is a prompt; a subclass declares the same by class attributes
    plain = PydanticAgent(TestModel(), name="plain", description="Answers.")

    class Plain(PydanticAIAgent):
        agent = plain

    (cap,) = Plain.card().capabilities
    assert cap.input_schema["$defs"]["Prompt"]["required"] == ["prompt"]
    assert cap.output_schema == {"type": "string"}
    assert Plain.card().description == "Answers."


async def test_a_test_model_agent_runs_beside_a_plain_agent(tmp_path: Path) -> None:
    inner = PydanticAgent(TestModel(), output_type=Explanation, name="explainer")
    Explainer = pydantic_ai_agent(inner, capability="explain", input_type=Term)
    result, events = await _run(tmp_path, [Topics, Explainer], _plan("pa-test-model"))
    assert result.status == "completed", result
    assert set(result.outputs["explain"]) == {"term", "sentence"}
    requested = [e for e in events if isinstance(e, ev.ModelRequested)]
    answered = [e for e in events if isinstance(e, ev.ModelAnswered)]
    assert len(requested) == len(answered) == 1
    (user,) = requested[0].request["messages"][0]["parts"]
    assert user["content"] == 'Inputs:\n{\n  "term": "tide"\n}'
    assert "timestamp" not in user
    assert requested[0].tools_offered == ["final_result"]
    assert answered[0].input_tokens > 0 and answered[0].model == "test"
    (done,) = _results(events)
    assert done.usage.input_tokens == answered[0].input_tokens


async def test_a_retry_replays_the_model_calls_and_tools_it_had(tmp_path: Path) -> None:
    calls: list[int] = []
    inner = PydanticAgent(_scripted(calls), output_type=Explanation, name="explainer")
    _with_note_tool(inner)
    Explainer = pydantic_ai_agent(
        inner, capability="explain", input_type=Term, tools_allowed=["glossary"]
    )
    NOTES_FAIL["left"], NOTES[:] = 1, []
    result, events = await _run(tmp_path, [Topics, Explainer], _plan("pa-retry"))
    assert result.status == "completed", result
    assert result.outputs["explain"] == {"term": "tide", "sentence": "The sea rises."}
    # attempt 1: two model calls, glossary, note fails; attempt 2: both model calls and
    # glossary replayed, note again (an error is not replayed), the last model call live
    assert len(calls) == 3
    assert NOTES == ["looked up"]
    answered = [e for e in events if isinstance(e, ev.ModelAnswered)]
    assert [(e.attempt, e.seq, e.replayed_from is not None) for e in answered] == [
        (1, 0, False),
        (1, 2, False),
        (2, 0, True),
        (2, 2, True),
        (2, 4, False),
    ]
    tools = [e for e in events if isinstance(e, ev.ToolCalled)]
    assert [
        (e.attempt, e.tool, e.local, e.replayed_from is not None, e.error_type) for e in tools
    ] == [
        (1, "glossary", False, False, None),
        (1, "note", True, False, "tool_error"),
        (2, "glossary", False, True, None),
        (2, "note", True, False, None),
    ]
    assert tools[0].result == {"term": "tide", "meaning": "what tide means"}
    assert any(isinstance(e, ev.ToolRequested) and e.tool == "glossary" for e in events)


async def test_a_tool_off_the_allow_list_is_not_offered(tmp_path: Path) -> None:
    inner = PydanticAgent(TestModel(), output_type=Explanation, name="explainer")
    Explainer = pydantic_ai_agent(inner, capability="explain", input_type=Term)
    result, events = await _run(tmp_path, [Topics, Explainer], _plan("pa-no-tools"))
    assert result.status == "completed", result
    assert not [e for e in events if isinstance(e, ev.ToolRequested)]


async def test_against_the_openai_stub_a_retry_does_not_ask_the_endpoint_again(
    tmp_path: Path,
) -> None:
    with OpenAIStub() as stub:
        stub.script(
            Reply(content=None, tool_calls=[("glossary", {"term": "tide"})]),
            Reply(content=None, tool_calls=[("note", {"text": "looked up"})]),
            Reply(
                content=None,
                tool_calls=[("final_result", {"term": "tide", "sentence": "The sea rises."})],
            ),
        )
        model = OpenAIChatModel(
            "stub-model", provider=OpenAIProvider(base_url=stub.url, api_key="k")
        )
        inner = PydanticAgent(model, output_type=Explanation, name="explainer")
        _with_note_tool(inner)
        Explainer = pydantic_ai_agent(
            inner, capability="explain", input_type=Term, tools_allowed=["glossary"]
        )
        NOTES_FAIL["left"], NOTES[:] = 1, []
        result, events = await _run(tmp_path, [Topics, Explainer], _plan("pa-stub"))
        bodies = stub.bodies()
    assert result.status == "completed", result
    assert result.outputs["explain"] == {"term": "tide", "sentence": "The sea rises."}
    assert len(bodies) == 3  # two in attempt 1, one in attempt 2
    assert bodies[0]["messages"][-1]["content"].endswith('"term": "tide"\n}')
    answered = [e for e in events if isinstance(e, ev.ModelAnswered)]
    assert [e.replayed_from is not None for e in answered] == [False, False, True, True, False]
    assert answered[0].model == "stub-model-2024" and answered[0].input_tokens == 11
    failed, done = _results(events)
    assert (failed.usage.input_tokens, failed.usage.output_tokens) == (22, 14)  # two calls
    assert (done.usage.input_tokens, done.usage.output_tokens) == (11, 7)  # one live call


async def test_the_tool_calls_of_one_response_keep_their_places_on_a_retry(
    tmp_path: Path,
) -> None:
    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(m, ModelResponse) for m in messages):  # both tools at once
            calls = [
                ToolCallPart("glossary", {"term": "tide"}),
                ToolCallPart("note", {"text": "n"}),
            ]
            return ModelResponse(parts=calls)
        final = {"term": "tide", "sentence": "The sea rises."}
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, final)])

    inner = PydanticAgent(FunctionModel(answer), output_type=Explanation, name="explainer")
    _with_note_tool(inner)
    Explainer = pydantic_ai_agent(
        inner, capability="explain", input_type=Term, tools_allowed=["glossary"]
    )
    NOTES_FAIL["left"], NOTES[:] = 1, []
    result, events = await _run(tmp_path, [Topics, Explainer], _plan("pa-parallel"))
    assert result.status == "completed", result
    calls = [
        (e.attempt, e.seq, getattr(e, "tool", "model"), e.replayed_from is not None)
        for e in events
        if isinstance(e, (ev.ModelAnswered, ev.ToolCalled))
    ]
    # one after the other, in the order asked: glossary then note, in both attempts
    assert sorted(calls) == [
        (1, 0, "model", False),
        (1, 1, "glossary", False),
        (1, 2, "note", False),  # failed
        (2, 0, "model", True),
        (2, 1, "glossary", True),
        (2, 2, "note", False),
        (2, 3, "model", False),
    ]
