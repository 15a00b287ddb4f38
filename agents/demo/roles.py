"""The demo's report pipeline: researcher, planner, writer, reviewer (and a merger).

The researcher, planner, writer and reviewer are LLM agents (``LLMAgent``),
written exactly as a user would write theirs: on a real endpoint the model
writes the facts, the outline, the report and the review; on the
deterministic mock each answers what its ``mock_answer`` builds from its card
alone, so the offline demo reads as a report too. The planner asks for more
facts once (needs input: figures) and passes them on in its outline; the
writer uses every fact and figure, and on a revision edits its previous draft
to fix each issue the review found; the reviewer returns one round of
structured issues (a missing conclusion), then passes. The researcher also
searches local documents with the ``doc_search`` tool (its only allowed tool),
and the writer looks up the user's preferred report format in long-term
memory (``pref/<user>/report_format``): both through requests the
orchestrator checks and records. Without a request path (an agent run on its
own) they simply do without.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import msgspec

from cardbus.agents.agent import Agent, Capability, NeedsInput, TaskContext
from cardbus.agents.cards import AgentConstraints, Review, TaskCard
from cardbus.agents.llm_agent import LLMAgent
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
    "compose_draft",
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
    # the figures the planner asked for (its supplement), passed on (None: none asked for)
    figures: list[str] | None = None


class WriteIn(msgspec.Struct, frozen=True):
    topic: str
    outline: list[str]
    facts: list[str]
    figures: list[str] | None = None  # the outline's figures, for the section about them
    user: str = ""  # whose preferences to look up in long-term memory


class WriteJob(msgspec.Struct, frozen=True):
    """What the writer's model is given: its inputs and the format to write in."""

    topic: str
    outline: list[str]
    facts: list[str]
    figures: list[str] = []
    format: str = "plain"


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
    checklist: list[str] = []


class MergeIn(msgspec.Struct, frozen=True):
    parts: list[list[str]]


class Researcher(LLMAgent):
    agent_id = "researcher"
    description = "Researches a topic and returns a list of short factual statements."
    capability = "research"
    input_type = ResearchIn
    output_type = Facts
    capabilities = [
        Capability("research", ResearchIn, Facts, "find facts about a topic", tags=["facts"])
    ]
    constraints = AgentConstraints(tools=["doc_search"])
    instructions = (
        "You are a careful researcher. List three to six short factual statements about the"
        " topic (about the focus, if one is given), each ending with its source in parentheses."
        " No speculation."
    )

    def mock_answer(self, task: TaskCard, inputs: ResearchIn) -> Facts:
        angle = inputs.focus or "overview"
        return Facts(
            facts=[
                f"{inputs.topic}: {angle} fact {i} (source: mock encyclopedia)" for i in (1, 2, 3)
            ]
        )

    async def handle(self, task: TaskCard, inputs: ResearchIn, ctx: TaskContext) -> Facts:
        found: Facts = await super().handle(task, inputs, ctx)
        facts = list(found.facts)
        try:  # local documents, through the orchestrator (checked and recorded)
            hits = await ctx.tool("doc_search", query=f"{inputs.topic} {inputs.focus}", k=1)
            facts += [f"{h['snippet']} (source: {h['path']})" for h in hits.get("hits", [])]
        except CardbusError:
            pass  # no documents here: the encyclopedia will do
        return Facts(facts=facts)


def _supplied(supplement: Any) -> list[str]:
    """The facts a supplementary research task answered (its ``facts``)."""
    facts = supplement.get("facts") if isinstance(supplement, dict) else supplement
    return [str(f) for f in facts] if isinstance(facts, list) else []


class Planner(LLMAgent):
    agent_id = "planner"
    description = "Plans the outline of a report from the facts it is given."
    capability = "outline"
    input_type = OutlineIn
    output_type = Outline
    capabilities = [Capability("outline", OutlineIn, Outline, "outline a report", tags=["plan"])]
    instructions = (
        "You outline short reports. Give the section headings, in order (three to five), of a"
        " report on the topic built from the facts; one of them is about the figures. Copy the"
        " figures you were given into figures."
    )

    def mock_answer(self, task: TaskCard, inputs: OutlineIn) -> Outline:
        return Outline(
            sections=["Introduction", "Key facts", "Figures", "Outlook"],
            figures=_supplied(task.supplement),
        )

    async def handle(self, task: TaskCard, inputs: OutlineIn, ctx: TaskContext) -> Outline:
        if task.supplement is None:  # the facts lack figures: ask for them, once
            raise NeedsInput(
                f"figures about {inputs.topic}",
                capability="research",
                inputs={"topic": inputs.topic, "focus": "figures"},
            )
        outline: Outline = await super().handle(task, inputs, ctx)
        # the figures pass on as they were found, whatever the model copied
        return Outline(sections=outline.sections, figures=_supplied(task.supplement))


_SOURCE = re.compile(r"\s*\(source: [^)]*\)\s*$")


def _sentence(fact: str) -> str:
    fact = fact.strip()
    return fact if fact.endswith((".", "!", "?", ")")) else fact + "."


def _bare(fact: str) -> str:
    """A fact without its trailing ``(source: ...)`` and full stop, for a summary."""
    return _SOURCE.sub("", fact).strip().rstrip(".")


