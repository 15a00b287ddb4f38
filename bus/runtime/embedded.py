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

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cardbus.agents.agent import Agent
from cardbus.agents.demo import demo_docs
from cardbus.agents.llm import LLM
from cardbus.agents.planning import PLAN_CAPABILITY, RulePlanner
from cardbus.agents.tools import ToolRegistry, doc_search_tool
from cardbus.bus.orchestrator.access import AccessPolicy
from cardbus.bus.orchestrator.core import Orchestrator, RunResult
from cardbus.bus.orchestrator.memory import LongTermMemory, MemoryKeeper, MemoryPolicy
from cardbus.bus.orchestrator.plan import Plan, as_plan
from cardbus.bus.orchestrator.policy import Policy
from cardbus.bus.runtime.worker import AgentWorker
from cardbus.bus.transport.inprocess import InProcessBus
from cardbus.eventstore import EventStore

__all__ = ["EmbeddedRuntime"]


class EmbeddedRuntime:
    """Store + in-process bus + agent workers + orchestrator, started and stopped together.

    ``tools`` is the registry agents' tool requests are served from (default:
    ``doc_search`` over ``docs``, or over :data:`cardbus.agents.demo.DEMO_DOCS` in a temporary
    folder); ``memory_policy`` decides what long-term memory keeps after a run;
    ``default_planner`` adds a ``RulePlanner`` when no agent offers ``plan``.
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
    ) -> None:
        self.store = store
        self.bus = InProcessBus()
        self.memory = LongTermMemory(store)
        self.keeper = MemoryKeeper(store, memory_policy, self.memory)
        self._docs: tempfile.TemporaryDirectory[str] | None = None
        if tools is None:
            if docs is None:
                self._docs = demo_docs()
                docs = self._docs.name
            tools = ToolRegistry([doc_search_tool(docs)])
        self.tools = tools
        self.orchestrator = Orchestrator(
            store, self.bus, policy, tools=tools, memory=self.memory, access=access
        )
        agents = list(agents)
        if default_planner and not any(
            c.name == PLAN_CAPABILITY for a in agents for c in a.capabilities
        ):
            agents.append(RulePlanner)
        self.workers = [AgentWorker(self.bus, a, llm) for a in agents]
        self.orchestrator.observers.append(self.keeper.observe)  # settle then needs no read

    async def __aenter__(self) -> EmbeddedRuntime:
        await self.orchestrator.start()
        for w in self.workers:
            await self.orchestrator.register(w.agent.card())
            await w.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.orchestrator.stop()
        await self.bus.close()
        if self._docs is not None:
            self._docs.cleanup()

    async def run(self, plan: Plan | Mapping[str, Any], timeout: float | None = 60) -> RunResult:
        """Run ``plan`` (a Plan or its JSON form, or a goal alone to plan); then apply the
        memory policy to it."""
        result = await self.orchestrator.run(as_plan(plan), timeout)
        await self.keeper.settle(result.root_id)
        return result
