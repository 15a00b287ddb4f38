"""``projections.traces``: spans rebuilt from a log with every kind of trouble in it."""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

import pytest
from click.testing import CliRunner
from lifecycle_log import T0, RunIds, write_run

from cardbus.eventstore import Envelope, MemoryEventStore
from cardbus.eventstore import events as ev
from cardbus.projections.traces import (
    SpanRecord,
    span_id_for,
    to_readable_spans,
    trace_id_for,
    trace_spans,
)
from cardbus.tools.cli import cli


@pytest.fixture
async def log() -> tuple[list[Envelope], RunIds]:
    store = MemoryEventStore()
    ids = await write_run(store)
    return await store.read_correlation(ids.root), ids


def _sha_int(text: str, n: int) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:n], "big")


def _task(spans: list[SpanRecord], task_id: str) -> SpanRecord:
    return next(
        s
        for s in spans
        if s.name.startswith("task ") and s.attributes["cardbus.task.id"] == task_id
    )


def _attempts(spans: list[SpanRecord], task: SpanRecord) -> list[SpanRecord]:
    return sorted(
        (s for s in spans if s.parent_span_id == task.span_id and s.kind == "client"),
        key=lambda s: s.start,
    )


def test_ids_are_derived_from_event_ids(log: tuple[list[Envelope], RunIds]) -> None:
    events, ids = log
    spans = trace_spans(events)
    assert trace_id_for(ids.root) == _sha_int(ids.root, 16)
    assert {s.trace_id for s in spans} == {trace_id_for(ids.root)}
    opening = {e.event_id: e for e in events}
    for s in spans:
        if s.name == "invoke_workflow":  # known before its run.started is written
            assert s.span_id == _sha_int(f"run:{ids.root}", 8)
        elif s.name.startswith("task "):  # known without the log (a resumed run)
            assert s.span_id == _sha_int(f"task:{s.attributes['cardbus.task.id']}", 8)
        else:
            assert s.span_id == _sha_int(s.opening_event_id, 8) == span_id_for(s.opening_event_id)
        assert s.start == opening[s.opening_event_id].recorded_at
    assert [s.span_id for s in trace_spans(events)] == [s.span_id for s in spans]


def test_tree_times_and_events(log: tuple[list[Envelope], RunIds]) -> None:
    events, ids = log
    spans = trace_spans(events, {"writer-2": "Writer Two"})
    run = spans[0]
    assert run.name == "invoke_workflow" and run.parent_span_id is None
    assert run.start == T0 + 1 and run.error == "tasks failed"
    assert run.end == max(e.recorded_at for e in events)
    assert run.attributes["gen_ai.usage.input_tokens"] == 100 + 200 + 30 + 250 + 10

    research = _task(spans, ids.research)
    assert research.parent_span_id == run.span_id and research.error is None
    (attempt,) = _attempts(spans, research)
    assert attempt.name == "invoke_agent researcher"
    assert attempt.attributes["gen_ai.usage.input_tokens"] == 100
    assert attempt.attributes["gen_ai.usage.output_tokens"] == 50
    assert attempt.end - attempt.start == pytest.approx(4.0)  # dispatched -> completed

    write = _task(spans, ids.write)
    rejected, second, third = _attempts(spans, write)
    assert rejected.error == "out_of_capability"
    assert [e.name for e in rejected.events] == ["task.rejected"]
    assert second.name == "invoke_agent Writer Two" and second.error is None
    assert second.attributes["cardbus.attempt.outcome"] == "revision"
    assert third.attributes["gen_ai.agent.name"] == "Writer Two"
    kinds = [e.name for e in write.events]
    assert kinds == ["task.retry_scheduled", "task.revision_requested"]
    assert _task(spans, ids.review).parent_span_id == write.span_id

    code = _task(spans, ids.code)
    assert code.error == "attempts_exhausted"
    schema, timeout = _attempts(spans, code)
    assert schema.error == "output_schema_mismatch"
    assert timeout.error == "timeout"
    assert "task.timed_out" in [e.name for e in timeout.events]

    loop = _task(spans, ids.loop)
    assert loop.error == "loop_detected"
    assert [s.error for s in _attempts(spans, loop)] == ["timeout", "timeout", "halted"]


