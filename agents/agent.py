"""The ``Agent`` base class: what a user writes to put an agent on the bus.

A subclass declares its card (``agent_id``, ``description``, one or more
``Capability(name, InputStruct, OutputStruct)``) and implements one
``handle(task, inputs, ctx)`` that turns typed inputs into a typed output:
``async def`` for work that awaits, a plain ``def`` for blocking work (CPU,
a blocking client, ``time.sleep``), which ``run`` calls in a thread so it
stalls nothing else in the process. The base class does the rest in ``run``:

* self-check before work: the capability is offered, the inputs decode into
  the input type, the task's constraints are within the agent's limits; a
  failure is a standard rejection (``rejected`` ResultCard with the reason);
* a fresh agent instance and ``TaskContext`` per task, so no state leaks
  between tasks;
* ``raise NeedsInput(...)`` asks for more input, ``raise Reject(...)``
  declines; any other exception becomes a ``failed`` ResultCard with the error;
* usage (tokens) and confidence are reported from the context: what the
  handler reports with ``ctx.usage`` / ``ctx.complete``, else what its calls
  of ``ctx.llm`` spent (counted automatically);
* an ``LLMError`` becomes a failed result whose ``reason`` is the error's
  ``error_type`` (``llm_rate_limited``, ``llm_timeout``, ...).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import math
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from typing import Any, ClassVar

import msgspec
import msgspec.inspect

from cardbus.agents.cards import (
    AgentCard,
    AgentConstraints,
    CapabilitySpec,
    ResultCard,
    TaskCard,
    constraint_problem,
    decode_result_card,
    encode,
)
from cardbus.agents.llm import LLM, MeteredLLM, MockLLM
from cardbus.agents.requests import TaskServices
from cardbus.eventstore.errors import (
    EffectUnknown,
    JournalTampered,
    LLMError,
    ReplayDiverged,
    ToolNotFound,
)
from cardbus.eventstore.events import Usage

__all__ = ["Agent", "Capability", "NeedsInput", "Reject", "TaskContext"]

#: where a sync ``handle`` runs: the serving worker's bounded pool (None: asyncio's default)
HANDLER_EXECUTOR: contextvars.ContextVar[Executor | None] = contextvars.ContextVar(
    "cardbus_handler_executor", default=None
)


class Capability:
    """One thing an agent can do, with typed input and output."""

    def __init__(
        self,
        name: str,
        input_type: type,
        output_type: type,
        description: str = "",
        tags: Sequence[str] = (),
        examples: Sequence[str] = (),
    ) -> None:
        self.name = name
        self.input_type = input_type
        self.output_type = output_type
        self.description = description
        self.tags = list(tags)
        self.examples = list(examples)

    def spec(self) -> CapabilitySpec:
        return CapabilitySpec(
            name=self.name,
            description=self.description,
            input_schema=_input_schema(self.input_type),
            output_schema=msgspec.json.schema(self.output_type),
            tags=self.tags,
            examples=self.examples,
        )


def _input_schema(input_type: Any) -> dict[str, Any]:
    """The JSON Schema of what ``run`` accepts as inputs.

    As msgspec's own schema, except that a tagged Struct's tag field is not
    required at the top level: ``msgspec.convert`` does not need it there
    (only inside a union), so the orchestrator's check must not either.
    """
    schema = msgspec.json.schema(input_type)
    info = msgspec.inspect.type_info(input_type)
    ref = schema.get("$ref")
    if isinstance(info, msgspec.inspect.StructType) and info.tag_field and isinstance(ref, str):
        defs = schema.get("$defs", {})
        body = dict(defs.get(ref.rsplit("/", 1)[-1], {}))
        body["required"] = [r for r in body.get("required", []) if r != info.tag_field]
        return {**body, "$defs": defs}
    return schema


class NeedsInput(Exception):
    """Raised by a handler that cannot go on without more input."""

    def __init__(
        self, missing: str, capability: str | None = None, inputs: dict[str, Any] | None = None
    ) -> None:
        super().__init__(missing)
        self.missing = missing
        self.capability = capability
        self.inputs = inputs or {}


class Reject(Exception):
    """Raised by a handler that declines the task after looking at it."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class TaskContext(TaskServices):
    """Per-task scratch space handed to ``handle``; made fresh for every task.

    Beyond the card, a handler asks the orchestrator (checked and recorded):
    ``await ctx.read_output(dep_id)``, ``await ctx.tool(name, **args)``,
    ``await ctx.long_term.get(key)`` / ``.list(...)`` / ``.search(text)``; see
    ``agents.requests``. ``ctx.llm`` counts the tokens of every call made
    through it; they are the task's usage unless the handler reports usage
    itself (``ctx.usage``, ``ctx.complete``).
    """

    def __init__(self, task: TaskCard, agent_id: str, llm: LLM | None) -> None:
        """``llm``: the model to call (None: a ``MockLLM``)."""
        self.task = task
        self.agent_id = agent_id
        self._given = llm
        self._metered: MeteredLLM | None = None
        self._reported = False
        self.confidence = 1.0
        self.notes = ""
        # the output is given, but the agent asks for another attempt (its notes say why);
        # the orchestrator retries under reason needs_retry while attempts remain
        self.needs_retry = False
        self.input_tokens = 0
        self.output_tokens = 0

    @property
    def llm(self) -> MeteredLLM:
        """The task's model, every call counted; made when first asked (most agents of a
        pipeline never call one, and each task would make two objects for nothing)."""
        if self._metered is None:
            self._metered = MeteredLLM(self._given or MockLLM(), journal=self.journal)
        return self._metered

    @llm.setter
    def llm(self, value: MeteredLLM) -> None:
        self._metered = value

    def usage(self, input_tokens: int = 0, output_tokens: int = 0) -> None:
        self._reported = True
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens

    async def complete(self, prompt: str, system: str = "") -> str:
        """Ask the LLM; its token usage is added to this task's usage."""
        result = await self.llm.complete(prompt, system=system)
        self.usage(result.input_tokens, result.output_tokens)
        return result.text


