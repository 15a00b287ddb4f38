"""An agent that asks its model one question and answers with the model's whole text
(the streaming tests: embedded, NATS, the console, A2A, ``cardbus run --follow``)."""

from __future__ import annotations

from typing import ClassVar

import msgspec

from cardbus.agents import Agent, Capability, TaskCard, TaskContext


class Topic(msgspec.Struct):
    topic: str = "tides"


class Essay(msgspec.Struct):
    text: str


class Writer(Agent):
    agent_id = "writer"
    description = "Writes about a topic with its model, in one call."
    capabilities: ClassVar = [Capability("write", Topic, Essay, "write about a topic")]

    async def handle(self, task: TaskCard, inputs: Topic, ctx: TaskContext) -> Essay:
        answer = await ctx.llm.chat([{"role": "user", "content": f"Write about {inputs.topic}"}])
        return Essay(text=answer.text)


def write_plan(plan_id: str = "stream-1") -> dict[str, object]:
    return {
        "plan_id": plan_id,
        "goal": "write about tides",
        "agents": ["streaming_agents:Writer"],
        "tasks": [{"id": "w", "capability": "write", "inputs": {"topic": "tides"}}],
    }


#: 50 pieces: what the stub streams (its join is the answer)
PIECES = [f"word{i} " for i in range(50)]
ANSWER = "".join(PIECES)
