"""The agents of the deployment: plain agents that say which process ran them."""

from __future__ import annotations

import os

import msgspec

from cardbus import Agent, Capability, TaskCard, TaskContext


class Text(msgspec.Struct):
    text: str


class Shouted(msgspec.Struct):
    text: str
    pid: int  # the process that ran the handler


class Counted(msgspec.Struct):
    words: int
    pid: int


class Shouter(Agent):
    agent_id = "shouter"
    description = "Upper-cases a text."
    capabilities = [Capability("shout", Text, Shouted, "upper-case a text")]

    async def handle(self, task: TaskCard, inputs: Text, ctx: TaskContext) -> Shouted:
        return Shouted(text=inputs.text.upper(), pid=os.getpid())


class Counter(Agent):
    agent_id = "counter"
    description = "Counts the words of a text."
    capabilities = [Capability("count", Text, Counted, "count words")]

    async def handle(self, task: TaskCard, inputs: Text, ctx: TaskContext) -> Counted:
        return Counted(words=len(inputs.text.split()), pid=os.getpid())
