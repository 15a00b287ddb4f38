"""The embedded runtime: store, in-process bus, agent workers and orchestrator in one process.

``EmbeddedRuntime`` also keeps long-term memory: after each run its
``MemoryKeeper`` applies the write policy (the session's ``preferences``
are stored once the run completes; failure reasons always), and the agents'
requests are served with a ``doc_search`` tool over a folder of documents
(by default a small demo folder about tides).

A plan may be a goal alone (``{"goal": ...}``): an agent offering the
capability ``plan`` proposes its tasks. When none of ``agents`` does, the
runtime adds the rule planner (``cardbus.agents.planning.RulePlanner``: no
model, deterministic), so a goal works out of the box; ``default_planner=False``
leaves it out.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from cardbus.agents.agent import Agent
from cardbus.agents.demo.docs import demo_docs, demo_docs_folder
from cardbus.agents.llm import LLM
from cardbus.agents.mcp_config import MCPServer
from cardbus.agents.planning import PLAN_CAPABILITY, RulePlanner
from cardbus.agents.tools import ToolRegistry, doc_search_tool
from cardbus.bus.orchestrator.access import AccessPolicy
from cardbus.bus.orchestrator.core import Orchestrator, RunResult
from cardbus.bus.orchestrator.memory import LongTermMemory, MemoryKeeper, MemoryPolicy
from cardbus.bus.orchestrator.plan import Plan, as_plan
from cardbus.bus.orchestrator.planning import proposal_plan
from cardbus.bus.orchestrator.policy import Policy
from cardbus.bus.orchestrator.reuse import ReusePolicy
from cardbus.bus.orchestrator.scheduler import Scheduler
from cardbus.bus.runtime.loop import tune_gc
from cardbus.bus.runtime.mcp import start_mcp
from cardbus.bus.runtime.plans import PlanLike, plan_of, require_started
from cardbus.bus.runtime.tools_served import check_served
from cardbus.bus.runtime.worker import AgentWorker
from cardbus.bus.transport.inprocess import InProcessBus
from cardbus.eventstore import Envelope, EventStore, MemoryEventStore
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import CardbusError, InvalidPlan
from cardbus.projections.replay import PlanRound, build_timeline

__all__ = ["EmbeddedRuntime", "PlannedGoal", "plan_goal", "with_planner"]

log = logging.getLogger(__name__)

#: the tool an embedded runtime serves when given none: local documents
DEFAULT_TOOL = "doc_search"


class EmbeddedRuntime:
    """Store + in-process bus + agent workers + orchestrator, started and stopped together.

    ``tools`` is the registry agents' tool requests are served from (default:
    ``doc_search`` over ``docs``, or over :data:`cardbus.agents.demo.DEMO_DOCS` in a temporary
    folder); ``memory_policy`` decides what long-term memory keeps after a run;
    ``default_planner`` adds a ``RulePlanner`` when no agent offers ``plan``;
    ``mcp_servers`` are started with the runtime and their tools mounted in ``tools``
    as ``<server>__<tool>`` (``cardbus.agents.mcp``, the ``mcp`` extra), and stopped with it.
    The ``Tool`` s an agent declares are run by its worker; a tool it declares by name or
    spec that ``tools`` lacks once the MCP servers are mounted refuses the start
    (``ToolNotServed``: ``bus.runtime.tools_served``), unless ``require_tools=False``
    (an offline re-run: every call is answered from the log).
    ``reuse``: completed tasks' results kept in long-term memory and (``reuse=True``)
    answering identical later tasks (``bus.orchestrator.reuse``); None: neither.
    ``schedules``: this runtime fires the log's schedules (``bus.orchestrator.scheduler``)
    while it runs; False for a process that runs its own plan and exits (``cardbus run``,
    ``fork``, ``rerun``, ``demo``): a firing there would start a run nobody stays to run.
    """

    def __init__(
        self,
        store: EventStore,
        agents: Sequence[type[Agent]],
        policy: Policy | None = None,
        llm: LLM | None = None,
        tools: ToolRegistry | None = None,
        memory_policy: MemoryPolicy | None = None,
        docs: str | Path | None = None,
        access: AccessPolicy | None = None,
        default_planner: bool = True,
        mcp_servers: Sequence[MCPServer] = (),
        reuse: ReusePolicy | None = None,
        require_tools: bool = True,
        schedules: bool = True,
    ) -> None:
        self.store = store
        self.bus = InProcessBus()
        self.memory = LongTermMemory(store)
        self.keeper = MemoryKeeper(store, memory_policy, self.memory, results=reuse)
        self._docs: tempfile.TemporaryDirectory[str] | None = None
        if tools is None:
            if docs is None:
                self._docs = demo_docs()
                docs = demo_docs_folder(self._docs)
            tools = ToolRegistry([doc_search_tool(docs, name=DEFAULT_TOOL)])
        self.tools = tools
        self.mcp_servers = list(mcp_servers)
        self._mcp: Any = None  # the MCPToolset while running
        self.require_tools = require_tools
        # its agents live in this process: the attempts a previous process left in flight
        # died with it, and time out at once on resume
        self.orchestrator = Orchestrator(
            store,
            self.bus,
            policy,
            tools=tools,
            memory=self.memory,
            access=access,
            attempts_survive_restart=False,
            reuse=reuse,
        )
        agents = with_planner(agents) if default_planner else list(agents)
        # no lease renewals (lease_s=0): the orchestrator pins its own runtime's agents,
        # live while it runs, and a renewal every few seconds was an idle runtime's work
        self.workers = [AgentWorker(self.bus, a, llm, tools=tools, lease_s=0) for a in agents]
        self.orchestrator.observers.append(self.keeper.observe)  # settle then needs no read
        # fires the log's schedules, once across every process on the log (its tick,
        # grace and clock may be set before the start); it sleeps until a due time or
        # until the orchestrator folds a schedule's event (the orchestrator follows the
        # whole log here)
        self.schedules = schedules
        self.scheduler = Scheduler(store, self.submit, self.orchestrator.orchestrator_id)
        self.scheduler.follows_log = True
        if schedules:
            self.orchestrator.observers.append(self.scheduler.observe)
        self._state = "new"  # running inside `async with`, then stopped

    async def __aenter__(self) -> EmbeddedRuntime:
        tune_gc()
        self._mcp = await start_mcp(self.mcp_servers, self.tools)
        try:
            # a tool an agent declares that nobody serves: refused now, not found mid-run
            if self.require_tools:
                check_served([w.agent for w in self.workers], self.tools)
            # its agents are registered before the open runs it finds are resumed
            await self.orchestrator.start(agents=[w.agent.card() for w in self.workers])
            for w in self.workers:
                await w.start()
            self._state = "running"  # its firings submit through self.submit
            if self.schedules:
                await self.scheduler.start()
        except BaseException:
            await self._stop_mcp()
            raise
        self._state = "running"
        return self

    @staticmethod
    def check_tools(
        agents: Sequence[type[Agent]],
        tools: ToolRegistry | None = None,
        mcp_servers: Sequence[MCPServer] = (),
    ) -> None:
        """``ToolNotServed`` now for a tool ``agents`` declare that a runtime made with these
        ``tools`` (None: the default, ``doc_search``) could not serve; one of the
        ``mcp_servers`` ' is checked when they are mounted (at the start)."""
        served = tools if tools is not None else {DEFAULT_TOOL}
        check_served(agents, served, mcp_servers)

    async def _stop_mcp(self) -> None:
        mcp, self._mcp = self._mcp, None
        if mcp is not None:
            await mcp.stop()

    async def __aexit__(self, *exc: object) -> None:
        self._state = "stopped"
        await self.scheduler.stop()
        # Its agents stop renewing, but are not deregistered: another process on the same
        # log may run agents of the same ids (its runs name their own agents, and a later
        # start finds these unconfirmed until they renew).
        for w in self.workers:
            await w.stop(announce=False)
        await self.orchestrator.stop()
        await self._stop_mcp()
        await self.bus.close()
        if self._docs is not None:
            self._docs.cleanup()

    async def submit(self, plan: PlanLike, actor: str | None = None) -> str:
        """Start a run of ``plan`` (any form :meth:`run` takes) on this runtime's agents; its
        root id. ``actor``: who asked (the actor of the run's creation events). Only
        inside ``async with``; the memory policy is applied by :meth:`settle`."""
        require_started(self, self._state)  # NotStarted outside `async with`
        # the run's agents are this runtime's: none registered by an earlier process is chosen
        agents = [w.agent.agent_id for w in self.workers]
        return await self.orchestrator.submit(plan_of(plan), agents, self.agent_paths(), actor)

    async def run(self, plan: PlanLike, timeout: float | None = 60) -> RunResult:
        """Run ``plan`` (a Plan, a mapping or JSON text of the plan format, or a goal alone
        to plan); then apply the memory policy to it. Only inside ``async with``."""
        result = await self.orchestrator.wait(await self.submit(plan), timeout)
        await self.settle(result.root_id)
        return result

    async def settle(self, root_id: str) -> None:
        """Apply the memory policy to the finished run ``root_id`` (:meth:`run` does it)."""
        try:
            await self.keeper.settle(root_id)
            if self.orchestrator.results is not None:  # the next run may reuse them at once
                await self.orchestrator.results.build(self.store)
        except CardbusError as e:
            # bookkeeping after the end: the run's result stands. The records' ids derive
            # from the events that call for them, so ``MemoryKeeper.catch_up`` (or the
            # next settle of this run) writes exactly them later.
            log.warning("memory records of run %s not written: %s", root_id, e)

    def agent_paths(self) -> list[str]:
        """Its agents' classes as "module:Class" (those importable by that name)."""
        return [p for p in (agent_path(w.agent) for w in self.workers) if p]


