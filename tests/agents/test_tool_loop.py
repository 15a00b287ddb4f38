"""LLMAgent's tool-calling loop: against the loopback stub, the mock, and a real runtime."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
from openai_stub import OpenAIStub, Reply

from cardbus.agents.cards import TaskCard
from cardbus.agents.llm import Completion, MockLLM, OpenAIChatLLM, ToolCall
from cardbus.agents.llm_agent import LLMAgent
from cardbus.agents.requests import REQUESTER, TOOL_SPECS, AgentRequest, AgentResponse
from cardbus.agents.tool_loop import object_root, tool_definition
from cardbus.agents.tools import Tool, ToolRegistry, ToolSpec
from cardbus.bus.orchestrator import Policy, RetryPolicy
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import MemoryEventStore
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import ConfigError, LLMServerError, ToolError


class Question(msgspec.Struct, frozen=True):
    question: str


class Answer(msgspec.Struct, frozen=True):
    answer: str
    sources: list[str]


class LookupIn(msgspec.Struct, frozen=True):
    term: str


class LookupOut(msgspec.Struct, frozen=True):
    term: str
    meaning: str


def lookup(args: LookupIn) -> LookupOut:
    return LookupOut(term=args.term, meaning=f"what {args.term} means")


LOOKUP = Tool.define("lookup", lookup, LookupIn, LookupOut, description="The meaning of a term.")


def broken(_args: Any) -> Any:
    raise RuntimeError("the index is down")


BROKEN = Tool.define("broken", broken, LookupIn, description="Always fails.")


class Researcher(LLMAgent):
    agent_id = "researcher"
    description = "Answers a question, looking terms up."
    capability = "answer"
    input_type = Question
    output_type = Answer
    instructions = "Answer the question; look up the terms you need."
    tools = [LOOKUP, "broken"]


GOOD = json.dumps({"answer": "Tides come from the moon.", "sources": ["lookup"]})


def card(**over: Any) -> TaskCard:
    base: dict[str, Any] = {
        "task_id": "t1",
        "root_id": "r1",
        "capability": "answer",
        "goal": "Why are there tides?",
        "inputs": {"question": "Why are there tides?"},
    }
    base.update(over)
    return TaskCard(**base)


class Broker:
    """What the orchestrator does with an agent's tool requests: allow-list, run, answer
    (its model calls, which the journal announces, go live unrecorded)."""

    def __init__(self, registry: ToolRegistry, allowed: Sequence[str]) -> None:
        self.registry = registry
        self.allowed = set(allowed)
        self.requests: list[AgentRequest] = []

    async def __call__(self, req: AgentRequest) -> AgentResponse:
        if req.kind in ("model.request", "model.answer"):
            return AgentResponse(request_id=req.request_id, ok=True, result={})
        self.requests.append(req)
        if req.target not in self.allowed:
            return AgentResponse(
                request_id=req.request_id,
                ok=False,
                error=f"{req.agent_id} may not tool {req.target!r}: tool_not_allowed",
                error_type="access_denied",
            )
        try:
            outcome = await self.registry.call(req.target, req.args)
        except ToolError as e:
            return AgentResponse(
                request_id=req.request_id, ok=False, error=str(e), error_type=e.error_type
            )
        return AgentResponse(request_id=req.request_id, ok=True, result=outcome.result)


@pytest.fixture
def broker() -> Iterator[Broker]:
    b = Broker(ToolRegistry([LOOKUP, BROKEN]), Researcher.constraints.tools)
    token = REQUESTER.set(b)
    try:
        yield b
    finally:
        REQUESTER.reset(token)


@pytest.fixture
def stub() -> Iterator[OpenAIStub]:
    with OpenAIStub() as s:
        yield s


def client(stub: OpenAIStub) -> OpenAIChatLLM:
    return OpenAIChatLLM(stub.url, "endpoint-model", api_key="k", max_retries=0)


def tool_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body["messages"] if m["role"] == "tool"]


# -- declaring tools -------------------------------------------------------------------


def test_the_allow_list_is_derived_from_the_declared_tools() -> None:
    assert Researcher.card().constraints.tools == ["lookup", "broken"]

    class Narrow(Researcher):
        constraints = msgspec.structs.replace(Researcher.constraints, tools=["lookup"])

    assert Narrow.card().constraints.tools == ["lookup"]  # given: kept as is


def test_a_tool_is_offered_with_an_object_schema_at_its_root() -> None:
    definition = tool_definition(LOOKUP.spec)
    assert definition["type"] == "function"
    fn = definition["function"]
    assert fn["name"] == "lookup" and fn["description"] == "The meaning of a term."
    assert fn["parameters"]["type"] == "object"
    assert fn["parameters"]["required"] == ["term"] and "$ref" not in fn["parameters"]
    bare = tool_definition(ToolSpec(name="ping"))
    assert bare["function"]["parameters"] == {"type": "object", "properties": {}}


# -- against the stub ------------------------------------------------------------------


async def test_a_two_turn_loop_with_one_tool(stub: OpenAIStub, broker: Broker) -> None:
    stub.script(Reply(tool_calls=[("lookup", {"term": "tide"})]), GOOD)
    async with client(stub) as llm:
        result = await Researcher.run(card(), llm)
    assert result.status == "completed", result
    assert result.output == json.loads(GOOD)
    first, second = stub.bodies()
    offered = [t["function"]["name"] for t in first["tools"]]
    assert offered == ["lookup", "broken"]
    # the model's turn and the tool's result go back, in OpenAI's shape
    turn = second["messages"][-2]
    assert turn["role"] == "assistant" and turn["content"] is None
    assert turn["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "lookup", "arguments": '{"term": "tide"}'},
        }
    ]
    (reply,) = tool_messages(second)
    assert reply["tool_call_id"] == "call_1"
    assert json.loads(reply["content"]) == {"term": "tide", "meaning": "what tide means"}
    assert [(r.kind, r.target, r.args) for r in broker.requests] == [
        ("tool", "lookup", {"term": "tide"})
    ]
    assert (result.usage.input_tokens, result.usage.output_tokens) == (22, 14)  # both turns


async def test_parallel_calls_run_together_and_answer_in_order(
    stub: OpenAIStub, broker: Broker
) -> None:
    second_started = asyncio.Event()

    async def first(args: LookupIn) -> dict[str, str]:
        # returns only once the second call has started: made one after the other,
        # the first would fail (its timeout) and say so in its result
        await second_started.wait()
        return {"term": args.term, "meaning": "first"}

    async def second(args: LookupIn) -> dict[str, str]:
        second_started.set()
        return {"term": args.term, "meaning": "second"}

    broker.registry = ToolRegistry(
        [Tool.define("lookup", first, LookupIn), Tool.define("broken", second, LookupIn)]
    )
    stub.script(
        Reply(tool_calls=[("lookup", {"term": "a"}), ("broken", {"term": "b"})]),
        GOOD,
    )
    async with client(stub) as llm:
        result = await Researcher.run(card(), llm)
    assert result.status == "completed", result
    replies = tool_messages(stub.bodies()[1])
    assert [r["tool_call_id"] for r in replies] == ["call_1", "call_2"]  # the model's order
    assert [json.loads(r["content"])["meaning"] for r in replies] == ["first", "second"]


async def test_a_tool_error_goes_back_to_the_model(stub: OpenAIStub, broker: Broker) -> None:
    stub.script(Reply(tool_calls=[("broken", {"term": "tide"})]), GOOD)
    async with client(stub) as llm:
        result = await Researcher.run(card(), llm)
    assert result.status == "completed", result  # the model recovered
    (reply,) = tool_messages(stub.bodies()[1])
    error = json.loads(reply["content"])
    assert error["error_type"] == "tool_error" and "the index is down" in error["error"]


async def test_bad_arguments_go_back_to_the_model(stub: OpenAIStub, broker: Broker) -> None:
    stub.script(
        Reply(tool_calls=[("lookup", "{not json"), ("lookup", {"word": "x"})]),
        GOOD,
    )
    async with client(stub) as llm:
        result = await Researcher.run(card(), llm)
    assert result.status == "completed", result
    unparsed, invalid = (json.loads(r["content"]) for r in tool_messages(stub.bodies()[1]))
    assert unparsed["error_type"] == "invalid_input" and "not JSON" in unparsed["error"]
    assert invalid["error_type"] == "invalid_input"  # the registry's schema check
    assert len(broker.requests) == 1  # unparsable arguments never leave the agent


async def test_a_refused_tool_goes_back_to_the_model(stub: OpenAIStub, broker: Broker) -> None:
    stub.script(Reply(tool_calls=[("delete_everything", {})]), GOOD)
    async with client(stub) as llm:
        result = await Researcher.run(card(), llm)
    assert result.status == "completed", result
    (reply,) = tool_messages(stub.bodies()[1])
    refusal = json.loads(reply["content"])
    assert refusal["error_type"] == "access_denied" and "tool_not_allowed" in refusal["error"]


async def test_the_structured_output_schema_has_an_object_at_its_root(
    stub: OpenAIStub, broker: Broker
) -> None:
    stub.script(GOOD)
    async with client(stub) as llm:
        result = await Researcher.run(card(), llm)
    assert result.status == "completed", result
    fmt = stub.bodies()[0]["response_format"]["json_schema"]
    schema = fmt["schema"]
    assert "$ref" not in schema and schema["type"] == "object"
    assert schema["required"] == ["answer", "sources"]
    assert schema["additionalProperties"] is False and fmt["strict"] is True
    assert "Answer" in schema["$defs"]  # kept: other references may point into them


class Node(msgspec.Struct):
    name: str
    children: list[Node] = []


def test_object_root_keeps_recursive_definitions() -> None:
    schema = object_root(msgspec.json.schema(Node))
    assert schema["type"] == "object"
    assert schema["properties"]["children"]["items"] == {"$ref": "#/$defs/Node"}
    assert "Node" in schema["$defs"]
    assert object_root({"type": "string"}) == {"type": "string"}


async def test_the_runtime_specs_are_offered_for_tools_declared_by_name(
    stub: OpenAIStub, broker: Broker
) -> None:
    stub.script(GOOD)
    token = TOOL_SPECS.set({"broken": BROKEN.spec})
    try:
        async with client(stub) as llm:
            await Researcher.run(card(), llm)
    finally:
        TOOL_SPECS.reset(token)
    by_name = {t["function"]["name"]: t["function"] for t in stub.bodies()[0]["tools"]}
    assert by_name["broken"]["description"] == "Always fails."
    assert by_name["broken"]["parameters"]["required"] == ["term"]


async def test_openai_parses_parallel_tool_calls_into_a_journalable_completion(
    stub: OpenAIStub,
) -> None:
    stub.script(Reply(tool_calls=[("lookup", {"term": "a"}), ("lookup", '{"term": "b"}')]))
    tools = [tool_definition(LOOKUP.spec)]
    async with client(stub) as llm:
        c = await llm.chat([{"role": "user", "content": "hi"}], tools=tools)
    assert c.text == "" and c.finish_reason == "tool_calls"
    assert c.tool_calls == (
        ToolCall("call_1", "lookup", '{"term": "a"}'),
        ToolCall("call_2", "lookup", '{"term": "b"}'),
    )
    assert stub.bodies()[0]["tools"] == tools
    again = msgspec.convert(json.loads(msgspec.json.encode(c)), Completion)
    assert again == c


# -- against the mock: the limits --------------------------------------------------------


async def test_the_mock_calls_the_first_tool_then_answers(broker: Broker) -> None:
    result = await Researcher.run(card(), MockLLM())
    assert result.status == "completed", result
    ((kind, target, args),) = [(r.kind, r.target, r.args) for r in broker.requests]
    assert (kind, target) == ("tool", "lookup") and isinstance(args["term"], str)
    assert set(result.output) == {"answer", "sources"}


async def test_the_mock_plays_its_tool_script(broker: Broker) -> None:
    llm = MockLLM(tool_script=[["lookup", ("lookup", {"term": "moon"})], ["broken"]])
    result = await Researcher.run(card(), llm)
    assert result.status == "completed", result
    assert [r.target for r in broker.requests] == ["lookup", "lookup", "broken"]
    assert broker.requests[1].args == {"term": "moon"}


@pytest.mark.parametrize(
    ("limits", "script", "reason"),
    [
        ({"max_turns": 2}, [["lookup"], ["lookup"], ["lookup"]], "llm_max_turns"),
        ({"max_tool_calls": 2}, [["lookup"], ["lookup", "lookup"]], "llm_max_tool_calls"),
        ({"max_tokens_per_task": 5}, [["lookup"]], "llm_token_limit"),
    ],
)
async def test_each_limit_fails_the_attempt_with_its_reason(
    broker: Broker, limits: dict[str, int], script: list[list[str]], reason: str
) -> None:
    limited: type[Researcher] = type("Limited", (Researcher,), dict(limits))
    result = await limited.run(card(), MockLLM(tool_script=script))
    assert result.status == "failed" and result.reason == reason, result
    (limit,) = limits
    assert f"{limit}=" in (result.error or "")  # the message names the limit


async def test_within_the_limits_the_same_script_completes(broker: Broker) -> None:
    result = await Researcher.run(card(), MockLLM(tool_script=[["lookup"]] * 3))
    assert result.status == "completed", result
    assert len(broker.requests) == 3


# -- end to end: a real runtime, its registry and its log -------------------------------


class ByName(LLMAgent):
    """Declares its tools by name only: their specs come from the runtime's registry."""

    agent_id = "by_name"
    description = "Answers a question, looking terms up."
    capability = "answer"
    input_type = Question
    output_type = Answer
    instructions = "Answer the question; look up the terms you need."
    tools = ["lookup"]


