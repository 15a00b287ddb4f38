"""A parent's budget bounds its child runs (issue 32 item 4): the child's model calls
are checked against the parent's caps before they are sent, and its spending is the
parent's too.

Real parts: ``EmbeddedRuntime`` on a SQLite file, model calls journaled through
``ctx.journal.call`` to the OpenAI-compatible stub on loopback (its request count is the
witness of what was sent). Each test waits for the runs' ends in the log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest

from cardbus.agents import Agent, Capability, TaskCard, TaskContext
from cardbus.agents.llm import OpenAIChatLLM
from cardbus.bus.orchestrator import Policy, RetryPolicy
from cardbus.bus.orchestrator.child_runs import child_root_id
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import events as ev
from cardbus.eventstore.sqlite import SqliteEventStore
from tests.agents.openai_stub import OpenAIStub

URL: dict[str, str] = {}


class Q(msgspec.Struct):
    q: str


class A(msgspec.Struct):
    answer: str


class Asker(Agent):
    """One journaled model call of max_tokens 450 per task."""

    agent_id = "asker"
    capabilities: ClassVar = [Capability("ask", Q, A)]

    async def handle(self, task: TaskCard, inputs: Q, ctx: TaskContext) -> A:
        request: dict[str, Any] = {
            "model": "stub-model",
            "messages": [{"role": "user", "content": inputs.q}],
            "max_tokens": 450,
        }
        llm = OpenAIChatLLM(URL["url"], "stub-model")

        async def live() -> dict[str, Any]:
            return msgspec.to_builtins(await llm.chat(request["messages"]))

        answer = await ctx.journal.call(request, live)
        return A(answer=str(answer.get("text")))


@pytest.fixture
def stub() -> Iterator[OpenAIStub]:
    with OpenAIStub() as s:
        URL["url"] = s.url
        yield s


def _lead(budget_tokens: int, asks: int) -> dict[str, Any]:
    """A parent whose only task is a department (a child run of ``asks`` parallel asks),
    under the parent's token budget; the child has no budget of its own."""
    return {
        "goal": "lead",
        "budget_tokens": budget_tokens,
        "tasks": [
            {
                "id": "dept",
                "capability": "department",
                "max_attempts": 1,
                "child": {
                    "plan": {
                        "goal": "research",
                        "tasks": [
                            {"id": f"a{i}", "capability": "ask", "inputs": {"q": f"q{i}"}}
                            for i in range(asks)
                        ],
                    }
                },
            }
        ],
    }


async def _run(db: Path, plan: dict[str, Any], stub: OpenAIStub) -> tuple[str, Any, Any]:
    llm = OpenAIChatLLM(stub.url, "stub-model")
    policy = Policy(retry=RetryPolicy(max_attempts=3, initial_interval_s=0.01, jitter=0.0))
    async with (
        await SqliteEventStore.open(db, poll_interval=0.01) as store,
        EmbeddedRuntime(store, [Asker], policy, llm=llm) as rt,
    ):
        root = await rt.orchestrator.submit(plan)
        parent = await rt.orchestrator.wait(root, timeout=60)
        child_root = child_root_id(f"dept-{root[-12:]}", 1)
        child = await rt.orchestrator.wait(child_root, timeout=60)
        events = await store.read_correlation(child_root)
    return root, (parent, child), events


def test_the_parents_budget_cap_stops_the_childs_model_calls(
    tmp_path: Path, stub: OpenAIStub
) -> None:
    stub.usage = {"prompt_tokens": 20, "completion_tokens": 430, "total_tokens": 450}
    _, (parent, child), events = asyncio.run(_run(tmp_path / "log.db", _lead(700, 3), stub))
    assert len(stub.requests) == 1  # the child's other two calls were never sent
    refused = [e.data for e in events if isinstance(e.data, ev.BudgetRefused)]
    assert len(refused) == 2
    assert {(r.action, r.scope, r.cap_tokens) for r in refused} == {
        ("model_call", "parent:run", 700)
    }
    assert all(r.spent_tokens + r.estimate_tokens > 700 for r in refused)
    spent = sum(
        e.data.input_tokens + e.data.output_tokens
        for e in events
        if isinstance(e.data, ev.ModelAnswered)
    )
    assert spent == 450  # under the parent's cap
    assert child.status == "failed" and parent.status == "failed"
    assert "child_run_failed" in parent.detail


def test_a_child_under_the_parents_cap_runs_and_counts_as_the_parents_spending(
    tmp_path: Path, stub: OpenAIStub
) -> None:
    stub.usage = {"prompt_tokens": 20, "completion_tokens": 430, "total_tokens": 450}
    db = tmp_path / "log.db"
    root, (parent, child), _ = asyncio.run(_run(db, _lead(2000, 2), stub))
    assert parent.status == "completed" and child.status == "completed"
    assert len(stub.requests) == 2

    async def tokens_of_parent() -> int:
        from cardbus.bus.orchestrator.runstate import RunState

        state = RunState()
        async with await SqliteEventStore.open(db) as store:
            for env in await store.read_all():
                state.apply(env)
        ledger = state.runs[root].budget
        assert ledger is not None
        return ledger.spent_tokens["run"]

    assert asyncio.run(tokens_of_parent()) == 900  # the child's two calls, in the parent's
