"""Inputs that used to wedge a run end it cleanly (issue 14, "Nothing can wedge a run").

Each test reproduces one measured wedge through the public API and checks
that the run (or the orchestrator) ends with a named reason, within seconds,
without a hot loop of error lines.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import pytest
from orchkit import TextOut, make_agent, plan, run_log, task

from cardbus.eventstore import Append, Envelope, MemoryEventStore
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import PayloadTooLarge

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
