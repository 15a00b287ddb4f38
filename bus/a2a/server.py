"""The orchestrator served as an A2A agent, on a2a-sdk's server (JSON-RPC, SSE).

``A2AGateway`` turns A2A requests into the orchestrator's own moves, and
reads every answer back from the log (``TaskFold``):

* ``SendMessage`` / ``SendStreamingMessage`` without a task id starts a run:
  a data part holding a plan (the plan format's JSON) is submitted as it is; a
  text goal with no plan is handed to the gateway's ``planner``:
  :class:`GoalPlanning` (what ``serve`` uses) makes it a plan of the goal
  alone, which the orchestrator splits with its planner agents (capability
  ``plan``) like any goal plan; with no planner the answer is
  ``UnsupportedOperationError``; a plan refused before it runs is
  ``InvalidParamsError`` with the reason. The A2A task id is the run's root
  id; the context id and the message are kept in ``run.started``'s session,
  the plan id is ``a2a-<hash of context id and message id>`` (a resent
  message answers with the task it started);
* a message on a task that is input-required answers what it waits for: an
  approval (``{"approve": true|false}`` or a text beginning with yes/approve
  or no/deny, through ``answer_approval``) or a question an agent asked
  (``AskPerson(question, schema)``, or a free-text ``NeedsInput(missing,
  capability="user_input")``): the input-required status carries the question's
  schema as a data part, and the message's data part (or text) is the answer,
  through ``answer_question`` (refused naming the field when it does not fit the
  schema: ``InvalidParamsError``, the question stays open);
* who does it is who authenticated: the actor of a run started, an approval
  answered or a run cancelled is the name of the token the request carried
  (``HttpGuard`` puts an :class:`~cardbus.bus.http_guard.Identity` in the
  request; a2a-sdk hands it on as ``context.user``), ``local:<user>`` on a
  loopback gateway without tokens (an answer to a question is a
  ``question.answered`` by that name). The message id is kept in the note, or
  in the ``question.answered``;
* ``CancelTask`` cancels the run (``cancel_run``); ``GetTask``, ``ListTasks``
  and ``SubscribeToTask`` fold the log, so they work after a restart, and a
  subscriber first gets the whole task (history and artifacts: what it
  missed), then the run's events as they are written (``store.subscribe``).

:class:`LogTaskStore` is the same reading as an a2a-sdk ``TaskStore``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import inspect
import json
import logging
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any, Protocol

import msgspec
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.server.routes import create_jsonrpc_routes
from a2a.server.tasks.task_store import TaskStore
from a2a.types import (
    AgentCard as PbAgentCard,
)
from a2a.types import (
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    InvalidParamsError,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskNotCancelableError,
    TaskNotFoundError,
    TaskPushNotificationConfig,
    TaskState,
    UnsupportedOperationError,
)
from a2a.utils.errors import (
    A2AError,
    ExtendedAgentCardNotConfiguredError,
    InternalError,
    PushNotificationNotSupportedError,
)
from a2a.utils.proto_utils import validate_proto_required_fields
from a2a.utils.task import (
    ListTasksCursor,
    decode_list_tasks_cursor,
    encode_list_tasks_cursor,
    validate_history_length,
    validate_page_size,
)
from google.protobuf.json_format import MessageToDict, ParseDict

from cardbus.agents.a2a_card import ints_back, to_a2a_v1
from cardbus.agents.cards import AgentCard, CapabilitySpec, ResultCard, TaskCard
from cardbus.agents.planning import PLAN_CAPABILITY
from cardbus.agents.streaming import Chunk
from cardbus.bus.a2a.fold import (
    CANCEL_REASON,
    USER_AGENT_ID,
    USER_CAPABILITY,
    Question,
    TaskFold,
    answer_notes,
    approval_note,
)
from cardbus.bus.a2a.streamed import ChunkArtifacts, merged
from cardbus.bus.http_guard import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_MAX_BODY,
    LOOPBACK_NAMES,
    HttpGuard,
    Refusal,
    Tokens,
)
from cardbus.bus.orchestrator.cancel import cancel_run
from cardbus.bus.orchestrator.children import remote_lineage
from cardbus.bus.orchestrator.core import Orchestrator, answer_approval
from cardbus.bus.orchestrator.plan import Plan, as_plan
from cardbus.bus.orchestrator.questions import QuestionRefused, answer_question
from cardbus.bus.transport.interface import Bus
from cardbus.eventstore import EventStore, new_id
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import CardbusError, InvalidPlan, PlanConflict

__all__ = [
    "A2AGateway",
    "GoalPlanning",
    "LogTaskStore",
    "Planner",
    "ShortInternalErrors",
    "actor_of",
    "build_app",
    "gateway_card",
    "user_agent_card",
]

log = logging.getLogger(__name__)
_YES = ("yes", "y", "ok", "approve", "approved", "grant", "granted", "accept")
_NO = ("no", "n", "deny", "denied", "reject", "rejected", "refuse")
#: the actor of a request no guard named (the handler called without the HTTP door)
UNNAMED = "unauthenticated"


def actor_of(context: ServerCallContext | None) -> str:
    """Who a request is: the name the door's guard established (a2a-sdk's ``context.user``
    reads the guard's ``Identity``); :data:`UNNAMED` when no guard saw it."""
    user = context.user if context is not None else None
    name = getattr(user, "user_name", "") if user is not None else ""
    return name or UNNAMED


