"""Retries: a per-task budget, exponential backoff with jitter, the reason recorded."""

from __future__ import annotations

import random

from orchkit import TextOut, ev, make_agent, plan, run_log, task, tid

from cardbus.bus import Policy
from cardbus.bus.orchestrator import RetryPolicy


def _fail_until(n: int):  # type: ignore[no-untyped-def]
    def handler(t, i, c):  # type: ignore[no-untyped-def]
        if t.attempt < n:
            raise RuntimeError(f"boom {t.attempt}")
        return TextOut(text="ok")

    return handler


async def test_failed_attempts_are_retried_with_growing_backoff(make_runtime, store):
    policy = Policy(retry=RetryPolicy(initial_interval_s=0.05, jitter=0.5), tick_s=0.005)
    rt = await make_runtime([make_agent("flaky", handler=_fail_until(3))], policy=policy)
    r = await rt.run(plan(task("t")))
    assert r.status == "completed"
    log = await run_log(store, r.root_id)
    t = tid(r.root_id, "t")
    retries = log.e(ev.TaskRetryScheduled, t)
    assert [x.data.attempt for x in retries] == [2, 3]
    assert [x.data.reason for x in retries] == [
        "agent_error: RuntimeError: boom 1",
        "agent_error: RuntimeError: boom 2",
    ]
    d1, d2 = (x.data.delay_s for x in retries)
    assert 0.05 <= d1 <= 0.05 * 1.5 + 1e-6
    assert 0.10 <= d2 <= 0.10 * 1.5 + 1e-6
    assert d2 > d1
    dispatched = log.e(ev.TaskDispatched, t)
    assert [x.data.attempt for x in dispatched] == [1, 2, 3]
    for retry, nxt in zip(retries, dispatched[1:], strict=True):
        decided_at = retry.data.not_before - retry.data.delay_s  # the decider's clock
        assert 0 <= retry.recorded_at - decided_at < 0.5  # decided, then recorded
        assert nxt.recorded_at >= retry.data.not_before - 1e-3  # the backoff was honoured
    assert log.first(ev.TaskCompleted, t).data.attempt == 3


async def test_jitter_spreads_the_delays(make_runtime, store):
    policy = Policy(retry=RetryPolicy(initial_interval_s=0.01, jitter=1.0), tick_s=0.005)
    rt = await make_runtime(
        [make_agent("flaky", handler=_fail_until(99))], policy=policy, rng=random.Random(7)
    )
    r = await rt.run(plan(*(task(f"t{i}", max_attempts=2) for i in range(6))))
    log = await run_log(store, r.root_id)
    delays = [x.delay_s for x in log.of(ev.TaskRetryScheduled)]
    assert len(delays) == 6
    assert all(0.01 <= d <= 0.02 + 1e-6 for d in delays)
    assert len(set(delays)) > 1  # jitter: not all the same


async def test_past_the_budget_the_task_fails_and_dependents_are_cancelled(make_runtime, store):
    rt = await make_runtime([make_agent("broken", handler=_fail_until(99))])
    r = await rt.run(plan(task("a"), task("b", deps=["a"]), task("c", deps=["b"])))
    assert r.status == "failed"
    log = await run_log(store, r.root_id)
    a, b, c = (tid(r.root_id, n) for n in "abc")
    assert len(log.of(ev.TaskDispatched, a)) == 3  # default max_attempts
    assert len(log.of(ev.TaskRetryScheduled, a)) == 2
    failed = log.first(ev.TaskFailed, a).data
    assert (failed.reason, failed.attempts) == ("agent_error", 3)
    assert "boom 3" in failed.error
    cb = log.first(ev.TaskCancelled, b).data
    cc = log.first(ev.TaskCancelled, c).data
    assert cb.cause_task_id == a and cc.cause_task_id == b
    assert cb.reason == "dependency_failed"
    assert not log.of(ev.TaskDispatched, b) and not log.of(ev.TaskDispatched, c)
    assert log.first(ev.RunFailed).data.failed_tasks == sorted([a, b, c])
    assert r.reason == "tasks_not_completed"


async def test_max_attempts_is_per_task(make_runtime, store):
    rt = await make_runtime([make_agent("broken", handler=_fail_until(99))])
    r = await rt.run(plan(task("once", max_attempts=1), task("twice", max_attempts=2)))
    log = await run_log(store, r.root_id)
    assert len(log.of(ev.TaskDispatched, tid(r.root_id, "once"))) == 1
    assert not log.of(ev.TaskRetryScheduled, tid(r.root_id, "once"))
    assert len(log.of(ev.TaskDispatched, tid(r.root_id, "twice"))) == 2
