"""An OpenAI Agents SDK agent as a cardbus agent, against the loopback OpenAI-compatible
stub: its card, its run as a task of a plan beside a plain cardbus agent, its model
calls and tool calls in the journal (recorded; replayed on a retry).

Real parts: the SDK itself (``Runner.run``, ``OpenAIChatCompletionsModel`` with an
``AsyncOpenAI`` client pointed at the stub), an ``EmbeddedRuntime`` on a SQLite file,
a real ``ToolRegistry``. Nothing of the SDK is mocked.
"""

from __future__ import annotations

import importlib.machinery
import sys
from pathlib import Path
from typing import Any, ClassVar

import agents as sdk
import msgspec
import pydantic
from agents import Agent as SDKAgent
from agents import OpenAIChatCompletionsModel, function_tool
from openai import AsyncOpenAI

from cardbus.agents import Agent, Capability, TaskCard, TaskContext
from cardbus.agents.frameworks import OpenAIAgentsAgent, openai_agents_agent
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


class Explanation(pydantic.BaseModel):
    term: str
    sentence: str


class Topics(Agent):
    agent_id = "topics"
    capabilities: ClassVar = [Capability("topic", Topic, TermArgs)]

    async def handle(self, task: TaskCard, inputs: Topic, ctx: TaskContext) -> TermArgs:
        return TermArgs(term=inputs.topic.lower())


def _glossary(args: TermArgs) -> dict[str, str]:
    return {"term": args.term, "meaning": f"what {args.term} means"}


GLOSSARY = Tool.define("glossary", _glossary, TermArgs, description="What a term means.")

NOTES_FAIL = {"left": 0}
NOTES: list[str] = []


@function_tool(failure_error_function=None)  # a failure fails the run (and the attempt)
def note(text: str) -> str:
    """Keep a note."""
    if NOTES_FAIL["left"] > 0:
        NOTES_FAIL["left"] -= 1
        raise RuntimeError("the note book is locked")
    NOTES.append(text)
    return f"kept: {text}"


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


def _model(stub: OpenAIStub) -> OpenAIChatCompletionsModel:
    client = AsyncOpenAI(base_url=stub.url, api_key="k", max_retries=0)
    return OpenAIChatCompletionsModel(model="stub-model", openai_client=client)


async def _run(tmp_path: Path, agents: list[type[Agent]], plan: dict[str, Any]) -> tuple[Any, list]:
    async with (
        await SqliteEventStore.open(tmp_path / "log.db", poll_interval=0.01) as store,
        EmbeddedRuntime(store, agents, _policy(), tools=ToolRegistry([GLOSSARY])) as rt,
    ):
        result = await rt.run(plan)
        events = [e.data for e in await store.read_correlation(result.root_id)]
    return result, events


def test_agents_is_the_sdk_not_the_repository_folder() -> None:
    # the repository's agents/ folder is cardbus.agents; `agents` is openai-agents
    assert "site-packages" in (sdk.__file__ or ""), sdk.__file__
    assert SDKAgent.__module__.startswith("agents.")
    # and nothing on sys.path now would shadow it (a fresh look, past the module cache)
    spec = importlib.machinery.PathFinder.find_spec("agents", sys.path)
    assert spec is not None and spec.origin == sdk.__file__


def test_the_card_is_derived_from_the_agent() -> None:
    inner = SDKAgent(
        name="Explainer",
        instructions="Explain a term.",
        output_type=Explanation,
        tools=[note],
    )
    cls = openai_agents_agent(inner, capability="explain", input_type=TermArgs)
    card = cls.card()
    assert (card.agent_id, card.name, card.description) == (
        "explainer",
        "Explainer",
        "Explain a term.",
    )
    (cap,) = card.capabilities
    assert cap.name == "explain"
    assert set(cap.output_schema["properties"]) == {"term", "sentence"}

    class Plain(OpenAIAgentsAgent):
        agent = SDKAgent(name="plain", handoff_description="Answers.")
        tools_allowed = ("glossary",)

    (cap,) = Plain.card().capabilities
    assert cap.output_schema == {"type": "string"}
    assert Plain.card().description == "Answers."
    assert Plain.card().constraints.tools == ["glossary"]


