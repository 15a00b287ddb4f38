"""The console's actions that make runs: start one (a goal or a plan), fork, re-run.

Running work needs agents, and the console gets them the way ``cardbus run``
does: ``cardbus ui --agent module:Class`` (repeat; the same loader) hosts an
:class:`~cardbus.bus.runtime.embedded.EmbeddedRuntime` in the console's own
process, on its SQLite log, with those agents (and the rule planner, for a goal).
Without agents, :class:`NoAgents` refuses each action (HTTP 409) saying how to
give them, and the page shows the buttons disabled with that line. On NATS
(:class:`LogActions`) the agents and orchestrators run in processes of their
own (``cardbus agent serve``, ``cardbus orchestrator``): an action writes the
new run to the log (``bus.orchestrator.submission.submit_to_log``, ``forks``)
and the running orchestrators, which follow the log, decide it.

Every action is a library call the command line makes too: a run is
``EmbeddedRuntime.submit`` (the plan decoded and checked as ``cardbus run``
does: ``split_plan_servers``, ``decode_plan``, ``validate_plan``); a fork
and a re-run are ``bus.orchestrator.forks`` (``cardbus fork``, ``cardbus
rerun``): the new run's events are written to the log and the orchestrator,
following the log, runs them. Each writes its events with ``by`` as their
actor (the app passes who the request authenticated as), and the body's
``note`` (what the person said, a name they gave) in ``run.started``'s note.
Bad input is a ``CardbusError`` with the reason (the app answers 4xx with it)
and nothing is written.

Why a re-run is a new run (``cardbus rerun --task``), not a retry inside the
failed run: a failed task and its run are finished, and the log keeps them as
they ended (the incident stays replayable as it happened); the re-run names
its source (``rerun_of``), reuses what completed, and ``cardbus diff`` (the
console's Diff) compares the two.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import msgspec

from cardbus.agents.agent import Agent
from cardbus.agents.cards import AgentCard
from cardbus.agents.mcp_config import MCPServer, split_plan_servers
from cardbus.bus.orchestrator.forks import (
    Streams,
    check_agents,
    on_agents,
    read_fork,
    read_rerun,
    write_run,
)
from cardbus.bus.orchestrator.plan import (
    Plan,
    as_plan,
    decode_plan,
    validate_goal_plan,
    validate_plan,
)
from cardbus.bus.orchestrator.submission import submit_to_log
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import (
    CardbusError,
    InvalidPlan,
    StreamNotFound,
    ValidationError,
)
from cardbus.eventstore.store import EventStore
from cardbus.projections import resolve_id
from cardbus.projections.fork import override_task

__all__ = ["Actions", "HostedAgents", "LogActions", "NoAgents", "NoAgentsHere"]

log = logging.getLogger(__name__)

#: what the page shows (and a refused action says) when the console runs no agents
HOW = (
    "Start, fork and re-run need agents: restart the console with"
    " `cardbus ui --agent module:Class` (repeat for each agent; the planner is added)"
)


class NoAgentsHere(CardbusError):
    """An action that needs agents, asked of a console that runs none."""


class Actions:
    """What the console's run-making actions need: agents to run the work."""

    enabled = False
    how = HOW

    async def __aenter__(self) -> Actions:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def describe(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "how": "" if self.enabled else self.how, "agents": []}

    async def start(self, body: dict[str, Any], by: str) -> dict[str, Any]:
        raise NoAgentsHere(self.how)

    async def fork(self, task: str, body: dict[str, Any], by: str) -> dict[str, Any]:
        raise NoAgentsHere(self.how)

    async def rerun(self, task: str, body: dict[str, Any], by: str) -> dict[str, Any]:
        raise NoAgentsHere(self.how)


class NoAgents(Actions):
    """A console started without ``--agent``: every action is refused with :data:`HOW`."""

    def __init__(self, how: str = HOW) -> None:
        self.how = how


