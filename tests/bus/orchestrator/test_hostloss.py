"""Host losses (``bus.orchestrator.hostloss``): an attempt that dies with the embedded
process is retried without spending the task's attempts, and bounded on its own.

The SIGKILL version runs ``cardbus run`` in processes (``tests/e2e/test_host_loss.py``);
these drive ``EmbeddedRuntime`` in one process: a stop that gives the attempts back,
and the fold's counts."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from orchkit import FAST, TextOut, is_, make_agent, plan, run_log, task, tid, wait_for

from cardbus.bus import EmbeddedRuntime
from cardbus.bus.orchestrator import RetryPolicy
from cardbus.bus.orchestrator.hostloss import is_host_loss
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.eventstore.taskspec import RetryOverride


class _Gate:
    open = False


def _gated(task: Any, inputs: Any, ctx: Any) -> Any:
    if not _Gate.open:
        return asyncio.Event().wait()  # this process never answers
    return TextOut(text=inputs.text.upper())


AGENT = make_agent("held", "echo", _gated)


async def _stopped_mid_attempt(db_path: Path, retry: RetryOverride) -> str:
    """A runtime that stops (as `cardbus run` on Ctrl-C does) with the task in flight."""
    store = await SqliteEventStore.open(db_path, poll_interval=0.01)
    try:
        async with EmbeddedRuntime(store, [AGENT], FAST) as rt:
            root = await rt.orchestrator.submit(plan(task("a", timeout_s=60, retry=retry)))
            await wait_for(store, is_(ev.TaskStarted, tid(root, "a")))
        return root
    finally:
        await store.close()


async def test_a_stop_gives_the_attempt_back_without_spending_it(db_path: Path) -> None:
    _Gate.open = False
    # one attempt only: an agent_lost would have failed the task
    root = await _stopped_mid_attempt(db_path, RetryOverride(max_attempts=1))
    a = tid(root, "a")
    _Gate.open = True
    store = await SqliteEventStore.open(db_path, poll_interval=0.01)
    try:
        async with EmbeddedRuntime(store, [AGENT], FAST) as rt:
            r = await rt.orchestrator.wait(root, 30)
            view = rt.orchestrator.state.tasks[a]
            assert (view.failures, view.host_losses) == (0, 1)
        assert r.status == "completed" and r.outputs["a"] == {"text": "A"}
        log = await run_log(store, root)
        (timed_out,) = log.of(ev.TaskTimedOut, a)
        assert (timed_out.attempt, timed_out.reason) == (1, "host_lost")
        (retry,) = log.of(ev.TaskRetryScheduled, a)
        assert is_host_loss(retry.reason) and "host loss 1 of 5" in retry.reason
        assert [d.attempt for d in log.of(ev.TaskDispatched, a)] == [1, 2]
    finally:
        await store.close()


async def test_past_max_host_losses_the_task_fails_host_lost(db_path: Path) -> None:
    _Gate.open = False
    root = await _stopped_mid_attempt(db_path, RetryOverride(max_host_losses=0))
    a = tid(root, "a")
    store = await SqliteEventStore.open(db_path, poll_interval=0.01)
    try:
        async with EmbeddedRuntime(store, [AGENT], FAST) as rt:
            r = await rt.orchestrator.wait(root, 30)
        assert r.status == "failed"
        log = await run_log(store, root)
        (failed,) = log.of(ev.TaskFailed, a)
        assert failed.reason == "host_lost" and "max_host_losses is 0" in failed.error
        assert log.of(ev.TaskRetryScheduled, a) == []
    finally:
        await store.close()


def test_a_host_loss_is_told_from_an_agents_failure_by_its_reason() -> None:
    assert is_host_loss("host_lost: the process running x ended before it answered")
    assert is_host_loss("host_lost")
    assert not is_host_loss("agent_lost: x went before it answered")
    assert not is_host_loss("agent_error: host_lost in its message")
    assert RetryPolicy().max_host_losses == 5
