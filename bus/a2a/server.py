"""The orchestrator served as an A2A agent, on a2a-sdk's server (JSON-RPC, SSE).

``A2AGateway`` turns A2A requests into the orchestrator's own moves, and
reads every answer back from the log (``TaskFold``):

* ``SendMessage`` / ``SendStreamingMessage`` without a task id starts a run:
  a data part holding a plan (the plan format's JSON) is submitted as it is; a
  text goal with no plan is handed to the gateway's ``planner``:
  :class:`GoalPlanning` (what ``serve`` uses) makes it a plan of the goal
  alone, which the orchestrator splits with its planner agents (capability
  ``plan``) like any goal plan; with no planner the answer is a failed task
  saying goal decomposition is not available. The A2A task id is the run's
  root id; the context id and the message are kept in ``run.started``'s
  session, the plan id is
  ``a2a-<message id>`` (so a resent message runs once);
* a message on a task that is input-required answers what it waits for: an
  approval (``{"approve": true|false}`` or a text beginning with yes/approve
  or no/deny, through ``answer_approval``) or a question an agent asked with
  ``NeedsInput(missing, capability="user_input")`` (the supplementary task is
  dispatched to the gateway's ``a2a-user`` agent; the message is its result);
* ``CancelTask`` cancels the run (``cancel_run``); ``GetTask``, ``ListTasks``
  and ``SubscribeToTask`` fold the log, so they work after a restart, and a
  subscriber first gets the whole task (history and artifacts: what it
  missed), then the run's events as they are written (``store.subscribe``).

:class:`LogTaskStore` is the same reading as an a2a-sdk ``TaskStore``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any, Protocol

import msgspec
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
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
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskNotCancelableError,
    TaskNotFoundError,
    TaskPushNotificationConfig,
    TaskState,
    TaskStatus,
    UnsupportedOperationError,
)
from a2a.utils.errors import ExtendedAgentCardNotConfiguredError, PushNotificationNotSupportedError
from google.protobuf.json_format import MessageToDict, ParseDict

from cardbus.agents.a2a_card import ints_back, to_a2a_v1
from cardbus.agents.cards import AgentCard, CapabilitySpec, ResultCard, TaskCard
from cardbus.agents.planning import PLAN_CAPABILITY
from cardbus.bus.a2a.fold import (
    CANCEL_REASON,
    USER_AGENT_ID,
    USER_CAPABILITY,
    Question,
    TaskFold,
)
from cardbus.bus.orchestrator.cancel import cancel_run
from cardbus.bus.orchestrator.core import Orchestrator, answer_approval
from cardbus.bus.orchestrator.plan import Plan, as_plan
from cardbus.bus.transport.interface import Bus
from cardbus.eventstore import EventStore, new_id
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import CardbusError, InvalidPlan

__all__ = [
    "A2AGateway",
    "GoalPlanning",
    "LogTaskStore",
    "Planner",
    "build_app",
    "gateway_card",
    "user_agent_card",
]

log = logging.getLogger(__name__)
_YES = ("yes", "y", "ok", "approve", "approved", "grant", "granted", "accept")
_NO = ("no", "n", "deny", "denied", "reject", "rejected", "refuse")


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


def _failed_task(text: str, context_id: str = "", message: Message | None = None) -> Task:
    """A task that never became a run (nothing to record): failed, with the reason."""
    task_id = new_id()
    status = TaskStatus(state=TaskState.TASK_STATE_FAILED)
    status.message.CopyFrom(
        Message(
            message_id=f"status-{task_id}",
            task_id=task_id,
            context_id=context_id or task_id,
            role=Role.ROLE_AGENT,
            parts=[Part(text=text)],
        )
    )
    history = [message] if message is not None else []
    return Task(id=task_id, context_id=context_id or task_id, status=status, history=history)


def _split(message: Message) -> tuple[str, list[Any]]:
    """A message's text (joined) and its data parts (numbers made ints where whole)."""
    texts = [p.text for p in message.parts if p.HasField("text")]
    data = [ints_back(MessageToDict(p.data)) for p in message.parts if p.HasField("data")]
    return "\n".join(texts).strip(), data


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

    async def list(
        self, params: ListTasksRequest, context: ServerCallContext | None = None
    ) -> ListTasksResponse:
        roots: list[str] = []
        position = 1
        while True:
            page = await self.store.read_all(position, 1000)
            for env in page:
                data = env.data
                if isinstance(data, ev.RunStarted) and "a2a" in data.session:
                    a2a = data.session["a2a"]
                    if not params.context_id or a2a.get("context_id") == params.context_id:
                        roots.append(env.stream)
            if len(page) < 1000:
                break
            position = page[-1].position + 1
        size = params.page_size or 50
        start = int(params.page_token) if params.page_token.isdigit() else 0
        tasks = []
        for root in reversed(roots[: len(roots) - start]):
            fold = await self.fold(root)
            if fold is None:
                continue
            if params.status and fold.status_state() != params.status:
                continue
            hl = params.history_length if params.HasField("history_length") else None
            tasks.append(fold.task(hl))
            if len(tasks) >= size:
                break
        nxt = start + size
        return ListTasksResponse(
            tasks=tasks,
            next_page_token=str(nxt) if nxt < len(roots) else "",
            page_size=size,
            total_size=len(roots),
        )

    async def save(self, task: Task, context: ServerCallContext | None = None) -> None:
        raise UnsupportedOperationError(message="A2A tasks are derived from the cardbus log")

    async def delete(self, task_id: str, context: ServerCallContext | None = None) -> None:
        raise UnsupportedOperationError(message="the cardbus log is append-only")


