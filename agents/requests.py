"""Agent -> orchestrator requests: how an agent pulls more than its card, on purpose.

An agent sees only its card (invariant 5). When it needs more - the output
of a task it depends on, a tool call, long-term memory - it asks the
orchestrator with an :class:`AgentRequest` and gets one :class:`AgentResponse`.
The orchestrator checks the request against the task's card and the agent's
registered card, does the work, records it as events on the task's stream,
and only then answers. Handlers use it through ``TaskContext``::

    facts = await ctx.read_output(task.deps[0])       # a declared dependency only
    page = await ctx.tool("http_fetch", url="http://…")  # on the agent's allow-list only
    prefs = await ctx.long_term.search("preferred report format")
    record = await ctx.long_term.get("pref/ann/report_format")
    await ctx.long_term.put("notes/q3", {"seen": True})  # if the policy lets it write

A refusal raises ``AccessDenied``; a tool that fails raises its typed error
(``ToolTimeout``, ``ToolResultTooLarge``, ... from ``agents.tools``); a bus
that cannot carry requests, or no answer in time, raises ``BusError``.

On the wire both are JSON (``encode``/``decode_request``/``decode_response``);
``request_id`` pairs them. Request kinds and their ``target``/``args``:

=================  ===============  =================================================
kind               target           args
=================  ===============  =================================================
``read_output``    a task id        -
``write_output``   a task id        ``value``
``tool``           a tool name      the tool's arguments
``memory.get``     a memory key     ``scope``
``memory.list``    -                ``tags``, ``kind``, ``prefix``, ``where``, ``limit``, ``scope``
``memory.search``  -                ``text``, ``k``, ``tags``, ``kind``, ``scope``
``memory.put``     a memory key     ``value``, ``text``, ``tags``, ``kind``, ``scope``
``model.request``  the model        ``request``, ``digest``, ``replay`` (``agents.journal``)
``model.answer``   the model        ``call``, ``answer`` or ``error`` and ``error_type``
``tool.begin``     the agent's tool ``arguments``, ``idempotent`` (before it runs)
``tool.end``       the agent's tool ``arguments``, ``key``, ``result`` or ``error``
``attempt.live``   -                - (the worker: is its attempt still wanted?)
``tool.specs``     -                - (the specs of the tools on its allow-list it serves)
=================  ===============  =================================================

``tool``, ``model.request`` and ``model.answer`` carry the journal's coordinates
(``execution``, ``seq``): see ``agents.journal``. A memory request's ``scope``
is a level of the task's run (``"user"``, ``"tenant"``, ``"global"``) or absent:
reads see the run's whole scope chain, a write goes to the run's own scope
(``bus.orchestrator.memory_access``).
"""

from __future__ import annotations

import asyncio
import builtins
import contextvars
import types
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from cardbus.agents.journal_settle import Unsettled
from cardbus.agents.tools import TOOL_ERRORS, ToolRegistry, ToolSpec, held_for_review
from cardbus.eventstore.errors import (
    AccessDenied,
    BudgetExceeded,
    BusError,
    CardbusError,
    DecodeError,
    EffectUnknown,
    JournalTampered,
    ReplayDiverged,
    ToolUnderReview,
    ValidationError,
)
from cardbus.eventstore.ids import new_id

if TYPE_CHECKING:
    from cardbus.agents.cards import TaskCard
    from cardbus.agents.journal import TaskJournal

__all__ = [
    "LOCAL_TOOLS",
    "REQUESTER",
    "REQUEST_KINDS",
    "TOOL_SPECS",
    "AgentRequest",
    "AgentResponse",
    "MemoryClient",
    "Requester",
    "TaskServices",
    "decode_request",
    "decode_response",
    "encode",
    "error_for",
]

RequestKind = Literal[
    "read_output",
    "write_output",
    "tool",
    "memory.get",
    "memory.list",
    "memory.search",
    "memory.put",
    "model.request",
    "model.answer",
    "model.queue",
    "tool.begin",
    "tool.end",
    "attempt.live",
    "tool.specs",
]
REQUEST_KINDS: tuple[str, ...] = (
    "read_output",
    "write_output",
    "tool",
    "memory.get",
    "memory.list",
    "memory.search",
    "memory.put",
    "model.request",
    "model.answer",
    "model.queue",
    "tool.begin",
    "tool.end",
    "attempt.live",
    "tool.specs",
)


class AgentRequest(msgspec.Struct, frozen=True, kw_only=True, tag="agent_request"):
    request_id: str
    task_id: str
    attempt: int
    agent_id: str
    kind: RequestKind
    target: str = ""
    args: dict[str, Any] = {}
    traceparent: str | None = None
    #: the journal's coordinates of a model or tool call: one handler run (``execution``,
    #: new at every delivery of the card) and the call's place in it (``seq``, from 0)
    execution: str = ""
    seq: int = -1
    #: the task's run (its card's root id): orchestrators that share the runs hand the
    #: request to the one deciding that run ("" from agents before it: answered where it
    #: lands)
    root_id: str = ""


