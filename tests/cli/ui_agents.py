"""Agents the console's action tests run (``cardbus ui --agent ui_agents:Counter``).

Deterministic and quick, no model: a counter that lists numbers up to ``n``, and
a summer that adds them up. The counter fails a task whose ``n`` is over 5
unless the task asks for the model ``careful`` (a constraint it offers): a run
with ``n`` 7 fails, and re-running that task with the model ``careful``
completes it.
"""

from __future__ import annotations

import msgspec

from cardbus.agents.agent import Agent, Capability, TaskContext
from cardbus.agents.cards import AgentConstraints, TaskCard


class Count(msgspec.Struct, frozen=True):
    n: int


class Numbers(msgspec.Struct, frozen=True):
    numbers: list[int]


class Total(msgspec.Struct, frozen=True):
    total: int


class Counter(Agent):
    agent_id = "ui-counter"
    description = "Counts from 1 to n."
    capabilities = [Capability("count", Count, Numbers, "list the numbers 1..n")]
    constraints = AgentConstraints(limits={"model": ["quick", "careful"]})

    async def handle(self, task: TaskCard, inputs: Count, ctx: TaskContext) -> Numbers:
        if inputs.n > 5 and task.constraints.get("model") != "careful":
            raise ValueError(f"n={inputs.n} is too many to count quickly: ask for 'careful'")
        return Numbers(list(range(1, inputs.n + 1)))


class Summer(Agent):
    agent_id = "ui-summer"
    description = "Adds numbers up."
    capabilities = [Capability("sum", Numbers, Total, "add the numbers up")]

    async def handle(self, task: TaskCard, inputs: Numbers, ctx: TaskContext) -> Total:
        return Total(sum(inputs.numbers))


def count_plan(n: int, plan_id: str | None = None) -> dict[str, object]:
    """Count to ``n``, then add the numbers up (one attempt each: a failure is final)."""
    plan: dict[str, object] = {
        "goal": f"add up 1..{n}",
        "tasks": [
            {"id": "count", "capability": "count", "inputs": {"n": n}, "max_attempts": 1},
            {
                "id": "sum",
                "capability": "sum",
                "deps": ["count"],
                "inputs": {"numbers": {"$dep": "count", "path": "numbers"}},
                "max_attempts": 1,
            },
        ],
    }
    if plan_id:
        plan["plan_id"] = plan_id
    return plan
