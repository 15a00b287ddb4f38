"""A streamed chat completion read into one ``Completion``, its text sent on as it comes.

``OpenAIChatLLM`` asks a streaming endpoint (``stream: true``, with
``stream_options.include_usage`` so the last chunk carries the usage the budget
and the costs need) and hands the SDK's chunk stream to :func:`read_stream`. It
puts the deltas together as the non-streamed answer would have been (the text,
the tool calls by index, the finish reason, the model, the usage) and sends each
piece of text to the attempt's :class:`~cardbus.agents.streaming.CallStream`,
which publishes it only if someone watches. What the caller gets, and what the
journal records, is the same ``Completion`` as without streaming.
"""

from __future__ import annotations

from collections.abc import AsyncIterable
from typing import Any

from cardbus.agents.llm import Completion, ToolCall
from cardbus.agents.streaming import CallStream
from cardbus.eventstore.errors import LLMBadOutput

__all__ = ["read_stream"]


def _count(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise LLMBadOutput(f"unexpected chat completion stream: bad token count {value!r}")
    return value


async def read_stream(chunks: AsyncIterable[Any], model: str, out: CallStream | None) -> Completion:
    """The whole answer of a chat-completion chunk stream (the ``openai`` SDK's objects);
    ``out``: where each piece of text goes as it comes (None: nowhere).

    A stream that ends with no choice at all is ``LLMBadOutput``, as an answer
    without a message is when not streamed.
    """
    text: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    reason = ""
    answered_model = ""
    usage: Any = None
    seen = False
    async for chunk in chunks:
        answered_model = getattr(chunk, "model", None) or answered_model
        if getattr(chunk, "usage", None) is not None:
            usage = chunk.usage
        for choice in getattr(chunk, "choices", None) or ():
            if getattr(choice, "index", 0) not in (0, None):
                continue  # n > 1 is never asked for: only the first choice is the answer
            seen = True
            if choice.finish_reason:
                reason = str(choice.finish_reason)
            delta = choice.delta
            if delta is None:
                continue
            piece = delta.content
            if piece:
                text.append(piece)
                if out is not None:
                    await out.send(piece)
            for call in delta.tool_calls or ():
                slot = calls.setdefault(call.index, {"id": "", "name": "", "arguments": []})
                if call.id:
                    slot["id"] = call.id
                fn = call.function
                if fn is not None:
                    if fn.name:
                        slot["name"] += fn.name
                    if fn.arguments:
                        slot["arguments"].append(fn.arguments)
    if not seen:
        raise LLMBadOutput("unexpected chat completion stream: it ended without an answer")
    if out is not None:
        await out.end()
    tool_calls = []
    for i, index in enumerate(sorted(calls)):
        slot = calls[index]
        if not slot["name"]:
            raise LLMBadOutput(f"unexpected chat completion stream: tool call {index} unnamed")
        tool_calls.append(
            ToolCall(slot["id"] or f"call_{i}", slot["name"], "".join(slot["arguments"]) or "{}")
        )
    return Completion(
        "".join(text),
        _count(getattr(usage, "prompt_tokens", 0)),
        _count(getattr(usage, "completion_tokens", 0)),
        str(answered_model or model),
        tuple(tool_calls),
        reason,
    )
