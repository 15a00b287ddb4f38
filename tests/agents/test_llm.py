"""The LLM seam: MockLLM determinism, OpenAIChatLLM against a stub server on loopback."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgspec
import pytest

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
from cardbus.eventstore.errors import CardbusError

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


# -- a stub chat-completions server ----------------------------------------------------


@dataclass
class Stub:
    """What the stub server saw, and what it answers next."""

    url: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200
    body: bytes = b""
    usage: dict[str, int] = field(
        default_factory=lambda: {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
    )

    def answer(self, content: Any = "stub answer", **extra: Any) -> None:
        doc = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": "stub-model-2024",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": self.usage,
        }
        doc.update(extra)
        self.status, self.body = 200, json.dumps(doc).encode()


@pytest.fixture
def stub() -> Iterator[Stub]:
    state = Stub()
    state.answer()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            state.requests.append(
                {
                    "path": self.path,
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                    "body": json.loads(raw),
                }
            )
            self.send_response(state.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(state.body)))
            self.end_headers()
            self.wfile.write(state.body)

        def log_message(self, *args: Any) -> None:  # keep the test output quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)  # a free port
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


async def test_openai_client_sends_a_chat_completion_request(stub: Stub) -> None:
    async with OpenAIChatLLM(stub.url, "gpt-test", api_key="sk-secret") as llm:
        c = await llm.complete("What is a bee?", system="You are terse.")
    assert c == Completion("stub answer", 11, 7, "stub-model-2024")
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


async def test_openai_client_without_key_or_system_prompt(stub: Stub) -> None:
    llm = OpenAIChatLLM(stub.url + "/", "m")  # a trailing slash is fine
    try:
        await llm.complete("hi")
    finally:
        await llm.aclose()
    (req,) = stub.requests
    assert req["path"] == "/v1/chat/completions"
    assert "authorization" not in req["headers"]
    assert req["body"]["messages"] == [{"role": "user", "content": "hi"}]


async def test_missing_usage_counts_as_zero_and_model_falls_back(stub: Stub) -> None:
    stub.answer(usage=None, model=None)
    async with OpenAIChatLLM(stub.url, "fallback-model") as llm:
        c = await llm.complete("x")
    assert c == Completion("stub answer", 0, 0, "fallback-model")


def _doc(**over: Any) -> bytes:
    base = {"choices": [{"message": {"role": "assistant", "content": "ok"}}]}
    base.update(over)
    return json.dumps(base).encode()


@pytest.mark.parametrize(
    ("status", "body", "match"),
    [
        (500, b'{"error": "boom"}', "failed"),
        (401, b'{"error": "bad key"}', "failed"),
        (429, b"", "failed"),
        (200, b"this is not json", "unexpected"),
        (200, b"", "unexpected"),
        (200, b"[1, 2]", "unexpected"),
        (200, b'{"id": "x"}', "unexpected"),  # no choices
        (200, _doc(choices=[]), "unexpected"),
        (200, _doc(choices=[{"finish_reason": "stop"}]), "unexpected"),  # no message
        (200, _doc(choices=[{"message": {"role": "assistant"}}]), "unexpected"),
        (200, _doc(choices=[{"message": {"content": None}}]), "not text"),
        (200, _doc(choices=[{"message": {"content": ["parts"]}}]), "not text"),
        (200, _doc(choices="all"), "unexpected"),
        (200, _doc(usage=[1, 2]), "unexpected"),
        (200, _doc(usage={"prompt_tokens": "eleven"}), "unexpected"),
        (200, _doc(usage={"completion_tokens": -1}), "unexpected"),
        (200, _doc(usage={"prompt_tokens": 1.5}), "unexpected"),
    ],
)
async def test_bad_responses_are_llm_errors(
    stub: Stub, status: int, body: bytes, match: str
) -> None:
    stub.status, stub.body = status, body
    async with OpenAIChatLLM(stub.url, "m") as llm:
        with pytest.raises(LLMError, match=match) as info:
            await llm.complete("x")
    assert isinstance(info.value, CardbusError)


async def test_an_unreachable_server_is_an_llm_error(stub: Stub) -> None:
    url = stub.url.replace("/v1", "")
    port = int(url.rsplit(":", 1)[1])
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    assert dead != port
    async with OpenAIChatLLM(f"http://127.0.0.1:{dead}", "m", timeout_s=2) as llm:
        with pytest.raises(LLMError, match="failed"):
            await llm.complete("x")


async def test_a_slow_server_is_an_llm_error(stub: Stub) -> None:
    import socket

    with socket.socket() as listener:  # accepts, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        async with OpenAIChatLLM(f"http://127.0.0.1:{port}", "m", timeout_s=0.2) as llm:
            with pytest.raises(LLMError, match="failed"):
                await llm.complete("x")


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


def ask(question: str = "Why do bees dance?") -> TaskCard:
    return TaskCard(task_id="t1", root_id="r1", capability="ask", inputs={"question": question})


async def test_an_agent_reports_the_servers_usage(stub: Stub) -> None:
    stub.usage = {"prompt_tokens": 123, "completion_tokens": 45, "total_tokens": 168}
    stub.answer("They tell each other where the flowers are.")
    async with OpenAIChatLLM(stub.url, "gpt-test", api_key="k") as llm:
        result = await Oracle.run(ask(), llm)
    assert result.status == "completed"
    assert result.output == {"answer": "They tell each other where the flowers are."}
    assert (result.usage.input_tokens, result.usage.output_tokens) == (123, 45)
    (req,) = stub.requests
    assert req["body"]["messages"][-1] == {"role": "user", "content": "Why do bees dance?"}


async def test_an_llm_error_fails_the_task_with_the_reason(stub: Stub) -> None:
    stub.status, stub.body = 500, b"{}"
    async with OpenAIChatLLM(stub.url, "m") as llm:
        result = await Oracle.run(ask(), llm)
    assert result.status == "failed"
    assert result.error is not None and result.error.startswith("LLMError: chat completion failed")
    assert "500" in result.error