class Agent:
    """Base class of every agent. Subclass it; see the module docstring."""

    agent_id: ClassVar[str]
    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    version: ClassVar[str] = "0.1.0"
    capabilities: ClassVar[Sequence[Capability]] = ()
    constraints: ClassVar[AgentConstraints] = AgentConstraints()
    #: a retried or redelivered attempt gets the answers its model and tool calls got
    #: before, while it asks the same (``agents.journal``); False: always fresh calls
    #: (still recorded)
    replay_journal: ClassVar[bool] = True
    #: how long a card runs before the worker reports it started (``task.started``: an
    #: attempt's ``timeout_s`` counts from it); 0: at once; None: the worker's own
    #: (``started_after_s`` of ``AgentWorker``, 0.01 s embedded, 1 s on NATS)
    started_after_s: ClassVar[float | None] = None
    _capabilities_by_name: ClassVar[tuple[Sequence[Capability], dict[str, Capability]] | None] = (
        None
    )

    async def handle(self, task: TaskCard, inputs: Any, ctx: TaskContext) -> Any:
        """Turn ``inputs`` into the output; override with ``async def`` or a blocking ``def``."""
        raise NotImplementedError

    @classmethod
    def card(cls) -> AgentCard:
        return AgentCard(
            agent_id=cls.agent_id,
            name=cls.name or cls.agent_id,
            description=cls.description,
            version=cls.version,
            capabilities=[c.spec() for c in cls.capabilities],
            constraints=cls.constraints,
        )

    @classmethod
    def capability_for(cls, name: str) -> Capability | None:
        """The capability called ``name`` (the first, if several are), or None."""
        # asked once per card: a dict made once per class, kept on the class with the
        # ``capabilities`` it was made from (a subclass, or a class given new ones, whose
        # ``capabilities`` are not those makes its own)
        cached = cls._capabilities_by_name
        if cached is None or cached[0] is not cls.capabilities:
            by_name: dict[str, Capability] = {}
            for c in cls.capabilities:
                by_name.setdefault(c.name, c)
            cached = (cls.capabilities, by_name)
            cls._capabilities_by_name = cached
        return cached[1].get(name)

    @classmethod
    async def run(cls, task: TaskCard, llm: LLM | None = None) -> ResultCard:
        """Self-check, then handle ``task`` on a fresh instance; never raises.

        Whatever the handler does (raises, returns something that cannot be
        serialised, leaves junk in ``ctx``), the answer is a ResultCard that
        encodes and decodes cleanly. Only ``asyncio.CancelledError`` (and
        other ``BaseException``s) propagate.
        """
        start = time.monotonic()
        base: dict[str, Any] = {
            "task_id": task.task_id,
            "attempt": task.attempt,
            "agent_id": cls.agent_id,
        }

        def reject(reason: str, detail: str) -> ResultCard:
            return ResultCard(**base, status="rejected", reason=reason, notes=detail)

        cap = cls.capability_for(task.capability)
        if cap is None:
            return reject("out_of_capability", f"{cls.agent_id} does not offer {task.capability!r}")
        try:
            inputs: Any = msgspec.convert(task.inputs, cap.input_type)
        except Exception as e:  # ValidationError, or inputs of a type msgspec refuses
            return reject("input_schema_mismatch", _text(e))
        try:
            size = len(msgspec.json.encode(task.inputs))
            problem = constraint_problem(cls.constraints, task.constraints, task.timeout_s, size)
        except Exception as e:  # inputs or constraints that cannot even be measured
            problem = f"constraints cannot be checked: {_text(e)}"
        if problem:
            return reject("over_constraint", problem)

        ctx = TaskContext(task, cls.agent_id, llm)
        if not cls.replay_journal:
            ctx.replay_journal = False
        extra: dict[str, Any]
        try:
            output = await _call_handler(cls(), task, inputs, ctx)
            payload = msgspec.to_builtins(output)  # it must cross the bus: checked below
            status: Any = "completed"
            extra = {"output": payload}
        except NeedsInput as e:
            status = "needs_input"
            extra = {
                "missing": _text(e.missing),
                "supplement_capability": None if e.capability is None else _text(e.capability),
                "supplement_inputs": e.inputs,
            }
        except Reject as e:
            status = "rejected"
            extra = {"reason": _text(e.reason)}
            ctx.notes = e.detail
        except Exception as e:  # the agent's bug becomes a failed result, not a crash
            status = "failed"
            extra = {"error": f"{type(e).__name__}: {_text(e)}"}
            if isinstance(e, LLMError):  # a typed reason for the retry policy
                extra["reason"] = _text(e.error_type)
            elif isinstance(e, EffectUnknown):  # the orchestrator asks an operator (a review)
                review = e.error_type == "tool_review"
                extra["reason"] = "tool_review" if review else "tool_effect_unknown"
            elif isinstance(e, ReplayDiverged):  # a strict re-run: never retried
                extra["reason"] = ReplayDiverged.error_type
            elif isinstance(e, JournalTampered):  # the task is failed already
                extra["reason"] = JournalTampered.error_type
            elif isinstance(e, ToolNotFound):  # nothing serves a tool it may call
                extra["reason"] = "tool_not_found"
        try:
            # the model answers recorded in the background are durable before the result
            # (which may carry what they said) leaves: agents.journal_settle
            await ctx.settle()
        except Exception as e:
            status = "failed"
            extra = {"error": f"a model answer could not be recorded: {_text(e)}"}
        result = ResultCard(
            **base,
            status=status,
            confidence=_confidence(ctx.confidence),
            needs_retry=status == "completed" and ctx.needs_retry is True,
            notes=_text(ctx.notes),
            usage=_usage(ctx),
            duration_s=time.monotonic() - start,
            **extra,
        )
        try:  # the answer must survive the trip across the bus
            try:
                data = encode(result)
            except Exception:
                # An output that cannot be encoded is the handler's failure, as if it had
                # raised (it is encoded once, with the card, not first on its own as well).
                problem = _encode_problem(extra.get("output")) if status == "completed" else None
                if problem is None:
                    raise
                result = msgspec.structs.replace(
                    result, status="failed", output=None, error=problem
                )
                data = encode(result)
            return decode_result_card(data)
        except Exception as e:
            return ResultCard(
                **base,
                status="failed",
                error=f"unserializable result: {_text(e)}",
                usage=result.usage,
                duration_s=result.duration_s,
            )


