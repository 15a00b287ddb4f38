"""Inputs that used to wedge a run end it cleanly (issue 14, "Nothing can wedge a run").

Each test reproduces one measured wedge through the public API and checks
that the run (or the orchestrator) ends with a named reason, within seconds,
without a hot loop of error lines.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import msgspec
import pytest
from orchkit import TextOut, make_agent, plan, run_log, task

from cardbus.agents.cards import AgentCard, Announce
from cardbus.bus.orchestrator.plan import decode_plan, validate_plan
from cardbus.eventstore import Append, Envelope, EventStore, MemoryEventStore
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import InvalidPlan, PayloadTooLarge
from cardbus.projections import AgentStat, AgentStats, Cost, ProjectionRunner, TaskTable

BIG = "x" * 600_000  # two of these are over the log's 1 MiB event limit


async def test_outputs_too_large_for_run_completed_fail_the_run_with_the_reason(
    store, make_runtime, caplog: pytest.LogCaptureFixture
) -> None:
    big = make_agent("big", handler=lambda t, i, c: TextOut(text=BIG))
    rt = await make_runtime([big])
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING):
        result = await rt.run(plan(task("a"), task("b")), timeout=20)
    assert time.monotonic() - t0 < 10
    assert result.status == "failed"
    assert result.reason == "result_too_large"
    assert "run.completed" in result.detail and "limit" in result.detail
    assert result.outputs["a"] == {"text": BIG}  # each task's output is in its own stream
    log = await run_log(store, result.root_id)
    assert len(log.of(ev.TaskCompleted)) == 2
    assert [f.reason for f in log.of(ev.RunFailed)] == ["result_too_large"]
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(noisy) <= 3, [r.getMessage()[:200] for r in noisy]


class RefusingStore(MemoryEventStore):
    """A log that refuses every run.completed as too large (a limit the Decider does
    not know of): the generic path for a decision the log will not take."""

    async def append_many(self, appends: Sequence[Append]) -> list[list[Envelope] | Exception]:
        refused = [any(isinstance(e.data, ev.RunCompleted) for e in a.events) for a in appends]
        kept = [a for a, r in zip(appends, refused, strict=True) if not r]
        done = iter(await super().append_many(kept) if kept else [])
        return [PayloadTooLarge(2_000_000, 1_000_000) if r else next(done) for r in refused]


async def test_a_decision_the_log_refuses_fails_the_run_once(
    make_runtime, caplog: pytest.LogCaptureFixture
) -> None:
    store = RefusingStore()
    rt = await make_runtime([make_agent("echo")], store=store)
    with caplog.at_level(logging.WARNING):
        result = await rt.run(plan(task("a")), timeout=20)
    assert result.status == "failed"
    assert result.reason == "decision_unstorable"
    assert "PayloadTooLarge" in result.detail
    assert result.outputs == {"a": {"text": "a"}}
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage()[:200] for r in errors]  # once, not a hot loop


async def test_a_task_id_too_long_for_its_streams_is_refused_before_anything_is_written(
    store, make_runtime
) -> None:
    rt = await make_runtime([make_agent("echo")])
    before = len(await store.read_all(0, 100_000))
    with pytest.raises(InvalidPlan, match=r"task id .* over the limit of 128 \(MAX_ID_CHARS\)"):
        await rt.orch.submit(plan(task("t" * 500)))
    with pytest.raises(InvalidPlan, match=r"capability .*MAX_ID_CHARS"):
        await rt.orch.submit(plan(task("a", capability="c" * 129)))
    with pytest.raises(InvalidPlan, match=r"plan_id .*MAX_ID_CHARS"):
        await rt.orch.submit(plan(task("a"), plan_id="p" * 600))
    assert len(await store.read_all(0, 100_000)) == before  # nothing half written
    ok = await rt.run(plan(task("t" * 128)), timeout=10)  # at the limit: it runs
    assert ok.status == "completed"


def nested(depth: int) -> bytes:
    return b"[" * depth + b"1" + b"]" * depth


@pytest.mark.parametrize("depth", [65, 5000])
async def test_a_plan_nested_too_deep_is_refused_naming_the_limit(
    store, make_runtime, depth: int
) -> None:
    rt = await make_runtime([make_agent("echo")])
    text = b'{"goal":"g","tasks":[{"id":"a","capability":"echo","inputs":{"text":%s}}]}'
    with pytest.raises(InvalidPlan, match=r"nested deeper than 64 levels \(MAX_DEPTH\)"):
        validate_plan(decode_plan(text % nested(depth)))
    before = len(await store.read_all(0, 100_000))
    with pytest.raises(InvalidPlan, match="MAX_DEPTH"):
        await rt.orch.submit(msgspec.json.decode(text % nested(min(depth, 500))))
    assert len(await store.read_all(0, 100_000)) == before


async def test_an_announcement_with_an_over_long_agent_id_is_dead_lettered(
    store, make_runtime, caplog: pytest.LogCaptureFixture
) -> None:
    rt = await make_runtime([make_agent("echo")])
    bad = AgentCard(agent_id="a" * 600, name="long")
    with caplog.at_level(logging.WARNING):
        await rt.bus.reply(Announce(card=bad))
        result = await rt.run(plan(task("x")), timeout=10)  # the loop still decides
        await rt.bus.reply(Announce(card=bad))
        again = await rt.run(plan(task("y")), timeout=10)
    assert result.status == again.status == "completed"
    reasons = [r for s, r in rt.orch.bad_messages if s.startswith("cardbus.announce.")]
    assert len(reasons) == 2 and "MAX_ID_CHARS" in reasons[0]
    assert not [r for r in caplog.records if r.exc_info]  # no traceback
    assert not [e for e in await store.read_all(0, 100_000) if len(e.stream) > 200]


@pytest.mark.parametrize(
    ("usage", "output", "problem"),
    [
        ({"input_tokens": 2**64}, "ok", "MAX_TOKENS"),
        ({"output_tokens": 2**53 + 1}, "ok", "MAX_TOKENS"),
        ({}, "deep", "MAX_DEPTH"),
    ],
)
async def test_results_out_of_range_fail_the_attempt_and_stats_still_work(
    store, make_runtime, usage: dict[str, int], output: str, problem: str
) -> None:
    def handler(t, i, ctx):  # type: ignore[no-untyped-def]
        if usage:
            ctx.usage(**usage)
        if output == "deep":
            v: object = "x"
            for _ in range(200):
                v = [v]
            return {"text": v}
        return TextOut(text="ok")

    odd = make_agent("odd", handler=handler, output_type=Any)
    rt = await make_runtime([odd])
    result = await rt.run(plan(task("a", max_attempts=1)), timeout=10)
    assert result.status == "failed"
    log = await run_log(store, result.root_id)
    submitted = log.of(ev.TaskResultSubmitted)
    assert submitted and problem in (submitted[0].error or "")
    assert submitted[0].usage == ev.Usage() and submitted[0].output is None
    assert await project(store)  # stats and rebuild work


async def project(store: EventStore) -> list[AgentStat]:
    """``cardbus stats`` and ``cardbus rebuild`` through the projections' public API."""
    runner = ProjectionRunner.open(store, ":memory:")
    try:
        await runner.catch_up()
        await runner.rebuild()
        Cost().list(runner.conn)
        TaskTable().list(runner.conn)
        return AgentStats().all(runner.conn)
    finally:
        runner.close()
