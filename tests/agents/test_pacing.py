"""The pacer: token buckets on a fake clock, the order waiters are served in, and the
limits learned from an endpoint's rate-limit headers (the loopback stub enforcing one)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest
from openai_stub import OpenAIStub

from cardbus.agents import Agent, Capability, TaskCard, TaskContext
from cardbus.agents.llm import OpenAIChatLLM
from cardbus.agents.pacing import Limit, Pacer, PaceState, parse_reset
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import LLMRateLimited
from cardbus.eventstore.sqlite import SqliteEventStore

KEY = ("stub", "m", "k")


class Q(msgspec.Struct):
    q: str = ""


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_reset_durations_as_providers_write_them() -> None:
    assert parse_reset("1s") == 1.0
    assert parse_reset("6m0s") == 360.0
    assert parse_reset("20ms") == pytest.approx(0.02)
    assert parse_reset("1h2m3.5s") == pytest.approx(3723.5)
    assert parse_reset("2.5") == 2.5
    assert parse_reset("soon") is None


def test_a_configured_limit_lets_a_burst_go_then_paces() -> None:
    state = PaceState()
    state.configure(Limit(requests_per_minute=60), now=0.0)  # a burst of 3, then 57 a minute
    for _ in range(3):
        assert state.wait_for(1, 0.0) == 0.0
        state.take(1, 0.0)
    assert state.wait_for(1, 0.0) == pytest.approx(60 / 57)
    assert state.wait_for(1, 60 / 57) == 0.0


def test_tokens_per_minute_pace_a_large_call() -> None:
    state = PaceState()
    state.configure(Limit(tokens_per_minute=6000), now=0.0)  # burst 300, 95 a second
    state.take(300, 0.0)
    assert state.wait_for(190, 0.0) == pytest.approx(2.0)


def test_headers_teach_the_limit_and_what_remains() -> None:
    state = PaceState()
    state.learn(
        {
            "X-RateLimit-Limit-Requests": "600",
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-requests": "100ms",
        },
        now=0.0,
    )
    assert state.requests is not None
    assert state.requests.rate == pytest.approx(9.5)  # 600 a minute, less the burst of 30
    assert state.wait_for(1, 0.0) == pytest.approx(1 / 9.5)  # none remains: wait for one


def test_a_configured_limit_is_not_overridden_by_headers() -> None:
    state = PaceState()
    state.configure(Limit(requests_per_minute=60), now=0.0)
    state.learn({"x-ratelimit-limit-requests": "6000"}, now=0.0)
    assert state.requests is not None and state.requests.rate == pytest.approx(57 / 60)


def test_a_429_holds_every_call_and_halves_the_pace() -> None:
    state = PaceState()
    state.learn({"x-ratelimit-limit-requests": "600"}, now=0.0)
    state.rate_limited_answer(2.0, now=0.0)
    assert state.wait_for(1, 1.0) == pytest.approx(1.0)  # held until 2.0
    assert state.requests is not None and state.requests.rate == pytest.approx(9.5 / 2)
    state.learn({"x-ratelimit-limit-requests": "600"}, now=2.5)  # past the hold: restored
    assert state.requests.rate == pytest.approx(9.5)


async def _grant_order(pacer: Pacer, asks: list[tuple[str, int]]) -> list[str]:
    """Hold the one concurrent slot, queue ``asks`` (run, priority), then release one
    at a time: the runs in the order they were granted."""
    await pacer.acquire(KEY, run="holder")
    order: list[str] = []

    async def ask(run: str, priority: int) -> None:
        await pacer.acquire(KEY, run=run, priority=priority)
        order.append(run)

    tasks = [asyncio.create_task(ask(r, p)) for r, p in asks]
    await asyncio.sleep(0)  # every ask is queued
    for n in range(len(asks)):
        pacer.release(KEY)
        while len(order) <= n:
            await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    return order


async def test_higher_priority_first_then_runs_round_robin() -> None:
    pacer = Pacer(clock=FakeClock())
    pacer.configure(KEY, Limit(concurrent=1))
    order = await _grant_order(pacer, [("a", 0), ("a", 0), ("a", 0), ("b", 0), ("urgent", 5)])
    assert order == ["urgent", "a", "b", "a", "a"]


async def test_round_robin_between_runs_on_the_real_clock() -> None:
    # waiters queued microseconds apart are equals: the runs take turns, not the oldest
    pacer = Pacer()
    pacer.configure(KEY, Limit(concurrent=1))
    order = await _grant_order(pacer, [("a", 0), ("a", 0), ("a", 0), ("b", 0), ("urgent", 5)])
    assert order == ["urgent", "a", "b", "a", "a"]


async def test_a_low_priority_waiter_ages_past_a_newer_high_one() -> None:
    clock = FakeClock()
    pacer = Pacer(clock=clock, aging_s=1.0)
    pacer.configure(KEY, Limit(concurrent=1))
    await pacer.acquire(KEY, run="holder")
    old = asyncio.create_task(pacer.acquire(KEY, run="old", priority=0))
    await asyncio.sleep(0)
    clock.now += 10.0  # waited 10 agings: worth priority 10
    new = asyncio.create_task(pacer.acquire(KEY, run="new", priority=3))
    await asyncio.sleep(0)
    pacer.release(KEY)
    assert await old == pytest.approx(10.0)  # the seconds it waited
    assert not new.done()
    pacer.release(KEY)
    await new


async def test_the_client_learns_the_limit_from_the_stub_and_backs_off_a_429() -> None:
    pacer = Pacer()
    with OpenAIStub() as stub:
        stub.limit_requests = 2
        stub.limit_window_s = 60.0
        llm = OpenAIChatLLM(stub.url, "m", max_retries=0, pacer=pacer)
        try:
            await llm.complete("one")  # nothing known yet: sent at once
            await llm.complete("two")  # the second of two the stub allows a minute
            state = pacer.state(llm.limit_key())
            assert state.requests is not None
            assert state.requests.rate == pytest.approx(1 / 60)  # learned from the headers
            # a second client of the same key shares the pace: no 429, it waits instead
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(
                    OpenAIChatLLM(stub.url, "m", max_retries=0, pacer=pacer).complete("three"),
                    0.2,
                )
            assert stub.rate_limited == 0
            # a 429 that comes anyway (the pacer was wrong) holds the key for its retry-after
            state.requests.level = 1.0
            with pytest.raises(LLMRateLimited):
                await llm.complete("four")
            assert stub.rate_limited == 1 and state.rate_limited == 1
            assert state.hold_until > pacer.clock()
        finally:
            await llm.aclose()


class Twice(Agent):
    agent_id = "twice"
    capabilities: ClassVar = [Capability("ask", Q, Q)]

    async def handle(self, task: TaskCard, inputs: Q, ctx: TaskContext) -> Q:
        await ctx.llm.chat([{"role": "user", "content": "one"}])
        second = await ctx.llm.chat([{"role": "user", "content": "two"}])
        return Q(q=second.text)


async def test_the_wait_for_the_limit_is_on_the_model_call_record(tmp_path: Path) -> None:
    pacer = Pacer(minute_s=30.0)  # a burst of one call, then one each 1.6 s (idle CPU)
    with OpenAIStub() as stub:
        llm = OpenAIChatLLM(stub.url, "m", pacer=pacer)
        pacer.configure(llm.limit_key(), Limit(requests_per_minute=20))
        async with (
            await SqliteEventStore.open(tmp_path / "log.db", poll_interval=0.01) as store,
            EmbeddedRuntime(store, [Twice], llm=llm) as rt,
        ):
            plan = {"goal": "ask", "tasks": [{"id": "t", "capability": "ask", "inputs": {}}]}
            result = await rt.run(plan)
            events = [e.data for e in await store.read_correlation(result.root_id)]
    assert result.status == "completed", result
    answered = [e for e in events if isinstance(e, ev.ModelAnswered)]
    assert [e.seq for e in answered] == [0, 1]
    assert answered[0].queued_s == 0.0  # the burst's one call went at once
    assert 0.0 < answered[1].queued_s <= answered[1].latency_s  # queued, within the latency


class TwiceQuick(Twice):
    agent_id = "twice-quick"


async def test_a_wait_for_the_limit_is_queued_not_the_tasks_run_time(tmp_path: Path) -> None:
    # one call a 2.5 s "minute" after the first: the second call waits about 2.5 s for its
    # slot, more than the task's 1 s timeout; queued, not running, it does not time out
    pacer = Pacer(minute_s=2.5)
    with OpenAIStub() as stub:
        llm = OpenAIChatLLM(stub.url, "m", pacer=pacer)
        pacer.configure(llm.limit_key(), Limit(requests_per_minute=2))
        async with (
            await SqliteEventStore.open(tmp_path / "log.db", poll_interval=0.01) as store,
            EmbeddedRuntime(store, [TwiceQuick], llm=llm) as rt,
        ):
            plan = {
                "goal": "ask",
                "tasks": [{"id": "t", "capability": "ask", "inputs": {}, "timeout_s": 1}],
            }
            result = await rt.run(plan)
            events = [e for e in await store.read_correlation(result.root_id)]
    assert result.status == "completed", result
    kinds = [type(e.data) for e in events]
    assert ev.TaskTimedOut not in kinds and ev.TaskRetryScheduled not in kinds
    queued = [e for e in events if isinstance(e.data, ev.ModelQueued)]
    granted = [e for e in events if isinstance(e.data, ev.ModelSlotGranted)]
    answered = [e.data for e in events if isinstance(e.data, ev.ModelAnswered)]
    assert [q.data.seq for q in queued] == [1] and [g.data.seq for g in granted] == [1]
    assert queued[0].data.limit.endswith("/m") and queued[0].data.max_wait_s == pacer.max_wait_s
    assert granted[0].data.waited_s > 1.0  # longer than the task's whole timeout
    assert granted[0].data.waited_s == pytest.approx(answered[1].queued_s, abs=1e-3)
    # in the log's order: asked, queued, granted, answered
    order = [kinds.index(t) for t in (ev.ModelQueued, ev.ModelSlotGranted)]
    assert order[0] < order[1] < max(i for i, k in enumerate(kinds) if k is ev.ModelAnswered)
    # replay shows the wait as queued for the model's limit, then the slot
    timeline = await _replay_of(tmp_path / "log.db", result.root_id)
    details = [s.detail or "" for n in timeline.tasks for s in n.steps]
    assert any(d.startswith("queued for the model's limit") for d in details), details
    assert any(d.startswith("slot of the model's limit after") for d in details), details
    # the task table (what the console lists) says "queued" while the call waits
    queued_at = kinds.index(ev.ModelQueued)
    assert _task_reason(events[: queued_at + 1]).startswith("queued for the model's limit")
    assert _task_reason(events[: kinds.index(ev.ModelSlotGranted) + 1]) is None


async def _replay_of(path: Path, root_id: str) -> Any:
    from cardbus.projections.replay import replay

    async with await SqliteEventStore.open(path) as store:
        return await replay(store, root_id)


def _task_reason(events: list[Any]) -> Any:
    from types import SimpleNamespace

    from cardbus.projections.model import MemoryTable
    from cardbus.projections.tasks import TASKS, TaskTable

    table = MemoryTable(TASKS)
    assert not TaskTable().apply_many(SimpleNamespace(tables={"proj_tasks": table}), events)  # type: ignore[arg-type]
    (row,) = [r for r in table.data.values() if r["capability"] == "ask"]
    return row["reason"]


def test_a_limits_file_in_toml_or_json_configures_keys_by_model_and_endpoint(
    tmp_path: Path,
) -> None:
    from cardbus.agents.pacing import LimitTable
    from cardbus.eventstore.errors import ConfigError

    toml = tmp_path / "limits.toml"
    toml.write_text(
        '[models."gpt-4o-mini"]\nrequests_per_minute = 500\ntokens_per_minute = 200000\n'
        '[models."llama*"]\nconcurrent = 4\nendpoint = "localhost:8000"\n'
    )
    as_json = tmp_path / "limits.json"
    as_json.write_text(
        '{"models": {"gpt-4o-mini": {"requests_per_minute": 500, "tokens_per_minute": 200000},'
        ' "llama*": {"concurrent": 4, "endpoint": "localhost:8000"}}}'
    )
    for path in (toml, as_json):
        table = LimitTable.load(path)
        assert table.limit_for(("api.openai.com", "gpt-4o-mini", "k")) == Limit(500, 200000)
        assert table.limit_for(("localhost:8000", "Llama-3", "k")) == Limit(concurrent=4)
        assert table.limit_for(("other:8000", "llama-3", "k")) is None  # another endpoint
    # a pacer keeps a configured limit for the keys it meets, whatever the headers say
    pacer = Pacer(limits=LimitTable.load(toml))
    state = pacer.state(("api.openai.com", "gpt-4o-mini", "k"))
    state.learn({"x-ratelimit-limit-requests": "10000"}, now=pacer.clock())
    assert state.configured and state.requests_per_minute == 500
    for bad, says in (
        ("{}", "no 'models' table"),
        ('{"models": {"m": {"rpm": 5}}}', "fields are"),
        ('{"models": {"m": {"concurrent": 0}}}', "concurrent must be a positive number"),
        ("{not json", "limits file"),
    ):
        as_json.write_text(bad)
        with pytest.raises(ConfigError, match=says):
            LimitTable.load(as_json)


def test_429s_in_a_row_halve_the_pace_down_to_a_floor() -> None:
    from cardbus.agents.pacing import MIN_SLOWDOWN

    state = PaceState()
    state.learn({"x-ratelimit-limit-requests": "600"}, now=0.0)
    for n in range(10):
        state.rate_limited_answer(0.1, now=float(n))
    assert state.slowdown == MIN_SLOWDOWN  # not 1/1024: the next answer comes in time
    assert state.requests is not None and state.requests.rate == pytest.approx(9.5 / 16)


def test_a_bucket_that_starts_empty_has_no_burst() -> None:
    # a cluster's member: the others may burst at the same moment (pace_share)
    state = PaceState(start_empty=True)
    state.learn({"x-ratelimit-limit-requests": "600"}, now=0.0)
    assert state.requests is not None and state.requests.level == 0.0
    assert state.wait_for(1, 0.0) == pytest.approx(1 / 9.5)