class Planner(Protocol):
    """Decomposes a goal into a plan (another engineer's goal planning plugs in here)."""

    async def plan(self, goal: str, agents: Sequence[AgentCard]) -> Plan: ...


class GoalPlanning:
    """The orchestrator's own goal planning as the gateway's :class:`Planner`.

    A goal becomes a plan of the goal alone (no tasks): the orchestrator sends
    it to an agent offering ``plan`` (``RulePlanner``, ``LLMPlanner``, ...),
    checks the proposal and runs it, every round in the log (``plan.proposed``,
    ``plan.refused``, ``plan.accepted``); the A2A task streams it all.
    """

    async def plan(self, goal: str, agents: Sequence[AgentCard]) -> Plan:
        if not any(a.capability(PLAN_CAPABILITY) is not None for a in agents):
            raise InvalidPlan(f"no agent offers the capability {PLAN_CAPABILITY!r} to plan a goal")
        return Plan(goal=goal)


def user_agent_card() -> AgentCard:
    """The card of ``a2a-user``: the human at the other end of an A2A task."""
    return AgentCard(
        agent_id=USER_AGENT_ID,
        name="A2A user",
        description="asks the user of an A2A task and answers with their reply",
        capabilities=[
            CapabilitySpec(
                name=USER_CAPABILITY,
                description="ask the person who sent the task for missing input",
                tags=["human", "a2a"],
            )
        ],
        provider="cardbus",
    )


def gateway_card(planner: bool = False) -> AgentCard:
    """The orchestrator's own card: it runs plans (and goals, with a planner)."""
    caps = [
        CapabilitySpec(
            name="run_plan",
            description="run a plan: a data part in the cardbus plan format (goal, tasks, ...)",
            input_schema=msgspec.json.schema(Plan),
            tags=["plan", "orchestrator"],
        )
    ]
    if planner:
        caps.append(
            CapabilitySpec(
                name="run_goal",
                description="decompose a goal (a text part) into a plan and run it",
                input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
                tags=["goal", "orchestrator"],
            )
        )
    return AgentCard(
        agent_id="cardbus",
        name="cardbus orchestrator",
        description="Runs plans of typed task cards over cardbus agents; the log is the truth.",
        capabilities=caps,
        provider="cardbus",
    )


def _refuse(message: str) -> InvalidParamsError:
    return InvalidParamsError(message=message)


def _answer_of(q: Question, text: str, data: list[Any]) -> Any:
    """The answer a message gives to a typed question: its data part (a ``task_id`` that
    names the question is not part of it), else its text: as it is for a string (a string
    schema, or choices that are all strings), ``{"text": ...}`` for a question of any
    answer, else read as JSON (the schema then says what is wrong)."""
    spec = q.spec or {}
    schema = spec.get("schema") or {}
    if data:
        doc = data[0]
        props = schema.get("properties")
        named = isinstance(doc, dict) and doc.get("task_id") == q.task_id
        if named and not (isinstance(props, dict) and "task_id" in props):
            doc = {k: v for k, v in doc.items() if k != "task_id"}
        return doc
    choices = spec.get("choices")
    if schema.get("type") == "string" or (choices and all(isinstance(c, str) for c in choices)):
        return text
    if not schema:
        return {"text": text}  # a free-text question, as before typed questions
    try:
        return json.loads(text)
    except ValueError:
        return text


