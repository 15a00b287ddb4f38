"""The demo plans and a helper that runs agents and the orchestrator in one process."""

from __future__ import annotations

from collections.abc import Sequence

from agents.agent import Agent
from agents.llm import LLM
from eventstore import EventStore

from .inprocess import InProcessBus
from .orchestrator import Orchestrator, RunResult
from .plan import Plan, PlanTask
from .policy import Policy
from .worker import AgentWorker

__all__ = ["EmbeddedRuntime", "parallel_plan", "report_plan"]


def report_plan(topic: str, plan_id: str | None = None) -> Plan:
    """research -> outline (asks for figures once) -> draft (reviewed)."""
    return Plan(
        goal=f"Write a short report on {topic}",
        plan_id=plan_id,
        session={"request": f"a short report on {topic}"},
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
        },
    )
    return Plan(
        goal=f"Write a report on {topic} from parallel research",
        tasks=[*research, merge, outline, draft],
    )


class EmbeddedRuntime:
    """Store + in-process bus + agent workers + orchestrator, started and stopped together."""

    def __init__(
        self,
        store: EventStore,
        agents: Sequence[type[Agent]],
        policy: Policy | None = None,
        llm: LLM | None = None,
    ) -> None:
        self.store = store
        self.bus = InProcessBus()
        self.orchestrator = Orchestrator(store, self.bus, policy)
        self.workers = [AgentWorker(self.bus, a, llm) for a in agents]

    async def __aenter__(self) -> EmbeddedRuntime:
        await self.orchestrator.start()
        for w in self.workers:
            await self.orchestrator.register(w.agent.card())
            await w.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.orchestrator.stop()
        await self.bus.close()

    async def run(self, plan: Plan, timeout: float | None = 60) -> RunResult:
        return await self.orchestrator.run(plan, timeout)