async def test_tool_calls_of_an_embedded_run_are_in_the_log() -> None:
    store = MemoryEventStore()
    registry = ToolRegistry([LOOKUP, BROKEN])
    # one turn of two parallel calls: lookup (allowed), broken (registered, not allowed)
    llm = MockLLM(tool_script=[["lookup", ("broken", {"term": "x"})]])
    plan = {
        "goal": "Why are there tides?",
        "tasks": [{"id": "a", "capability": "answer", "inputs": {"question": "Why tides?"}}],
    }
    async with EmbeddedRuntime(store, [ByName], llm=llm, tools=registry) as rt:
        result = await rt.run(plan, timeout=30)
    assert result.status == "completed", result
    events = [e.data for e in await store.read_correlation(result.root_id)]
    requested = [e for e in events if isinstance(e, ev.ToolRequested)]
    called = [e for e in events if isinstance(e, ev.ToolCalled)]
    refused = [e for e in events if isinstance(e, ev.AccessRefused)]
    assert [e.tool for e in requested] == ["lookup"] and [e.tool for e in called] == ["lookup"]
    # the registry's spec was offered: the mock's arguments fit it, and the call succeeded
    assert called[0].error is None and called[0].result["term"] == called[0].arguments["term"]
    assert [(e.target, e.reason) for e in refused] == [("broken", "tool_not_allowed")]


