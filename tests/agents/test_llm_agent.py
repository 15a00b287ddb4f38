"""LLMAgent against a stub OpenAI-compatible server: structured output, fallback, repairs."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from openai_stub import OpenAIStub, Reply
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cardbus.agents import llm as llm_module
from cardbus.agents.cards import TaskCard, decode_result_card, encode
from cardbus.agents.llm import Completion, MockLLM, OpenAIChatLLM
from cardbus.agents.llm_agent import LLMAgent, extract_json, response_format, structured_schema
from cardbus.eventstore.events import ReviewIssue


class Topic(msgspec.Struct, frozen=True):
    topic: str
    words: int = 50


class Summary(msgspec.Struct, frozen=True):
    title: str
    points: list[str]
    confidence: float = 0.5


class Summarist(LLMAgent):
    agent_id = "summarist"
    description = "Summarises what is known about a topic in a few points."
    capability = "summarize"
    input_type = Topic
    output_type = Summary
    instructions = "You summarise topics for a general audience."
    model = "class-model"
    models = ["small-model"]


GOOD = {"title": "Tides", "points": ["The moon pulls the sea."], "confidence": 0.9}


def card(**over: Any) -> TaskCard:
    base: dict[str, Any] = {
        "task_id": "t1",
        "root_id": "r1",
        "capability": "summarize",
        "goal": "Summarise tides",
        "inputs": {"topic": "tides"},
    }
    base.update(over)
    return TaskCard(**base)


@pytest.fixture
def stub() -> Iterator[OpenAIStub]:
    with OpenAIStub() as s:
        yield s


def client(stub: OpenAIStub, **kw: Any) -> OpenAIChatLLM:
    kw.setdefault("max_retries", 0)
    return OpenAIChatLLM(stub.url, "endpoint-model", api_key="k", **kw)


def survives(result: Any) -> Any:
    return decode_result_card(encode(result))


# -- structured output ----------------------------------------------------------------


async def test_structured_output_is_asked_for_and_honoured(stub: OpenAIStub) -> None:
    stub.script(json.dumps(GOOD))
    async with client(stub) as llm:
        result = survives(await Summarist.run(card(), llm))
    assert result.status == "completed", result
    assert result.output == GOOD
    (body,) = stub.bodies()
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["name"] == "Summary" and fmt["json_schema"]["strict"] is True
    summary = fmt["json_schema"]["schema"]["$defs"]["Summary"]
    assert summary["additionalProperties"] is False
    assert summary["required"] == ["title", "points", "confidence"]  # strict: all of them
    assert "default" not in summary["properties"]["confidence"]
    assert body["model"] == "class-model"
    assert (result.usage.input_tokens, result.usage.output_tokens) == (11, 7)
    assert result.notes == "model: stub-model-2024"


async def test_refused_structured_output_falls_back_to_the_prompt(stub: OpenAIStub) -> None:
    stub.refuse_structured = True
    stub.script(json.dumps(GOOD), json.dumps(GOOD))
    async with client(stub) as llm:
        result = await Summarist.run(card(), llm)
        assert result.status == "completed", result
        first, second = stub.bodies()
        assert "response_format" in first and "response_format" not in second
        system = second["messages"][0]
        assert system["role"] == "system" and "JSON Schema" in system["content"]
        assert '"points"' in system["content"]  # the schema itself is in the prompt
        # the refusal is remembered for this endpoint and model: one request next time
        again = await Summarist.run(card(task_id="t2"), llm)
    assert again.status == "completed"
    assert len(stub.requests) == 3 and "response_format" not in stub.bodies()[2]
    assert result.usage.input_tokens == 11  # the refused request cost nothing


async def test_a_plain_llm_without_chat_gets_the_schema_in_the_prompt() -> None:
    seen: list[tuple[str, str]] = []

    class Plain:
        model = "plain"

        async def complete(self, prompt: str, *, system: str = "") -> Completion:
            seen.append((prompt, system))
            return Completion(f"Here you go:\n{json.dumps(GOOD)}", 3, 2, "plain")

    result = await Summarist.run(card(), Plain())
    assert result.status == "completed" and result.output == GOOD
    ((prompt, system),) = seen
    assert "JSON Schema" in system and "tides" in prompt
    assert (result.usage.input_tokens, result.usage.output_tokens) == (3, 2)


# -- tolerant extraction ----------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        "```json\n" + json.dumps(GOOD, indent=2) + "\n```",
        "```\n" + json.dumps(GOOD) + "\n```\nThat is all.",
        "Sure! Here is the summary:\n" + json.dumps(GOOD) + "\nLet me know if you need more.",
        "<think>the user wants {json}</think>\n" + json.dumps(GOOD),
        "Points [1] and [2] below. " + json.dumps(GOOD) + " {not this}",
    ],
    ids=["json-fence", "bare-fence", "prose-around", "think-block", "brackets-in-prose"],
)
async def test_json_is_found_in_fences_and_prose(stub: OpenAIStub, content: str) -> None:
    stub.script(content)
    async with client(stub) as llm:
        result = await Summarist.run(card(), llm)
    assert result.status == "completed", result
    assert result.output == GOOD
    assert len(stub.requests) == 1


def test_extract_json_says_why_when_there_is_none() -> None:
    with pytest.raises(ValueError, match="no JSON object"):
        extract_json("I cannot help with that.")
    with pytest.raises(ValueError, match="empty"):
        extract_json("  <think>hmm</think> ")
    assert extract_json("the list: [1, 2] done") == [1, 2]


# -- repairs ------------------------------------------------------------------------------


async def test_invalid_json_then_valid_on_the_second_ask(stub: OpenAIStub) -> None:
    stub.script('{"title": "Tides", "points": [', json.dumps(GOOD))
    async with client(stub) as llm:
        result = await Summarist.run(card(), llm)
    assert result.status == "completed" and result.output == GOOD
    first, second = stub.bodies()
    assert second["messages"][:2] == first["messages"]
    assert second["messages"][2] == {
        "role": "assistant",
        "content": '{"title": "Tides", "points": [',
    }
    assert (
        second["messages"][3]["role"] == "user" and "not JSON" in second["messages"][3]["content"]
    )
    assert (result.usage.input_tokens, result.usage.output_tokens) == (22, 14)  # both asks


async def test_wrong_schema_then_the_right_one(stub: OpenAIStub) -> None:
    stub.script(json.dumps({"title": 7, "points": "one"}), json.dumps(GOOD))
    async with client(stub) as llm:
        result = await Summarist.run(card(), llm)
    assert result.status == "completed" and result.output == GOOD
    repair = stub.bodies()[1]["messages"][-1]["content"]
    assert "$.title" in repair and "$.points" in repair


async def test_answers_that_never_fit_fail_with_llm_bad_output(stub: OpenAIStub) -> None:
    stub.default = Reply(content="I would rather not.")
    async with client(stub) as llm:
        result = await Summarist.run(card(), llm)
    assert result.status == "failed"
    assert result.reason == "llm_bad_output"
    assert result.error is not None and "no usable answer in 3 asks" in result.error
    assert len(stub.requests) == 1 + Summarist.max_repairs
    assert result.usage.input_tokens == 3 * 11  # the failed asks count toward the budget


async def test_check_sends_semantic_errors_back() -> None:
    class Careful(Summarist):
        def check(self, output: Any, inputs: Any, task: TaskCard) -> list[str]:
            return [] if output.points else ["give at least one point"]

    answers = iter([{**GOOD, "points": []}, GOOD])
    llm = MockLLM(respond=lambda prompt: json.dumps(next(answers)))
    result = await Careful.run(card(), llm)
    assert result.status == "completed" and result.output == GOOD
    assert "give at least one point" in llm.calls[1]


# -- endpoint failures become typed reasons ----------------------------------------------


async def test_a_rate_limit_with_retry_after_is_waited_out(stub: OpenAIStub) -> None:
    stub.script(Reply(status=429, headers={"Retry-After": "0.3"}), json.dumps(GOOD))
    async with client(stub, max_retries=1) as llm:
        started = time.monotonic()
        result = await Summarist.run(card(), llm)
    assert result.status == "completed"
    assert time.monotonic() - started >= 0.25


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (Reply(status=429, headers={"Retry-After": "30"}), "llm_rate_limited"),
        (Reply(status=500), "llm_server_error"),
        (Reply(content=json.dumps(GOOD), delay_s=1.0), "llm_timeout"),
        (Reply(status=401), "llm_request_refused"),  # not a structured-output refusal
    ],
)
async def test_endpoint_failures_are_failed_attempts_with_typed_reasons(
    stub: OpenAIStub, reply: Reply, reason: str
) -> None:
    stub.script(reply)
    # only the late reply is meant to outlast the client's deadline: under a busy
    # machine's load a prompt 429 could take 0.3 s to arrive, and would time out
    timeout_s = 0.3 if reason == "llm_timeout" else 30.0
    async with client(stub, timeout_s=timeout_s) as llm:
        result = await Summarist.run(card(), llm)
    assert result.status == "failed"
    assert result.reason == reason
    assert len(stub.requests) == 1


# -- the card, the model ---------------------------------------------------------------


async def test_only_the_card_reaches_the_model() -> None:
    llm = MockLLM(respond=lambda prompt: json.dumps(GOOD))
    issue = ReviewIssue(
        issue_type="missing_point", section="points", severity="low", suggestion="Add springs."
    )
    task = card(
        task_id="secret-task-id",
        root_id="secret-root",
        inputs={"topic": "tides", "words": 80},
        review=[issue],
        supplement={"figures": [2, 4]},
    )
    result = await Summarist.run(task, llm)
    assert result.status == "completed"
    (prompt,) = llm.calls
    assert prompt.startswith("Task: Summarise tides\n\nInputs:\n")
    assert json.loads(prompt.split("Inputs:\n", 1)[1].split("\n\n", 1)[0]) == {
        "topic": "tides",
        "words": 80,
    }
    assert "Add springs." in prompt and '"figures"' in prompt
    assert "secret" not in prompt


async def test_the_model_is_per_class_and_per_task(stub: OpenAIStub) -> None:
    assert Summarist.card().constraints.limits["model"] == ["class-model", "small-model"]
    stub.default = Reply(content=json.dumps(GOOD))
    async with client(stub) as llm:
        default = await Summarist.run(card(), llm)
        small = await Summarist.run(card(constraints={"model": "small-model"}), llm)
        other = await Summarist.run(card(constraints={"model": "gpt-huge"}), llm)
    assert (default.status, small.status) == ("completed", "completed")
    assert [b["model"] for b in stub.bodies()] == ["class-model", "small-model"]
    assert other.status == "rejected" and other.reason == "over_constraint"


async def test_without_a_class_model_the_endpoints_default_is_used(stub: OpenAIStub) -> None:
    class Anymodel(Summarist):
        model = None
        models = ()

    stub.script(json.dumps(GOOD))
    async with client(stub) as llm:
        await Anymodel.run(card(), llm)
    assert stub.bodies()[0]["model"] == "endpoint-model"


async def test_the_mock_answers_structured_output_with_an_instance_of_the_schema() -> None:
    llm = MockLLM()
    a = await Summarist.run(card(), llm)
    b = await Summarist.run(card(), MockLLM())
    assert a.status == "completed", a
    assert a.output == b.output  # deterministic
    assert set(a.output) == {"title", "points", "confidence"} and len(a.output["points"]) == 1
    assert a.notes == "model: class-model"


def test_a_schema_with_free_keys_is_sent_non_strict() -> None:
    class Free(msgspec.Struct):
        name: str
        extra: dict[str, Any]

    schema = msgspec.json.schema(Free)
    body, strict = structured_schema(schema)
    assert strict is False and body == schema
    fmt = response_format("Free thing!", schema)
    assert fmt["json_schema"]["name"] == "Free_thing_" and fmt["json_schema"]["strict"] is False
    closed, ok = structured_schema(msgspec.json.schema(Summary))
    assert ok and closed["$defs"]["Summary"]["additionalProperties"] is False


# -- a GenAI span per model call -------------------------------------------------------


async def test_each_model_call_is_a_genai_span(stub: OpenAIStub) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    llm_module.use_tracer_provider(provider)
    try:
        stub.script("not json", json.dumps(GOOD), Reply(status=500))
        async with client(stub) as llm:
            ok = await Summarist.run(card(), llm)
            failed = await Summarist.run(card(task_id="t2"), llm)
    finally:
        llm_module.use_tracer_provider(None)
    assert (ok.status, failed.status) == ("completed", "failed")
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["chat class-model"] * 3
    attrs = dict(spans[0].attributes or {})
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == "class-model"
    assert attrs["gen_ai.response.model"] == "stub-model-2024"
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (11, 7)
    assert attrs["gen_ai.provider.name"] == "127.0.0.1"  # from the endpoint: the stub's host
    assert dict(spans[2].attributes or {})["error.type"] == "llm_server_error"


async def test_no_span_without_tracing(stub: OpenAIStub) -> None:
    assert llm_module._tracer() is None  # no SDK provider set globally in the test process
    stub.script(json.dumps(GOOD))
    async with client(stub) as llm:
        assert (await Summarist.run(card(), llm)).status == "completed"