def _encode_problem(payload: Any) -> str | None:
    """Why ``payload`` cannot be encoded (in the words of a handler's failure), or None."""
    try:
        msgspec.json.encode(payload)
    except Exception as e:
        return f"{type(e).__name__}: {_text(e)}"
    return None


#: whether a class's ``handle`` function is ``async def`` (``inspect.iscoroutinefunction``
#: costs ~0.8 us, asked for every card): keyed by the function, a class's or a subclass's
_IS_ASYNC: dict[Any, bool] = {}


def _is_async(handle: Any) -> bool:
    func = getattr(handle, "__func__", None)  # a bound method: ask once per function
    if func is None:  # anything else (an instance's own callable): ask every time
        return inspect.iscoroutinefunction(handle)
    known = _IS_ASYNC.get(func)
    if known is None:
        known = _IS_ASYNC[func] = inspect.iscoroutinefunction(handle)
    return known


async def _call_handler(agent: Agent, task: TaskCard, inputs: Any, ctx: TaskContext) -> Any:
    """Await an ``async def handle``; run a sync one in a thread (its context copied)."""
    handle = agent.handle
    if _is_async(handle):
        return await handle(task, inputs, ctx)
    loop = asyncio.get_running_loop()
    call = functools.partial(contextvars.copy_context().run, handle, task, inputs, ctx)
    output = await loop.run_in_executor(HANDLER_EXECUTOR.get(), call)
    if inspect.isawaitable(output):  # a def that returns a coroutine
        output = await output
    return output