class A2AGateway(RequestHandler):
    """a2a-sdk's ``RequestHandler`` over an orchestrator, its store and its bus."""

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

    async def start(self) -> None:
        """Register ``a2a-user`` and take its cards (their state is read from the log)."""
        await self.orchestrator.register(user_agent_card())
        await self.bus.consume(USER_AGENT_ID, self._on_question)

    async def _on_question(self, card: TaskCard) -> None:
        log.info("A2A task %s asks the user: %s", card.root_id, card.goal)

    # -- starting runs and answering them -------------------------------------------

    async def _start(self, message: Message) -> Task | str:
        """Submit the run a message asks for; its root id, or a failed task."""
        text, data = _split(message)
        context_id = message.context_id or new_id()
        plan_doc = next((d for d in data if isinstance(d, dict)), None)
        try:
            if plan_doc is not None and plan_doc.get("tasks"):
                plan = as_plan(plan_doc)
            else:
                goal = text or str((plan_doc or {}).get("goal") or "")
                if not goal:
                    return _failed_task("send a plan (a data part) or a goal (text)", context_id)
                if self.planner is None:
                    return _failed_task(
                        "goal decomposition is not available on this server: send a plan "
                        "(a data part in the cardbus plan format) instead of a goal",
                        context_id,
                        message,
                    )
                plan = await self.planner.plan(goal, list(self.orchestrator.state.agents.values()))
            unknown = [a for a in plan.agents if a not in self.served]
            if unknown:
                return _failed_task(
                    f"agents not served here: {', '.join(unknown)} (start `cardbus a2a serve`"
                    " with --agent for each)",
                    context_id,
                    message,
                )
            first = MessageToDict(message)
            first.pop("taskId", None)
            session = {**plan.session, "a2a": {"context_id": context_id, "message": first}}
            digest = hashlib.sha256(message.message_id.encode()).hexdigest()[:24]
            plan = msgspec.structs.replace(
                plan, session=session, plan_id=plan.plan_id or f"a2a-{digest}"
            )
            return await self.orchestrator.submit(plan)
        except CardbusError as e:
            return _failed_task(f"{type(e).__name__}: {e}", context_id, message)

    async def _answer(self, fold: TaskFold, message: Message) -> Question:
        """Answer what the task waits for with ``message``; the question answered."""
        questions = fold.questions()
        if not questions:
            raise InvalidParamsError(
                message=f"task {fold.root_id} is {TaskState.Name(fold.status_state())}: "
                "it waits for no input"
            )
        text, data = _split(message)
        fields = next((d for d in data if isinstance(d, dict)), {})
        wanted = fields.get("task_id")
        q = next((q for q in questions if q.task_id == wanted), questions[0])
        by = f"a2a:{message.message_id}"
        if q.kind == "approval":
            verdict = fields.get("approve", fields.get("approved"))
            if verdict is None:
                word = text.split()[0].lower().strip(".,!") if text else ""
                verdict = True if word in _YES else False if word in _NO else None
            if not isinstance(verdict, bool):
                raise InvalidParamsError(
                    message=f"{q.text}: answer yes/approve or no/deny, or {{'approve': bool}}"
                )
            await answer_approval(self.store, q.task_id, verdict, by, text or str(fields))
        else:
            output: Any = fields if fields else {"text": text}
            await self.bus.reply(
                ResultCard(
                    task_id=q.task_id,
                    attempt=q.attempt,
                    agent_id=USER_AGENT_ID,
                    status="completed",
                    output=output,
                    notes=by,
                )
            )
        return q

    # -- following a run --------------------------------------------------------------

    async def _follow(
        self, root_id: str, answered: Question | None = None, snapshot: bool = True
    ) -> AsyncIterator[Any]:
        """The task, then its events as the log gets them, until it is final or
        interrupted (a question other than the one just ``answered``)."""
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
        async for env in self.store.subscribe(fold.position + 1):
            if env.correlation_id != root_id:
                continue
            for item in fold.apply(env):
                yield item
            if fold.terminal or waiting_still(fold):
                return

    async def _stream(self, params: SendMessageRequest) -> AsyncIterator[Any]:
        message = params.message
        if message.task_id:
            fold = await self.tasks.fold(message.task_id)
            if fold is None:
                raise TaskNotFoundError(message=f"no task {message.task_id}")
            answered = await self._answer(fold, message)
            async for item in self._follow(message.task_id, answered):
                yield item
            return
        started = await self._start(message)
        if isinstance(started, Task):
            yield started
            return
        async for item in self._follow(started):
            yield item

    # -- the A2A methods ----------------------------------------------------------------

    async def on_message_send(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> Task | Message:
        last: Task | None = None
        stream = self._stream(params)
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
            raise InvalidParamsError(message="no task")
        if (
            params.configuration.return_immediately
            and last.status.state != TaskState.TASK_STATE_FAILED
        ):
            return last
        got = await self.tasks.get(last.id)
        return _trim(got or last, params.configuration)

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Any]:
        async for item in self._stream(params):
            yield item

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Any]:
        async for item in self._follow(params.id):
            yield item

    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        fold = await self.tasks.fold(params.id)
        if fold is None:
            raise TaskNotFoundError(message=f"no task {params.id}")
        hl = params.history_length if params.HasField("history_length") else None
        return fold.task(hl)

    async def on_list_tasks(
        self, params: ListTasksRequest, context: ServerCallContext
    ) -> ListTasksResponse:
        return await self.tasks.list(params, context)

    async def on_cancel_task(
        self, params: CancelTaskRequest, context: ServerCallContext
    ) -> Task | None:
        fold = await self.tasks.fold(params.id)
        if fold is None:
            raise TaskNotFoundError(message=f"no task {params.id}")
        if fold.terminal:
            raise TaskNotCancelableError(
                message=f"task {params.id} is {TaskState.Name(fold.status_state())}"
            )
        await cancel_run(self.store, params.id, by="a2a", reason=CANCEL_REASON)
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
        raise ExtendedAgentCardNotConfiguredError


def _trim(task: Task, config: Any) -> Task:
    if config.HasField("history_length"):
        n = config.history_length
        keep = list(task.history)[-n:] if n > 0 else []
        del task.history[:]
        task.history.extend(keep)
    return task


def build_app(gateway: A2AGateway, url: str) -> Any:
    """The Starlette app: the card at ``/.well-known/agent-card.json``, JSON-RPC at ``/``
    (A2A 1.0, and 0.3 for older clients)."""
    from starlette.applications import Starlette

    doc = to_a2a_v1(gateway_card(gateway.planner is not None), url, streaming=True)
    card = ParseDict(doc, PbAgentCard())
    routes = [
        *create_agent_card_routes(card),
        *create_jsonrpc_routes(gateway, rpc_url="/", enable_v0_3_compat=True),
    ]
    return Starlette(routes=routes)