def test_a_task_alone_is_a_subtree_with_the_same_ids(log: tuple[list[Envelope], RunIds]) -> None:
    events, ids = log
    whole = {s.span_id: s for s in trace_spans(events)}
    alone = trace_spans(events, task_id=ids.write)
    assert {s.span_id for s in alone} < set(whole)
    assert alone[0].attributes["cardbus.task.id"] == ids.write
    assert {s.attributes.get("cardbus.task.id") for s in alone} == {ids.write, ids.review}
    assert trace_spans(events, task_id="no-such-task") == []


def test_readable_spans_carry_ids_kinds_status_and_parents(
    log: tuple[list[Envelope], RunIds],
) -> None:
    from opentelemetry.trace import SpanKind, StatusCode

    events, _ = log
    records = trace_spans(events)
    spans = to_readable_spans(records)
    for r, s in zip(records, spans, strict=True):
        assert s.context.trace_id == r.trace_id and s.context.span_id == r.span_id
        assert (s.parent.span_id if s.parent else None) == r.parent_span_id
        assert s.start_time == round(r.start * 1e9) and s.end_time == round(r.end * 1e9)
        assert s.kind == (SpanKind.CLIENT if r.kind == "client" else SpanKind.INTERNAL)
        assert (s.status.status_code is StatusCode.ERROR) == (r.error is not None)
        assert s.resource.attributes["service.name"] == "cardbus"


async def test_unfinished_run_ends_at_its_latest_event() -> None:
    store = MemoryEventStore()
    from cardbus.eventstore import NewEvent

    def new(data: ev.Event, t: float) -> NewEvent:
        return NewEvent(data=data, correlation_id="r", recorded_at=t)

    await store.append("r", [new(ev.RunStarted(goal="g", plan_id="p"), 10.0)], 0)
    await store.append(
        "t",
        [
            new(ev.TaskCreated(root_id="r", capability="c"), 11.0),
            new(ev.TaskDispatched(attempt=1, agent_id="a"), 12.0),
        ],
        0,
    )
    spans = trace_spans(await store.read_correlation("r"))
    run, task, attempt = spans
    assert run.attributes["cardbus.run.status"] == "open"
    assert (run.start, run.end) == (10.0, 12.0)
    assert attempt.attributes["cardbus.attempt.outcome"] == "open"
    assert attempt.end == 12.0 and task.end == 12.0


def test_console_export_and_a_clear_error_without_the_otlp_exporter(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from cardbus.eventstore import SqliteEventStore

    async def populate() -> RunIds:
        store = await SqliteEventStore.open(tmp_path / "c.db")
        try:
            return await write_run(store)
        finally:
            await store.close()

    ids = asyncio.run(populate())
    db = str(tmp_path / "c.db")
    runner = CliRunner()
    out = runner.invoke(cli, ["export", ids.write, "--console", "--db", db])
    assert out.exit_code == 0, out.output
    printed = out.stdout
    first = json.loads(printed[: printed.index("\n}\n") + 2])
    assert first["name"] == "task write"
    assert first["context"]["trace_id"] == f"0x{trace_id_for(ids.root):032x}"

    since = runner.invoke(cli, ["export", "--since", str(T0 + 3600), "--console", "--db", db])
    assert since.exit_code == 0 and "exported 0 spans" in since.stderr

    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    missing = runner.invoke(cli, ["export", ids.write, "--otlp", "http://127.0.0.1:9", "--db", db])
    assert missing.exit_code == 1
    assert missing.stderr.strip().splitlines() == [
        "Error: OTLP export needs the opentelemetry-exporter-otlp-proto-http package: "
        "pip install 'cardbus[otlp]'"
    ]


def test_export_needs_a_target(tmp_path: Any) -> None:
    out = CliRunner().invoke(
        cli,
        ["export", "x", "--db", str(tmp_path / "none.db")],
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": "", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": ""},
    )
    assert out.exit_code == 2 and "--otlp URL or --console" in out.output


async def test_a_run_traced_live_links_to_its_live_trace() -> None:
    from cardbus.eventstore import NewEvent

    live = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    store = MemoryEventStore()
    await store.append(
        "r",
        [
            NewEvent(
                data=ev.RunStarted(goal="g", plan_id="p"),
                correlation_id="r",
                traceparent=live,
                recorded_at=10.0,
            )
        ],
        0,
    )
    (span,) = to_readable_spans(trace_spans(await store.read_correlation("r")))
    (link,) = span.links
    assert link.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert link.context.span_id == 0xB7AD6B7169203331
    assert span.context.trace_id == trace_id_for("r")  # the export keeps its own ids
