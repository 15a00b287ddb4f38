"""cardbus's own metrics against the log that the runs wrote: the two journal runs of
tests/journal_log.py (a retry whose second attempt replays two model calls; a run whose
process "dies" during a tool call and whose next process resumes it), recorded into the
SDK's in-memory metric reader (the same instruments and code path the OTLP exporter is fed
by; test_otlp_llm_mcp_run.py exports them for real).

Every figure is computed again from the log, so a metric that counts an event twice, or
misses one, or counts a replayed call, fails here.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from journal_log import write_journal_runs
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from cardbus.bus import meters
from cardbus.bus.run_metrics import RunMetrics
from cardbus.eventstore import events as ev
from cardbus.eventstore.sqlite import SqliteEventStore


def _points(
    reader: InMemoryMetricReader,
) -> dict[str, tuple[str, list[tuple[dict[str, Any], Any]]]]:
    data = reader.get_metrics_data()
    out: dict[str, tuple[str, list[tuple[dict[str, Any], Any]]]] = {}
    assert data is not None
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out[m.name] = (m.unit, [(dict(p.attributes or {}), p) for p in m.data.data_points])
    return out


async def _log(db: Path) -> list[Any]:
    async with await SqliteEventStore.open(db) as store:
        return await store.read_all(0, 100_000)


def _short(reason: str) -> str:
    return reason.split(":", 1)[0].strip()


@pytest.fixture
def reader() -> Any:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    meters.use_meter_provider(provider)
    try:
        yield reader
    finally:
        meters.use_meter_provider(None)
        provider.shutdown()


def test_the_metrics_agree_with_the_log(
    reader: InMemoryMetricReader, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"stub-model*": {"input": 3.0, "output": 15.0}}))
    monkeypatch.setenv("CARDBUS_PRICES", str(prices))
    runs = asyncio.run(write_journal_runs(tmp_path / "log.db"))
    events = asyncio.run(_log(runs.db))
    got = _points(reader)
    data = [e.data for e in events]
    capability = {e.stream: e.data.capability for e in events if isinstance(e.data, ev.TaskCreated)}

    unit, points = got["cardbus.runs.finished"]
    assert unit == "{run}"
    ended = [d for d in data if isinstance(d, (ev.RunCompleted, ev.RunFailed, ev.RunHalted))]
    assert len(ended) == 2
    assert sum(p.value for a, p in points if a["cardbus.run.status"] == "completed") == 2

    # the unknown-effect run was started by a process that stopped; the one that resumed it
    # did not see its start: one duration only, the retry run's, exact
    unit, points = got["cardbus.run.duration"]
    assert unit == "s"
    [(_, point)] = points
    at = {
        (e.stream, type(e.data)): e.recorded_at
        for e in events
        if isinstance(e.data, (ev.RunStarted, ev.RunCompleted))
    }
    took = at[(runs.retry_root, ev.RunCompleted)] - at[(runs.retry_root, ev.RunStarted)]
    assert point.count == 1 and abs(point.sum - took) < 1e-6

    unit, points = got["cardbus.tasks.finished"]
    assert unit == "{task}"
    counted = Counter(
        {(a["cardbus.task.status"], a.get("cardbus.task.capability")): p.value for a, p in points}
    )
    expected = Counter(
        ("completed", capability[e.stream]) for e in events if isinstance(e.data, ev.TaskCompleted)
    )
    # the resumed run's task was created before its process started: its capability is
    # found in the orchestrator's state, not lost
    assert counted == expected == {("completed", "ask"): 1, ("completed", "pay"): 1}

    unit, points = got["cardbus.task.retries"]
    assert unit == "{retry}"
    counted = Counter({a["cardbus.retry.reason"]: p.value for a, p in points})
    scheduled = [d for d in data if isinstance(d, ev.TaskRetryScheduled)]
    assert scheduled and counted == Counter(_short(d.reason) for d in scheduled)

    # queue wait: each answered attempt, dispatch to the handler's start
    unit, points = got["cardbus.task.queue_wait"]
    assert unit == "s"
    dispatched = {
        (e.stream, e.data.attempt): e.recorded_at
        for e in events
        if isinstance(e.data, ev.TaskDispatched)
    }
    waits = [
        max(0.0, e.recorded_at - e.data.duration_s - dispatched[(e.stream, e.data.attempt)])
        for e in events
        if isinstance(e.data, ev.TaskResultSubmitted)
    ]
    assert sum(p.count for _, p in points) == len(waits) >= 3
    assert abs(sum(p.sum for _, p in points) - sum(waits)) < 1e-6

    # cost: the live calls only, as priced when recorded (the replayed two cost nothing)
    unit, points = got["cardbus.model.cost"]
    assert unit == "{USD}"
    live = [d for d in data if isinstance(d, ev.ModelAnswered) and d.replayed_from is None]
    replayed = [d for d in data if isinstance(d, ev.ModelAnswered) and d.replayed_from]
    assert len(live) == 3 and len(replayed) == 2
    spent = sum(d.input_tokens * 3.0 + d.output_tokens * 15.0 for d in live) / 1e6
    assert spent > 0
    assert abs(sum(p.value for _, p in points) - spent) < 1e-12
    for attrs, _ in points:
        assert attrs == {
            "gen_ai.agent.id": "asker",
            "gen_ai.provider.name": "127.0.0.1",
            "gen_ai.request.model": "stub-model",
        }

    _, points = got["gen_ai.client.operation.duration"]
    assert sum(p.count for _, p in points) == len(live)


def test_nothing_is_folded_without_a_meter_provider() -> None:
    """No SDK provider: the observer returns at once (it keeps no state to grow)."""
    metrics = RunMetrics()
    env: Any = type("E", (), {"data": ev.RunStarted(goal="g", plan_id="p"), "stream": "r"})()
    metrics.observe(env)
    assert not metrics._run_started and not metrics._tasks


def test_runs_another_orchestrator_owns_are_not_counted(reader: InMemoryMetricReader) -> None:
    metrics = RunMetrics(owns=lambda root: root == "mine")

    def env(root: str, data: Any) -> Any:
        return type(
            "E", (), {"data": data, "stream": root, "correlation_id": root, "recorded_at": 1.0}
        )()

    metrics.observe(env("mine", ev.RunCompleted()))
    metrics.observe(env("theirs", ev.RunCompleted()))
    metrics.observe(env("theirs", ev.RunFailed(reason="tasks_not_completed")))
    _, points = _points(reader)["cardbus.runs.finished"]
    assert [(a["cardbus.run.status"], p.value) for a, p in points] == [("completed", 1)]


def test_a_failed_call_has_a_duration_with_its_error_type_and_no_tokens(
    reader: InMemoryMetricReader,
) -> None:
    """The conventions: ``error.type`` is required on the duration of a call that failed;
    a failed call reports no token usage. A replayed call records nothing at all."""
    metrics = RunMetrics()

    def env(data: Any, t: float) -> Any:
        fields = {"data": data, "stream": "t1", "correlation_id": "r1", "recorded_at": t}
        return type("E", (), fields)()

    asked = {"task_id": "t1", "agent_id": "a", "execution": "x", "model": "m-1"}
    metrics.observe(env(ev.ModelRequested(**asked, seq=0, provider="openai"), 10.0))
    failed = ev.ModelAnswered(
        task_id="t1", agent_id="a", execution="x", seq=0, model="m-1",
        error="rate limited", error_type="RateLimited",
    )  # fmt: skip
    metrics.observe(env(failed, 10.5))
    replayed = ev.ModelAnswered(
        task_id="t1", agent_id="a", execution="x", seq=1, model="m-1",
        replayed_from="e-0", latency_s=3.0,
    )  # fmt: skip
    metrics.observe(env(ev.ModelRequested(**asked, seq=1, provider="openai"), 11.0))
    metrics.observe(env(replayed, 11.0))
    got = _points(reader)
    assert "gen_ai.client.token.usage" not in got
    [(attrs, point)] = got["gen_ai.client.operation.duration"][1]
    assert attrs == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "m-1",
        "gen_ai.response.model": "m-1",
        "error.type": "RateLimited",
    }
    assert point.count == 1 and abs(point.sum - 0.5) < 1e-9  # no latency: request to answer
