"""Budgets checked before the call: a model call that would cross a cap is never sent.

Real parts: ``EmbeddedRuntime`` on a SQLite file, model calls journaled through
``ctx.journal.call`` / ``ctx.llm`` to the OpenAI-compatible stub on loopback
(its request count is the witness of what was sent), a user's price table.
Nothing waits on a clock: each test waits for the run's end in the log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest
from click.testing import CliRunner

from cardbus.agents import Agent, Capability, TaskCard, TaskContext
from cardbus.agents.llm import OpenAIChatLLM
from cardbus.bus.orchestrator import Policy, RetryPolicy
from cardbus.bus.orchestrator.budget import Budgets, limits_of
from cardbus.bus.orchestrator.plan import Plan, validate_plan
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import InvalidPlan
from cardbus.eventstore.sqlite import SqliteEventStore
from cardbus.projections.pricing import PriceTable
from cardbus.tools.cli import cli
from tests.agents.openai_stub import OpenAIStub

URL: dict[str, str] = {}  # the stub's address, for the agents below


class Q(msgspec.Struct):
    q: str


class A(msgspec.Struct):
    answer: str


async def _ask(ctx: TaskContext, text: str, max_tokens: int | None) -> str:
    """One journaled model call to the stub; ``max_tokens`` is in the request the
    orchestrator sees (what a framework's request carries)."""
    request: dict[str, Any] = {
        "model": "stub-model",
        "messages": [{"role": "user", "content": text}],
    }
    if max_tokens is not None:
        request["max_tokens"] = max_tokens
    llm = OpenAIChatLLM(URL["url"], "stub-model")

    async def live() -> dict[str, Any]:
        done = await llm.chat(request["messages"])
        return msgspec.to_builtins(done)

    answer = await ctx.journal.call(request, live)
    return str(answer.get("text"))


class Wants500(Agent):
    """Each task wants about 500 tokens: a call with max_tokens 450 (and a short prompt)."""

    agent_id = "wants500"
    capabilities: ClassVar = [Capability("ask", Q, A)]

    async def handle(self, task: TaskCard, inputs: Q, ctx: TaskContext) -> A:
        return A(answer=await _ask(ctx, inputs.q, 450))


class Writer(Agent):
    """Two calls of max_tokens 450 each."""

    agent_id = "writer"
    capabilities: ClassVar = [Capability("write", Q, A)]

    async def handle(self, task: TaskCard, inputs: Q, ctx: TaskContext) -> A:
        first = await _ask(ctx, f"draft {inputs.q}", 450)
        second = await _ask(ctx, f"polish {first}", 450)
        return A(answer=second)


class Checker(Agent):
    """The same two calls, under no cap of its own."""

    agent_id = "checker"
    capabilities: ClassVar = [Capability("check", Q, A)]

    async def handle(self, task: TaskCard, inputs: Q, ctx: TaskContext) -> A:
        first = await _ask(ctx, f"check {inputs.q}", 450)
        second = await _ask(ctx, f"again {first}", 450)
        return A(answer=second)


class Spender(Agent):
    """One call through ``ctx.llm`` (no max_tokens: the default output cap applies)."""

    agent_id = "spender"
    capabilities: ClassVar = [Capability("spend", Q, A)]

    async def handle(self, task: TaskCard, inputs: Q, ctx: TaskContext) -> A:
        done = await ctx.llm.chat([{"role": "user", "content": inputs.q}])
        return A(answer=done.text)


@pytest.fixture
def stub() -> Iterator[OpenAIStub]:
    with OpenAIStub() as s:
        URL["url"] = s.url
        yield s


PRICES = PriceTable({"stub-*": (10.0, 10.0)}, bundled=False)  # $0.00001 a token


def _policy() -> Policy:
    return Policy(retry=RetryPolicy(max_attempts=3, initial_interval_s=0.01, jitter=0.0))


async def _run(
    db: Path,
    agents: list[type[Agent]],
    plan: dict[str, Any],
    stub: OpenAIStub,
    approve: bool = False,
) -> tuple[str, str, list[Any]]:
    llm = OpenAIChatLLM(stub.url, "stub-model")
    async with (
        await SqliteEventStore.open(db, poll_interval=0.01) as store,
        EmbeddedRuntime(store, agents, _policy(), llm=llm) as rt,
    ):
        rt.orchestrator.budgets.prices = PRICES
        root = await rt.orchestrator.submit(plan)
        if approve:  # each task that waits for a budget approval is approved, once
            approved: set[str] = set()
            while True:
                result = rt.orchestrator._result(root)
                if result is not None:
                    break
                for env in await store.read_correlation(root):
                    data = env.data
                    if (
                        isinstance(data, ev.ApprovalRequested)
                        and data.reason == "budget_exceeded"
                        and env.stream not in approved
                    ):
                        approved.add(env.stream)
                        await rt.orchestrator.approve(env.stream, by="operator")
                await asyncio.sleep(0.02)
        result = await rt.orchestrator.wait(root, timeout=60)
        events = [e for e in await store.read_correlation(root)]
    return root, result.status, events


def _of(events: list[Any], kind: type) -> list[Any]:
    return [e.data for e in events if isinstance(e.data, kind)]


def _three_tasks(**extra: Any) -> dict[str, Any]:
    return {
        "goal": "three answers",
        "budget_tokens": 700,
        "tasks": [{"id": f"t{i}", "capability": "ask", "inputs": {"q": f"q{i}"}} for i in range(3)],
        **extra,
    }


def test_three_parallel_500_token_tasks_under_700_not_all_run(
    tmp_path: Path, stub: OpenAIStub
) -> None:
    """The issue's finding: three parallel 500-token tasks under a 700-token budget all
    completed, then the run halted at 1,500. Now the calls that would cross are refused."""
    stub.usage = {"prompt_tokens": 20, "completion_tokens": 430, "total_tokens": 450}
    db = tmp_path / "log.db"
    root, status, events = asyncio.run(_run(db, [Wants500], _three_tasks(), stub))
    assert len(stub.requests) == 1  # the other two calls were never sent
    refused = _of(events, ev.BudgetRefused)
    assert len(refused) == 2
    assert {(r.action, r.scope, r.decision, r.cap_tokens) for r in refused} == {
        ("model_call", "run", "fail", 700)
    }
    assert all(r.spent_tokens + r.estimate_tokens > 700 for r in refused)
    failed = _of(events, ev.TaskFailed)
    assert [f.reason for f in failed] == ["budget_exceeded"] * 2
    assert not _of(events, ev.TaskRetryScheduled)  # not retried
    assert len(_of(events, ev.TaskCompleted)) == 1 and status == "failed"
    # spent stays under the cap: 450 tokens of one call
    spent = sum(a.input_tokens + a.output_tokens for a in _of(events, ev.ModelAnswered))
    assert spent == 450
    # the reason is in replay
    out = CliRunner().invoke(cli, ["replay", root, "--db", str(db)], terminal_width=400)
    assert out.exit_code == 0, out.output
    assert "budget.refused" in out.output and "over the cap of 700 tokens" in out.output
    assert "failed: budget_exceeded" in out.output


def test_on_budget_approval_waits_and_an_approved_task_goes_on(
    tmp_path: Path, stub: OpenAIStub
) -> None:
    stub.usage = {"prompt_tokens": 20, "completion_tokens": 430, "total_tokens": 450}
    plan = _three_tasks(on_budget="approval")
    _, status, events = asyncio.run(_run(tmp_path / "log.db", [Wants500], plan, stub, True))
    asked = [a for a in _of(events, ev.ApprovalRequested) if a.reason == "budget_exceeded"]
    assert len(asked) == 2 and all("over the cap" in a.detail for a in asked)
    assert {r.decision for r in _of(events, ev.BudgetRefused)} == {"approval"}
    # approved, each went on over the budget: three calls sent in all, three completed
    assert status == "completed" and len(stub.requests) == 3


def test_a_money_budget_stops_the_run_before_the_call_that_would_cross_it(
    tmp_path: Path, stub: OpenAIStub
) -> None:
    # each answer spends 1000 tokens ($0.01); a call without max_tokens may spend its
    # prompt plus the default output cap (1024): about $0.0105
    stub.usage = {"prompt_tokens": 100, "completion_tokens": 900, "total_tokens": 1000}
    plan = {
        "goal": "two steps",
        "budget_usd": 0.015,
        "tasks": [
            {"id": "a", "capability": "spend", "inputs": {"q": "first"}},
            {"id": "b", "capability": "spend", "inputs": {"q": "second"}, "deps": ["a"]},
        ],
    }
    db = tmp_path / "log.db"
    root, status, events = asyncio.run(_run(db, [Spender], plan, stub))
    assert len(stub.requests) == 1  # b's call would have crossed $0.015: never sent
    (refused,) = _of(events, ev.BudgetRefused)
    assert (refused.action, refused.scope, refused.cap_usd) == ("model_call", "run", 0.015)
    assert refused.spent_usd == pytest.approx(0.01)
    assert refused.estimate_usd is not None and 0.01 < refused.estimate_usd < 0.011
    (answered,) = [a for a in _of(events, ev.ModelAnswered)]
    assert answered.cost_usd == pytest.approx(0.01)  # priced when recorded
    assert status == "failed"
    assert [f.reason for f in _of(events, ev.TaskFailed)] == ["budget_exceeded"]
    out = CliRunner().invoke(cli, ["replay", root, "--db", str(db)], terminal_width=400)
    assert "over the cap of $0.015" in out.output


def test_a_run_at_its_money_cap_dispatches_nothing_more(tmp_path: Path, stub: OpenAIStub) -> None:
    plan = {
        "goal": "two steps",
        "budget_usd": 0.0106,  # room for a's estimate (about $0.0105), not for more
        "tasks": [
            {"id": "a", "capability": "spend", "inputs": {"q": "first"}},
            {"id": "b", "capability": "spend", "inputs": {"q": "second"}, "deps": ["a"]},
            {"id": "c", "capability": "spend", "inputs": {"q": "third"}, "deps": ["b"]},
        ],
    }
    stub.usage = {"prompt_tokens": 100, "completion_tokens": 960, "total_tokens": 1060}
    _, status, events = asyncio.run(_run(tmp_path / "log.db", [Spender], plan, stub))
    # a spent $0.0106: the run is at its cap, b is not dispatched, the run halts
    assert len(stub.requests) == 1
    dispatched = {e.stream for e in events if isinstance(e.data, ev.TaskDispatched)}
    assert len(dispatched) == 1
    (halted,) = _of(events, ev.RunHalted)
    assert halted.reason == "budget_exceeded" and "spent of $0.0106" in halted.detail
    assert status == "halted"


def test_a_per_agent_budget_refuses_that_agents_calls_only(
    tmp_path: Path, stub: OpenAIStub
) -> None:
    stub.usage = {"prompt_tokens": 20, "completion_tokens": 430, "total_tokens": 450}
    plan = {
        "goal": "write and check",
        "budgets": {"agent:writer": {"tokens": 800}},
        "tasks": [
            {"id": "w", "capability": "write", "inputs": {"q": "tides"}},
            {"id": "c", "capability": "check", "inputs": {"q": "tides"}},
        ],
    }
    _, status, events = asyncio.run(_run(tmp_path / "log.db", [Writer, Checker], plan, stub))
    # the writer's second call: 450 spent plus about 475 would cross its 800
    refused = _of(events, ev.BudgetRefused)
    assert [(r.scope, r.agent_id) for r in refused] == [("agent:writer", "writer")]
    assert (
        refused[0].spent_tokens == 450
        and refused[0].spent_tokens + refused[0].estimate_tokens > 800
    )
    # the checker's two calls and the writer's first: three sent
    assert len(stub.requests) == 3
    completed = {e.agent_id for e in _of(events, ev.TaskCompleted)}
    assert completed == {"checker"}
    assert [f.reason for f in _of(events, ev.TaskFailed)] == ["budget_exceeded"]
    assert status == "failed"


def test_budgets_are_checked_in_the_plan() -> None:
    for bad in (
        {"budget_usd": -1},
        {"budgets": {"writer": {"usd": 1}}},
        {"budgets": {"agent:writer": {}}},
        {"budgets": {"role:review": {"tokens": -5}}},
        {"on_budget": "ignore"},
    ):
        plan = msgspec.convert(
            {"goal": "g", "tasks": [{"id": "a", "capability": "x"}], **bad}, Plan
        )
        with pytest.raises(InvalidPlan):
            validate_plan(plan)
    started = ev.RunStarted(goal="g", plan_id="p", budget_usd=1.0, budget_tokens=None)
    assert limits_of(started) == {"run": ev.BudgetLimit(usd=1.0)}


def test_the_estimate_reads_max_tokens_or_the_default() -> None:
    budgets = Budgets(prices=PRICES)
    tokens, usd = budgets.estimate("stub-model", {"max_tokens": 100}, 400)
    assert tokens == 200 and usd == pytest.approx(0.002)
    tokens, usd = budgets.estimate("stub-model", {}, 40)
    assert tokens == 10 + budgets.default_output_tokens
    assert budgets.estimate("no-price-model", {}, 40)[1] is None


def test_a_runs_ledger_is_folded_from_the_log_and_survives_a_snapshot(
    tmp_path: Path, stub: OpenAIStub
) -> None:
    from cardbus.bus.orchestrator import snapshot
    from cardbus.bus.orchestrator.runstate import RunState

    stub.usage = {"prompt_tokens": 20, "completion_tokens": 430, "total_tokens": 450}
    db = tmp_path / "log.db"
    root, _, events = asyncio.run(_run(db, [Wants500], _three_tasks(), stub))
    state = RunState()
    for env in events:
        state.apply(env)
    ledger = state.runs[root].budget
    assert ledger is not None and ledger.spent_tokens == {"run": 450} and not ledger.held
    again = snapshot.restore(snapshot.decode_state(snapshot.encode_state(state)), RunState())
    if root in again.runs:  # a finished run is not kept: an open one keeps its ledger
        assert again.runs[root].budget == ledger
    # an open run with a call in flight: its hold survives the snapshot
    state = RunState()
    for env in events:
        if isinstance(env.data, (ev.ModelAnswered, ev.RunCompleted, ev.RunFailed)):
            continue
        if isinstance(env.data, (ev.TaskCompleted, ev.TaskFailed, ev.TaskResultSubmitted)):
            continue
        state.apply(env)
    held = state.runs[root].budget
    assert held is not None and len(held.held) == 1
    again = snapshot.restore(snapshot.decode_state(snapshot.encode_state(state)), RunState())
    assert again.runs[root].budget == held