async def test_the_tutorial_tool_agent_runs() -> None:
    page = Path(__file__).resolve().parents[2] / "docs" / "tutorials" / "llm-agents.md"
    blocks = re.findall(r"```python[^\n]*\n(.*?)```", page.read_text(), re.S)
    code = next(b for b in blocks if "tools = [" in b)
    namespace: dict[str, Any] = {"__name__": "tutorial_tool_agent"}
    exec(compile(code, str(page), "exec"), namespace)
    agent, glossary = namespace["Explainer"], namespace["GLOSSARY"]
    assert agent.card().constraints.tools == ["glossary"]
    assert (agent.max_turns, agent.max_tool_calls) == (6, 8)
    store = MemoryEventStore()
    plan = {
        "goal": "Explain",
        "tasks": [{"id": "e", "capability": "explain", "inputs": {"term": "tide"}}],
    }
    async with EmbeddedRuntime(store, [agent], tools=ToolRegistry([glossary])) as rt:
        result = await rt.run(plan, timeout=30)
    assert result.status == "completed", result
    events = [e.data for e in await store.read_correlation(result.root_id)]
    assert [e.tool for e in events if isinstance(e, ev.ToolCalled)] == ["glossary"]


@pytest.mark.parametrize(
    "limits", [{"max_turns": 0}, {"max_tool_calls": True}, {"max_tokens_per_task": -1}]
)
def test_a_bad_limit_is_refused_when_the_class_is_made(limits: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=next(iter(limits))):
        type("Bad", (Researcher,), dict(limits))


