"""An agent whose input takes free text, as a user writes one: the goal's words fill it.

Used by the planning tests: a value the planner takes from the goal is said so in
``plan.proposed``, by ``cardbus plan`` and by ``cardbus replay``.
"""

from __future__ import annotations

import msgspec

from cardbus.agents.agent import Agent, Capability, TaskContext
from cardbus.agents.cards import TaskCard


class TranslateIn(msgspec.Struct, frozen=True):
    text: str  # free text by its name: the goal's words may fill it


class Translation(msgspec.Struct, frozen=True):
    translation: str


class Translator(Agent):
    agent_id = "translator"
    description = "Translates text into French."
    capabilities = [Capability("translate", TranslateIn, Translation, "translate text")]

    async def handle(self, task: TaskCard, inputs: TranslateIn, ctx: TaskContext) -> Translation:
        return Translation(f"[French] {inputs.text}")
