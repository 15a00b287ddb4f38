"""``LLMAgent``: an agent whose work is model calls, declared rather than written.

A subclass declares a capability name, input and output msgspec Structs and
``instructions``; the base class does the rest in ``handle``:

1. renders only its card into messages: the task's goal, its inputs (its own,
   with the outputs of its declared dependencies already placed in them), the
   review issues or the supplement it is re-run with; nothing else (context
   isolation: it never sees the session, the plan or other tasks);
2. asks for the output schema as OpenAI structured output (``response_format``
   ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``);
   an endpoint that refuses that (HTTP 400) is asked again with the schema as
   instructions in the prompt, and is remembered as such (per LLM and model);
3. extracts the JSON tolerantly (code fences, prose around it, a ``<think>``
   block before it), validates it against the output schema (and
   :meth:`LLMAgent.check`) and asks again with the errors, at most
   ``max_repairs`` times, then fails with ``LLMBadOutput`` (``llm_bad_output``);
4. its usage is the calls' (``ctx.llm`` counts them), and the model that
   answered goes into the result's ``notes`` (``model: <name>``).

Tools: an agent that declares ``tools`` (``ToolSpec``, ``Tool`` or names; its
allow-list ``constraints.tools`` is derived from them unless given) offers the
model those on its allow-list, as OpenAI function tools, with the specs the
runtime serving it knows (``ctx.tool_specs``) or else its own. While the model
answers with tool calls, each goes through ``ctx.tool`` (checked against the
allow-list and recorded by the orchestrator), the calls of one turn
concurrently, and the results (or the calls' errors: a refusal, a tool error)
go back as tool messages; then the final answer is parsed and repaired as
above (``agents.tool_loop``). Per task, ``max_turns`` model answers,
``max_tool_calls`` tool calls and ``max_tokens_per_task`` tokens: past one the
attempt fails with ``llm_max_turns``, ``llm_max_tool_calls`` or
``llm_token_limit``.

On the deterministic mock (a ``MockLLM`` without ``respond``), an agent that
defines :meth:`LLMAgent.mock_answer` gets that answer from the model instead
of a schema-shaped placeholder: built from its inputs, it goes through the
same call, parsing and checks, so an offline run reads like a real one.

The model: ``model`` on the class (None: the endpoint's default, e.g.
``CARDBUS_MODEL``), overridden per plan task by ``constraints: {"model": ...}``,
which must be one of the class's ``models`` (it is offered in the agent card's
``limits``, so selection and plan checks route such a task only to agents that
can run that model).
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Sequence
from typing import Any, ClassVar

import msgspec

from cardbus.agents.agent import Agent, Capability, TaskContext
from cardbus.agents.cards import TaskCard
from cardbus.agents.llm import Message, MeteredLLM, MockLLM, assistant_message
from cardbus.agents.schema import schema_errors
from cardbus.agents.tool_loop import (
    TaskSpend,
    declared_names,
    object_root,
    offered_specs,
    run_tool_calls,
    tool_definition,
)
from cardbus.agents.tools import Tool, ToolSpec
from cardbus.eventstore.errors import LLMBadOutput, LLMRequestRefused

__all__ = ["LLMAgent", "extract_json", "response_format", "structured_schema"]

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_-]*)[ \t]*\n?(.*?)```", re.S)
_THINK = re.compile(r"<think>.*?</think>", re.S | re.I)
#: LLMs (and models) that refused structured output once: asked in the prompt from then on
_REFUSED: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def extract_json(text: str) -> Any:
    """The JSON value in a model's answer, found tolerantly; ``ValueError`` if there is none.

    Tried in order: the whole text; each fenced code block (```json ... ```);
    then the first object (else array) that parses starting at any ``{``
    (``[``) in the text, so prose before and after it does not matter.
    """
    text = _THINK.sub("", text).strip()
    if not text:
        raise ValueError("the answer is empty")
    try:
        return json.loads(text)
    except ValueError:
        pass
    for match in _FENCE.finditer(text):
        try:
            return json.loads(match.group(2).strip())
        except ValueError:
            continue
    decoder = json.JSONDecoder()
    found_list: Any = None
    tried = 0
    for i, ch in enumerate(text):
        if ch not in "{[":
            continue
        tried += 1
        if tried > 200:
            break
        try:
            value, _ = decoder.raw_decode(text, i)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
        if found_list is None:
            found_list = value
    if found_list is not None:
        return found_list
    raise ValueError(f"no JSON object in the answer: {text[:120]!r}")


_SUBSCHEMA_MAPS = ("properties", "$defs", "patternProperties")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_ONE = ("items", "not", "additionalProperties")
_DROPPED = ("default", "discriminator")


def structured_schema(schema: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """``schema`` as OpenAI's strict structured output wants it, and whether it can be strict.

    Strict mode needs every object closed (``additionalProperties: false``)
    with all its properties required, and takes no ``default``. An object of
    free keys (a ``dict`` field) cannot be closed: then the schema is returned
    as is with ``False`` (sent with ``strict: false``; validation still applies).
    """
    strict = True

    def walk(node: Any) -> Any:
        nonlocal strict
        if not isinstance(node, dict):
            return node
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in _DROPPED:
                continue
            if key in _SUBSCHEMA_MAPS and isinstance(value, dict):
                out[key] = {k: walk(v) for k, v in value.items()}
            elif key in _SUBSCHEMA_LISTS and isinstance(value, list):
                out[key] = [walk(v) for v in value]
            elif key in _SUBSCHEMA_ONE and isinstance(value, dict):
                out[key] = walk(value)
            else:
                out[key] = value
        if out.get("type") == "object" or "properties" in out:
            extra = out.get("additionalProperties", True)
            if "properties" not in out or extra not in (True, False):
                strict = False  # free keys: cannot be closed
            else:
                out["additionalProperties"] = False
                out["required"] = list(out["properties"])
        return out

    converted = walk(schema)
    return (converted, True) if strict else (schema, False)


def response_format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The ``response_format`` asking for ``schema`` as structured output.

    Its root is an object (strict mode requires one): a root ``$ref`` is
    replaced by the definition it names, and ``$defs`` are kept.
    """
    body, strict = structured_schema(object_root(schema))
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64] or "output"
    return {"type": "json_schema", "json_schema": {"name": safe, "schema": body, "strict": strict}}


class LLMAgent(Agent):
    """Base class of an agent whose work is model calls; see the module docstring.

    Declare ``agent_id``, ``description``, ``capability`` (a name),
    ``input_type``, ``output_type`` and ``instructions``; override
    :meth:`render` to word the card differently, :meth:`check` to refuse
    outputs that fit the schema but are wrong (the errors go back to the model).
    """

    capability: ClassVar[str] = ""
    input_type: ClassVar[type] = dict
    output_type: ClassVar[type] = dict
    instructions: ClassVar[str] = ""
    #: the model to ask; None: the endpoint's default (``CARDBUS_MODEL``, ``--model``)
    model: ClassVar[str | None] = None
    #: models a plan task may ask for with ``constraints: {"model": ...}``
    models: ClassVar[Sequence[str]] = ()
    #: how many times a wrong answer is sent back with its errors
    max_repairs: ClassVar[int] = 2
    #: ask for structured output first (False: always the schema in the prompt)
    structured_output: ClassVar[bool] = True
    #: the tools offered to the model (those on the allow-list, ``constraints.tools``,
    #: which is derived from these unless the class gives it)
    tools: ClassVar[Sequence[ToolSpec | Tool | str]] = ()
    #: per task: model answers (tool-calling turns and repairs included)
    max_turns: ClassVar[int] = 10
    #: per task: tool calls in all
    max_tool_calls: ClassVar[int] = 20
    #: per task: input plus output tokens of all its model answers (None: no limit)
    max_tokens_per_task: ClassVar[int | None] = 200_000

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        names = declared_names(cls.tools)
        own_list = "constraints" in cls.__dict__ and cls.constraints.tools
        if "tools" in cls.__dict__ and names and not own_list:  # the allow-list, derived
            cls.constraints = msgspec.structs.replace(cls.constraints, tools=names)
        TaskSpend(cls.max_turns, cls.max_tool_calls, cls.max_tokens_per_task)  # checked early
        if cls.capability and "capabilities" not in cls.__dict__:
            cls.capabilities = [
                Capability(cls.capability, cls.input_type, cls.output_type, cls.description)
            ]
        offered = list(dict.fromkeys([m for m in (cls.model, *cls.models) if m]))
        if offered:  # a task may ask for these: offered in the card's limits
            have = cls.constraints.limits.get("model")
            merged = list(dict.fromkeys([*(have if isinstance(have, list) else []), *offered]))
            limits = {**cls.constraints.limits, "model": merged}
            cls.constraints = msgspec.structs.replace(cls.constraints, limits=limits)

    # -- what the model sees ---------------------------------------------------------

    def model_for(self, task: TaskCard) -> str | None:
        """The task's ``constraints["model"]``, else the class's ``model``."""
        wanted = task.constraints.get("model")
        return wanted if isinstance(wanted, str) and wanted else self.model

    def render(self, task: TaskCard, inputs: Any) -> str:
        """The user message: the card's goal, inputs, review issues and supplement."""
        parts = []
        if task.goal:
            parts.append(f"Task: {task.goal}")
        parts.append("Inputs:\n" + _json(msgspec.to_builtins(inputs)))
        if task.previous_output is not None:
            parts.append(
                "Your previous answer, to revise (keep what is right):\n"
                + _json(task.previous_output)
            )
        if task.review:
            issues = [msgspec.to_builtins(i) for i in task.review]
            parts.append(
                "A reviewer found these issues in your previous answer; fix each of them:\n"
                + _json(issues)
            )
        if task.supplement is not None:
            parts.append("The input you asked for:\n" + _json(task.supplement))
        return "\n\n".join(parts)

    def system_prompt(self, schema: dict[str, Any] | None) -> str:
        text = self.instructions.strip()
        if schema is None:
            return (
                text + "\n\nAnswer with one JSON object that fits the requested schema."
            ).strip()
        return (
            text + "\n\nAnswer with only one JSON object (no prose, no code fence) that fits this"
            " JSON Schema:\n" + _json(schema)
        ).strip()

    def check(self, output: Any, inputs: Any, task: TaskCard) -> list[str]:
        """Problems with an output that fits the schema (sent back to the model); none here."""
        return []

    def mock_answer(self, task: TaskCard, inputs: Any) -> Any:
        """What the deterministic mock model answers this agent (None: a schema instance).

        Build it from the card alone (its inputs, ``task.previous_output`` and
        ``task.review`` on a revision), as a model would: offline runs then
        produce usable outputs. Real endpoints never see it.
        """
        return None

    # -- the loop ----------------------------------------------------------------------

    async def handle(self, task: TaskCard, inputs: Any, ctx: TaskContext) -> Any:
        cap = self.capability_for(task.capability)
        output_type = cap.output_type if cap is not None else self.output_type
        schema = msgspec.json.schema(output_type)
        model = self.model_for(task)
        llm = ctx.llm
        inner = llm.inner if isinstance(llm, MeteredLLM) else llm
        if isinstance(llm, MeteredLLM) and isinstance(inner, MockLLM) and inner.respond is None:
            answer = self.mock_answer(task, inputs)
            if answer is not None:  # the mock answers what the agent built from its card
                text = json.dumps(msgspec.to_builtins(answer), ensure_ascii=False)
                llm.inner = MockLLM(
                    respond=lambda _prompt: text,
                    model=inner.model,
                    tool_script=inner.tool_script,
                    chunk_delay_s=inner.chunk_delay_s,
                )
                try:
                    return await self._converse(task, inputs, ctx, output_type, schema, model)
                finally:
                    llm.inner = inner
        return await self._converse(task, inputs, ctx, output_type, schema, model)

    async def _converse(
        self,
        task: TaskCard,
        inputs: Any,
        ctx: TaskContext,
        output_type: type,
        schema: dict[str, Any],
        model: str | None,
    ) -> Any:
        llm = ctx.llm
        inner = llm.inner if isinstance(llm, MeteredLLM) else llm
        model_key = model or str(getattr(inner, "model", "") or "")
        structured = self.structured_output and model_key not in _refused(inner)
        fmt = response_format(output_type.__name__, schema) if structured else None
        user = self.render(task, inputs)
        messages: list[Message] = [
            {"role": "system", "content": self.system_prompt(None if structured else schema)},
            {"role": "user", "content": user},
        ]
        specs = offered_specs(self.tools, self.constraints.tools, ctx.tool_specs)
        tools = [tool_definition(s) for s in specs] or None
        spend = TaskSpend(self.max_turns, self.max_tool_calls, self.max_tokens_per_task)
        errors: list[str] = []
        asks = 0
        while asks <= self.max_repairs:
            try:
                completion = await llm.chat(messages, model=model, response_format=fmt, tools=tools)
            except LLMRequestRefused as e:
                if fmt is None or e.status not in (0, 400, 422):
                    raise
                _remember_refusal(inner, model_key)
                fmt = None  # the endpoint cannot do structured output: say it in the prompt
                messages[0] = {"role": "system", "content": self.system_prompt(schema)}
                continue
            spend.answered(completion)
            if completion.tool_calls:  # the model asks for tools: make the calls, answer them
                spend.another_turn()
                spend.calls(len(completion.tool_calls))
                results = await run_tool_calls(ctx, completion.tool_calls)
                messages = [*messages, assistant_message(completion), *results]
                continue
            asks += 1
            output, errors = self._parse(completion.text, schema, output_type, inputs, task)
            if not errors:
                if not ctx.notes:
                    ctx.notes = f"model: {completion.model or model_key}"
                return output
            if asks > self.max_repairs:
                break
            spend.another_turn()
            messages = [
                *messages,
                {"role": "assistant", "content": completion.text},
                {
                    "role": "user",
                    "content": "That answer cannot be used:\n- "
                    + "\n- ".join(errors)
                    + "\nAnswer again with only the corrected JSON object.",
                },
            ]
        raise LLMBadOutput(f"no usable answer in {asks} asks: " + "; ".join(errors[:5]))

    def _parse(
        self, text: str, schema: dict[str, Any], output_type: type, inputs: Any, task: TaskCard
    ) -> tuple[Any, list[str]]:
        try:
            value = extract_json(text)
        except ValueError as e:
            return None, [f"not JSON: {e}"]
        problems = schema_errors(value, schema)
        if problems:
            return None, problems[:10]
        try:
            output: Any = msgspec.convert(value, output_type)
        except (msgspec.ValidationError, TypeError) as e:
            return None, [str(e)]
        return output, self.check(output, inputs, task)


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def _refused(llm: Any) -> set[str]:
    try:
        return _REFUSED.get(llm, set())
    except TypeError:  # not weak-referenceable
        return set()


def _remember_refusal(llm: Any, model: str) -> None:
    try:
        _REFUSED.setdefault(llm, set()).add(model)
    except TypeError:
        pass
