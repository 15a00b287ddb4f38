"""Timeouts: an attempt still running past its deadline times out and is retried."""

from __future__ import annotations

import asyncio

from orchkit import TableEmbedder, TextOut, ev, make_agent, plan, run_log, task, tid


async def _hang(t, i, c):  # type: ignore[no-untyped-def]
    await asyncio.sleep(3600)


async def test_a_hanging_agent_times_out_and_another_agent_completes(make_runtime, store):
    emb = TableEmbedder({"hanger": 0.9, "steady": 0.7})
    rt = await make_runtime(
        [
            make_agent("hanger", handler=_hang, description="hanger"),
            make_agent("steady", description="steady"),
        ],
        embedder=emb,
    )
    r = await rt.run(plan(task("t", timeout_s=0.3)))
    assert r.status == "completed"
    log = await run_log(store, r.root_id)
    t = tid(r.root_id, "t")
    first = log.first(ev.TaskDispatched, t)
    timed_out = log.first(ev.TaskTimedOut, t)
    assert (timed_out.data.attempt, timed_out.data.agent_id) == (1, "hanger")
    # the deadline counts from the start (task.started), not the dispatch (deadlines)
    started = log.first(ev.TaskStarted, t)
    assert first.data.timeout_s == 0.3 and timed_out.data.reason == "deadline"
    assert timed_out.data.deadline == started.recorded_at + first.data.timeout_s
    assert timed_out.recorded_at >= timed_out.data.deadline
    retry = log.first(ev.TaskRetryScheduled, t).data
    assert retry.attempt == 2 and retry.reason.startswith("timeout")
    second = log.of(ev.TaskDispatched, t)[1]
    assert second.agent_id == "steady"  # the timeout counted against the hanging agent
    assert log.first(ev.TaskCompleted, t).data.agent_id == "steady"


async def test_a_later_attempt_completes_and_the_late_answer_is_ignored(make_runtime, store):
    async def slow_first(t, i, c):  # type: ignore[no-untyped-def]
        if t.attempt == 1:
            await asyncio.sleep(0.6)
            return TextOut(text="late")
        return TextOut(text="on time")

    rt = await make_runtime([make_agent("sometimes", handler=slow_first)], concurrency=2)
    r = await rt.run(plan(task("t", timeout_s=0.3)))
    assert r.outputs["t"] == {"text": "on time"}
    t = tid(r.root_id, "t")
    # the late answer of attempt 1 arrives when its handler is done (0.6 s after it began,
    # later on a busy machine): waited for in the log, not for a fixed time
    for _ in range(600):
        log = await run_log(store, r.root_id)
        if log.of(ev.TaskResultIgnored, t):
            break
        await asyncio.sleep(0.05)
    assert [x.attempt for x in log.of(ev.TaskTimedOut, t)] == [1]
    assert [x.attempt for x in log.of(ev.TaskDispatched, t)] == [1, 2]
    ignored = log.first(ev.TaskResultIgnored, t).data
    assert ignored.attempt == 1 and ignored.reason == "stale_attempt"
    assert len(log.of(ev.TaskCompleted, t)) == 1
    assert [x.attempt for x in log.of(ev.TaskResultSubmitted, t)] == [2]


async def test_every_attempt_hanging_fails_with_timeout(make_runtime, store):
    rt = await make_runtime([make_agent("hanger", handler=_hang)], concurrency=3)
    r = await rt.run(plan(task("t", timeout_s=0.2, max_attempts=2)))
    assert r.status == "failed"
    log = await run_log(store, r.root_id)
    t = tid(r.root_id, "t")
    # each attempt timed out: by the orchestrator's deadline, or (on a busy machine, its
    # timer late) by the worker's backstop, which cancels the handler and says "timeout"
    by_orchestrator = {x.attempt for x in log.of(ev.TaskTimedOut, t)}
    by_worker = {
        x.attempt
        for x in log.of(ev.TaskResultSubmitted, t)
        if x.status == "failed" and (x.error or "").startswith("TimeoutError: still running")
    } - by_orchestrator
    assert sorted(by_orchestrator | by_worker) == [1, 2], log.summary()
    retried = [x.reason for x in log.of(ev.TaskRetryScheduled, t)]
    assert len(retried) == 1 and retried[0].startswith("timeout"), retried
    failed = log.first(ev.TaskFailed, t).data
    assert failed.reason == "timeout" and failed.attempts == 2


async def test_a_hung_handler_does_not_block_the_agents_inbox(make_runtime, store):
    async def hang_first(t, i, c):  # type: ignore[no-untyped-def]
        if t.attempt == 1:
            await asyncio.sleep(3600)
        return TextOut(text="second try")

    # one consumer (the default): a retry can only run if attempt 1's handler is let go
    rt = await make_runtime([make_agent("solo", handler=hang_first)])
    r = await rt.run(plan(task("t", timeout_s=0.3)), timeout=5)
    assert r.outputs["t"] == {"text": "second try"}
    await asyncio.sleep(0.1)
    log = await run_log(store, r.root_id)
    t = tid(r.root_id, "t")
    assert log.first(ev.TaskTimedOut, t).data.attempt == 1
    assert log.first(ev.TaskCompleted, t).data.attempt >= 2
    # the worker's own failure for attempt 1 came after the orchestrator gave up on it
    late = log.first(ev.TaskResultIgnored, t).data
    assert late.attempt == 1 and late.agent_id == "solo"
    assert all(x.status == "completed" for x in log.of(ev.TaskResultSubmitted, t))