class AgentResponse(msgspec.Struct, frozen=True, kw_only=True, tag="agent_response"):
    request_id: str
    ok: bool
    result: Any = None
    error: str | None = None
    #: access_denied | not_found | invalid_input | timeout | result_too_large | tool_error
    #: | bad_request | unavailable | effect_unknown | replay_diverged | budget_exceeded
    error_type: str | None = None
    duration_s: float = 0.0


_encoder = msgspec.json.Encoder()
_req_decoder = msgspec.json.Decoder(AgentRequest)
_resp_decoder = msgspec.json.Decoder(AgentResponse)


def encode(message: AgentRequest | AgentResponse) -> bytes:
    return _encoder.encode(message)


def decode_request(data: bytes) -> AgentRequest:
    try:
        return _req_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise DecodeError(f"invalid agent request: {e}") from e


def decode_response(data: bytes) -> AgentResponse:
    try:
        return _resp_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise DecodeError(f"invalid agent response: {e}") from e


def error_for(response: AgentResponse) -> CardbusError:
    """The typed error a failed response stands for."""
    message = response.error or response.error_type or "request failed"
    kind = response.error_type or ""
    if kind == "access_denied":
        return AccessDenied(message)
    if kind == "effect_unknown":
        return EffectUnknown(message)
    if kind == "tool_review":
        return ToolUnderReview(message)
    if kind == "replay_diverged":
        return ReplayDiverged(message)
    if kind == "journal_tampered":  # the orchestrator failed the task already
        return JournalTampered(message)
    if kind == "budget_exceeded":  # a model call refused before it was sent
        return BudgetExceeded(message)
    if kind in TOOL_ERRORS:
        return TOOL_ERRORS[kind](message)
    if kind == "bad_request":
        return ValidationError(message)
    return BusError(message)


Requester = Callable[[AgentRequest], Awaitable[AgentResponse]]

#: The requester of the agent worker running the current task (set by ``AgentWorker``).
REQUESTER: contextvars.ContextVar[Requester | None] = contextvars.ContextVar(
    "cardbus_requester", default=None
)


#: The specs of the tools the current task's agent may call, by name, as the runtime
#: serving it has them (set by ``AgentWorker`` from its ``ToolRegistry``; empty: none known).
TOOL_SPECS: contextvars.ContextVar[Mapping[str, ToolSpec]] = contextvars.ContextVar(
    "cardbus_tool_specs", default=types.MappingProxyType({})
)


#: The tools the current task's agent brought (its declared ``Tool`` s on its allow-list),
#: which the worker running it runs itself, journaled (set by ``AgentWorker``; None: none).
LOCAL_TOOLS: contextvars.ContextVar[ToolRegistry | None] = contextvars.ContextVar(
    "cardbus_local_tools", default=None
)


class MemoryClient:
    """``ctx.long_term``: long-term memory, each request checked and recorded by the
    orchestrator, within the scopes of the task's run (its user's, its tenant's, global).

    ``scope`` narrows a read to one level of them (``"user"``, ``"tenant"``,
    ``"global"``); a write goes to the run's own scope unless it names a broader level.
    A scope the agent may not use raises ``AccessDenied``."""

    def __init__(self, services: TaskServices) -> None:
        self._services = services

    async def get(self, key: str, *, scope: str | None = None) -> dict[str, Any] | None:
        """The record under ``key`` (a dict: key, value, text, tags, kind, scope, ...) or
        None; of the run's most specific scope that has it."""
        args = {"scope": scope} if scope else {}
        result: dict[str, Any] | None = await self._services.request("memory.get", key, args)
        return result

    async def put(
        self,
        key: str,
        value: Any,
        *,
        text: str = "",
        tags: Sequence[str] = (),
        kind: str = "record",
        scope: str | None = None,
    ) -> dict[str, Any]:
        """Write a record (allowed only to agents the access policy's ``memory_write``
        grants); ``{"key", "scope", "event_id"}`` of the write."""
        args: dict[str, Any] = {"value": value, "text": text, "tags": list(tags), "kind": kind}
        if scope:
            args["scope"] = scope
        result: dict[str, Any] = await self._services.request("memory.put", key, args)
        return result

    async def list(
        self,
        *,
        tags: Sequence[str] = (),
        kind: str | None = None,
        prefix: str = "",
        where: dict[str, Any] | None = None,
        limit: int | None = 20,
        scope: str | None = None,
    ) -> list[dict[str, Any]]:
        args = {
            "tags": list(tags),
            "kind": kind,
            "prefix": prefix,
            "where": where or {},
            "limit": limit,
        }
        if scope:
            args["scope"] = scope
        result: list[dict[str, Any]] = await self._services.request("memory.list", "", args)
        return result

    async def search(
        self,
        text: str,
        *,
        k: int = 5,
        tags: Sequence[str] = (),
        kind: str | None = None,
        scope: str | None = None,
    ) -> builtins.list[dict[str, Any]]:
        """Hits, best first: ``{"record": {...}, "score": float}``."""
        args: dict[str, Any] = {"text": text, "k": k, "tags": list(tags), "kind": kind}
        if scope:
            args["scope"] = scope
        result: builtins.list[dict[str, Any]] = await self._services.request(
            "memory.search", "", args
        )
        return result


