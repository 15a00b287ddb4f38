"""The agent the serving cardbus offers over A2A."""

from __future__ import annotations

import msgspec

from cardbus import Agent, Capability, TaskCard, TaskContext

GLOSSARY = {"tide": "the rise and fall of the sea", "neap": "a tide of small range"}


class Term(msgspec.Struct):
    term: str


class Definition(msgspec.Struct):
    term: str
    meaning: str


class Definer(Agent):
    agent_id = "definer"
    description = "Defines a term of the sea's glossary."
    capabilities = [Capability("define", Term, Definition, "define a term")]

    async def handle(self, task: TaskCard, inputs: Term, ctx: TaskContext) -> Definition:
        return Definition(term=inputs.term, meaning=GLOSSARY.get(inputs.term, "unknown"))
