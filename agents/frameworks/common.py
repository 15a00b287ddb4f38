"""What the framework adapters share: the card, the prompt, the output, cardbus tools.

``cardbus.agents.frameworks.pydantic_ai`` and ``.openai_agents`` turn another
framework's agent into a cardbus ``Agent``. Both derive its card the same way (a
capability with the run's input and output schemas: msgspec types as cardbus has
them, pydantic models and other types through pydantic), render the task's card into
the run's prompt, hand back the framework's output as JSON builtins, and offer the
runtime's tools (``ctx.tool_specs``) to the framework's model, each call made with
``ctx.tool`` (checked against the allow-list, journaled by the orchestrator). The
framework's own function tools run in the agent, through ``local_tool_call``
(``ctx.journal.tool_call``: recorded, replayed on a retry).

pydantic is a dependency of both frameworks, not of cardbus: it is imported here only
when a type msgspec does not know is met.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from cardbus.agents.agent import Capability, Reject, TaskContext
from cardbus.agents.cards import CapabilitySpec, TaskCard
from cardbus.agents.tools import ToolError
from cardbus.eventstore.errors import AccessDenied

__all__ = [
    "FrameworkCapability",
    "Prompt",
    "agent_id_from",
    "call_cardbus_tool",
    "decode_inputs",
    "json_schema",
    "local_tool_call",
    "render_prompt",
    "to_json",
]


class Prompt(msgspec.Struct, frozen=True):
    """The default input of a framework agent: the user prompt of its run."""

    prompt: str


def _msgspec_schema(t: Any) -> dict[str, Any] | None:
    try:
        return msgspec.json.schema(t)
    except Exception:  # a type msgspec does not know: a pydantic model, ...
        return None


def json_schema(t: Any) -> dict[str, Any]:
    """The JSON Schema of ``t``: msgspec's for the types it knows, else pydantic's."""
    schema = _msgspec_schema(t)
    if schema is not None:
        return schema
    from pydantic import TypeAdapter

    return TypeAdapter(t).json_schema()


class FrameworkCapability(Capability):
    """A capability whose schemas are given (the framework's types may be pydantic ones).

    ``input_type`` is what the inputs are decoded to: a type msgspec knows is used as
    the base class does; any other (a pydantic model) is decoded from a dict by
    ``decode_inputs``, with pydantic.
    """

    def __init__(
        self,
        name: str,
        input_type: Any,
        output_schema: dict[str, Any],
        description: str = "",
    ) -> None:
        self.framework_input_type = input_type
        self.msgspec_input = _msgspec_schema(input_type) is not None
        super().__init__(
            name,
            input_type if self.msgspec_input else dict[str, Any],
            dict[str, Any],
            description,
        )
        self.input_schema = json_schema(input_type)
        self.output_schema = output_schema

    def spec(self) -> CapabilitySpec:
        base = super().spec() if self.msgspec_input else None
        return CapabilitySpec(
            name=self.name,
            description=self.description,
            input_schema=base.input_schema if base is not None else self.input_schema,
            output_schema=self.output_schema,
            tags=self.tags,
            examples=self.examples,
        )


def decode_inputs(cap: Capability | None, inputs: Any) -> Any:
    """The inputs as the framework's input type (a pydantic model validated here)."""
    if not isinstance(cap, FrameworkCapability) or cap.msgspec_input:
        return inputs
    from pydantic import TypeAdapter, ValidationError

    try:
        return TypeAdapter(cap.framework_input_type).validate_python(inputs)
    except ValidationError as e:
        raise Reject("input_schema_mismatch", str(e)) from e


def to_json(value: Any) -> Any:
    """``value`` as JSON builtins (msgspec types, pydantic models, dataclasses, ...)."""
    try:
        return msgspec.to_builtins(value)
    except Exception:
        from pydantic_core import to_jsonable_python

        return to_jsonable_python(value, fallback=str)


def _text(value: Any) -> str:
    return json.dumps(to_json(value), ensure_ascii=False, indent=2, sort_keys=True)


def render_prompt(task: TaskCard, inputs: Any) -> str:
    """The run's user prompt: the default input's ``prompt`` as it is (else the inputs as
    JSON), after the task's goal, with a revision's previous output and review issues
    and a supplement, as ``LLMAgent`` renders its card."""
    parts = []
    if task.goal:
        parts.append(f"Task: {task.goal}")
    if isinstance(inputs, Prompt):
        parts.append(inputs.prompt)
    else:
        parts.append("Inputs:\n" + _text(inputs))
    if task.previous_output is not None:
        parts.append(
            "Your previous answer, to revise (keep what is right):\n" + _text(task.previous_output)
        )
    if task.review:
        parts.append(
            "A reviewer found these issues in your previous answer; fix each of them:\n"
            + _text([msgspec.to_builtins(i) for i in task.review])
        )
    if task.supplement is not None:
        parts.append("The input you asked for:\n" + _text(task.supplement))
    return "\n\n".join(parts)


def agent_id_from(name: str | None, given: str | None) -> str:
    """The agent id: the one given, else the framework agent's name made id-safe."""
    if given:
        return given
    slug = re.sub(r"[^a-z0-9_-]+", "-", (name or "").strip().lower()).strip("-")
    if not slug:
        raise ValueError("the framework agent has no name: give agent_id")
    return slug


async def call_cardbus_tool(ctx: TaskContext, name: str, arguments: dict[str, Any]) -> Any:
    """A cardbus tool called for the framework's model: its result, or (refused, failed,
    timed out) ``{"error_type", "error"}`` for the model to read, as ``LLMAgent`` does.
    An unknown effect (``EffectUnknown``) is the task's, and propagates."""
    try:
        return await ctx.tool(name, **arguments)
    except AccessDenied as e:
        return {"error_type": "access_denied", "error": str(e)}
    except ToolError as e:
        return {"error_type": e.error_type, "error": str(e)}


async def local_tool_call(
    ctx: TaskContext,
    name: str,
    arguments: dict[str, Any],
    run: Callable[[], Awaitable[Any]],
    *,
    idempotent: bool = False,
) -> Any:
    """One of the framework agent's own tools, run in the agent and journaled
    (``ctx.journal.tool_call``): ``tool.requested`` before it runs, its result after,
    replayed on a retry that calls it again with the same arguments at the same place.
    The result is JSON builtins (what the log keeps), live and replayed alike. A call
    whose effect is unknown (the process died during it) runs again only if
    ``idempotent``; else the task waits for an operator (``EffectUnknown``)."""

    async def live(_key: str) -> Any:
        return to_json(await run())

    return await ctx.journal.tool_call(name, to_json(arguments), live, idempotent=idempotent)