class TaskServices:
    """What ``TaskContext`` offers beyond the card: requests to the orchestrator.

    The requester is the one given to the context, else the one the agent
    worker set for the current task (:data:`REQUESTER`).
    """

    task: TaskCard
    agent_id: str
    requester: Requester | None = None

    @property
    def tool_specs(self) -> Mapping[str, ToolSpec]:
        """Specs of the tools on this agent's allow-list that the runtime knows, by name
        (what ``ctx.tool`` runs them with: an ``LLMAgent`` offers them to its model);
        empty when the runtime has not said (an agent outside a worker)."""
        return TOOL_SPECS.get()

    @property
    def long_term(self) -> MemoryClient:
        """Long-term memory (``get``, ``list``, ``search``, ``put``), checked and recorded."""
        return MemoryClient(self)

    _journal: TaskJournal | None = None
    #: False: the orchestrator never answers this task's calls from the journal
    replay_journal: bool = True
    #: model answers whose records were sent and are not known durable yet
    #: (``agents.journal_settle``): every later request, and the result, waits for them
    _unsettled: Unsettled | None = None

    def defer_record(self, record: Awaitable[Any]) -> bool:
        """Send ``record`` (a model answer's) and let it finish in the background, if the
        caller runs on the task's loop; False (nothing sent) when it does not."""
        unsettled = self._unsettled
        if unsettled is None:
            try:
                unsettled = self._unsettled = Unsettled(asyncio.get_running_loop())
            except RuntimeError:
                return False
        if not unsettled.here():
            return False
        unsettled.defer(record)
        return True

    async def settle(self) -> None:
        """Wait until the answers recorded in the background are durable (the barrier
        before anything that depends on them leaves the process); raises if one failed."""
        unsettled = self._unsettled
        if unsettled and unsettled.here():
            await unsettled.settle()

    @property
    def journal(self) -> TaskJournal:
        """This handler run's journal of model and tool calls (made when first used)."""
        journal = self._journal
        if journal is None:
            from cardbus.agents.journal import TaskJournal

            journal = self._journal = TaskJournal(self, replay=self.replay_journal)
        return journal

    async def request(
        self,
        kind: RequestKind,
        target: str = "",
        args: dict[str, Any] | None = None,
        *,
        seq: int = -1,
        execution: str = "",
    ) -> Any:
        """Send one request; its result, or the typed error it failed with. The model
        answers recorded in the background are durable first (``settle``): what this
        request carries may depend on them."""
        requester = self.requester or REQUESTER.get()
        if requester is None:
            raise BusError("no orchestrator to ask: this task runs without a request path")
        if self._unsettled and kind != "model.answer":
            await self.settle()
        req = AgentRequest(
            request_id=new_id(),
            task_id=self.task.task_id,
            root_id=self.task.root_id,
            attempt=self.task.attempt,
            agent_id=self.agent_id,
            kind=kind,
            target=target,
            args=args or {},
            traceparent=self.task.traceparent,
            execution=execution,
            seq=seq,
        )
        try:
            resp = await asyncio.wait_for(requester(req), max(1.0, self.task.timeout_s))
        except TimeoutError as e:
            raise BusError(f"no answer to {kind} {target!r} in time") from e
        if not resp.ok:
            raise error_for(resp)
        return resp.result

    async def tool(self, name: str, /, **args: Any) -> Any:
        """Call a tool on this agent's allow-list; its result (JSON builtins).

        The call is journaled: a retried attempt that calls the same tool with the same
        arguments at the same place gets the recorded result, and the tool does not run
        again (``bus.orchestrator.journal``). A tool the agent brought (``LOCAL_TOOLS``)
        runs here, in the worker, recorded the same way (``ctx.journal.tool_call``)."""
        journal = self.journal
        local = LOCAL_TOOLS.get()
        tool = local.get(name) if local is not None else None
        if local is not None and tool is not None:

            async def run(key: str, arguments: dict[str, Any] = args) -> Any:
                return (await local.call(name, arguments, idempotency_key=key)).result

            return await journal.tool_call(
                name,
                args,
                run,
                idempotent=tool.spec.idempotent,
                review=held_for_review(tool, args),
                schema=tool.spec.input_schema,
                edited=run,
            )
        return await self.request(
            "tool", name, args, seq=journal.next_seq(), execution=journal.execution
        )

    async def read_output(self, task_id: str) -> Any:
        """The output of ``task_id``, which must be one of this task's declared deps."""
        return await self.request("read_output", task_id)

    async def write_output(self, task_id: str, value: Any) -> None:
        """Write a task's output: allowed for this agent's own task only.

        The own task's output travels in the ResultCard (what ``handle``
        returns); this request exists so that a write anywhere else is
        refused and recorded.
        """
        await self.request("write_output", task_id, {"value": value})