def agent_path(agent: type[Agent]) -> str:
    """``module:Class`` of an agent class importable by that name ("" if it is not: a class
    made in a function, or a remote agent's); ``RunStarted.agent_paths`` keeps them."""
    path = f"{agent.__module__}:{agent.__qualname__}"
    return "" if "<" in path or agent.__module__ == "__main__" else path


def with_planner(agents: Sequence[type[Agent]]) -> list[type[Agent]]:
    """``agents``, and a ``RulePlanner`` if none of them offers the capability ``plan``."""
    out = list(agents)
    if not any(_plans(a) for a in out):
        out.append(RulePlanner)
    return out


def _plans(agent: type[Agent]) -> bool:
    return any(c.name == PLAN_CAPABILITY for c in agent.capabilities)


@dataclass(frozen=True)
class PlannedGoal:
    """What planning a goal gave: the checked plan (None if none was accepted) and how."""

    plan: Plan | None
    rounds: list[PlanRound]  # each proposal, refused with its errors or accepted
    status: str  # "accepted" | "failed" | "halted"
    reason: str = ""  # why none was accepted (plan_invalid, planning_failed, ...)
    detail: str = ""
    events: int = 0  # events the planning wrote
    duration_s: float = 0.0


async def plan_goal(
    plan: Plan | Mapping[str, Any],
    agents: Sequence[type[Agent]],
    *,
    llm: LLM | None = None,
    policy: Policy | None = None,
    timeout: float = 60.0,
) -> PlannedGoal:
    """Plan a goal alone (``plan`` without tasks) without running it, on a throw-away log.

    The orchestrator sees every agent's card but only the planners (agents
    offering ``plan``; a ``RulePlanner`` if none does) run, so nothing but
    planning happens; the proposals are checked exactly as in a run. The
    accepted plan is returned in the plan format, ready for ``cardbus run``.
    """
    plan = as_plan(plan)
    if plan.tasks:
        raise InvalidPlan("plan_goal plans a goal alone: this plan has tasks already")
    agents = with_planner(agents)
    store = MemoryEventStore()
    bus = InProcessBus()
    # an LLM planner's model calls are journaled: requests are served, as in a run
    orchestrator = Orchestrator(store, bus, policy, serve_requests=True)
    done = asyncio.Event()
    root: list[str] = []

    def observe(env: Envelope) -> None:
        if root and env.stream == root[0] and isinstance(env.data, _PLAN_ENDS):
            done.set()

    orchestrator.observers.append(observe)
    workers = [AgentWorker(bus, a, llm) for a in agents if _plans(a)]
    started = time.perf_counter()
    await orchestrator.start()
    try:
        for a in agents:
            await orchestrator.register(a.card())
        for w in workers:
            await w.start()
        root.append(await orchestrator.submit(plan))
        run = orchestrator.state.runs.get(root[0])
        if run is None or not (run.accepted or run.finished):
            await asyncio.wait_for(done.wait(), timeout)
    finally:
        await orchestrator.stop()
        await bus.close()
    elapsed = time.perf_counter() - started
    events = await store.read_correlation(root[0])
    timeline = build_timeline(events, root[0], root[0])
    run = orchestrator.state.runs[root[0]]
    # up to the verdict: the accepted plan's tasks are created after it, and not counted
    end = max((e.position for e in events if isinstance(e.data, _PLAN_ENDS)), default=0)
    count = sum(1 for e in events if e.position <= end)
    if run.accepted:
        proposed = run.proposals[run.accepted[-1].round]
        tasks = proposal_plan(proposed.proposal, plan.goal).tasks
        checked = msgspec.structs.replace(plan, tasks=tasks, from_goal=proposed.from_goal)
        return PlannedGoal(checked, timeline.planning, "accepted", events=count, duration_s=elapsed)
    finish = run.finish_event
    return PlannedGoal(
        None,
        timeline.planning,
        run.finished or "failed",
        getattr(finish, "reason", ""),
        getattr(finish, "detail", ""),
        events=count,
        duration_s=elapsed,
    )


_PLAN_ENDS = (ev.PlanAccepted, ev.RunFailed, ev.RunHalted, ev.RunCompleted)