async def test_a_retry_does_not_send_the_completed_model_calls_again(tmp_path: Path) -> None:
    with OpenAIStub() as stub:
        stub.script(
            Reply(content=None, tool_calls=[("glossary", {"term": "tide"})]),
            Reply(content=None, tool_calls=[("note", {"text": "looked up"})]),
            Reply(content='{"term": "tide", "sentence": "The sea rises."}'),
        )
        inner = SDKAgent(
            name="explainer",
            instructions="Look the term up, keep a note, then explain it.",
            output_type=Explanation,
            tools=[note],
            model=_model(stub),
        )
        Explainer = openai_agents_agent(
            inner, capability="explain", input_type=TermArgs, tools_allowed=["glossary"]
        )
        NOTES_FAIL["left"], NOTES[:] = 1, []
        result, events = await _run(tmp_path, [Topics, Explainer], _plan("oa-retry"))
        bodies = stub.bodies()
    assert result.status == "completed", result
    assert result.outputs["explain"] == {"term": "tide", "sentence": "The sea rises."}
    # attempt 1: two model calls, glossary, note fails; attempt 2: both model calls and
    # glossary replayed, note again (an error is not replayed), the last model call live
    assert len(bodies) == 3
    assert NOTES == ["looked up"]
    first = bodies[0]
    assert first["messages"][0] == {
        "role": "system",
        "content": "Look the term up, keep a note, then explain it.",
    }
    assert '"term": "tide"' in first["messages"][1]["content"]
    assert {t["function"]["name"] for t in first["tools"]} == {"note", "glossary"}
    requested = [e for e in events if isinstance(e, ev.ModelRequested)]
    assert set(requested[0].tools_offered) == {"note", "glossary"}
    assert requested[0].request["framework"] == "openai-agents"
    answered = [e for e in events if isinstance(e, ev.ModelAnswered)]
    assert [(e.attempt, e.seq, e.replayed_from is not None) for e in answered] == [
        (1, 0, False),
        (1, 2, False),
        (2, 0, True),
        (2, 2, True),
        (2, 4, False),
    ]
    assert answered[0].input_tokens == 11 and answered[0].model == "stub-model"
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
    failed, done = [
        e for e in events if isinstance(e, ev.TaskResultSubmitted) and e.agent_id == "explainer"
    ]
    assert (failed.usage.input_tokens, done.usage.input_tokens) == (22, 11)


def test_chat_completions_is_picked_for_any_endpoint_but_openais() -> None:
    from cardbus.agents.frameworks.openai_agents import chat_completions_only

    assert chat_completions_only("http://127.0.0.1:8000/v1")
    assert chat_completions_only("http://localhost:4000")
    assert not chat_completions_only("https://api.openai.com/v1")
    assert not chat_completions_only(None) and not chat_completions_only("")


async def test_a_model_named_by_string_asks_a_local_server_through_chat_completions(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """The SDK's default (the Responses API, /v1/responses) is not what local servers
    serve: with OPENAI_BASE_URL naming one, the agent's model name goes to
    /v1/chat/completions."""
    with OpenAIStub() as stub:
        monkeypatch.setenv("OPENAI_BASE_URL", stub.url)
        monkeypatch.setenv("OPENAI_API_KEY", "k")
        stub.script('{"term": "tide", "sentence": "The sea rises."}')
        inner = SDKAgent(
            name="explainer",
            instructions="Explain the term.",
            output_type=Explanation,
            model="stub-model",
        )
        Explainer = openai_agents_agent(inner, capability="explain", input_type=TermArgs)
        result, _events = await _run(tmp_path, [Topics, Explainer], _plan("oa-chat"))
        paths = [r["path"] for r in stub.requests]
        bodies = stub.bodies()
    assert result.status == "completed", result
    assert result.outputs["explain"] == {"term": "tide", "sentence": "The sea rises."}
    assert [p.rsplit("/v1", 1)[-1] for p in paths] == ["/chat/completions"]
    assert bodies[0]["model"] == "stub-model"


StubExplainer = openai_agents_agent(
    SDKAgent(
        name="explainer", instructions="Explain.", output_type=Explanation, model="stub-model"
    ),
    capability="explain",
    input_type=TermArgs,
)


def test_cardbus_run_with_the_sdks_endpoint_in_the_environment_needs_no_cardbus_model(
    tmp_path: Path,
) -> None:
    """The framework tutorial's command against a local server: OPENAI_BASE_URL names it
    for the SDK, no cardbus LLM agent runs, so no CARDBUS_MODEL is asked for, and no line
    says a cardbus model answered (the SDK's own model did)."""
    import json

    from click.testing import CliRunner

    from cardbus.tools.cli import cli

    plan = {**_plan("oa-cli"), "agents": [f"{__name__}:Topics", f"{__name__}:StubExplainer"]}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    with OpenAIStub() as stub:
        stub.script('{"term": "tide", "sentence": "The sea rises."}')
        env = {"OPENAI_BASE_URL": stub.url, "OPENAI_API_KEY": "k", "CARDBUS_MODEL": None}
        args = ["run", str(path), "--db", str(tmp_path / "d.db"), "--json"]
        result = CliRunner(env=env).invoke(cli, args)
        paths = [r["path"].rsplit("/v1", 1)[-1] for r in stub.requests]
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["outputs"]["explain"]["sentence"] == "The sea rises."
    assert paths == ["/chat/completions"]
    assert "LLM:" not in result.stderr, result.stderr