def _text(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValidationError(f"{key} must be text, not {type(value).__name__}")
    return value.strip()


def _noted(plan: Plan, body: dict[str, Any]) -> Plan:
    """``plan`` with the body's note (kept in ``run.started``), if it gives one."""
    note = _text(body, "note")
    return msgspec.structs.replace(plan, note=note) if note else plan


def _noted_streams(streams: Streams, body: dict[str, Any]) -> Streams:
    """A new run's streams with the body's note in their ``run.started``."""
    note = _text(body, "note")
    if not note:
        return streams
    return [
        (
            stream,
            [
                msgspec.structs.replace(d, note=note) if isinstance(d, ev.RunStarted) else d
                for d in datas
            ],
        )
        for stream, datas in streams
    ]


def plan_from(body: dict[str, Any], agent_paths: Sequence[str]) -> Plan:
    """The plan a start asks for: ``{"goal": text}`` (planned by the run's planner, as
    ``cardbus run --goal``) or ``{"plan": JSON text or object}`` (as ``cardbus run
    plan.json``); ``InvalidPlan`` with the reason for anything else."""
    goal, plan = body.get("goal"), body.get("plan")
    if (goal is None or goal == "") == (plan is None or plan == ""):
        raise InvalidPlan('give a goal ({"goal": "..."}) or a plan ({"plan": ...}), one of them')
    if goal not in (None, ""):
        text = _text(body, "goal")
        if not text:
            raise InvalidPlan("the goal is empty")
        return as_plan({"goal": text, "agents": list(agent_paths)})
    data = plan.encode() if isinstance(plan, str) else msgspec.json.encode(plan)
    data, servers = split_plan_servers(data)
    if servers:
        raise InvalidPlan(
            "the console does not start a plan's mcp_servers: run this plan with `cardbus run`"
        )
    return decode_plan(data)


class _RunMaker(Actions):
    """Fork and re-run, the same wherever the work runs: read the new run from the log
    (``bus.orchestrator.forks``), check some agent can take each task to run, write it
    by the operator. Subclasses say which agents, and what happens once it is written."""

    enabled = True

    def __init__(self, store: EventStore) -> None:
        self.store = store

    async def cards(self) -> list[AgentCard]:
        raise NotImplementedError

    def agents_of_new_runs(self) -> tuple[list[str], list[str]] | None:
        """(import paths, agent ids) a new run is named to run on; None: the recorded."""
        return None

    def written(self, root: str) -> None:
        """Called once a new run is in the log."""

    async def describe(self) -> dict[str, Any]:
        return {"enabled": True, "how": "", "agents": [c.agent_id for c in await self.cards()]}

    async def fork(self, task: str, body: dict[str, Any], by: str) -> dict[str, Any]:
        at = _text(body, "at") or None
        model = _text(body, "model") or None
        inputs = body.get("inputs")
        if isinstance(inputs, str):
            try:
                inputs = msgspec.json.decode(inputs) if inputs.strip() else None
            except msgspec.DecodeError as e:
                raise ValidationError(f"the inputs override is not JSON: {e}") from e
        plan = await read_fork(self.store, task, at)
        if inputs is not None or model:
            plan = override_task(
                plan, await resolve_id(self.store, task), inputs=inputs, model=model
            )
        named = self.agents_of_new_runs()
        if named is not None:
            plan = on_agents(plan, *named)
        check_agents(plan.streams, await self.cards())
        streams = _noted_streams(plan.streams, body)
        await write_run(self.store, streams, plan.root_id, plan.at_event_id, by)
        self.written(plan.root_id)
        return {
            "root_id": plan.root_id,
            "forked_from": plan.forked_from,
            "at_position": plan.at_position,
            "reused": plan.reused,
            "rerun": plan.rerun,
            "by": by,
        }

    async def rerun(self, task: str, body: dict[str, Any], by: str) -> dict[str, Any]:
        model = _text(body, "model") or None
        task_id = await resolve_id(self.store, task)
        own = await self.store.read_stream(task_id)
        if not own:
            raise StreamNotFound(task)
        named = self.agents_of_new_runs()
        plan, _ = await read_rerun(
            self.store,
            own[0].correlation_id,
            [task_id],
            model=model,
            agents=None if named is None else named[1],
        )
        check_agents(plan.streams, await self.cards())
        streams = _noted_streams(plan.streams, body)
        await write_run(self.store, streams, plan.root_id, plan.source_root_id, by)
        self.written(plan.root_id)
        return {
            "root_id": plan.root_id,
            "rerun_of": plan.source_root_id,
            "reused": plan.reused,
            "rerun": plan.rerun,
            "by": by,
        }


class HostedAgents(_RunMaker):
    """An embedded runtime in the console's process, on its log, with the given agents."""

    def __init__(
        self,
        store: EventStore,
        agents: Sequence[type[Agent]],
        llm: Any = None,
        mcp_servers: Sequence[MCPServer] = (),
    ) -> None:
        super().__init__(store)
        self.runtime = EmbeddedRuntime(store, agents, llm=llm, mcp_servers=mcp_servers)
        self._settling: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> HostedAgents:
        await self.runtime.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for t in list(self._settling):
            t.cancel()
        for t in list(self._settling):
            with contextlib.suppress(BaseException):
                await t
        await self.runtime.__aexit__(*exc)

    async def cards(self) -> list[AgentCard]:
        return [w.agent.card() for w in self.runtime.workers]

    def agents_of_new_runs(self) -> tuple[list[str], list[str]]:
        # the runs it starts run here, on its agents alone (as `cardbus fork --agent`)
        return self.runtime.agent_paths(), [w.agent.agent_id for w in self.runtime.workers]

    def written(self, root: str) -> None:
        """When the run ends, the memory policy is applied to it (as ``cardbus run`` does)."""

        async def settle() -> None:
            try:
                await self.runtime.orchestrator.wait(root, None)
                await self.runtime.settle(root)
            except CardbusError as e:
                log.warning("run %s not settled: %s", root, e)

        task = asyncio.create_task(settle(), name=f"console-settle-{root}")
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def start(self, body: dict[str, Any], by: str) -> dict[str, Any]:
        plan = _noted(plan_from(body, self.runtime.agent_paths()), body)
        # checked against this console's agents (the orchestrator checks against every
        # agent the log knows, some of them gone): refused before anything is written
        cards = await self.cards()
        if plan.tasks:
            validate_plan(plan, cards, self.runtime.orchestrator.policy.retry)
        else:
            validate_goal_plan(plan, cards)
        root = await self.runtime.submit(plan, actor=by)
        self.written(root)
        return {"root_id": root, "by": by, "goal": plan.goal}


class LogActions(_RunMaker):
    """The orchestrators and agents run elsewhere (NATS): a new run is written to the log,
    where the running orchestrators fold it and decide it. Plans are checked against the
    agents the log has registered (and not deregistered)."""

    def __init__(self, store: EventStore) -> None:
        super().__init__(store)
        self._known: dict[str, AgentCard] = {}
        self._position = 0  # how far the registrations are folded
        self._lock = asyncio.Lock()

    async def cards(self) -> list[AgentCard]:
        async with self._lock:
            while True:
                page = await self.store.read_all(self._position + 1, 5000)
                for env in page:
                    data = env.data
                    if isinstance(data, ev.AgentRegistered):
                        try:
                            self._known[data.agent_id] = msgspec.convert(data.card, AgentCard)
                        except msgspec.ValidationError:
                            log.warning("agent %s: a card that is not one", data.agent_id)
                    elif isinstance(data, ev.AgentDeregistered):
                        self._known.pop(data.agent_id, None)
                if page:
                    self._position = page[-1].position
                if len(page) < 5000:
                    break
        return list(self._known.values())

    async def start(self, body: dict[str, Any], by: str) -> dict[str, Any]:
        plan = _noted(plan_from(body, []), body)
        root = await submit_to_log(self.store, plan, await self.cards(), by)
        return {"root_id": root, "by": by, "goal": plan.goal}
