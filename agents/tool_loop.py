"""The pieces of an ``LLMAgent``'s tool-calling loop: what it offers, how calls run, its limits.

The loop itself is ``LLMAgent._converse``: it offers the model the tools the
agent may use (:func:`offered_specs`, as OpenAI function tools:
:func:`tool_definition`), and while the model answers with ``tool_calls`` it
makes them (:func:`run_tool_calls`) and sends the results back, until an
answer that fits the output schema. Each call goes through ``ctx.tool``: the
orchestrator checks it against the agent's allow-list and records it
(``tool.requested`` before it runs, ``tool.called`` after). The calls of one
turn (parallel calls) run concurrently; their results go back in the order
the model asked for them (a call held for a person's review, or one that fails
the attempt, ends it only once its siblings are through: the held calls of a turn
are reviewed together). A call that fails as a tool call (``ToolError``:
bad arguments, timeout, too large, the tool raised; or ``AccessDenied``: not
on the allow-list) is answered to the model as the tool message's content, an
object with ``error_type`` and ``error``, so the model can recover; so are
arguments that are not a JSON object. A tool on the allow-list that nothing
serves (``ToolNotFound``) is not the model's to fix: it fails the attempt
(``tool_not_found``).

:class:`TaskSpend` keeps one task's conversation within its agent's limits
and fails it with a typed ``LLMLimitExceeded`` (``llm_max_turns``,
``llm_max_tool_calls``, ``llm_token_limit``) past one.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cardbus.agents.llm import Completion, ToolCall, tool_message
from cardbus.agents.tools import Tool, ToolSpec
from cardbus.eventstore.errors import (
    AccessDenied,
    ConfigError,
    LLMMaxToolCalls,
    LLMMaxTurns,
    LLMTokenLimit,
    ToolError,
    ToolNotFound,
)

if TYPE_CHECKING:
    from cardbus.agents.requests import TaskServices

__all__ = [
    "TaskSpend",
    "declared_names",
    "object_root",
    "offered_specs",
    "run_tool_calls",
    "tool_definition",
]


def object_root(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with an object at its root: a root ``$ref`` (as ``msgspec.json.schema``
    gives for a Struct) is replaced by the definition it names; ``$defs`` stay (other
    definitions, or the same one recursively, still point into them)."""
    ref = schema.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/$defs/"):
        return schema
    defs = schema.get("$defs")
    body = defs.get(ref.removeprefix("#/$defs/")) if isinstance(defs, dict) else None
    if not isinstance(body, dict):
        return schema
    rest = {k: v for k, v in schema.items() if k not in ("$ref", "$defs")}
    return {**rest, **body, "$defs": defs}


def tool_definition(spec: ToolSpec) -> dict[str, Any]:
    """``spec`` as an OpenAI function tool (its input schema as the parameters, object-rooted)."""
    params = object_root(spec.input_schema) if spec.input_schema else {}
    if not params:
        params = {"type": "object", "properties": {}}
    function: dict[str, Any] = {"name": spec.name, "parameters": params}
    if spec.description:
        function["description"] = spec.description
    return {"type": "function", "function": function}


def declared_names(declared: Iterable[ToolSpec | Tool | str]) -> list[str]:
    """The names of the tools an agent declares, once each, in order."""
    return list(dict.fromkeys(_name(d) for d in declared))


def offered_specs(
    declared: Iterable[ToolSpec | Tool | str],
    allowed: Iterable[str],
    known: Mapping[str, ToolSpec],
) -> list[ToolSpec]:
    """The specs to offer the model: each declared tool on the allow-list ``allowed``.

    A spec the runtime knows (``known``: its registry's, which checks the
    arguments) wins over the agent's own; a tool declared by name alone that
    the runtime does not know is offered without a schema (any object).
    """
    allow = set(allowed)
    out: dict[str, ToolSpec] = {}
    for d in declared:
        name = _name(d)
        if name not in allow or name in out:
            continue
        own = d if isinstance(d, ToolSpec) else d.spec if isinstance(d, Tool) else None
        out[name] = known.get(name) or own or ToolSpec(name=name)
    return list(out.values())


