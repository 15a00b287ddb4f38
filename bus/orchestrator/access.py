"""The orchestrator's side of agent requests: check, do, record, then answer.

:class:`RequestBroker` serves ``AgentRequest``s (``agents.requests``) for the
orchestrator. For each one it

1. checks it with :func:`access_problem`, a pure function of the state folded
   from the log: the asking agent must be working on the task right now (a
   dispatched agent of the current attempt); ``read_output`` may name only a
   task the card declares as a dependency, ``write_output`` only the task
   itself; ``tool`` only a tool on the agent's allow-list as registered in the
   log (``AgentConstraints.tools``, not what the request claims), whose entries
   are names or globs (:func:`tool_allowed`: ``"time__*"`` names every tool of
   the MCP server ``time``); long-term memory requests reach only the scopes
   of the task's run (user, tenant, global) that the policy's ``memory_read``
   / ``memory_write`` grant the agent (``memory_access``);
2. on a refusal records ``access.refused`` and answers ``access_denied``
   (the agent gets ``AccessDenied``);
3. otherwise does the work - reads the dependency's output, calls the tool
   through the ``ToolRegistry`` (time-out, size limit, schemas), reads
   or writes long-term memory - and records what happened: ``memory.read`` (mode
   ``output`` for task memory, ``get``/``list``/``search`` for long-term
   memory) or, for a tool, ``tool.requested`` *before* the call (the log
   knows of a side effect before it can happen) and ``tool.called`` after it
   with the arguments (or only their digest, per :class:`AccessPolicy`), the
   result (inline when small, else its digest and size), the error and its
   type, and the duration;
4. answers only once those events are durable (``record`` returns after the
   append): the log knows of every effect before the agent does.

Events go on the task's own stream, appended by the orchestrator's one
decision loop (``record``), so their versions never race the task's
lifecycle events; folds that understand only ``task.*`` skip them. A request
for a task the log does not know is recorded on the agent's stream
(``agent-<id>``) if the agent is registered, and only refused otherwise.
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from cardbus.agents.requests import AgentRequest, AgentResponse
from cardbus.agents.tools import ToolRegistry
from cardbus.bus.orchestrator.cancel_notices import attempt_live
from cardbus.bus.orchestrator.checks import allowed_values, check_choice, check_number
from cardbus.bus.orchestrator.journal import BadJournalRequest, Journal, inline_size
from cardbus.bus.orchestrator.memory import LongTermMemory
from cardbus.bus.orchestrator.memory_access import (
    RESERVED_KINDS,
    MemoryGrant,
    MemoryScopes,
    memory_scopes,
    parse_grants,
)
from cardbus.bus.orchestrator.runstate import RunState, TaskView
from cardbus.eventstore import TaskState
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import CardbusError, ConfigError
from cardbus.projections.scope import check_key

if TYPE_CHECKING:
    from cardbus.eventstore.store import EventStore

__all__ = [
    "AccessPolicy",
    "ArgumentsRecord",
    "Record",
    "RequestBroker",
    "access_problem",
    "digest",
    "inline_size",
    "tool_allowed",
]

log = logging.getLogger(__name__)

Record = Callable[[str, list[ev.Event]], Awaitable[Any]]
_WORKING = (TaskState.DISPATCHED, TaskState.RUNNING)


#: what ``tool.called`` keeps of a call's arguments: all of them, or their digest only
ArgumentsRecord = Literal["full", "digest"]


@dataclass(frozen=True)
class AccessPolicy:
    """What agents may read and what the log keeps of their requests; checked when made."""

    arguments: ArgumentsRecord = "full"
    max_inline_bytes: int = 4096  # larger arguments are recorded as digest + size
    memory_reads: bool = True  # may agents read long-term memory at all
    max_memory_results: int = 20
    #: what ``model.requested`` / ``model.answered`` keep of prompts and answers: all of
    #: them, or (``"digest"``) only their digests and sizes, for deployments that must not
    #: store prompts (such calls are recorded but cannot be replayed)
    model_content: ArgumentsRecord = "full"
    max_model_bytes: int = 1 << 20  # a larger prompt or answer is kept as digest + size
    #: called as ``redact(kind, value)`` (kind ``model.request`` or ``model.answer``)
    #: before anything is written; what it returns is what the log keeps
    redact: Callable[[str, Any], Any] | None = None
    #: answer a retried attempt's calls from the journal (``bus.orchestrator.journal``)
    replay: bool = True
    #: who may read / write which levels of their run's memory scopes: grants "<who>" or
    #: "<who>@<level>", who an agent id glob or "capability:<glob>", level user, tenant
    #: or global (``bus.orchestrator.memory_access``); by default all read, none write
    memory_read: tuple[str, ...] = ("*",)
    memory_write: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        me = "AccessPolicy"
        check_choice(me, "arguments", self.arguments, allowed_values(ArgumentsRecord))
        check_choice(me, "model_content", self.model_content, allowed_values(ArgumentsRecord))
        check_number(me, "max_inline_bytes", self.max_inline_bytes, at_least=0, integer=True)
        check_number(me, "max_model_bytes", self.max_model_bytes, at_least=0, integer=True)
        if self.redact is not None and not callable(self.redact):
            raise ConfigError(f"{me}.redact must be a function or None; got {self.redact!r}")
        if not isinstance(self.replay, bool):
            raise ConfigError(f"{me}.replay must be True or False; got {self.replay!r}")
        if not isinstance(self.memory_reads, bool):
            raise ConfigError(f"{me}.memory_reads must be True or False; got {self.memory_reads!r}")
        check_number(me, "max_memory_results", self.max_memory_results, at_least=1, integer=True)
        object.__setattr__(self, "_read", parse_grants(me, "memory_read", self.memory_read))
        object.__setattr__(self, "_write", parse_grants(me, "memory_write", self.memory_write))
        object.__setattr__(self, "memory_read", tuple(self.memory_read))
        object.__setattr__(self, "memory_write", tuple(self.memory_write))

    def memory_scopes(self, state: RunState, req: AgentRequest) -> MemoryScopes:
        """Where a memory request of a task in ``state`` may look or write, or why not."""
        task = state.tasks.get(req.task_id)
        run = state.runs.get(task.created.root_id) if task is not None else None
        read: tuple[MemoryGrant, ...] = getattr(self, "_read", ())
        write: tuple[MemoryGrant, ...] = getattr(self, "_write", ())
        return memory_scopes(
            run.started if run is not None else None,
            req.agent_id,
            task.created.capability if task is not None else "",
            req.kind,
            req.args.get("scope"),
            read,
            write,
        )


def digest(value: Any) -> str:
    try:
        data = msgspec.json.encode(value, order="sorted")
    except Exception:
        data = repr(value).encode()
    return hashlib.sha256(data).hexdigest()


def tool_allowed(name: str, allowed: Iterable[str]) -> bool:
    """Whether tool ``name`` is on the allow-list ``allowed``: an entry is a name, or a
    glob (``fnmatch``, case-sensitive: ``*``, ``?``, ``[...]``) such as ``"time__*"``."""
    return any(name == p or fnmatch.fnmatchcase(name, p) for p in allowed)


def access_problem(
    state: RunState, req: AgentRequest, policy: AccessPolicy = AccessPolicy()
) -> str | None:
    """Why ``req`` is refused, or None when it is allowed."""
    task = state.tasks.get(req.task_id)
    if task is None:
        return "unknown_task"
    if (
        req.agent_id not in task.dispatched_to
        or req.attempt != task.attempt
        or (task.state not in _WORKING and not _interrupted(task, req))
    ):
        return "not_assigned"  # not (or no longer) this agent's task
    match req.kind:
        case "read_output":
            if req.target not in task.created.deps:
                return "not_a_dependency"
            dep = state.tasks.get(req.target)
            if dep is None or dep.state is not TaskState.COMPLETED:
                return "dependency_not_completed"
        case "write_output":
            if req.target != req.task_id:
                return "not_own_task"
        case "tool":
            card = state.agents.get(req.agent_id)
            if card is None or not tool_allowed(req.target, card.constraints.tools):
                return "tool_not_allowed"
        case "memory.get" | "memory.list" | "memory.search" | "memory.put":
            if not policy.memory_reads and req.kind != "memory.put":
                return "memory_not_allowed"
            if req.kind == "memory.put" and str(req.args.get("kind") or "") in RESERVED_KINDS:
                return "memory_kind_reserved"
            return policy.memory_scopes(state, req).problem
        case (
            "model.request"
            | "model.answer"
            | "model.queue"
            | "tool.begin"
            | "tool.end"
            | "tool.specs"
        ):
            pass  # its own model call or tool (recorded: the journal), its tools' specs
        case _:
            return "unknown_request"
    return None


def _interrupted(task: TaskView, req: AgentRequest) -> bool:
    """The end of a tool or model call (``tool.end``, ``model.answer``) that the task's
    cancel or halt interrupted: a record of what happened, kept though the attempt is no
    longer wanted."""
    stopped = task.state in (TaskState.CANCELLED, TaskState.HALTED)
    return stopped and req.kind in ("tool.end", "model.answer")


class _BadRequest(Exception):
    pass


class RequestBroker:
    def __init__(
        self,
        state: RunState,
        record: Record,
        tools: ToolRegistry | None = None,
        memory: LongTermMemory | None = None,
        policy: AccessPolicy | None = None,
        store: EventStore | None = None,
        catch_up: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        """``store``: where the journal reads a task's recorded calls (None: no replay).
        ``catch_up``: waits until the state holds what the log held when called; asked
        before refusing a request for a task not (or no longer) the agent's, since with
        several orchestrators serving requests this one may not have folded it yet."""
        self.catch_up = catch_up
        self.state = state
        self.record = record
        self.tools = tools or ToolRegistry()
        self.memory = memory
        policy = policy or AccessPolicy()
        self.journal = Journal(
            store, record, self.tools, policy, self._replay_allowed, self._folded_version
        )

    @property
    def policy(self) -> AccessPolicy:
        return self.journal.policy

    @policy.setter
    def policy(self, value: AccessPolicy) -> None:
        self.journal.policy = value

    def _folded_version(self, task_id: str) -> int:
        return self.state.versions.get(task_id, 0)

    def _replay_allowed(self, task_id: str) -> bool:
        task = self.state.tasks.get(task_id)
        return self.policy.replay and (task is None or task.created.journal)

    async def handle(self, req: AgentRequest) -> AgentResponse:
        """Check, do, record, answer; never raises for a bad or refused request."""
        start = time.monotonic()
        try:
            return await self._handle(req, start)
        except (_BadRequest, BadJournalRequest) as e:
            return self._answer(req, start, error=str(e), error_type="bad_request")
        except Exception as e:  # e.g. the record could not be appended: no effect, no answer
            log.exception("request %s failed", req.request_id)
            return self._answer(
                req, start, error=f"request failed: {e!r}", error_type="unavailable"
            )

    async def _handle(self, req: AgentRequest, start: float) -> AgentResponse:
        if req.kind == "attempt.live":  # read only, nothing recorded (cancel_notices)
            return self._answer(req, start, result=attempt_live(self.state, req))
        problem = access_problem(self.state, req, self.policy)
        if problem in ("unknown_task", "not_assigned") and self.catch_up is not None:
            await self.catch_up()  # behind the log? (another orchestrator decided it)
            problem = access_problem(self.state, req, self.policy)
        if problem is not None:
            refused = ev.AccessRefused(
                task_id=req.task_id,
                agent_id=req.agent_id,
                action=req.kind,
                target=req.target,
                reason=problem,
                attempt=req.attempt,
            )
            await self._record(req, [refused])
            message = f"{req.agent_id} may not {req.kind} {req.target!r}: {problem}"
            return self._answer(req, start, error=message, error_type="access_denied")
        match req.kind:
            case "read_output":
                output = self.state.tasks[req.target].output
                await self._record(
                    req, [self._read(req, start, "output", req.target, [req.target])]
                )
                return self._answer(req, start, result=output)
            case "write_output":  # its own task: the output itself arrives in the ResultCard
                return self._answer(req, start, result={"accepted": True})
            case "tool":
                outcome = await self.journal.tool(req)
            case "model.request":
                outcome = await self.journal.model_request(req)
            case "model.answer":
                outcome = await self.journal.model_answer(req)
            case "model.queue":  # waiting for the provider's limit (``limit_waits``)
                outcome = await self.journal.model_queue(req)
            case "tool.begin":
                outcome = await self.journal.tool_begin(req)
            case "tool.end":
                outcome = await self.journal.tool_end(req)
            case "tool.specs":  # what the agent's model is offered: read-only, not recorded
                return self._answer(req, start, result=self._tool_specs(req.agent_id))
            case _:
                return await self._memory(req, start)
        return self._answer(req, start, outcome.result, outcome.error, outcome.error_type)

    def _tool_specs(self, agent_id: str) -> dict[str, Any]:
        """The specs of the registry's tools on ``agent_id``'s allow-list (as registered)."""
        card = self.state.agents.get(agent_id)
        allowed = card.constraints.tools if card is not None else []
        return {
            s.name: msgspec.to_builtins(s)
            for s in self.tools.specs()
            if tool_allowed(s.name, allowed)
        }

    # -- long-term memory --------------------------------------------------------

    async def _memory(self, req: AgentRequest, start: float) -> AgentResponse:
        if self.memory is None:
            return self._answer(
                req, start, error="no long-term memory here", error_type="unavailable"
            )
        a = req.args
        limit = self.policy.max_memory_results
        scopes = list(self.policy.memory_scopes(self.state, req).scopes)  # checked: allowed
        try:
            tags = [str(t) for t in a.get("tags") or []]
            kind = a.get("kind")
            if kind is not None and not isinstance(kind, str):
                raise TypeError("kind must be a string")
            if req.kind == "memory.put":
                return await self._put(req, start, scopes[0], tags, kind or "record")
            if req.kind == "memory.get":
                record = await self.memory.get(check_key(req.target), scopes)
                result: Any = None if record is None else _record_view(record)
                mode, query, keys = "get", req.target, [] if record is None else [record.key]
            elif req.kind == "memory.list":
                where = a.get("where") or {}
                if not isinstance(where, dict):
                    raise TypeError("where must be an object")
                n = min(int(a.get("limit") or limit), limit)
                records = await self.memory.list(
                    scopes=scopes,
                    tags=tags,
                    kind=kind,
                    prefix=str(a.get("prefix") or ""),
                    where=where,
                    limit=n,
                )
                result = [_record_view(r) for r in records]
                mode, keys = "list", [r.key for r in records]
                query = msgspec.json.encode(
                    {"tags": tags, "kind": kind, "prefix": a.get("prefix"), "where": where},
                    order="sorted",
                ).decode()
            else:
                text = a.get("text")
                if not isinstance(text, str):
                    raise TypeError("text must be a string")
                k = min(int(a.get("k") or 5), limit)
                hits = await self.memory.search(text, k=k, scopes=scopes, tags=tags, kind=kind)
                result = [{"record": _record_view(h.record), "score": h.score} for h in hits]
                mode, query, keys = "search", text, [h.record.key for h in hits]
        except (TypeError, ValueError, CardbusError) as e:
            raise _BadRequest(f"{req.kind}: {e}") from e
        await self._record(req, [self._read(req, start, mode, query, keys, scopes)])
        return self._answer(req, start, result=result)

    async def _put(
        self, req: AgentRequest, start: float, scope: str, tags: list[str], kind: str
    ) -> AgentResponse:
        """An agent's write, to its run's scope (or the broader level it named, if granted):
        the ``memory.written`` names the agent, the task and the run."""
        assert self.memory is not None
        task = self.state.tasks[req.task_id]
        text = req.args.get("text") or ""
        if not isinstance(text, str):
            raise _BadRequest("memory.put: text must be a string")
        try:
            env = await self.memory.remember(
                check_key(req.target),
                req.args.get("value"),
                text=text,
                tags=tags,
                kind=kind,
                policy="agent",
                root_id=task.created.root_id,
                actor=req.agent_id,
                scope=scope,
                agent_id=req.agent_id,
            )
        except CardbusError as e:  # a bad key, a value over the log's size limit
            raise _BadRequest(f"memory.put: {e}") from e
        return self._answer(
            req, start, result={"key": req.target, "scope": scope, "event_id": env.event_id}
        )

    # -- helpers -------------------------------------------------------------------

    def _read(
        self,
        req: AgentRequest,
        start: float,
        mode: str,
        query: str,
        keys: list[str],
        scopes: list[str] | None = None,
    ) -> ev.MemoryRead:
        return ev.MemoryRead(
            task_id=req.task_id,
            query=query,
            keys=keys,
            agent_id=req.agent_id,
            attempt=req.attempt,
            mode=mode,
            duration_s=round(time.monotonic() - start, 6),
            scopes=list(scopes or []),
        )

    async def _record(self, req: AgentRequest, events: list[ev.Event]) -> None:
        if req.task_id in self.state.tasks:
            await self.record(req.task_id, events)
        elif req.agent_id in self.state.agents:
            await self.record(f"agent-{req.agent_id}", events)
        else:
            log.warning("refused a request of unregistered agent %r: not recorded", req.agent_id)

    @staticmethod
    def _answer(
        req: AgentRequest,
        start: float,
        result: Any = None,
        error: str | None = None,
        error_type: str | None = None,
    ) -> AgentResponse:
        return AgentResponse(
            request_id=req.request_id,
            ok=error is None,
            result=result,
            error=error,
            error_type=error_type,
            duration_s=round(time.monotonic() - start, 6),
        )


def _record_view(record: Any) -> dict[str, Any]:
    """What an agent sees of a memory record."""
    return {
        "key": record.key,
        "value": record.value,
        "text": record.text,
        "tags": list(record.tags),
        "kind": record.kind,
        "scope": record.scope,
        "recorded_at": record.recorded_at,
    }
