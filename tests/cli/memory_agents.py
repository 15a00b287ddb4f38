"""An agent for the ``cardbus run --reuse`` test (named by import path): it counts its calls."""

from __future__ import annotations

from typing import ClassVar

from cardbus.agents.agent import Agent, Capability, TaskContext
from cardbus.agents.cards import TaskCard


class Doubler(Agent):
    agent_id = "mem-doubler"
    capabilities = [Capability("double", dict, dict)]
    calls: ClassVar[list[int]] = []

    async def handle(self, task: TaskCard, inputs: dict, ctx: TaskContext) -> dict:
        type(self).calls.append(inputs["n"])
        return {"n": inputs["n"] * 2}
