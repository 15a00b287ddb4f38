"""The demo's report pipeline: researcher, planner, writer, reviewer (and a merger).

Deterministic agents on the mock LLM, written exactly as a user would write
theirs. The planner asks for more facts once (needs input); the reviewer
returns one round of structured issues (a missing conclusion), then passes.
The researcher also searches local documents with the ``doc_search`` tool
(its only allowed tool), and the writer looks up the user's preferred report
format in long-term memory (``pref/<user>/report_format``): both through
requests the orchestrator checks and records. Without a request path (an
agent run on its own) they simply do without.
"""

from __future__ import annotations

import msgspec

from cardbus.agents.agent import Agent, Capability, NeedsInput, TaskContext
from cardbus.agents.cards import AgentConstraints, Review, TaskCard
from cardbus.eventstore.errors import CardbusError
from cardbus.eventstore.events import ReviewIssue

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
    "preferred_format",
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
    user: str = ""  # whose preferences to look up in long-term memory


class Section(msgspec.Struct, frozen=True):
    heading: str
    text: str


class Draft(msgspec.Struct, frozen=True):
    title: str
    sections: list[Section]
    format: str = "plain"  # "plain" | "markdown": the user's preference, if one is known


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
    constraints = AgentConstraints(tools=["doc_search"])

    async def handle(self, task: TaskCard, inputs: ResearchIn, ctx: TaskContext) -> Facts:
        await ctx.complete(f"List facts about {inputs.topic} {inputs.focus}".strip())
        angle = inputs.focus or "overview"
        facts = [f"{inputs.topic}: {angle} fact {i} (source: mock encyclopedia)" for i in (1, 2, 3)]
        try:  # local documents, through the orchestrator (checked and recorded)
            found = await ctx.tool("doc_search", query=f"{inputs.topic} {inputs.focus}", k=1)
            facts += [f"{h['snippet']} (source: {h['path']})" for h in found.get("hits", [])]
        except CardbusError:
            pass  # no documents here: the encyclopedia will do
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
        fmt = await preferred_format(ctx, inputs.user)
        join = "\n".join if fmt == "markdown" else " ".join
        sections = []
        for i, heading in enumerate(inputs.outline):
            facts = inputs.facts[i :: len(inputs.outline)]
            items = [f"- {f}" for f in facts] if fmt == "markdown" else facts
            sections.append(Section(heading=heading, text=join(items) or "..."))
        for issue in task.review:  # a revision: address each review issue
            if issue.issue_type == "missing_section":
                sections.append(Section(heading=issue.section, text=issue.suggestion))
        return Draft(title=f"Report: {inputs.topic}", sections=sections, format=fmt)


async def preferred_format(ctx: TaskContext, user: str) -> str:
    """The user's stored report format (long-term memory), else "plain"."""
    try:
        if user:
            record = await ctx.long_term.get(f"pref/{user}/report_format")
        else:
            hits = await ctx.long_term.search("preferred report format", kind="preference", k=1)
            record = hits[0]["record"] if hits else None
    except CardbusError:  # no memory to ask (or not allowed): the default
        return "plain"
    value = record.get("value") if isinstance(record, dict) else None
    return value if value in ("plain", "markdown") else "plain"


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
