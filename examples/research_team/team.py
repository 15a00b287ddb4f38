"""A small research team: a researcher that looks things up with a tool, and a writer.

Both are LLM agents: on the deterministic mock (no OPENAI_BASE_URL) each answers from
its card alone (``mock_answer``); with an endpoint, a model does the work through the
same calls, checks and journal.
"""

from __future__ import annotations

import msgspec

from cardbus import LLMAgent, TaskCard
from cardbus.agents import Tool

NOTES = {
    "tides": "Tides are the rise and fall of the sea, driven by the Moon's gravity.",
    "moon": "The Moon is about 384,400 km from the Earth.",
    "spring tide": "Spring tides happen at new and full moon, when Sun and Moon align.",
}


class Query(msgspec.Struct):
    term: str


def look_up(args: Query) -> dict[str, str]:
    """The team's notes: what a term means (a tool runs in the runtime, not in an agent)."""
    key = args.term.lower().strip()
    return {"term": args.term, "note": NOTES.get(key, f"no note on {args.term!r}")}


NOTES_TOOL = Tool.define("notes", look_up, Query, description="The team's note on a term.")


class Topic(msgspec.Struct):
    topic: str


class Findings(msgspec.Struct):
    topic: str
    facts: list[str]


class Article(msgspec.Struct):
    title: str
    text: str


class Researcher(LLMAgent):
    agent_id = "researcher"
    description = "Finds facts on a topic, looking terms up in the team's notes."
    capability = "research"
    input_type = Topic
    output_type = Findings
    instructions = "Look the topic up in the notes, then list two to four short facts."
    tools = [NOTES_TOOL]
    max_turns = 4

    def mock_answer(self, task: TaskCard, inputs: Topic) -> Findings:
        return Findings(topic=inputs.topic, facts=[look_up(Query(inputs.topic))["note"]])


class Writer(LLMAgent):
    agent_id = "writer"
    description = "Writes a short article from findings."
    capability = "write"
    input_type = Findings
    output_type = Article
    instructions = "Write a title and one paragraph from the facts, and nothing else."

    def mock_answer(self, task: TaskCard, inputs: Findings) -> Article:
        return Article(title=f"About {inputs.topic}", text=" ".join(inputs.facts))
