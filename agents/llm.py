"""The LLM seam agents call: a protocol, a deterministic mock, an OpenAI-compatible client.

Two calls, both answering a ``Completion`` (text, token usage, model, and the
tool calls the model asked for with the reason it stopped):

* ``complete(prompt, *, system)``: the bare prompt -> text call every ``LLM`` has;
* ``chat(messages, *, model, response_format, tools)``: chat messages, a model
  chosen per call, optionally OpenAI structured output (``response_format``)
  and OpenAI function tools (``tools``: the model may answer ``tool_calls``);
  ``MockLLM`` and ``OpenAIChatLLM`` have it, and :func:`chat` gives it to any
  ``LLM`` (a plain one refuses structured output and tools with ``LLMRequestRefused``).

Tool-calling messages are OpenAI's: the model's turn is
:func:`assistant_message` of its completion (``tool_calls`` included), and each
result goes back as :func:`tool_message` (role ``tool``, ``tool_call_id``).

The mock is the default everywhere (demo, tests): the same messages always give
the same text and token counts, so runs are reproducible and need no network;
asked for structured output it answers a deterministic instance of the schema.
``OpenAIChatLLM`` speaks the chat-completions API of any OpenAI-compatible
server (vLLM, llama.cpp server, Ollama, OpenAI) through the official ``openai``
SDK (its retries with Retry-After, its timeouts); it needs the ``openai`` extra.
Its failures are typed (``eventstore.errors``): ``LLMRateLimited`` (429),
``LLMTimeout``, ``LLMServerError`` (5xx, unreachable), ``LLMRequestRefused``
(other 4xx), ``LLMBadOutput`` (a response that is not a chat completion).

:class:`MeteredLLM` is what a handler's ``ctx.llm`` is: it adds every call's
usage to the task's, and makes each call a GenAI span (``chat <model>``) when
tracing is on. :func:`configured_llm` picks the endpoint from flags or the
environment (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``CARDBUS_MODEL``).
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import json
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

import msgspec
from opentelemetry import trace

from cardbus.agents.pacing import (
    CALL_QUEUED_S,
    LimitKey,
    Pacer,
    current_pacing,
    process_pacer,
)
from cardbus.agents.streaming import ChunkSink, current_sink
from cardbus.eventstore.errors import (
    ConfigError,
    LLMBadOutput,
    LLMError,
    LLMRateLimited,
    LLMRequestRefused,
    LLMServerError,
    LLMTimeout,
    MissingExtra,
)

__all__ = [
    "ENV_API_KEY",
    "ENV_BASE_URL",
    "ENV_MODEL",
    "LLM",
    "ChatLLM",
    "Completion",
    "LLMError",
    "Message",
    "MeteredLLM",
    "MockLLM",
    "ModelJournal",
    "OpenAIChatLLM",
    "ToolCall",
    "assistant_message",
    "chat",
    "configured_llm",
    "current_max_tokens",
    "describe_llm",
    "provider_of_url",
    "schema_instance",
    "tool_message",
    "use_tracer_provider",
]

#: The output bound of the model call being made: what the orchestrator's budget check
#: reserved for its answer and handed back with its go-ahead (``TaskJournal.call`` sets it
#: around the live call). None: no budget bounds the call.
CALL_MAX_TOKENS: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "cardbus_call_max_tokens", default=None
)


def current_max_tokens(own: int | None = None) -> int | None:
    """The ``max_tokens`` to send with the model call being made: the budget's bound
    (``CALL_MAX_TOKENS``) and the caller's ``own``, the smaller; None when neither is set.

    A client that talks to an endpoint itself (a framework's model) sends this, so that a
    call under a run's budget can never be answered past what the budget reserved for it.
    """
    bound = CALL_MAX_TOKENS.get()
    given = [v for v in (own, bound) if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    return min(given) if given else None


ENV_BASE_URL = "OPENAI_BASE_URL"
ENV_API_KEY = "OPENAI_API_KEY"
ENV_MODEL = "CARDBUS_MODEL"

#: one chat message, as OpenAI's: ``{"role": "system" | "user" | "assistant", "content": text}``;
#: an assistant turn that called tools also has ``tool_calls`` (see :func:`assistant_message`),
#: a tool's result is ``{"role": "tool", "tool_call_id": id, "content": text}``
Message = Mapping[str, Any]


class ToolCall(msgspec.Struct, frozen=True):
    """One function call the model asked for: ``arguments`` is JSON text, as the model wrote it
    (it may not parse: the caller checks)."""

    id: str
    name: str
    arguments: str = "{}"


class Completion(msgspec.Struct, frozen=True):
    """One model answer. ``tool_calls``: the calls it asked for (several: parallel calls, to
    be answered in one go); ``finish_reason``: why it stopped (``stop``, ``tool_calls``,
    ``length``, ...; "" when the endpoint does not say)."""

    text: str
    input_tokens: int = 0
    output_tokens: int = 0
    model: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str = ""


def assistant_message(completion: Completion) -> dict[str, Any]:
    """The model's turn as the next request must repeat it (its ``tool_calls`` included)."""
    if not completion.tool_calls:
        return {"role": "assistant", "content": completion.text}
    return {
        "role": "assistant",
        "content": completion.text or None,
        "tool_calls": [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in completion.tool_calls
        ],
    }


def tool_message(call_id: str, content: str) -> dict[str, Any]:
    """The result of the tool call ``call_id``, as the model reads it."""
    return {"role": "tool", "tool_call_id": call_id, "content": content}


class LLM(Protocol):
    async def complete(self, prompt: str, *, system: str = "") -> Completion: ...


@runtime_checkable
class ChatLLM(Protocol):
    async def complete(self, prompt: str, *, system: str = "") -> Completion: ...

    async def chat(
        self,
        messages: Sequence[Message],
        *,
        model: str | None = None,
        response_format: dict[str, Any] | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> Completion: ...


async def chat(
    llm: LLM,
    messages: Sequence[Message],
    *,
    model: str | None = None,
    response_format: dict[str, Any] | None = None,
    tools: Sequence[dict[str, Any]] | None = None,
) -> Completion:
    """``llm.chat(...)`` if it has one; else the messages flattened into ``complete``.

    A plain ``LLM`` cannot honour ``response_format``: asked for it, this
    raises ``LLMRequestRefused`` (as an endpoint refusing it would), so the
    caller falls back to instructions in the prompt.
    """
    if isinstance(llm, ChatLLM):
        if tools:
            return await llm.chat(
                messages, model=model, response_format=response_format, tools=tools
            )
        return await llm.chat(messages, model=model, response_format=response_format)
    if tools:
        raise LLMRequestRefused(f"{type(llm).__name__} has no chat(): no tool calls")
    if response_format is not None:
        raise LLMRequestRefused(f"{type(llm).__name__} has no chat(): no structured output")
    system = "\n\n".join(str(m["content"]) for m in messages if m.get("role") == "system")
    rest = [m for m in messages if m.get("role") != "system"]
    if len(rest) == 1:
        prompt = str(rest[0]["content"])
    else:
        prompt = "\n\n".join(f"{m.get('role', 'user')}: {m['content']}" for m in rest)
    return await llm.complete(prompt, system=system)


def _tokens(text: str) -> int:
    return max(1, len(text.split())) if text else 0


def _count(value: Any) -> int:
    """A token count from a response; anything but a non-negative integer is an error."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"bad token count {value!r}")
    return value


# -- the mock ------------------------------------------------------------------------


#: one call in a ``MockLLM`` tool script: a tool's name (its arguments are then an instance
#: of the parameters schema it is offered with), or ``(name, arguments)``
MockToolCall = str | tuple[str, Mapping[str, Any]]


class MockLLM:
    """Deterministic: ``respond(prompt)`` if given, else a stable echo of the prompt.

    ``chat`` hands ``respond`` the last user message; without ``respond`` and
    asked for structured output it answers :func:`schema_instance` of the
    schema (seeded by the messages), so an ``LLMAgent`` works on it as is.

    Offered ``tools``, it drives a tool loop with no network: ``tool_script`` is
    its tool-calling turns, each a sequence of calls (several: parallel calls);
    a call is a tool's name (its arguments: :func:`schema_instance` of the
    tool's parameters) or ``(name, arguments)``. Which turn it plays is read
    from the conversation (the n-th assistant turn with tool calls in it), so
    the same messages always get the same answer. Past its script it answers
    as it would without tools (the final answer). The default script is one
    turn calling the first tool offered; ``tool_script=()`` never calls one.
    """

    provider = "cardbus.mock"

    def __init__(
        self,
        respond: Callable[[str], str] | None = None,
        model: str = "mock-1",
        tool_script: Sequence[Sequence[MockToolCall]] | None = None,
        chunk_delay_s: float = 0.0,
    ) -> None:
        self.respond = respond
        self.model = model
        self.tool_script = None if tool_script is None else [list(t) for t in tool_script]
        self.calls: list[str] = []
        #: in a worker, the answer is written word by word to the attempt's chunk sink
        #: (``agents.streaming``), this long apart, as a streaming endpoint would
        self.chunk_delay_s = chunk_delay_s

    async def _write(self, text: str) -> None:
        """The answer, piece by piece, to whoever watches (nothing when nobody does)."""
        sink = current_sink()
        if sink is None or not text:
            return
        out = sink.call()
        for i, word in enumerate(text.split(" ")):
            if i and self.chunk_delay_s > 0:
                await asyncio.sleep(self.chunk_delay_s)
            await out.send(word if i == 0 else " " + word)
        await out.end()

    async def complete(self, prompt: str, *, system: str = "") -> Completion:
        self.calls.append(prompt)
        if self.respond is not None:
            text = self.respond(prompt)
        else:
            digest = hashlib.sha256(prompt.encode()).hexdigest()[:8]
            text = f"[{self.model}:{digest}] {prompt[:200]}"
        await self._write(text)
        return Completion(text, _tokens(system) + _tokens(prompt), _tokens(text), self.model)

    async def chat(
        self,
        messages: Sequence[Message],
        *,
        model: str | None = None,
        response_format: dict[str, Any] | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> Completion:
        model = model or self.model
        prompt = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
        prompt = prompt if isinstance(prompt, str) else ""
        self.calls.append(prompt)
        seed = hashlib.sha256(
            json.dumps([dict(m) for m in messages], sort_keys=True, default=str).encode()
        ).hexdigest()[:8]
        used = sum(_tokens(str(m.get("content") or "")) for m in messages)
        calls = self._tool_turn(messages, tools or (), f"{model}:{seed}")
        if calls:
            spent = sum(_tokens(c.arguments) + 1 for c in calls)
            return Completion("", used, spent, model, calls, "tool_calls")
        schema = _json_schema_of(response_format)
        if self.respond is not None:
            text = self.respond(prompt)
        elif schema is not None:
            text = json.dumps(schema_instance(schema, f"{model}:{seed}"))
        else:
            text = f"[{model}:{seed}] {prompt[:200]}"
        await self._write(text)
        return Completion(text, used, _tokens(text), model, (), "stop")

    def _tool_turn(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], seed: str
    ) -> tuple[ToolCall, ...]:
        """The scripted calls of this turn (none: past the script, or no tools offered)."""
        params: dict[str, Any] = {}
        for t in tools:
            fn = t.get("function") if isinstance(t, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                params.setdefault(fn["name"], fn.get("parameters") or {})
        if not params:
            return ()
        script = self.tool_script
        if script is None:
            script = [[next(iter(params))]]
        turn = sum(1 for m in messages if m.get("role") == "assistant" and m.get("tool_calls"))
        if turn >= len(script):
            return ()
        calls = []
        for i, call in enumerate(script[turn]):
            if isinstance(call, str):
                name, args = call, schema_instance(params.get(call, {}), seed)
            else:
                name, args = call[0], dict(call[1])
            arguments = json.dumps(args if isinstance(args, dict) else {}, sort_keys=True)
            calls.append(ToolCall(f"call_{turn}_{i}", name, arguments))
        return tuple(calls)


def _json_schema_of(response_format: dict[str, Any] | None) -> dict[str, Any] | None:
    if not isinstance(response_format, dict) or response_format.get("type") != "json_schema":
        return None
    inner = response_format.get("json_schema")
    schema = inner.get("schema") if isinstance(inner, dict) else None
    return schema if isinstance(schema, dict) else None


def schema_instance(schema: dict[str, Any], seed: str = "mock") -> Any:
    """A deterministic value that fits ``schema`` (the subset ``msgspec.json.schema`` emits).

    Every property is filled (strict structured output requires them all);
    strings say which field they fill, arrays hold ``max(1, minItems)`` items.
    """
    defs = schema.get("$defs", {})

    def make(s: Any, name: str, depth: int) -> Any:
        if not isinstance(s, dict) or depth > 12:
            return None
        ref = s.get("$ref")
        if isinstance(ref, str):
            return make(defs.get(ref.rsplit("/", 1)[-1], {}), name, depth + 1)
        if "const" in s:
            return s["const"]
        if s.get("enum"):
            return s["enum"][0]
        options = s.get("anyOf") or s.get("oneOf")
        if options:
            real = [o for o in options if not (isinstance(o, dict) and o.get("type") == "null")]
            return make((real or options)[0], name, depth + 1)
        kind = s.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "null")
        if kind == "object" or "properties" in s:
            props = s.get("properties", {})
            return {k: make(v, k, depth + 1) for k, v in props.items()}
        if kind == "array":
            count = max(1, int(s.get("minItems", 1)))
            if "maxItems" in s:
                count = min(count, int(s["maxItems"]))
            return [make(s.get("items", {}), name, depth + 1) for _ in range(count)]
        if kind == "string":
            text = f"{name or 'text'} ({seed})"
            min_len, max_len = int(s.get("minLength", 0)), s.get("maxLength")
            text = text.ljust(min_len, ".")
            return text[: int(max_len)] if max_len is not None else text
        if kind in ("integer", "number"):
            low: Any = s.get("minimum", s.get("exclusiveMinimum", 0))
            value = max(1, int(low or 0) + (1 if "exclusiveMinimum" in s else 0))
            if "maximum" in s:
                value = min(value, int(s["maximum"]))
            return value if kind == "integer" else float(value)
        if kind == "boolean":
            return True
        return None

    return make(schema, "", 0)


# -- the OpenAI-compatible client ------------------------------------------------------


def provider_of_url(base_url: str) -> str:
    """``gen_ai.provider.name`` of an OpenAI-compatible endpoint, from its host (see
    ``OpenAIChatLLM.provider``); shared with the framework adapters' journaled calls."""
    host = (urlsplit(base_url).hostname or "").lower().rstrip(".")
    if host.endswith(".openai.azure.com"):
        return "azure.ai.openai"
    return OpenAIChatLLM.PROVIDERS.get(host) or host or "unknown"


class OpenAIChatLLM:
    """Chat completions through the ``openai`` SDK (``POST {base_url}/chat/completions``).

    ``max_retries`` and ``timeout_s`` are the SDK's: it retries 408, 409, 429
    and 5xx with exponential backoff, waiting what a ``Retry-After`` header
    says (up to two minutes), and times out each try after ``timeout_s``.
    What is left after the retries is a typed ``LLMError``. Without an API key
    (argument or ``OPENAI_API_KEY``) no ``Authorization`` header is sent, as
    local servers expect.
    """

    #: hosts of OpenAI-compatible endpoints -> the GenAI registry's ``gen_ai.provider.name``
    PROVIDERS = {
        "api.openai.com": "openai",
        "api.anthropic.com": "anthropic",
        "generativelanguage.googleapis.com": "gcp.gemini",
        "api.mistral.ai": "mistral_ai",
        "api.deepseek.com": "deepseek",
        "api.groq.com": "groq",
        "api.x.ai": "x_ai",
        "api.perplexity.ai": "perplexity",
        "api.cohere.ai": "cohere",
    }

    @property
    def provider(self) -> str:
        """``gen_ai.provider.name`` of the endpoint, from the base URL's host: the
        OpenTelemetry registry's name for a known provider (api.openai.com -> ``openai``,
        ``*.openai.azure.com`` -> ``azure.ai.openai``, ...), else the host itself (a
        custom value, as the GenAI conventions allow: a local vLLM is not OpenAI)."""
        return provider_of_url(self.base_url)

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        temperature: float = 0.0,
        max_retries: int = 2,
        max_tokens: int | None = None,
        pacer: Pacer | None = None,
        stream: bool | None = None,
    ) -> None:
        """``max_tokens``: the most output tokens any call may be answered with (None: the
        endpoint's own limit); under a run's budget a call is sent with the smaller of this
        and what the budget reserved for it (``current_max_tokens``). ``pacer``: where
        calls wait for the provider's limit (default: the one the process shares).
        ``stream``: ask the endpoint to stream its answers (``agents.llm_stream``); None:
        when the call runs in a worker whose bus carries chunks (``agents.streaming``), so
        watchers see the text as it is written; False: never."""
        if max_tokens is not None and (
            isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
        ):
            raise ConfigError(f"max_tokens must be None or >= 1; got {max_tokens!r}")
        try:
            import openai
        except ImportError as e:  # pragma: no cover - depends on the install
            raise MissingExtra("openai", "an OpenAI-compatible endpoint") from e
        key = api_key if api_key is not None else os.environ.get(ENV_API_KEY)
        self._headers: dict[str, Any] = {} if key else {"Authorization": openai.Omit()}
        self.base_url = base_url.rstrip("/")
        self._client = openai.AsyncOpenAI(
            base_url=self.base_url,
            api_key=key or "unused",
            timeout=timeout_s,
            max_retries=max_retries,
        )
        self.model = model
        self.temperature = temperature
        self.timeout_s = timeout_s
        self.max_tokens = max_tokens
        self.stream = stream
        self._stream_refused = False  # the endpoint refused streaming: asked whole
        self.pacer = pacer if pacer is not None else process_pacer()
        # the key's fingerprint, never the key: limits are per key, the key stays secret
        fingerprint = hashlib.sha256((key or "").encode()).hexdigest()[:12]
        # the endpoint (host and port) names the provider: two local servers are two limits
        self._limit_key = (urlsplit(self.base_url).netloc or self.provider, model, fingerprint)
        #: seconds the last call waited for the provider's limit (read by the journal)
        self.last_queued_s = 0.0

    def limit_key(self, model: str | None = None) -> LimitKey:
        """The (endpoint, model, key fingerprint) a call's limit is kept under."""
        provider, own, fingerprint = self._limit_key
        return (provider, model or own, fingerprint)

    async def complete(self, prompt: str, *, system: str = "") -> Completion:
        messages: list[Message] = []
        if system:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": prompt})
        return await self.chat(messages)

    async def chat(
        self,
        messages: Sequence[Message],
        *,
        model: str | None = None,
        response_format: dict[str, Any] | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> Completion:
        """One chat completion; ``tools`` are OpenAI function tools
        (``{"type": "function", "function": {"name", "description", "parameters"}}``),
        and the calls the model asks for are the answer's ``tool_calls``."""
        import openai

        model = model or self.model
        if not model:  # an endpoint configured without a default (model_required=False)
            raise ConfigError(_no_model_message(self.base_url))
        extra: dict[str, Any] = {}
        if response_format is not None:
            extra["response_format"] = response_format
        if tools:
            extra["tools"] = [dict(t) for t in tools]
        bound = current_max_tokens(self.max_tokens)
        if bound is not None:
            extra["max_tokens"] = bound
        key = self.limit_key(model)
        sent = [dict(m) for m in messages]
        self.last_queued_s = await self.pacer.acquire(
            key, _estimate_tokens(sent, bound), **current_pacing()
        )
        CALL_QUEUED_S.set(self.last_queued_s)
        sink = current_sink()
        streamed = self.stream if self.stream is not None else sink is not None
        streamed = streamed and not self._stream_refused
        refused_stream = False
        try:
            if streamed:  # paced as any call: the pacer's slot is held until the stream ends
                try:
                    return await self._streamed(key, model, sent, extra, sink)
                except (openai.BadRequestError, openai.UnprocessableEntityError):
                    if self.stream is True:
                        raise
                    # an endpoint that refuses a streamed request (or its stream_options)
                    # is asked whole; if that is answered, whole from now on
                    refused_stream = True
            raw = await self._client.chat.completions.with_raw_response.create(
                model=model,
                messages=sent,  # type: ignore[arg-type]
                temperature=self.temperature,
                extra_headers=self._headers,
                **extra,
            )
            self.pacer.learn(key, raw.headers)
            body = raw.http_response.content
            if refused_stream:
                self._stream_refused = True
        except openai.OpenAIError as e:
            error = self._error(e)
            if isinstance(error, LLMRateLimited):
                self.pacer.rate_limited(key, error.retry_after)
            if isinstance(e, openai.APIStatusError):
                self.pacer.learn(key, e.response.headers)
            raise error from e
        finally:
            self.pacer.release(key)
        return _completion(body, model)

    async def _streamed(
        self,
        key: LimitKey,
        model: str,
        sent: list[dict[str, Any]],
        extra: dict[str, Any],
        sink: ChunkSink | None,
    ) -> Completion:
        """The call streamed: each piece of text to ``sink`` as it comes, the whole answer
        returned (``agents.llm_stream``)."""
        import httpx

        from cardbus.agents.llm_stream import read_stream

        create: Any = self._client.chat.completions.with_raw_response.create  # its overloads
        raw = await create(
            model=model,
            messages=sent,
            temperature=self.temperature,
            extra_headers=self._headers,
            stream=True,
            stream_options={"include_usage": True},
            **extra,
        )
        self.pacer.learn(key, raw.headers)
        kind = raw.headers.get("content-type", "")
        if not kind.startswith("text/event-stream"):
            # a server that ignores "stream" (a small stand-in) answers whole: read as such
            try:
                body = await raw.http_response.aread()
            finally:
                await raw.http_response.aclose()
            return _completion(body, model)
        chunks = raw.parse()
        try:
            return await read_stream(chunks, model, sink.call() if sink is not None else None)
        except httpx.TimeoutException as e:
            raise LLMTimeout(f"chat completion stream stalled past {self.timeout_s}s") from e
        except httpx.HTTPError as e:  # the connection dropped mid-stream
            raise LLMServerError(f"chat completion stream broke off: {e!r}") from e
        finally:
            await chunks.close()

    def _error(self, e: Exception) -> LLMError:
        """The SDK's error as ours, most specific first."""
        import openai

        if isinstance(e, openai.APITimeoutError):
            return LLMTimeout(f"chat completion failed: no answer within {self.timeout_s}s")
        if isinstance(e, openai.APIConnectionError):
            return LLMServerError(f"chat completion failed: cannot reach {self.base_url}: {e}")
        if isinstance(e, openai.RateLimitError):
            after = _retry_after(e.response.headers)
            hint = f" (retry after {after:g}s)" if after is not None else ""
            return LLMRateLimited(f"chat completion failed: HTTP 429 rate limited{hint}", after)
        if isinstance(e, openai.APIStatusError):
            status = e.status_code
            text = f"chat completion failed: HTTP {status}: {_short(e.response.text)}"
            if status >= 500:
                return LLMServerError(text)
            return LLMRequestRefused(text, status)
        return LLMError(f"chat completion failed: {e}")

    async def aclose(self) -> None:
        await self._client.close()

    async def __aenter__(self) -> OpenAIChatLLM:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _estimate_tokens(messages: Sequence[Mapping[str, Any]], max_tokens: int | None) -> float:
    """What a provider counts against a tokens-per-minute limit before it answers: the
    prompt (about four characters a token) plus the output it may write."""
    chars = sum(len(str(m.get("content") or "")) for m in messages)
    return max(1.0, chars / 4.0) + (max_tokens or 0)


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _retry_after(headers: Mapping[str, str]) -> float | None:
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return float(value) / scale
        except ValueError:
            continue  # an HTTP date: the SDK honoured it already; we keep no number
    return None


def _completion(body: bytes, model: str) -> Completion:
    """A chat-completion response body as a ``Completion``; anything else is LLMBadOutput.

    A message with ``tool_calls`` may have no content (null): its text is then "".
    """
    try:
        doc: Any = msgspec.json.decode(body)
        choice = doc["choices"][0]
        message = choice["message"]
        calls = _tool_calls(message.get("tool_calls"))
        text = message["content"] if not calls else (message.get("content") or "")
        usage = doc.get("usage") or {}
        reason = choice.get("finish_reason")
        completion = Completion(
            text,
            _count(usage.get("prompt_tokens", 0)),
            _count(usage.get("completion_tokens", 0)),
            str(doc.get("model") or model),
            calls,
            reason if isinstance(reason, str) else "",
        )
    except (
        msgspec.DecodeError,  # not JSON
        KeyError,  # no choices / message / content
        IndexError,  # empty choices
        TypeError,  # a field of the wrong type
        AttributeError,  # "usage", the message or the document is not an object
        ValueError,  # a bad token count, a bad tool call
    ) as e:
        raise LLMBadOutput(f"unexpected chat completion response: {e!r}") from e
    if not isinstance(text, str):
        raise LLMBadOutput("chat completion content is not text")
    return completion


def _tool_calls(raw: Any) -> tuple[ToolCall, ...]:
    """The message's ``tool_calls`` (function calls; arguments kept as JSON text)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ValueError(f"tool_calls is not a list: {raw!r}")
    calls = []
    for i, item in enumerate(raw):
        fn = item["function"]
        name = fn["name"]
        if not isinstance(name, str) or not name:
            raise ValueError(f"tool call without a name: {item!r}")
        args = fn.get("arguments")
        if args is None:
            args = "{}"
        elif not isinstance(args, str):  # some servers send the object itself
            args = json.dumps(args)
        call_id = item.get("id")
        calls.append(
            ToolCall(call_id if isinstance(call_id, str) and call_id else f"call_{i}", name, args)
        )
    return tuple(calls)


# -- configuration ---------------------------------------------------------------------


def configured_llm(
    base_url: str | None = None,
    model: str | None = None,
    *,
    api_key: str | None = None,
    timeout_s: float = 60.0,
    max_retries: int = 2,
    env: Mapping[str, str] | None = None,
    model_required: bool = True,
) -> LLM:
    """The endpoint the flags or the environment name, else the mock.

    ``base_url`` falls back to ``OPENAI_BASE_URL``, ``model`` to
    ``CARDBUS_MODEL``, the key to ``OPENAI_API_KEY``. An endpoint is configured
    only by a base URL (a key alone never sends anything anywhere); it needs a
    model (``ConfigError`` otherwise). Without one the answer is ``MockLLM``
    (named ``model`` when one is given).

    ``model_required=False``: an endpoint without a model is no error yet, only a
    call that names none is (``ConfigError`` then). For a command whose agents may
    never ask this endpoint: ``OPENAI_BASE_URL`` is also read by other SDKs (the
    OpenAI Agents SDK), and an agent may name its own model.
    """
    env = os.environ if env is None else env
    base_url = base_url or env.get(ENV_BASE_URL) or None
    model = model or env.get(ENV_MODEL) or None
    if not base_url:
        return MockLLM(model=model) if model else MockLLM()
    if not model and model_required:
        raise ConfigError(_no_model_message(base_url))
    key = api_key if api_key is not None else env.get(ENV_API_KEY)
    return OpenAIChatLLM(
        base_url, model or "", api_key=key or "", timeout_s=timeout_s, max_retries=max_retries
    )


def _no_model_message(base_url: str) -> str:
    """What an endpoint asked without a model says: where a model is named."""
    return f"an LLM endpoint ({base_url}) needs a model: set {ENV_MODEL} or pass --model"


def describe_llm(llm: LLM) -> str:
    """One line saying which model answers: the endpoint, or the mock and why."""
    if isinstance(llm, OpenAIChatLLM):
        host = urlsplit(llm.base_url).netloc or llm.base_url
        return f"LLM: {llm.model or '(no model named)'} at {llm.base_url} ({host})"
    if isinstance(llm, MockLLM):
        return (
            # one line of at most 100 columns (the demo's screen); --help names the flags
            f"LLM: deterministic mock ({llm.model}); no endpoint configured"
            f" (set {ENV_BASE_URL} and {ENV_MODEL})"
        )
    return f"LLM: {type(llm).__name__}"


# -- metering and spans ----------------------------------------------------------------

_provider: trace.TracerProvider | None = None
_NOOP_PROVIDERS = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


def use_tracer_provider(provider: trace.TracerProvider | None) -> None:
    """Make model-call spans in ``provider`` instead of the global one (None: the global).

    The counterpart of ``bus.telemetry.use_tracer_provider`` for the agents layer.
    """
    global _provider
    _provider = provider


def _tracer() -> trace.Tracer | None:
    provider = _provider if _provider is not None else trace.get_tracer_provider()
    if isinstance(provider, _NOOP_PROVIDERS):
        return None  # no SDK: no span objects at all
    return provider.get_tracer("cardbus")


class ModelJournal(Protocol):
    """Records a model call and answers it from the log when a retry asks it again."""

    @property
    def recording(self) -> bool:
        """Whether there is a log to record in (else calls go out as they are)."""
        ...

    async def model_call(
        self,
        request: dict[str, Any],
        live: Callable[[], Awaitable[Completion]],
        provider: str = "",
    ) -> Completion:
        """``provider``: the client's ``gen_ai.provider.name``, recorded beside the request."""
        ...


class MeteredLLM:
    """An ``LLM`` that counts what it spends and traces each call.

    Every completion's tokens are added to ``input_tokens`` / ``output_tokens``
    and its model to ``models``; with tracing on, each call is a CLIENT span
    ``chat <model>`` with ``gen_ai.operation.name``, ``gen_ai.request.model``,
    ``gen_ai.response.model`` and ``gen_ai.usage.input_tokens`` /
    ``output_tokens`` (a failure sets ``error.type`` to the error's reason).
    """

    def __init__(self, inner: LLM, journal: ModelJournal | None = None) -> None:
        self.inner = inner
        #: where each call is recorded and from which a retry's calls are answered
        #: (``agents.journal``; None: calls go out unrecorded, as outside a worker)
        self.journal = journal
        self.input_tokens = 0
        self.output_tokens = 0
        self.calls = 0
        self.models: list[str] = []

    @property
    def model(self) -> str:
        return str(getattr(self.inner, "model", "") or "")

    async def complete(self, prompt: str, *, system: str = "") -> Completion:
        request = {"op": "complete", "model": self.model, "prompt": prompt, "system": system}
        self._bounded(request)
        return await self._call(None, lambda: self.inner.complete(prompt, system=system), request)

    def _bounded(self, request: dict[str, Any]) -> None:
        """The model's own ``max_tokens`` (``OpenAIChatLLM(max_tokens=...)``), in the request
        the journal records: the budget check reserves that much output, not its default."""
        own = getattr(self.inner, "max_tokens", None)
        if isinstance(own, int) and not isinstance(own, bool) and own > 0:
            request["max_tokens"] = own

    async def chat(
        self,
        messages: Sequence[Message],
        *,
        model: str | None = None,
        response_format: dict[str, Any] | None = None,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> Completion:
        request: dict[str, Any] = {
            "op": "chat",
            "model": model or self.model,
            "messages": [dict(m) for m in messages],
        }
        if response_format is not None:
            request["response_format"] = response_format
        if tools:
            request["tools"] = [dict(t) for t in tools]
        self._bounded(request)
        return await self._call(
            model,
            lambda: chat(
                self.inner, messages, model=model, response_format=response_format, tools=tools
            ),
            request,
        )

    async def _call(
        self, model: str | None, call: Callable[[], Any], request: dict[str, Any]
    ) -> Completion:
        journal = self.journal
        if journal is not None and journal.recording:
            # recorded in the task's stream, answered from it on a retry; its span is the
            # orchestrator's, made from the log (one span a call, not one on each side)
            provider = getattr(self.inner, "provider", None)
            return await journal.model_call(
                request,
                lambda: self._live(model, call, False),
                provider if isinstance(provider, str) else "",
            )
        return await self._live(model, call)

    async def _live(
        self, model: str | None, call: Callable[[], Any], traced: bool = True
    ) -> Completion:
        requested = model or self.model
        tracer = _tracer() if traced else None
        if tracer is None:
            return self._count(await call())
        with tracer.start_as_current_span(
            f"chat {requested}".rstrip(),
            kind=trace.SpanKind.CLIENT,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            if span.is_recording():
                span.set_attribute("gen_ai.operation.name", "chat")
                if requested:
                    span.set_attribute("gen_ai.request.model", requested)
                provider = getattr(self.inner, "provider", None)
                if isinstance(provider, str):
                    span.set_attribute("gen_ai.provider.name", provider)
            try:
                completion = self._count(await call())
            except Exception as e:
                reason = getattr(e, "error_type", None) or type(e).__name__
                span.set_attribute("error.type", str(reason))
                span.set_status(trace.Status(trace.StatusCode.ERROR, str(e)))
                raise
            if span.is_recording():
                span.set_attributes(
                    {
                        "gen_ai.response.model": completion.model,
                        "gen_ai.usage.input_tokens": completion.input_tokens,
                        "gen_ai.usage.output_tokens": completion.output_tokens,
                    }
                )
            return completion

    def _count(self, completion: Completion) -> Completion:
        self.calls += 1
        self.input_tokens += max(0, int(completion.input_tokens))
        self.output_tokens += max(0, int(completion.output_tokens))
        if completion.model and completion.model not in self.models:
            self.models.append(completion.model)
        return completion
