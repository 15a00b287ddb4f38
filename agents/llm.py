"""The LLM seam agents call: a protocol, a deterministic mock, an OpenAI-compatible client.

The mock is the default everywhere (demo, tests): the same prompt always gives
the same text and token counts, so runs are reproducible and need no network.
``OpenAIChatLLM`` speaks the chat-completions API of any OpenAI-compatible
server; it needs the ``openai`` extra (httpx).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from cardbus.eventstore.errors import LLMError

__all__ = ["LLM", "Completion", "LLMError", "MockLLM", "OpenAIChatLLM"]


class Completion(msgspec.Struct, frozen=True):
    text: str
    input_tokens: int = 0
    output_tokens: int = 0
    model: str = ""


class LLM(Protocol):
    async def complete(self, prompt: str, *, system: str = "") -> Completion: ...


def _tokens(text: str) -> int:
    return max(1, len(text.split())) if text else 0


def _count(value: Any) -> int:
    """A token count from a response; anything but a non-negative integer is an error."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"bad token count {value!r}")
    return value


class MockLLM:
    """Deterministic: ``respond(prompt)`` if given, else a stable echo of the prompt."""

    def __init__(self, respond: Callable[[str], str] | None = None, model: str = "mock-1") -> None:
        self.respond = respond
        self.model = model
        self.calls: list[str] = []

    async def complete(self, prompt: str, *, system: str = "") -> Completion:
        self.calls.append(prompt)
        if self.respond is not None:
            text = self.respond(prompt)
        else:
            digest = hashlib.sha256(prompt.encode()).hexdigest()[:8]
            text = f"[{self.model}:{digest}] {prompt[:200]}"
        return Completion(text, _tokens(system) + _tokens(prompt), _tokens(text), self.model)


class OpenAIChatLLM:
    """Chat completions over HTTP (``POST {base_url}/chat/completions``)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        temperature: float = 0.0,
    ) -> None:
        try:
            import httpx
        except ImportError as e:  # pragma: no cover - depends on the install
            raise LLMError("OpenAIChatLLM needs httpx: pip install 'cardbus[openai]'") from e
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s
        )
        self.model = model
        self.temperature = temperature

    async def complete(self, prompt: str, *, system: str = "") -> Completion:
        import httpx

        messages: list[dict[str, str]] = []
        if system:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": prompt})
        body = {"model": self.model, "messages": messages, "temperature": self.temperature}
        try:
            resp = await self._client.post("/chat/completions", json=body)
            resp.raise_for_status()
        except httpx.HTTPError as e:  # connection, timeout, 4xx/5xx
            raise LLMError(f"chat completion failed: {e}") from e
        try:
            doc: Any = msgspec.json.decode(resp.content)
            text = doc["choices"][0]["message"]["content"]
            usage = doc.get("usage") or {}
            completion = Completion(
                text,
                _count(usage.get("prompt_tokens", 0)),
                _count(usage.get("completion_tokens", 0)),
                str(doc.get("model") or self.model),
            )
        except (
            msgspec.DecodeError,  # not JSON
            KeyError,  # no choices / message / content
            IndexError,  # empty choices
            TypeError,  # a field of the wrong type
            AttributeError,  # "usage" or the document is not an object
            ValueError,  # a bad token count
        ) as e:
            raise LLMError(f"unexpected chat completion response: {e!r}") from e
        if not isinstance(text, str):
            raise LLMError("chat completion content is not text")
        return completion

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> OpenAIChatLLM:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