def _body(items: list[str], fmt: str) -> str:
    if fmt == "markdown":
        return "\n".join(f"- {i}" for i in items)
    return " ".join(_sentence(i) for i in items)


def _conclusion(job: WriteJob, sections: list[Section]) -> str:
    """A closing paragraph that sums up the report's facts and figures (written, not pasted)."""
    prefix = f"{job.topic}:".lower()
    points = []
    for fact in [*job.facts[:2], *job.figures[:1]]:
        point = _bare(fact)
        if point.lower().startswith(prefix):  # "tides: ..." in a summary about tides
            point = point[len(prefix) :].strip()
        if point:
            points.append(point)
    if not points:
        return f"This report covered {job.topic} in {len(sections)} sections."
    return f"To sum up {job.topic}: " + "; ".join(points) + "."


def compose_draft(job: WriteJob, previous: Any = None, issues: Sequence[ReviewIssue] = ()) -> Draft:
    """The report a writer composes from its inputs alone (the mock model's answer).

    Each outline heading is a section; a heading about figures gets the
    figures, the others share the facts in turn (each fact once). On a
    revision (``previous``, the draft the review was about) the previous
    sections are kept and each issue is fixed: a missing section is written
    (a conclusion sums up the key facts and figures), a weak one gets the
    facts it lacks.
    """
    try:
        before = msgspec.convert(previous, Draft) if previous is not None else None
    except (msgspec.ValidationError, TypeError):
        before = None
    job = msgspec.structs.replace(job, figures=[f for f in job.figures if f not in job.facts])
    if before is not None:
        sections = list(before.sections)
    else:
        about_figures = [h for h in job.outline if "figure" in h.lower()] if job.figures else []
        others = [h for h in job.outline if h not in about_figures] or list(job.outline)
        shares: dict[str, list[str]] = {h: [] for h in job.outline}
        for i, fact in enumerate(job.facts):
            if others:
                shares[others[i % len(others)]].append(fact)
        for h in about_figures:
            shares[h] = list(job.figures)
        if job.figures and not about_figures and job.outline:  # nowhere else: the last section
            shares[job.outline[-1]] += job.figures
        sections = [
            Section(heading=h, text=_body(shares[h], job.format) or f"More on {job.topic} to come.")
            for h in job.outline
        ]
    for issue in issues:
        have = [s.heading for s in sections]
        if issue.section not in have:
            text = (
                _conclusion(job, sections)
                if "conclu" in issue.section.lower() or "summar" in issue.section.lower()
                else _body([*job.facts, *job.figures][:2], job.format)
            )
            sections.append(Section(heading=issue.section, text=text))
            continue
        used = " ".join(s.text for s in sections)
        missing = [f for f in [*job.facts, *job.figures] if f not in used]
        if missing:
            i = have.index(issue.section)
            old = sections[i]
            sep = "\n" if job.format == "markdown" else " "
            sections[i] = Section(old.heading, old.text + sep + _body(missing, job.format))
    return Draft(title=f"Report: {job.topic}", sections=sections, format=job.format)


class Writer(LLMAgent):
    agent_id = "writer"
    description = "Writes a report draft that follows an outline and uses the given facts."
    capability = "write"
    input_type = WriteIn
    output_type = Draft
    capabilities = [Capability("write", WriteIn, Draft, "write a report draft", tags=["text"])]
    # a task (or `cardbus rerun --task write --model mock-1`) may ask for the deterministic
    # mock by name; without a model asked, the writer runs the endpoint's default
    models = ["mock-1"]
    instructions = (
        "You write short reports. Follow the outline: one section per heading, in order, each a"
        " short paragraph (format markdown: '- ' bullet points). Use every fact and figure you are"
        " given, with its source. Given your previous draft and a reviewer's issues, return the"
        " whole draft again with each issue fixed: write the missing or weak part yourself from"
        " the facts and figures; never copy the reviewer's suggestion into the report."
    )

    def mock_answer(self, task: TaskCard, inputs: WriteJob) -> Draft:
        return compose_draft(inputs, task.previous_output, list(task.review))

    async def handle(self, task: TaskCard, inputs: WriteIn, ctx: TaskContext) -> Draft:
        fmt = await preferred_format(ctx, inputs.user)
        job = WriteJob(
            topic=inputs.topic,
            outline=inputs.outline,
            facts=inputs.facts,
            figures=inputs.figures or [],
            format=fmt,
        )
        draft: Draft = await super().handle(task, job, ctx)
        return msgspec.structs.replace(draft, format=fmt)


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


class Reviewer(LLMAgent):
    agent_id = "reviewer"
    description = "Reviews a report draft and returns structured issues."
    capability = "review"
    input_type = ReviewIn
    output_type = Review
    capabilities = [Capability("review", ReviewIn, Review, "review a draft", tags=["quality"])]
    instructions = (
        "You review short reports against their goal and checklist. Pass a draft that covers"
        " the goal with sourced facts and ends with a conclusion. Otherwise list each problem"
        " as an issue: issue_type (missing_section, missing_facts, unclear, ...), the section,"
        " severity (low, medium or high) and a suggestion for the writer."
    )

    def mock_answer(self, task: TaskCard, inputs: ReviewIn) -> Review:
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
