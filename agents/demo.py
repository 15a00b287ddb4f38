"""The demo's report pipeline: researcher, planner, writer, reviewer (and a merger).

Deterministic agents on the mock LLM, written exactly as a user would write
theirs. The planner asks for more facts once (needs input); the reviewer
returns one round of structured issues (a missing conclusion), then passes.
"""

from __future__ import annotations

import msgspec

from eventstore.events import ReviewIssue

from .agent import Agent, Capability, NeedsInput, TaskContext
from .cards import Review, TaskCard

__all__ = [
    "DEMO_AGENTS",
    "Draft",
    "Facts",
    "Merger",
    "Outline",
    "Planner",
    "Researcher",
    "Reviewer",
    "Section",
    "Writer",
]


class ResearchIn(msgspec.Struct, frozen=True):
    topic: str
    focus: str = ""


class Facts(msgspec.Struct, frozen=True):
    facts: list[str]


class OutlineIn(msgspec.Struct, frozen=True):
    topic: str
    facts: list[str]


class Outline(msgspec.Struct, frozen=True):
    sections: list[str]


class WriteIn(msgspec.Struct, frozen=True):
    topic: str
    outline: list[str]
    facts: list[str]


class Section(msgspec.Struct, frozen=True):
    heading: str
    text: str


class Draft(msgspec.Struct, frozen=True):
    title: str
    sections: list[Section]


class ReviewIn(msgspec.Struct, frozen=True):
    draft: Draft
    goal: str = ""


class MergeIn(msgspec.Struct, frozen=True):
    parts: list[list[str]]


class Researcher(Agent):
    agent_id = "researcher"
    description = "Researches a topic and returns a list of short factual statements."
    capabilities = [
        Capability("research", ResearchIn, Facts, "find facts about a topic", tags=["facts"])
    ]

    async def handle(self, task: TaskCard, inputs: ResearchIn, ctx: TaskContext) -> Facts:
        await ctx.complete(f"List facts about {inputs.topic} {inputs.focus}".strip())
        angle = inputs.focus or "overview"
        facts = [f"{inputs.topic}: {angle} fact {i} (source: mock encyclopedia)" for i in (1, 2, 3)]
        return Facts(facts=facts)


class Planner(Agent):
    agent_id = "planner"
    description = "Plans the outline of a report from the facts it is given."
    capabilities = [Capability("outline", OutlineIn, Outline, "outline a report", tags=["plan"])]

    async def handle(self, task: TaskCard, inputs: OutlineIn, ctx: TaskContext) -> Outline:
        if task.supplement is None:  # the facts lack figures: ask for them, once
            raise NeedsInput(
                f"figures about {inputs.topic}",
                capability="research",
                inputs={"topic": inputs.topic, "focus": "figures"},
            )
        await ctx.complete(f"Outline a report on {inputs.topic} from {len(inputs.facts)} facts")
        return Outline(sections=["Introduction", "Key facts", "Figures", "Outlook"])


class Writer(Agent):
    agent_id = "writer"
    description = "Writes a report draft that follows an outline and uses the given facts."
    capabilities = [Capability("write", WriteIn, Draft, "write a report draft", tags=["text"])]

    async def handle(self, task: TaskCard, inputs: WriteIn, ctx: TaskContext) -> Draft:
        await ctx.complete(f"Write a report on {inputs.topic} following {inputs.outline}")
        sections = [
            Section(heading=h, text=" ".join(inputs.facts[i :: len(inputs.outline)]) or "...")
            for i, h in enumerate(inputs.outline)
        ]
        for issue in task.review:  # a revision: address each review issue
            if issue.issue_type == "missing_section":
                sections.append(Section(heading=issue.section, text=issue.suggestion))
        return Draft(title=f"Report: {inputs.topic}", sections=sections)


class Reviewer(Agent):
    agent_id = "reviewer"
    description = "Reviews a report draft and returns structured issues."
    capabilities = [Capability("review", ReviewIn, Review, "review a draft", tags=["quality"])]

    async def handle(self, task: TaskCard, inputs: ReviewIn, ctx: TaskContext) -> Review:
        await ctx.complete(f"Review the draft {inputs.draft.title}")
        headings = {s.heading for s in inputs.draft.sections}
        if "Conclusion" in headings:
            return Review(passed=True)
        issue = ReviewIssue(
            issue_type="missing_section",
            section="Conclusion",
            severity="medium",
            suggestion="Close with a conclusion that sums up the key facts and figures.",
        )
        return Review(passed=False, issues=[issue])


class Merger(Agent):
    agent_id = "merger"
    description = "Merges several lists of facts into one, without duplicates."
    capabilities = [Capability("merge", MergeIn, Facts, "merge research results", tags=["facts"])]

    async def handle(self, task: TaskCard, inputs: MergeIn, ctx: TaskContext) -> Facts:
        merged = list(dict.fromkeys(f for part in inputs.parts for f in part))
        ctx.usage(input_tokens=len(merged), output_tokens=len(merged))
        return Facts(facts=merged)


DEMO_AGENTS: list[type[Agent]] = [Researcher, Planner, Writer, Reviewer, Merger]
