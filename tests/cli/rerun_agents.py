"""LLM agents for the ``cardbus rerun`` / ``cardbus diff`` tests (named by import path)."""

from __future__ import annotations

import msgspec

from cardbus.agents import LLMAgent


class Topic(msgspec.Struct):
    topic: str


class Notes(msgspec.Struct):
    notes: list[str]


class Brief(msgspec.Struct):
    title: str
    points: list[str]


class Researcher(LLMAgent):
    agent_id = "rr-researcher"
    description = "Looks a topic up and lists notes."
    capability = "rr_research"
    input_type = Topic
    output_type = Notes
    instructions = "Look the topic up with doc_search, then list three notes."
    tools = ["doc_search"]


class Writer(LLMAgent):
    agent_id = "rr-writer"
    description = "Writes a brief from notes."
    capability = "rr_write"
    input_type = Notes
    output_type = Brief
    instructions = "Write a brief of exactly three points for a general audience."
    models = ["stub-big"]  # a plan task (or a re-run) may ask for it


class WriterFive(Writer):
    """The writer with other instructions: an offline re-run with it diverges."""

    instructions = "Write a brief of exactly five points for experts."
