"""Two real runs whose attempts made journaled model and tool calls, for the replay, trace,
console and cost tests.

* ``retry``: an agent asks the model twice and fails; the retry is answered from the
  journal for those two calls (``replayed_from``), then calls a tool and the model live.
* ``unknown``: an agent's process "dies" during a tool call that is not idempotent; the
  restarted orchestrator records ``tool.effect_unknown`` (``ask``), an operator approves,
  and the next attempt repeats the call (``repeat``) with the same idempotency key.

Real parts: ``EmbeddedRuntime`` on a SQLite file, ``OpenAIChatLLM`` against the
OpenAI-compatible stub on loopback (each answer with its own token counts), a real
``ToolRegistry``. The log is the witness: nothing waits on a clock.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import msgspec

from cardbus.agents import Agent, Capability, TaskCard, TaskContext
from cardbus.agents.cards import AgentConstraints
from cardbus.agents.llm import OpenAIChatLLM
from cardbus.agents.tools import Tool, ToolRegistry
from cardbus.bus.orchestrator import Policy, RetryPolicy
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import events as ev
from cardbus.eventstore.sqlite import SqliteEventStore
from tests.agents.openai_stub import OpenAIStub, Reply

#: the stub's answers: text, prompt tokens, completion tokens
ANSWERS = [("answer one", 101, 11), ("answer two", 102, 12), ("answer three", 103, 13)]


class Q(msgspec.Struct):
    q: str


class A(msgspec.Struct):
    answer: str


_FAILS: dict[str, int] = {}


class Asker(Agent):
    """Two model calls, a failure on the first attempt, then a tool call and a third call."""

    agent_id = "asker"
    capabilities: ClassVar = [Capability("ask", Q, A)]
    constraints = AgentConstraints(tools=["charge"])

    async def handle(self, task: TaskCard, inputs: Q, ctx: TaskContext) -> A:
        first = await ctx.llm.chat([{"role": "user", "content": f"one: {inputs.q}"}])
        second = await ctx.llm.chat([{"role": "user", "content": f"two: {first.text}"}])
        if _FAILS.get(task.task_id, 1) > 0:
            _FAILS[task.task_id] = 0
            raise RuntimeError("failed after two model calls")
        paid = await ctx.tool("charge", amount=5)
        third = await ctx.llm.chat([{"role": "user", "content": f"three: {paid}"}])
        return A(answer=f"{second.text}|{third.text}")


class Payer(Agent):
    """One tool call (``charge``, not idempotent) and nothing else."""

    agent_id = "payer"
    capabilities: ClassVar = [Capability("pay", Q, A)]
    constraints = AgentConstraints(tools=["charge"])

    async def handle(self, task: TaskCard, inputs: Q, ctx: TaskContext) -> A:
        paid = await ctx.tool("charge", amount=7)
        return A(answer=str(paid))


def _charge(args: dict[str, Any]) -> dict[str, Any]:
    return {"charged": args["amount"]}


def _policy() -> Policy:
    return Policy(retry=RetryPolicy(max_attempts=3, initial_interval_s=0.01, jitter=0.0))


@dataclass
class JournalRuns:
    db: Path
    retry_root: str
    retry_task: str
    unknown_root: str
    unknown_task: str


async def _until(store: SqliteEventStore, root: str, done: Any) -> list[Any]:
    for _ in range(3000):  # up to a minute; the log is the witness
        events = [e.data for e in await store.read_correlation(root)]
        if done(events):
            return events
        await asyncio.sleep(0.02)
    raise AssertionError(f"not reached: {[type(e).__name__ for e in events]}")


async def write_journal_runs(path: Path) -> JournalRuns:
    _FAILS.clear()
    with OpenAIStub() as stub:
        stub.script(
            *[
                Reply(content=text, usage={"prompt_tokens": i, "completion_tokens": o})
                for text, i, o in ANSWERS
            ]
        )
        llm = OpenAIChatLLM(stub.url, "stub-model")
        tools = ToolRegistry([Tool.define("charge", _charge)])
        async with (
            await SqliteEventStore.open(path, poll_interval=0.01) as store,
            EmbeddedRuntime(store, [Asker], _policy(), llm=llm, tools=tools) as rt,
        ):
            plan = {
                "plan_id": "journal-retry",
                "goal": "ask twice",
                "tasks": [{"id": "t", "capability": "ask", "inputs": {"q": "tides"}}],
            }
            result = await rt.run(plan, timeout=60)
            assert result.status == "completed", result
            retry_root = result.root_id
            retry_task = next(
                e.stream
                for e in await store.read_correlation(retry_root)
                if isinstance(e.data, ev.TaskCreated)
            )

    hang = asyncio.Event()

    async def charge_and_die(args: dict[str, Any]) -> dict[str, Any]:
        await hang.wait()  # never set: the process "dies" here
        return {}

    plan = {
        "plan_id": "journal-unknown",
        "goal": "pay once",
        "tasks": [{"id": "p", "capability": "pay", "inputs": {"q": "bill"}}],
    }
    dying = ToolRegistry([Tool.define("charge", charge_and_die, timeout_s=600)])
    async with (
        await SqliteEventStore.open(path, poll_interval=0.01) as store,
        EmbeddedRuntime(store, [Payer], _policy(), tools=dying) as rt,
    ):
        unknown_root = await rt.orchestrator.submit(plan)
        await _until(
            store, unknown_root, lambda es: any(isinstance(e, ev.ToolRequested) for e in es)
        )
    again = ToolRegistry([Tool.define("charge", _charge)])
    async with (
        await SqliteEventStore.open(path, poll_interval=0.01) as store,
        EmbeddedRuntime(store, [Payer], _policy(), tools=again) as rt,
    ):
        events = await _until(
            store, unknown_root, lambda es: any(isinstance(e, ev.ApprovalRequested) for e in es)
        )
        unknown_task = next(e.task_id for e in events if isinstance(e, ev.ToolRequested))
        await rt.orchestrator.approve(unknown_task, by="operator")
        done = await rt.orchestrator.wait(unknown_root, timeout=60)
        assert done.status == "completed", done
    return JournalRuns(path, retry_root, retry_task, unknown_root, unknown_task)