class FailsOnce(MockLLM):
    """The mock, whose second call fails once (a retryable server error)."""

    def __init__(self) -> None:
        super().__init__(tool_script=[["lookup", "lookup"]])
        self.live = 0

    async def chat(self, messages: Any, **kw: Any) -> Completion:
        self.live += 1
        if self.live == 2:
            raise LLMServerError("HTTP 503")
        return await super().chat(messages, **kw)


async def test_a_retry_replays_the_tool_turn_from_the_journal() -> None:
    made: list[str] = []

    def counted(args: LookupIn) -> LookupOut:
        made.append(args.term)
        return lookup(args)

    registry = ToolRegistry([Tool.define("lookup", counted, LookupIn, LookupOut)])
    llm = FailsOnce()
    policy = Policy(retry=RetryPolicy(max_attempts=2, initial_interval_s=0.01, jitter=0.0))
    plan = {
        "goal": "Why are there tides?",
        "tasks": [{"id": "a", "capability": "answer", "inputs": {"question": "Why tides?"}}],
    }
    store = MemoryEventStore()
    async with EmbeddedRuntime(store, [ByName], policy, llm=llm, tools=registry) as rt:
        result = await rt.run(plan, timeout=30)
    assert result.status == "completed", result
    # the second attempt got the tool-calling turn and both calls from the log: the
    # tools ran once each, and only the failed call went out again
    assert len(made) == 2 and llm.live == 3