def _name(d: ToolSpec | Tool | str) -> str:
    if isinstance(d, str):
        return d
    if isinstance(d, (ToolSpec, Tool)):
        return d.name
    raise ConfigError(f"a tool is a ToolSpec, a Tool or a name; got {d!r}")


async def run_tool_calls(ctx: TaskServices, calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    """Make ``calls`` concurrently through ``ctx.tool``; their tool messages, in their order.

    Every call of the turn is seen through before a failure ends the attempt (the first,
    in the model's order): the calls a review holds are then all in the log together, for
    a person to answer together or one by one, and no call is left running after its
    attempt ended."""
    outcomes = await asyncio.gather(*(_call(ctx, c) for c in calls), return_exceptions=True)
    results: list[str] = []
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
        results.append(outcome)
    return [tool_message(c.id, r) for c, r in zip(calls, results, strict=True)]


async def _call(ctx: TaskServices, call: ToolCall) -> str:
    try:
        args = json.loads(call.arguments or "{}")
    except ValueError as e:
        return _error("invalid_input", f"{call.name}: the arguments are not JSON: {e}")
    if not isinstance(args, dict):
        return _error("invalid_input", f"{call.name}: the arguments must be a JSON object")
    try:
        result = await ctx.tool(call.name, **args)
    except AccessDenied as e:
        return _error("access_denied", str(e))
    except ToolNotFound:  # a deployment's error (nothing serves it), not the model's
        raise
    except ToolError as e:
        return _error(e.error_type, str(e))
    return json.dumps(result, ensure_ascii=False, default=str)


def _error(error_type: str, message: str) -> str:
    return json.dumps({"error_type": error_type, "error": message}, ensure_ascii=False)


class TaskSpend:
    """What one task's conversation has spent, held to its agent's limits.

    ``max_turns``: model answers (tool-calling turns and repairs included);
    ``max_tool_calls``: tool calls in all; ``max_tokens``: input plus output
    tokens of every answer (None: no limit).
    """

    def __init__(self, max_turns: int, max_tool_calls: int, max_tokens: int | None) -> None:
        for name, value in (("max_turns", max_turns), ("max_tool_calls", max_tool_calls)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1; got {value!r}")
        if max_tokens is not None and (
            isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
        ):
            raise ConfigError(f"max_tokens_per_task must be None or >= 1; got {max_tokens!r}")
        self.max_turns = max_turns
        self.max_tool_calls = max_tool_calls
        self.max_tokens = max_tokens
        self.turns = 0
        self.tool_calls = 0
        self.tokens = 0

    def answered(self, completion: Completion) -> None:
        """Count one answer; past the token limit, ``LLMTokenLimit``."""
        self.turns += 1
        self.tokens += max(0, completion.input_tokens) + max(0, completion.output_tokens)
        if self.max_tokens is not None and self.tokens > self.max_tokens:
            raise LLMTokenLimit(
                f"{self.tokens} tokens spent, over max_tokens_per_task={self.max_tokens}",
                self.max_tokens,
            )

    def another_turn(self) -> None:
        """Before asking again (with tool results or a repair): ``LLMMaxTurns`` if none is left."""
        if self.turns >= self.max_turns:
            raise LLMMaxTurns(
                f"no final answer within max_turns={self.max_turns} model turns", self.max_turns
            )

    def calls(self, count: int) -> None:
        """Before making ``count`` more tool calls: ``LLMMaxToolCalls`` past the limit."""
        if self.tool_calls + count > self.max_tool_calls:
            raise LLMMaxToolCalls(
                f"the model asked for {self.tool_calls + count} tool calls,"
                f" over max_tool_calls={self.max_tool_calls}",
                self.max_tool_calls,
            )
        self.tool_calls += count
