"""The LLM seam: MockLLM determinism, OpenAIChatLLM (the openai SDK) against a stub server."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from openai_stub import OpenAIStub, Reply

from cardbus.agents import (
    Agent,
    Capability,
    Completion,
    MockLLM,
    OpenAIChatLLM,
    TaskCard,
    TaskContext,
)
from cardbus.agents.llm import LLMError
from cardbus.eventstore.errors import (
    CardbusError,
    LLMBadOutput,
    LLMRateLimited,
    LLMRequestRefused,
    LLMServerError,
    LLMTimeout,
)

# -- MockLLM --------------------------------------------------------------------------


async def test_mock_llm_is_deterministic() -> None:
    a, b = MockLLM(), MockLLM()
    first = await a.complete("list facts about bees", system="be brief")
    assert first == await b.complete("list facts about bees", system="be brief")
    assert first == await a.complete("list facts about bees", system="be brief")
    assert first.text.startswith("[mock-1:") and "list facts about bees" in first.text
    assert first.input_tokens == 4 + 2  # words of the prompt and of the system prompt
    assert first.output_tokens == len(first.text.split())
    assert first.model == "mock-1"
    other = await a.complete("list facts about wasps")
    assert other.text != first.text
    assert a.calls == ["list facts about bees"] * 2 + ["list facts about wasps"]


async def test_mock_llm_with_a_respond_function() -> None:
    llm = MockLLM(respond=lambda p: p.upper(), model="m2")
    c = await llm.complete("hello there")
    assert c == Completion("HELLO THERE", 2, 2, "m2")
    assert (await llm.complete("")).input_tokens == 0


# -- the client against a stub chat-completions server ------------------------------


@pytest.fixture
def stub() -> Iterator[OpenAIStub]:
    with OpenAIStub() as s:
        yield s


def client(stub: OpenAIStub, model: str = "m", **kw: Any) -> OpenAIChatLLM:
    kw.setdefault("max_retries", 0)
    kw.setdefault("api_key", "")
    return OpenAIChatLLM(stub.url, model, **kw)


async def test_openai_client_sends_a_chat_completion_request(stub: OpenAIStub) -> None:
    async with OpenAIChatLLM(stub.url, "gpt-test", api_key="sk-secret") as llm:
        c = await llm.complete("What is a bee?", system="You are terse.")
    assert c == Completion("stub answer", 11, 7, "stub-model-2024", finish_reason="stop")
    (req,) = stub.requests
    assert req["path"] == "/v1/chat/completions"
    assert req["headers"]["authorization"] == "Bearer sk-secret"
    assert req["headers"]["content-type"] == "application/json"
    assert req["body"]["model"] == "gpt-test"
    assert req["body"]["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is a bee?"},
    ]
    assert req["body"]["temperature"] == 0.0
    assert "response_format" not in req["body"]


async def test_openai_client_without_key_or_system_prompt(
    stub: OpenAIStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    llm = OpenAIChatLLM(stub.url + "/", "m")  # a trailing slash is fine
    try:
        await llm.complete("hi")
    finally:
        await llm.aclose()
    (req,) = stub.requests
    assert req["path"] == "/v1/chat/completions"
    assert "authorization" not in req["headers"]
    assert req["body"]["messages"] == [{"role": "user", "content": "hi"}]


async def test_the_key_comes_from_the_environment(
    stub: OpenAIStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    async with OpenAIChatLLM(stub.url, "m") as llm:
        await llm.complete("hi")
    assert stub.requests[0]["headers"]["authorization"] == "Bearer sk-from-env"


async def test_chat_sends_the_model_and_the_response_format(stub: OpenAIStub) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "A", "schema": {}, "strict": True}}
    async with client(stub, "default-model") as llm:
        await llm.chat([{"role": "user", "content": "q"}], model="small", response_format=fmt)
        await llm.chat([{"role": "user", "content": "q"}])
    first, second = stub.bodies()
    assert (first["model"], first["response_format"]) == ("small", fmt)
    assert second["model"] == "default-model" and "response_format" not in second


async def test_missing_usage_counts_as_zero_and_model_falls_back(stub: OpenAIStub) -> None:
    stub.script(
        Reply(
            body=json.dumps(
                {"choices": [{"message": {"role": "assistant", "content": "stub answer"}}]}
            ).encode()
        )
    )
    async with client(stub, "fallback-model") as llm:
        c = await llm.complete("x")
    assert c == Completion("stub answer", 0, 0, "fallback-model")


def _doc(**over: Any) -> bytes:
    base = {"choices": [{"message": {"role": "assistant", "content": "ok"}}]}
    base.update(over)
    return json.dumps(base).encode()


@pytest.mark.parametrize(
    ("status", "body", "error", "match"),
    [
        (500, b'{"error": "boom"}', LLMServerError, "HTTP 500"),
        (503, b"overloaded", LLMServerError, "HTTP 503: overloaded"),
        (401, b'{"error": "bad key"}', LLMRequestRefused, "HTTP 401"),
        (404, b'{"error": "no such model"}', LLMRequestRefused, "HTTP 404"),
        (429, b"", LLMRateLimited, "HTTP 429"),
        (200, b"this is not json", LLMBadOutput, "unexpected"),
        (200, b"", LLMBadOutput, "unexpected"),
        (200, b"[1, 2]", LLMBadOutput, "unexpected"),
        (200, b'{"id": "x"}', LLMBadOutput, "unexpected"),  # no choices
        (200, _doc(choices=[]), LLMBadOutput, "unexpected"),
        (200, _doc(choices=[{"finish_reason": "stop"}]), LLMBadOutput, "unexpected"),
        (200, _doc(choices=[{"message": {"role": "assistant"}}]), LLMBadOutput, "unexpected"),
        (200, _doc(choices=[{"message": {"content": None}}]), LLMBadOutput, "not text"),
        (200, _doc(choices=[{"message": {"content": ["parts"]}}]), LLMBadOutput, "not text"),
        (200, _doc(choices="all"), LLMBadOutput, "unexpected"),
        (200, _doc(usage=[1, 2]), LLMBadOutput, "unexpected"),
        (200, _doc(usage={"prompt_tokens": "eleven"}), LLMBadOutput, "unexpected"),
        (200, _doc(usage={"completion_tokens": -1}), LLMBadOutput, "unexpected"),
        (200, _doc(usage={"prompt_tokens": 1.5}), LLMBadOutput, "unexpected"),
    ],
)
async def test_bad_responses_are_typed_llm_errors(
    stub: OpenAIStub, status: int, body: bytes, error: type[LLMError], match: str
) -> None:
    stub.script(Reply(status=status, body=body))
    async with client(stub) as llm:
        with pytest.raises(error, match=match) as info:
            await llm.complete("x")
    assert type(info.value) is error and isinstance(info.value, CardbusError)
    assert info.value.error_type.startswith("llm_")


async def test_a_rate_limit_is_retried_after_the_servers_delay(stub: OpenAIStub) -> None:
    stub.script(Reply(status=429, headers={"Retry-After": "0.4"}), Reply(content="later"))
    async with client(stub, max_retries=1) as llm:
        started = time.monotonic()
        c = await llm.complete("x")
        waited = time.monotonic() - started
    assert c.text == "later" and len(stub.requests) == 2
    assert 0.35 <= waited < 3  # the SDK waited what Retry-After said


async def test_a_rate_limit_past_the_retries_says_when_to_come_back(stub: OpenAIStub) -> None:
    stub.script(*[Reply(status=429, headers={"Retry-After": "0.05"})] * 2)
    async with client(stub, max_retries=1) as llm:
        with pytest.raises(LLMRateLimited, match=r"retry after 0\.05s") as info:
            await llm.complete("x")
    assert info.value.retry_after == 0.05 and info.value.error_type == "llm_rate_limited"
    assert len(stub.requests) == 2


async def test_a_server_error_is_retried_then_succeeds(stub: OpenAIStub) -> None:
    stub.script(Reply(status=500), Reply(content="fine now"))
    async with client(stub, max_retries=2) as llm:
        assert (await llm.complete("x")).text == "fine now"
    assert len(stub.requests) == 2


async def test_an_unreachable_server_is_a_server_error() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    async with OpenAIChatLLM(f"http://127.0.0.1:{dead}/v1", "m", timeout_s=2, max_retries=0) as llm:
        with pytest.raises(LLMServerError, match="cannot reach"):
            await llm.complete("x")


async def test_an_answer_slower_than_the_timeout_is_llm_timeout(stub: OpenAIStub) -> None:
    stub.script(Reply(content="too late", delay_s=1.5))
    async with client(stub, timeout_s=0.3) as llm:
        started = time.monotonic()
        with pytest.raises(LLMTimeout, match=r"within 0\.3s") as info:
            await llm.complete("x")
    assert time.monotonic() - started < 1.4
    assert info.value.error_type == "llm_timeout"


# -- an agent that calls the real client ------------------------------------------------


class AskIn(msgspec.Struct, frozen=True):
    question: str


class Answer(msgspec.Struct, frozen=True):
    answer: str


class Oracle(Agent):
    agent_id = "oracle"
    capabilities = [Capability("ask", AskIn, Answer, "answer a question")]

    async def handle(self, task: TaskCard, inputs: AskIn, ctx: TaskContext) -> Answer:
        return Answer(answer=await ctx.complete(inputs.question, system="Answer briefly."))


class RawOracle(Agent):
    """Calls ``ctx.llm`` directly and reports nothing: its usage is counted anyway."""

    agent_id = "raw-oracle"
    capabilities = [Capability("ask", AskIn, Answer, "answer a question")]

    async def handle(self, task: TaskCard, inputs: AskIn, ctx: TaskContext) -> Answer:
        first = await ctx.llm.complete(inputs.question)
        second = await ctx.llm.complete(first.text)
        return Answer(answer=second.text)


def ask(question: str = "Why do bees dance?") -> TaskCard:
    return TaskCard(task_id="t1", root_id="r1", capability="ask", inputs={"question": question})


async def test_an_agent_reports_the_servers_usage(stub: OpenAIStub) -> None:
    stub.usage = {"prompt_tokens": 123, "completion_tokens": 45, "total_tokens": 168}
    stub.script("They tell each other where the flowers are.")
    async with OpenAIChatLLM(stub.url, "gpt-test", api_key="k") as llm:
        result = await Oracle.run(ask(), llm)
    assert result.status == "completed"
    assert result.output == {"answer": "They tell each other where the flowers are."}
    assert (result.usage.input_tokens, result.usage.output_tokens) == (123, 45)
    (req,) = stub.requests
    assert req["body"]["messages"][-1] == {"role": "user", "content": "Why do bees dance?"}


async def test_plain_llm_calls_are_counted_automatically(stub: OpenAIStub) -> None:
    stub.usage = {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}
    async with client(stub) as llm:
        result = await RawOracle.run(ask(), llm)
    assert result.status == "completed" and len(stub.requests) == 2
    assert (result.usage.input_tokens, result.usage.output_tokens) == (200, 40)


async def test_usage_the_handler_reports_wins_over_the_count() -> None:
    class Reports(RawOracle):
        async def handle(self, task: TaskCard, inputs: AskIn, ctx: TaskContext) -> Answer:
            await ctx.llm.complete("one two three")
            ctx.usage(input_tokens=1, output_tokens=1)  # e.g. a cached answer's own bill
            return Answer(answer="x")

    result = await Reports.run(ask(), MockLLM())
    assert (result.usage.input_tokens, result.usage.output_tokens) == (1, 1)


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (Reply(status=500), "llm_server_error"),
        (Reply(status=429, headers={"Retry-After": "7"}), "llm_rate_limited"),
        (Reply(status=400), "llm_request_refused"),
        (Reply(body=b"<html>gateway</html>"), "llm_bad_output"),
        (Reply(content="late", delay_s=1.0), "llm_timeout"),
    ],
)
async def test_an_llm_error_fails_the_task_with_a_typed_reason(
    stub: OpenAIStub, reply: Reply, reason: str
) -> None:
    stub.script(reply)
    # only the late reply is meant to outlast the client's deadline: under a busy
    # machine's load a prompt 429 could take 0.3 s to arrive, and would time out
    timeout_s = 0.3 if reason == "llm_timeout" else 30.0
    async with client(stub, timeout_s=timeout_s) as llm:
        result = await Oracle.run(ask(), llm)
    assert result.status == "failed"
    assert result.reason == reason
    assert result.error is not None and result.error.startswith("LLM")
