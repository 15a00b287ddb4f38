"""Budgets are bounds (issue 30, item 6): a call under a cap is sent with ``max_tokens``
that fits what the cap leaves, so an endpoint that honours it cannot answer past the cap;
one that ignores it is recorded (``overrun_tokens``) and the next dispatch stops.

Real parts: ``EmbeddedRuntime`` on a SQLite file, ``OpenAIChatLLM`` to the OpenAI-compatible
stub on loopback (it honours ``max_tokens`` as a real server does: the answer cut, finish
reason ``length``; or, told to, ignores it), a price file named by ``CARDBUS_PRICES``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest

from cardbus.agents import Agent, Capability, TaskCard, TaskContext
from cardbus.agents.llm import OpenAIChatLLM
from cardbus.bus.orchestrator import Policy, RetryPolicy
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import events as ev
from cardbus.eventstore.sqlite import SqliteEventStore
from tests.agents.openai_stub import OpenAIStub, Reply

PRICE = 1000.0 / 1_000_000  # USD a token, input and output: $1,000 per million
LONG = Reply(
    content=" ".join(["tok"] * 5000), usage={"prompt_tokens": 10, "completion_tokens": 5000}
)


class Q(msgspec.Struct):
    q: str


class A(msgspec.Struct):
    answer: str


class Talker(Agent):
    """One call through ``ctx.llm``; it names no max_tokens of its own."""

    agent_id = "talker"
    capabilities: ClassVar = [Capability("talk", Q, A)]

    async def handle(self, task: TaskCard, inputs: Q, ctx: TaskContext) -> A:
        done = await ctx.llm.chat([{"role": "user", "content": inputs.q}])
        return A(answer=done.text[:40])


@pytest.fixture
def prices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = tmp_path / "prices.toml"
    table.write_text('[models."stub-*"]\ninput = 1000\noutput = 1000\n')
    monkeypatch.setenv("CARDBUS_PRICES", str(table))


def _plan(cap: dict[str, Any], steps: int = 1) -> dict[str, Any]:
    tasks = [{"id": "t0", "capability": "talk", "inputs": {"q": "go on at length"}}]
    for i in range(1, steps):
        tasks.append({"id": f"t{i}", "capability": "talk", "inputs": {"q": "more"}})
        tasks[-1]["deps"] = [f"t{i - 1}"]
    return {"goal": "talk", **cap, "tasks": tasks}


async def _run(
    db: Path, stub: OpenAIStub, plan: dict[str, Any], max_tokens: int | None = None
) -> tuple[str, list[Any]]:
    llm = OpenAIChatLLM(stub.url, "stub-model", max_tokens=max_tokens)
    policy = Policy(retry=RetryPolicy(max_attempts=1))
    async with (
        await SqliteEventStore.open(db, poll_interval=0.01) as store,
        EmbeddedRuntime(store, [Talker], policy, llm=llm) as rt,
    ):
        root = await rt.orchestrator.submit(plan)
        result = await rt.orchestrator.wait(root, timeout=60)
        return result.status, [e.data for e in await store.read_correlation(root)]


def _of(events: list[Any], kind: type) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


def _spent(answered: list[ev.ModelAnswered]) -> tuple[int, float]:
    tokens = sum(a.input_tokens + a.output_tokens for a in answered)
    return tokens, sum(a.cost_usd or 0.0 for a in answered)


@pytest.mark.parametrize(
    "cap", [{"budget_usd": 3.0}, {"budget_tokens": 3000}], ids=["usd", "tokens"]
)
async def test_a_long_answer_under_a_cap_is_sent_a_max_tokens_that_fits_it(
    tmp_path: Path, prices: None, cap: dict[str, Any]
) -> None:
    with OpenAIStub() as stub:
        stub.script(LONG)
        status, events = await _run(tmp_path / "log.db", stub, _plan(cap))
        bodies = stub.bodies()
    assert status == "completed"
    (sent,) = bodies
    (requested,) = _of(events, ev.ModelRequested)
    (answered,) = _of(events, ev.ModelAnswered)
    # the call carried the bound its reservation assumed, and the reservation fits the cap
    assert sent["max_tokens"] == requested.max_tokens == 1024  # the default output bound
    assert requested.reserved_tokens <= 3000
    assert requested.reserved_usd is not None and requested.reserved_usd <= 3.0
    # the stub honoured it: the answer was cut there
    assert answered.output_tokens == 1024 and answered.answer["finish_reason"] == "length"
    assert answered.overrun_tokens == 0
    tokens, usd = _spent([answered])
    assert tokens <= 3000 and usd <= 3.0
    assert usd == pytest.approx((10 + 1024) * PRICE)


async def test_the_models_own_max_tokens_is_reserved_and_sent_when_it_fits(
    tmp_path: Path, prices: None
) -> None:
    with OpenAIStub() as stub:
        stub.script(LONG)
        status, events = await _run(tmp_path / "log.db", stub, _plan({"budget_usd": 3.0}), 2500)
        bodies = stub.bodies()
    assert status == "completed"
    (requested,) = _of(events, ev.ModelRequested)
    (answered,) = _of(events, ev.ModelAnswered)
    assert bodies[0]["max_tokens"] == requested.max_tokens == 2500
    assert requested.reserved_usd is not None and 2.5 < requested.reserved_usd <= 3.0
    assert answered.output_tokens == 2500
    assert _spent([answered])[1] <= 3.0


async def test_a_max_tokens_past_what_the_cap_leaves_is_refused_not_sent(
    tmp_path: Path, prices: None
) -> None:
    with OpenAIStub() as stub:
        stub.script(LONG)
        status, events = await _run(tmp_path / "log.db", stub, _plan({"budget_usd": 3.0}), 4000)
        sent = len(stub.requests)
    assert sent == 0
    (refused,) = _of(events, ev.BudgetRefused)
    assert refused.estimate_usd is not None and refused.estimate_usd > 3.0
    assert status == "failed"
    assert [f.reason for f in _of(events, ev.TaskFailed)] == ["budget_exceeded"]


@pytest.mark.parametrize(
    "cap", [{"budget_usd": 3.0}, {"budget_tokens": 3000}], ids=["usd", "tokens"]
)
async def test_an_endpoint_that_ignores_max_tokens_is_recorded_and_the_next_dispatch_stops(
    tmp_path: Path, prices: None, cap: dict[str, Any]
) -> None:
    with OpenAIStub() as stub:
        stub.ignore_max_tokens = True
        stub.script(LONG, LONG)
        status, events = await _run(tmp_path / "log.db", stub, _plan(cap, steps=2))
        bodies = stub.bodies()
    # sent with its bound, answered past it: recorded, counted, and nothing more goes out
    assert len(bodies) == 1 and bodies[0]["max_tokens"] == 1024
    (answered,) = _of(events, ev.ModelAnswered)
    assert answered.output_tokens == 5000 and answered.overrun_tokens == 5000 - 1024
    tokens, usd = _spent([answered])
    assert tokens == 5010 and usd == pytest.approx(5010 * PRICE)
    dispatched = {e.attempt for e in _of(events, ev.TaskDispatched)}
    assert len(_of(events, ev.TaskDispatched)) == 1 and dispatched == {1}
    (halted,) = _of(events, ev.RunHalted)
    assert halted.reason == "budget_exceeded"
    assert status == "halted"