def _check_message(params: SendMessageRequest) -> None:
    """What a2a-sdk's default handler checks (``validate_request_params``), in short words."""
    try:
        validate_proto_required_fields(params)
    except InvalidParamsError as e:
        errors = (e.data or {}).get("errors") or []
        said = "; ".join(f"{x.get('field')}: {x.get('message')}" for x in errors)
        raise _refuse(said or "required fields are missing") from None
    validate_history_length(params.configuration)
    for i, part in enumerate(params.message.parts):
        if part.WhichOneof("content") is None:
            raise _refuse(f"message.parts[{i}] has no content (text, data, raw or url)")


def _a2a_errors(method: Callable[..., Any]) -> Callable[..., Any]:
    """A2A errors as they are; a cardbus error as invalid params with its message; anything
    else as an internal error that names its type only (the details go to the log)."""

    def translate(e: Exception) -> Exception:
        if isinstance(e, A2AError):
            return e
        if isinstance(e, CardbusError):
            return InvalidParamsError(message=str(e)[:500])
        log.exception("A2A %s failed", method.__name__)
        return InternalError(message=f"internal error ({type(e).__name__})")

    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def gen(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            inner = method(*args, **kwargs)
            try:
                async for item in inner:
                    yield item
            except Exception as e:
                raise translate(e) from e
            finally:
                await inner.aclose()

        return gen

    @functools.wraps(method)
    async def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return await method(*args, **kwargs)
        except Exception as e:
            raise translate(e) from e

    return call


def _split(message: Message) -> tuple[str, list[Any]]:
    """A message's text (joined) and its data parts (numbers made ints where whole)."""
    texts = [p.text for p in message.parts if p.HasField("text")]
    data = [ints_back(MessageToDict(p.data)) for p in message.parts if p.HasField("data")]
    return "\n".join(texts).strip(), data


def _plan_id(message: Message) -> str:
    """The run a message starts, named by its id in its context: a resend finds it again."""
    key = f"{message.context_id}\x00{message.message_id}"
    return "a2a-" + hashlib.sha256(key.encode()).hexdigest()[:24]


class LogTaskStore(TaskStore):
    """a2a-sdk's ``TaskStore``, read from the cardbus log: nothing to lose on a restart.

    ``save`` and ``delete`` refuse: the log is append-only and an A2A task is
    derived from a run's events, never stored beside them.
    """

    def __init__(self, store: EventStore) -> None:
        self.store = store

    async def fold(self, task_id: str) -> TaskFold | None:
        fold = TaskFold(task_id)
        for env in await self.store.read_correlation(task_id):
            fold.apply(env)
        return fold if fold.found else None

    async def get(self, task_id: str, context: ServerCallContext | None = None) -> Task | None:
        fold = await self.fold(task_id)
        return fold.task() if fold else None

    async def _folds(self, context_id: str) -> list[TaskFold]:
        """Every A2A run (of ``context_id``, if given), folded in one pass over the log."""
        folds: dict[str, TaskFold] = {}
        position = 1
        while True:
            page = await self.store.read_all(position, 1000)
            for env in page:
                data = env.data
                if isinstance(data, ev.RunStarted) and env.stream == env.correlation_id:
                    a2a = data.session.get("a2a") if isinstance(data.session, dict) else None
                    if isinstance(a2a, dict) and (
                        not context_id or a2a.get("context_id") == context_id
                    ):
                        folds[env.stream] = TaskFold(env.stream)
                fold = folds.get(env.correlation_id)
                if fold is not None:
                    fold.apply(env)
            if len(page) < 1000:
                break
            position = page[-1].position + 1
        return [f for f in folds.values() if f.found]

    async def list(
        self, params: ListTasksRequest, context: ServerCallContext | None = None
    ) -> ListTasksResponse:
        """Newest status first (spec 3.1.4: by status timestamp, then id, descending)."""
        validate_history_length(params)
        if params.HasField("page_size"):
            validate_page_size(params.page_size)
        after: tuple[bool, int, str] | None = None
        if params.page_token:
            cursor = decode_list_tasks_cursor(params.page_token)
            if cursor is None:
                raise _refuse("pageToken is not a token this server gave")
            after = cursor.sort_key()
        folds = await self._folds(params.context_id)
        if params.status:
            folds = [f for f in folds if f.status_state() == params.status]
        if params.HasField("status_timestamp_after"):
            since = params.status_timestamp_after.ToNanoseconds()
            folds = [f for f in folds if f.timestamp_ns() >= since]
        keyed = sorted(((True, f.timestamp_ns(), f.root_id), f) for f in folds)
        keyed.reverse()
        total = len(keyed)
        if after is not None:
            keyed = [(k, f) for k, f in keyed if k < after]
        size = params.page_size or 50
        page, rest = keyed[:size], keyed[size:]
        hl = params.history_length if params.HasField("history_length") else None
        token = ""
        if rest:
            last = page[-1][0]
            token = encode_list_tasks_cursor(ListTasksCursor(timestamp_ns=last[1], task_id=last[2]))
        return ListTasksResponse(
            tasks=[f.task(hl) for _, f in page],
            next_page_token=token,
            page_size=size,
            total_size=total,
        )

    async def save(self, task: Task, context: ServerCallContext | None = None) -> None:
        raise UnsupportedOperationError(message="A2A tasks are derived from the cardbus log")

    async def delete(self, task_id: str, context: ServerCallContext | None = None) -> None:
        raise UnsupportedOperationError(message="the cardbus log is append-only")


class A2AGateway(RequestHandler):
    """a2a-sdk's ``RequestHandler`` over an orchestrator, its store and its bus.

    Every method checks its parameters as a2a-sdk's default handler does
    (``-32602`` naming the field) and answers errors with a short message.
    """

    def __init__(
        self,
        store: EventStore,
        orchestrator: Orchestrator,
        bus: Bus,
        planner: Planner | None = None,
        served: Sequence[str] = (),
        wait_timeout_s: float = 600.0,
    ) -> None:
        self.store = store
        self.orchestrator = orchestrator
        self.bus = bus
        self.planner = planner
        self.tasks = LogTaskStore(store)
        self.served = set(served)  # agent import paths / ids a plan may name
        self.wait_timeout_s = wait_timeout_s
        self.extended_card: PbAgentCard | None = None  # set by build_app when tokens lock it

    async def start(self) -> None:
        """Register ``a2a-user`` and take its cards (their state is read from the log)."""
        await self.orchestrator.register(user_agent_card())
        await self.bus.consume(USER_AGENT_ID, self._on_question)

    async def _on_question(self, card: TaskCard) -> None:
        log.info("A2A task %s asks the user: %s", card.root_id, card.goal)

    def served_capabilities(self) -> list[tuple[str, CapabilitySpec]]:
        """(agent id, capability) of the agents served, but the planners and ``a2a-user``."""
        out = []
        for card in sorted(self.orchestrator.state.agents.values(), key=lambda c: c.agent_id):
            if card.agent_id == USER_AGENT_ID:
                continue
            out += [(card.agent_id, c) for c in card.capabilities if c.name != PLAN_CAPABILITY]
        return out

    # -- starting runs and answering them -------------------------------------------

    async def _plan(self, message: Message) -> Plan:
        """The plan a message asks for: a plan (data part), a goal (text), or one capability
        of a served agent (``metadata.cardbus.capability``, as a cardbus caller sends)."""
        text, data = _split(message)
        doc = next((d for d in data if isinstance(d, dict)), None)
        meta = MessageToDict(message.metadata).get("cardbus") if message.metadata else None
        wanted = meta.get("capability") if isinstance(meta, dict) else None
        direct = {c.name for _, c in self.served_capabilities()}
        if isinstance(wanted, str) and wanted in direct:
            inputs = doc if doc is not None else {"text": text}
            return as_plan(
                {
                    "goal": f"{wanted} for an A2A caller",
                    "tasks": [{"id": wanted, "capability": wanted, "inputs": inputs}],
                }
            )
        if doc is not None and doc.get("tasks"):
            return as_plan(doc)
        goal = text or str((doc or {}).get("goal") or (doc or {}).get("text") or "")
        if not goal:
            raise _refuse("send a plan (a data part) or a goal (a text part)")
        if self.planner is None:
            raise UnsupportedOperationError(
                message="goal decomposition is not available on this server: send a plan"
                " (a data part in the cardbus plan format) instead of a goal"
            )
        return await self.planner.plan(goal, list(self.orchestrator.state.agents.values()))

    async def _start(self, message: Message, actor: str) -> str:
        """Submit the run a message asks for, by ``actor``; its root id (the run it started
        before, when the same message id comes again in the same context)."""
        plan_id = _plan_id(message)
        known = self.orchestrator.state.plans.get(plan_id)
        if known is not None:
            return known
        plan = await self._plan(message)
        unknown = [a for a in plan.agents if a not in self.served]
        if unknown:
            raise _refuse(
                f"agents not served here: {', '.join(unknown)} (start `cardbus a2a serve`"
                " with --agent for each)"
            )
        first = MessageToDict(message)
        first.pop("taskId", None)
        context_id = message.context_id or new_id()
        session = {**plan.session, "a2a": {"context_id": context_id, "message": first}}
        plan = msgspec.structs.replace(plan, session=session, plan_id=plan.plan_id or plan_id)
        meta = MessageToDict(message.metadata).get("cardbus") if message.metadata else None
        try:  # a cardbus caller's task: this run is its (remote) child
            lineage = remote_lineage(meta)
        except InvalidPlan as e:
            raise _refuse(str(e)) from e
        try:
            return await self.orchestrator.submit(plan, actor=actor, lineage=lineage)
        except PlanConflict as e:
            if e.plan_id == plan_id:  # the same message again, its run started meanwhile
                return e.root_id
            raise

    async def _answer(self, fold: TaskFold, message: Message, actor: str) -> Question:
        """Answer what the task waits for with ``message``, as ``actor``; the question
        answered."""
        if fold.terminal:
            raise UnsupportedOperationError(
                message=f"task {fold.root_id} is {TaskState.Name(fold.status_state())}:"
                " a finished task takes no more messages"
            )
        questions = fold.questions()
        if not questions:
            raise _refuse(
                f"task {fold.root_id} is {TaskState.Name(fold.status_state())}: "
                "it waits for no input"
            )
        text, data = _split(message)
        fields = next((d for d in data if isinstance(d, dict)), {})
        wanted = fields.get("task_id")
        q = next((q for q in questions if q.task_id == wanted), questions[0])
        if q.kind == "approval":
            verdict = fields.get("approve", fields.get("approved"))
            if verdict is None:
                word = text.split()[0].lower().strip(".,!") if text else ""
                verdict = True if word in _YES else False if word in _NO else None
            if not isinstance(verdict, bool):
                raise _refuse(f"{q.text}: answer yes/approve or no/deny, or {{'approve': bool}}")
            note = approval_note(text or str(fields), message.message_id)
            await answer_approval(self.store, q.task_id, verdict, actor, note)
        elif q.kind == "question":
            try:
                await answer_question(
                    self.store,
                    q.task_id,
                    _answer_of(q, text, data),
                    by=actor,
                    door="a2a",
                    message_id=message.message_id,
                )
            except QuestionRefused as e:  # the question stays open: the client may try again
                raise _refuse(f"{q.text}: {e}") from e
        else:
            output: Any = fields if fields else {"text": text}
            await self.bus.reply(
                ResultCard(
                    task_id=q.task_id,
                    attempt=q.attempt,
                    agent_id=USER_AGENT_ID,
                    status="completed",
                    output=output,
                    # the history shows it under the message's id; who answered
                    notes=answer_notes(message.message_id, actor),
                )
            )
        return q

    # -- following a run --------------------------------------------------------------

    async def _follow(
        self,
        root_id: str,
        answered: Question | None = None,
        snapshot: bool = True,
        live_text: bool = True,
    ) -> AsyncIterator[Any]:
        """The task, then its events as the log gets them, until it is final or
        interrupted (a question other than the one just ``answered``); ``live_text``: and
        its model answers as they are written (a client that waits for the end gets
        none: then nobody watches, and nothing is published)."""
        fold = TaskFold(root_id)
        for env in await self.store.read_correlation(root_id):
            fold.apply(env)
        if not fold.found:
            raise TaskNotFoundError(message=f"no task {root_id}")

        def waiting_still(f: TaskFold) -> bool:
            qs = f.questions()
            return bool(qs) and not (answered is not None and qs == [answered])

        if snapshot:
            yield fold.task()
        if fold.terminal or waiting_still(fold):
            return
        # model answers as they are written: appending artifact updates (a2a.streamed)
        chunks: asyncio.Queue[Chunk] = asyncio.Queue()
        stop = (
            await self.bus.watch_chunks(chunks.put_nowait, root_id)
            if live_text and self.bus.carries_chunks
            else None
        )
        shown = ChunkArtifacts(fold)
        try:
            async for item in merged(self.store.subscribe(fold.position + 1), chunks):
                if isinstance(item, Chunk):
                    update = shown.update(item)
                    if update is not None:
                        yield update
                    continue
                if item.correlation_id != root_id:
                    continue
                for out in fold.apply(item):
                    yield out
                if fold.terminal or waiting_still(fold):
                    return
        finally:
            if stop is not None:
                await stop()

    async def _stream(
        self, params: SendMessageRequest, actor: str, live_text: bool = True
    ) -> AsyncIterator[Any]:
        _check_message(params)
        message = params.message
        if message.task_id:
            fold = await self.tasks.fold(message.task_id)
            if fold is None:
                raise TaskNotFoundError(message=f"no task {message.task_id}")
            if message.context_id and message.context_id != fold.context_id:
                raise _refuse(
                    f"contextId {message.context_id} is not the context of task {fold.root_id}"
                )
            if any(m.message_id == message.message_id for m in fold.history):
                yield fold.task()  # a resent answer: the task as it is, not a second answer
                return
            answered = await self._answer(fold, message, actor)
            async for item in self._follow(message.task_id, answered, live_text=live_text):
                yield item
            return
        async for item in self._follow(await self._start(message, actor), live_text=live_text):
            yield item

    # -- the A2A methods ----------------------------------------------------------------

    @_a2a_errors
    async def on_message_send(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> Task | Message:
        last: Task | None = None
        stream = self._stream(params, actor_of(context), live_text=False)
        try:
            async with asyncio.timeout(self.wait_timeout_s):
                async for item in stream:
                    if isinstance(item, Task):
                        last = item
                        if params.configuration.return_immediately:
                            break
        except TimeoutError:
            pass
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        if last is None:
            raise InternalError(message="internal error (no task)")
        if params.configuration.return_immediately:
            return _trim(last, params.configuration)
        got = await self.tasks.get(last.id)
        return _trim(got or last, params.configuration)

    @_a2a_errors
    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Any]:
        async for item in self._stream(params, actor_of(context)):
            yield item

    @_a2a_errors
    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Any]:
        validate_proto_required_fields(params)
        fold = await self.tasks.fold(params.id)
        if fold is None:
            raise TaskNotFoundError(message=f"no task {params.id}")
        if fold.terminal:  # spec 3.1.6: nothing more will come
            raise UnsupportedOperationError(
                message=f"task {params.id} is {TaskState.Name(fold.status_state())}:"
                " GetTask reads a finished task"
            )
        async for item in self._follow(params.id):
            yield item

    @_a2a_errors
    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        validate_proto_required_fields(params)
        validate_history_length(params)
        fold = await self.tasks.fold(params.id)
        if fold is None:
            raise TaskNotFoundError(message=f"no task {params.id}")
        hl = params.history_length if params.HasField("history_length") else None
        return fold.task(hl)

    @_a2a_errors
    async def on_list_tasks(
        self, params: ListTasksRequest, context: ServerCallContext
    ) -> ListTasksResponse:
        return await self.tasks.list(params, context)

    @_a2a_errors
    async def on_cancel_task(
        self, params: CancelTaskRequest, context: ServerCallContext
    ) -> Task | None:
        validate_proto_required_fields(params)
        fold = await self.tasks.fold(params.id)
        if fold is None:
            raise TaskNotFoundError(message=f"no task {params.id}")
        if fold.terminal:
            raise TaskNotCancelableError(
                message=f"task {params.id} is {TaskState.Name(fold.status_state())}"
            )
        await cancel_run(self.store, params.id, by=actor_of(context), reason=CANCEL_REASON)
        last: Task | None = None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                async for item in self._follow(params.id):
                    if isinstance(item, Task):
                        last = item
        return await self.tasks.get(params.id) or last

    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> ListTaskPushNotificationConfigsResponse:
        raise PushNotificationNotSupportedError

    async def on_delete_task_push_notification_config(
        self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        raise PushNotificationNotSupportedError

    async def on_get_extended_agent_card(
        self, params: GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> PbAgentCard:
        """The card, for a caller who passed the token (the guard checked it)."""
        if self.extended_card is None:
            raise ExtendedAgentCardNotConfiguredError
        return self.extended_card


def _trim(task: Task, config: Any) -> Task:
    if config.HasField("history_length"):
        n = config.history_length
        keep = list(task.history)[-n:] if n > 0 else []
        del task.history[:]
        task.history.extend(keep)
    return task


#: the header an API key may come in (the card's ``apiKey`` scheme; ``Authorization:
#: Bearer`` is the ``bearer`` scheme)
API_KEY_HEADER = "X-API-Key"
CARD_PATH = "/.well-known/agent-card.json"


def _example(cap: CapabilitySpec) -> str:
    """A message that runs ``cap``: its own example, else a plan of it with its inputs' names."""
    if cap.examples:
        return cap.examples[0]
    props = (cap.input_schema or {}).get("properties") or {}
    inputs = {k: "..." for k in props} or {"text": "..."}
    doc = {
        "goal": cap.description or cap.name,
        "tasks": [{"id": cap.name, "capability": cap.name, "inputs": inputs}],
    }
    return json.dumps(doc)


def card_doc(gateway: A2AGateway, url: str, locked: bool = False) -> dict[str, Any]:
    """The gateway's v1.0 card: ``run_plan``, ``run_goal`` (with a planner) and each
    capability of the agents served (a message naming it in ``metadata.cardbus.capability``
    runs it alone), each with an example; with ``locked``, its security schemes."""
    card = gateway_card(gateway.planner is not None)
    plan_example = json.dumps(
        {
            "goal": "say hello",
            "tasks": [{"id": "t", "capability": "<a capability below>", "inputs": {}}],
        }
    )
    caps = []
    for c in card.capabilities:
        example = plan_example if c.name == "run_plan" else "Write a short report on tides"
        caps.append(msgspec.structs.replace(c, examples=[example]))
    for agent_id, c in gateway.served_capabilities():
        described = f"{c.description or c.name} (agent {agent_id})"
        caps.append(msgspec.structs.replace(c, description=described, examples=[_example(c)]))
    card = msgspec.structs.replace(card, capabilities=caps)
    doc = to_a2a_v1(card, url, streaming=True)
    for skill in doc["skills"]:
        if skill["id"] == "run_goal":
            skill["inputModes"] = ["text/plain"]
    if locked:
        doc["securitySchemes"] = {
            "bearer": {
                "httpAuthSecurityScheme": {
                    "scheme": "Bearer",
                    "description": "the token `cardbus a2a serve` was given (--token, "
                    "CARDBUS_A2A_TOKEN or --token-file)",
                }
            },
            "apiKey": {
                "apiKeySecurityScheme": {
                    "location": "header",
                    "name": API_KEY_HEADER,
                    "description": "the same token, as an API key",
                }
            },
        }
        doc["securityRequirements"] = [{"schemes": {"bearer": {}}}, {"schemes": {"apiKey": {}}}]
        doc["capabilities"]["extendedAgentCard"] = True
    return doc


#: JSON-RPC's parse error: the body is not (UTF-8) JSON
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INTERNAL_ERROR = -32603
#: what an internal error says when its message is not one of ours (Python's own text,
#: "maximum recursion depth exceeded...", a codec's complaint: the log has the details)
INTERNAL_MESSAGE = "internal error"
_OURS = re.compile(r"internal error( \([\w .-]{1,80}\))?")


def _jsonrpc_refusal(refusal: Refusal) -> bytes:
    code = PARSE_ERROR if refusal.kind == "parse" else INVALID_REQUEST
    return json.dumps(
        {
            "jsonrpc": "2.0",
            "id": None,
            "error": {
                "code": code,
                "message": refusal.message,
                "data": {"refused": refusal.kind},
            },
        }
    ).encode()


class ShortInternalErrors:
    """ASGI layer: a JSON-RPC internal error (-32603) in a JSON answer says
    :data:`INTERNAL_MESSAGE`, or the gateway's own ``internal error (<type>)``, never the
    text of the exception a2a-sdk's dispatcher caught (``str(e)`` of whatever broke);
    that text goes to the log. Other answers (the SSE streams, whose errors are the
    gateway's translated ones) pass as they are."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start: dict[str, Any] | None = None
        chunks: list[bytes] = []

        async def filtered(message: Any) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                kind = dict(message.get("headers", [])).get(b"content-type", b"")
                if kind.startswith(b"application/json"):
                    start = dict(message)  # held until the body is whole
                    return
            elif message["type"] == "http.response.body" and start is not None:
                chunks.append(message.get("body", b""))
                if message.get("more_body", False):
                    return
                body = _shortened(b"".join(chunks))
                headers = [(k, v) for k, v in start.get("headers", []) if k != b"content-length"]
                headers.append((b"content-length", str(len(body)).encode()))
                await send({**start, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
            await send(message)

        await self.app(scope, receive, filtered)


def _shortened(body: bytes) -> bytes:
    """``body`` with an internal error's message replaced when it is not ours."""
    try:
        doc = json.loads(body)
    except ValueError:
        return body
    error = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(error, dict) or error.get("code") != INTERNAL_ERROR:
        return body
    message = str(error.get("message") or "")
    if _OURS.fullmatch(message):
        return body  # ours: "internal error", or with a few words of ours in brackets
    log.warning("A2A internal error (message replaced): %s", message[:500])
    doc["error"] = {"code": INTERNAL_ERROR, "message": INTERNAL_MESSAGE}
    return json.dumps(doc).encode()


def build_app(
    gateway: A2AGateway,
    url: str,
    *,
    tokens: Tokens | Sequence[str] = (),
    hosts: Sequence[str] = LOOPBACK_NAMES,
    max_body: int = DEFAULT_MAX_BODY,
    body_timeout_s: float | None = DEFAULT_BODY_TIMEOUT_S,
) -> Any:
    """The ASGI app: the card at ``/.well-known/agent-card.json`` (v1.0; the v0.3 form for
    a request with ``A2A-Version: 0.3``), JSON-RPC at ``/`` (A2A 1.0, and 0.3), behind
    :class:`~cardbus.bus.http_guard.HttpGuard`: ``hosts`` the ``Host`` may name,
    ``tokens`` (token -> name, or a list named ``token``) one of which every request but
    the card's must carry, its name the actor of what the request does; ``max_body``
    bytes at most, whole within ``body_timeout_s`` (408); a refusal is a JSON-RPC error
    with the HTTP status: -32700 for a body that is not UTF-8 JSON, -32600 for the rest
    (one nested too deep among them). An internal error answers in words of its own
    (:class:`ShortInternalErrors`)."""
    from a2a.server.request_handlers.response_helpers import agent_card_to_dict
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    card = ParseDict(card_doc(gateway, url, locked=bool(tokens)), PbAgentCard())  # strict
    gateway.extended_card = card if tokens else None
    v1 = MessageToDict(card)
    v03 = agent_card_to_dict(card)  # a2a-sdk's merge of the v0.3 keys

    async def card_route(request: Request) -> JSONResponse:
        version = request.headers.get("a2a-version", "")
        return JSONResponse(v03 if version.startswith("0.") else v1)

    routes = [
        Route(CARD_PATH, card_route, methods=["GET"]),
        *create_jsonrpc_routes(gateway, rpc_url="/", enable_v0_3_compat=True),
    ]
    return HttpGuard(
        ShortInternalErrors(Starlette(routes=routes)),
        hosts=hosts,
        tokens=tokens,
        token_headers=[API_KEY_HEADER],
        open_paths=[CARD_PATH],
        max_body=max_body,
        body_timeout_s=body_timeout_s,
        render=_jsonrpc_refusal,
    )
