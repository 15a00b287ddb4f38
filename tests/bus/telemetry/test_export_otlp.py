"""End to end: ``cardbus export`` sends OTLP/HTTP protobuf to a real receiver on loopback.

The receiver (tests/telemetry/conftest.py) decodes ``ExportTraceServiceRequest``
with opentelemetry-proto; the ids, times and attributes it got are checked
against the log, and a second export must carry exactly the same ids.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from click.testing import CliRunner
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from cardbus.eventstore import Envelope, SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.tools.cli import cli


def _value(v: AnyValue) -> Any:
    return getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


def _spans(bodies: list[bytes]) -> list[tuple[Span, dict[str, Any]]]:
    out = []
    for body in bodies:
        req = ExportTraceServiceRequest.FromString(body)
        for rs in req.resource_spans:
            resource = _attrs(rs.resource.attributes)
            for ss in rs.scope_spans:
                assert ss.scope.name == "cardbus.export"
                for span in ss.spans:
                    out.append((span, resource))
    return out


def _export(*args: str) -> None:
    result = CliRunner().invoke(cli, ["export", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output


async def _events(db: str, root_id: str) -> list[Envelope]:
    store = await SqliteEventStore.open(db, create=False)
    try:
        return await store.read_correlation(root_id)
    finally:
        await store.close()


def _sha(text: str, n: int) -> bytes:
    return hashlib.sha256(text.encode()).digest()[:n]


def test_export_sends_the_run_with_recorded_times_and_derived_ids(
    demo_db: tuple[str, str], otlp_receiver: Any, monkeypatch: Any
) -> None:
    db, root_id = demo_db
    monkeypatch.setenv("OTEL_SERVICE_NAME", "cardbus-test")
    _export(root_id, "--otlp", otlp_receiver.url, "--db", db)
    reqs = otlp_receiver.received.requests_to("/v1/traces")
    assert len(reqs) == 1
    assert reqs[0][1] == "application/x-protobuf"
    spans = _spans([r[2] for r in reqs])
    assert spans and all(res["service.name"] == "cardbus-test" for _, res in spans)

    events = asyncio.run(_events(db, root_id))
    by_span_id = {_sha(e.event_id, 8): e for e in events}
    # the workflow's is sha256("run:" + root)[:8], known before run.started is written
    by_span_id[_sha(f"run:{root_id}", 8)] = next(
        e for e in events if isinstance(e.data, ev.RunStarted)
    )
    for e in events:  # a task's is sha256("task:" + task id)[:8], known without the log
        if isinstance(e.data, ev.TaskCreated):
            by_span_id[_sha(f"task:{e.stream}", 8)] = e
    trace_id = _sha(root_id, 16)
    assert {s.trace_id for s, _ in spans} == {trace_id}

    named = {}
    for span, _ in spans:
        opening = by_span_id[span.span_id]  # every span id is sha256(opening event id)[:8]
        assert span.start_time_unix_nano == round(opening.recorded_at * 1e9)
        assert span.end_time_unix_nano >= span.start_time_unix_nano
        named.setdefault(span.name, []).append((span, opening))

    ((workflow, started),) = named["invoke_workflow"]
    assert isinstance(started.data, ev.RunStarted)
    assert workflow.parent_span_id == b""
    assert workflow.kind == Span.SPAN_KIND_INTERNAL
    finished = next(e for e in events if isinstance(e.data, ev.RunCompleted))
    assert workflow.end_time_unix_nano == round(finished.recorded_at * 1e9)
    wattrs = _attrs(workflow.attributes)
    assert wattrs["gen_ai.operation.name"] == "invoke_workflow"
    assert wattrs["cardbus.root_id"] == root_id
    assert wattrs["cardbus.run.status"] == "completed"

    # every attempt: invoke_agent {name}, a CLIENT span under its task's span, with usage
    attempts = [
        (s, o) for name, xs in named.items() if name.startswith("invoke_agent ") for s, o in xs
    ]
    dispatches = [e for e in events if isinstance(e.data, ev.TaskDispatched)]
    assert len(attempts) == len(dispatches)
    results = {
        (e.stream, e.data.attempt, e.data.agent_id): e.data
        for e in events
        if isinstance(e.data, ev.TaskResultSubmitted)
    }
    for span, opening in attempts:
        assert isinstance(opening.data, ev.TaskDispatched)
        a = _attrs(span.attributes)
        assert span.kind == Span.SPAN_KIND_CLIENT
        assert a["gen_ai.operation.name"] == "invoke_agent"
        assert a["gen_ai.agent.id"] == opening.data.agent_id
        assert span.name == f"invoke_agent {a['gen_ai.agent.name']}"
        result = results[(opening.stream, opening.data.attempt, opening.data.agent_id)]
        assert a["gen_ai.usage.input_tokens"] == result.usage.input_tokens
        assert a["gen_ai.usage.output_tokens"] == result.usage.output_tokens
        assert span.status.code != Status.STATUS_CODE_ERROR
        assert span.parent_span_id == _sha(f"task:{opening.stream}", 8)

    # tasks: plan tasks under the workflow, the review and supplement tasks under their parent
    tasks = {
        _attrs(s.attributes)["cardbus.task.id"]: s for s, _ in spans if s.name.startswith("task ")
    }
    for e in events:
        if isinstance(e.data, ev.TaskCreated):
            parent = tasks[e.data.parent_id].span_id if e.data.parent_id else workflow.span_id
            assert tasks[e.stream].parent_span_id == parent
    draft = next(t for tid, t in tasks.items() if tid.startswith("draft-"))
    revision = [x for x in draft.events if x.name == "task.revision_requested"]
    assert len(revision) == 1
    asked = next(e for e in events if isinstance(e.data, ev.RevisionRequested))
    assert revision[0].time_unix_nano == round(asked.recorded_at * 1e9)
    assert _attrs(revision[0].attributes)["cardbus.event.id"] == asked.event_id
    assert any(x.name == "task.needs_input" for t in tasks.values() for x in t.events)


def test_exporting_twice_yields_identical_ids(demo_db: tuple[str, str], otlp_receiver: Any) -> None:
    db, root_id = demo_db
    _export(root_id, "--otlp", otlp_receiver.url, "--db", db)
    _export(root_id, "--root", "--otlp", otlp_receiver.url + "/v1/traces", "--db", db)
    first, second = (_spans([r[2]]) for r in otlp_receiver.received.requests_to("/v1/traces"))

    def ids(spans: list[tuple[Span, Any]]) -> list[tuple[bytes, bytes, bytes, int, int]]:
        return sorted(
            (s.trace_id, s.span_id, s.parent_span_id, s.start_time_unix_nano, s.end_time_unix_nano)
            for s, _ in spans
        )

    assert len(first) > 10
    assert ids(first) == ids(second)
    assert len({s.span_id for s, _ in first}) == len(first)


def test_a_task_alone_has_the_same_ids_as_in_its_run(
    demo_db: tuple[str, str], otlp_receiver: Any
) -> None:
    db, root_id = demo_db
    events = asyncio.run(_events(db, root_id))
    draft = next(e.stream for e in events if e.stream.startswith("draft-") and "~" not in e.stream)
    _export(draft, "--otlp", otlp_receiver.url, "--db", db)
    _export(draft, "--root", "--otlp", otlp_receiver.url, "--db", db)
    alone, whole = (_spans([r[2]]) for r in otlp_receiver.received.requests_to("/v1/traces"))
    alone_ids = {s.span_id for s, _ in alone}
    assert alone_ids < {s.span_id for s, _ in whole}
    names = sorted(s.name for s, _ in alone)
    assert names.count("task review") == 2  # both review rounds ride along with the draft
    assert "invoke_workflow" not in names
