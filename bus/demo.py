"""The demo plans and a helper that runs agents and the orchestrator in one process.

``EmbeddedRuntime`` also keeps long-term memory: after each run its
``MemoryKeeper`` applies the write policy (the session's ``preferences``
are stored once the run completes; failure reasons always), and the agents'
requests are served with a ``doc_search`` tool over a folder of documents
(by default a small demo folder about tides).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agents.agent import Agent
from agents.llm import LLM
from agents.tools import ToolRegistry, doc_search_tool
from eventstore import EventStore

from .access import AccessPolicy
from .inprocess import InProcessBus
from .memory import LongTermMemory, MemoryKeeper, MemoryPolicy
from .orchestrator import Orchestrator, RunResult
from .plan import Plan, PlanTask
from .policy import Policy
from .worker import AgentWorker

__all__ = ["DEMO_DOCS", "EmbeddedRuntime", "demo_docs", "parallel_plan", "report_plan"]

#: the demo's local documents (file name -> text), searched by the doc_search tool
DEMO_DOCS = {
    "tides.md": "# Ocean tides\n\nOcean tides are the rise and fall of sea level caused by the"
    " gravity of the moon and the sun acting on the rotating earth.\n\n"
    "Spring tides, with the largest range, come at new and full moon.",
    "figures.md": "# Tidal figures\n\nThe largest tidal range on earth, about 16 metres,"
    " is in the Bay of Fundy in Canada; most coasts see two high tides a day.",
}


def report_plan(
    topic: str,
    plan_id: str | None = None,
    user: str = "demo",
    preferences: dict[str, Any] | None = None,
) -> Plan:
    """research -> outline (asks for figures once) -> draft (reviewed).

    The session (what the user asked) holds the user's ``preferences``, by
    default ``{"report_format": "markdown"}``; the writer never sees it: it
    gets only ``user`` and looks the format up in long-term memory, where the
    memory policy puts it once a run has completed.
    """
    prefs = {"report_format": "markdown"} if preferences is None else preferences
    return Plan(
        goal=f"Write a short report on {topic}",
        plan_id=plan_id,
        session={"request": f"a short report on {topic}", "user": user, "preferences": prefs},
        tasks=[
            PlanTask(
                id="research",
                capability="research",
                goal=f"Find facts about {topic}",
                inputs={"topic": topic},
            ),
            PlanTask(
                id="outline",
                capability="outline",
                goal=f"Outline a report on {topic}",
                deps=["research"],
                inputs={"topic": topic, "facts": {"$dep": "research", "path": "facts"}},
            ),
            PlanTask(
                id="draft",
                capability="write",
                goal=f"Write the report on {topic}",
                deps=["outline", "research"],
                review_by="review",
                inputs={
                    "topic": topic,
                    "outline": {"$dep": "outline", "path": "sections"},
                    "facts": {"$dep": "research", "path": "facts"},
                    "user": user,
                },
            ),
        ],
    )


def parallel_plan(topic: str, subtopics: Sequence[str] = ("history", "economy", "culture")) -> Plan:
    """Three research tasks in parallel, merged, then outlined and written."""
    research = [
        PlanTask(
            id=f"research_{s}",
            capability="research",
            goal=f"Research the {s} of {topic}",
            inputs={"topic": topic, "focus": s},
        )
        for s in subtopics
    ]
    merge = PlanTask(
        id="merge",
        capability="merge",
        goal="Merge the research",
        deps=[r.id for r in research],
        inputs={"parts": [{"$dep": r.id, "path": "facts"} for r in research]},
    )
    base = report_plan(topic)
    outline, draft = base.tasks[1], base.tasks[2]
    outline = PlanTask(
        id="outline",
        capability="outline",
        goal=outline.goal,
        deps=["merge"],
        inputs={"topic": topic, "facts": {"$dep": "merge", "path": "facts"}},
    )
    draft = PlanTask(
        id="draft",
        capability="write",
        goal=draft.goal,
        deps=["outline", "merge"],
        review_by="review",
        inputs={
            "topic": topic,
            "outline": {"$dep": "outline", "path": "sections"},
            "facts": {"$dep": "merge", "path": "facts"},
            "user": "demo",
        },
    )
    return Plan(
        goal=f"Write a report on {topic} from parallel research",
        session=base.session,
        tasks=[*research, merge, outline, draft],
    )


def demo_docs() -> tempfile.TemporaryDirectory[str]:
    """A temporary folder holding :data:`DEMO_DOCS` (clean it up when done)."""
    folder = tempfile.TemporaryDirectory(prefix="cardbus-docs-")
    for name, text in DEMO_DOCS.items():
        Path(folder.name, name).write_text(text, encoding="utf-8")
    return folder


class EmbeddedRuntime:
    """Store + in-process bus + agent workers + orchestrator, started and stopped together.

    ``tools`` is the registry agents' tool requests are served from (default:
    ``doc_search`` over ``docs``, or over :data:`DEMO_DOCS` in a temporary
    folder); ``memory_policy`` decides what long-term memory keeps after a run.
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

    async def run(self, plan: Plan, timeout: float | None = 60) -> RunResult:
        """Run ``plan``; then apply the memory policy to it before returning."""
        result = await self.orchestrator.run(plan, timeout)
        await self.keeper.settle(result.root_id)
        return result