def _text(value: Any) -> str:
    """``str(value)`` that never raises (a broken ``__str__`` is the agent's bug)."""
    try:
        return value if isinstance(value, str) else str(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"


def _confidence(value: Any) -> float:
    """Clamp to 0..1; NaN and non-numbers count as no confidence (0.0)."""
    try:
        c = float(value)
    except Exception:
        return 0.0
    if math.isnan(c):
        return 0.0
    return min(1.0, max(0.0, c))


def _tokens(v: Any) -> int:
    if type(v) is int:  # the usual case, without int() and its try
        return v if v > 0 else 0
    try:
        return max(0, int(v))
    except Exception:
        return 0


_USAGE_HAS_MODEL = "model" in Usage.__struct_fields__  # once Usage carries the model
_NO_USAGE = Usage()  # frozen: the one answer of every task that spent nothing


def _usage(ctx: TaskContext) -> Usage:
    reported = getattr(ctx, "_reported", False) or (ctx.input_tokens, ctx.output_tokens) != (0, 0)
    llm = getattr(ctx, "_metered", None)  # None: the handler never asked for ctx.llm
    source: Any = ctx if reported else llm
    input_tokens = _tokens(getattr(source, "input_tokens", 0))
    output_tokens = _tokens(getattr(source, "output_tokens", 0))
    models = getattr(llm, "models", None)
    if models and _USAGE_HAS_MODEL:
        return Usage(
            input_tokens=input_tokens, output_tokens=output_tokens, model=_text(models[-1])
        )
    if not input_tokens and not output_tokens:
        return _NO_USAGE
    return Usage(input_tokens=input_tokens, output_tokens=output_tokens)
