"""A run traced live, then exported from its log, is ONE trace at a real OTLP/HTTP receiver.

The live spans go through an SDK ``TracerProvider`` with the OTLP/HTTP exporter to
the receiver of conftest.py; ``cardbus export`` then sends the spans rebuilt from
the log to the same receiver. Every exported span must have a live twin (same id,
name and parent, same span events), the live spans the export lacks are the
messaging and worker spans under an attempt, and the attempt that ran past its
deadline has error status in both.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import msgspec
from click.testing import CliRunner
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from cardbus.agents.agent import Agent, Capability, TaskContext
from cardbus.agents.cards import AgentConstraints, TaskCard
from cardbus.agents.demo import DEMO_AGENTS, report_plan
from cardbus.bus import Policy, telemetry
from cardbus.bus.orchestrator import RetryPolicy
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.tools.cli import cli


class Text(msgspec.Struct, frozen=True):
    text: str


class Slow(Agent):
    """Runs 0.6 s on its first attempt (deadline 0.5 s), answers at once on the second."""

    agent_id = "slow"
    name = "slow"
    description = "late on its first try"
    capabilities = [Capability("summarize", Text, Text, "summarize a text")]
    constraints = AgentConstraints(max_concurrency=2)

    async def handle(self, task: TaskCard, inputs: Any, ctx: TaskContext) -> Any:
        if task.attempt == 1:
            await asyncio.sleep(0.6)
        return Text(text=inputs.text[:20])


def _received(receiver: Any) -> list[tuple[str, Span]]:
    """(scope name, span) of everything the receiver got."""
    out = []
    for _, _, body in receiver.received.requests_to("/v1/traces"):
        for rs in ExportTraceServiceRequest.FromString(body).resource_spans:
            for ss in rs.scope_spans:
                out += [(ss.scope.name, s) for s in ss.spans]
    return out


async def _traced_run(path: Path) -> str:
    plan = report_plan("ocean tides")
    plan["tasks"].append(
        {
            "id": "gist",
            "capability": "summarize",
            "inputs": {"text": "tides rise and fall twice a day"},
            "timeout_s": 0.5,
        }
    )
    fast = Policy(retry=RetryPolicy(initial_interval_s=0.01), tick_s=0.01)
    store = await SqliteEventStore.open(path)
    try:
        async with EmbeddedRuntime(store, [*DEMO_AGENTS, Slow], policy=fast) as rt:
            result = await rt.run(plan, timeout=30)
            await asyncio.sleep(0.3)  # the late first attempt of "gist" answers, is ignored
        assert result.status == "completed"
        return result.root_id
    finally:
        await store.close()


def test_a_run_traced_live_and_then_exported_is_one_trace(
    otlp_receiver: Any, tmp_path: Path
) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "cardbus"}))
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{otlp_receiver.url}/v1/traces"))
    )
    db = tmp_path / "log.db"
    telemetry.use_tracer_provider(provider)
    try:
        root_id = asyncio.run(_traced_run(db))
    finally:
        telemetry.use_tracer_provider(None)
        provider.shutdown()
    out = CliRunner().invoke(cli, ["export", root_id, "--otlp", otlp_receiver.url, "--db", str(db)])
    assert out.exit_code == 0, out.output

    spans = _received(otlp_receiver)
    live = {s.span_id: s for scope, s in spans if scope == telemetry.TRACER_NAME}
    exported = {s.span_id: s for scope, s in spans if scope == "cardbus.export"}
    assert live and exported
    # one trace: the same function of the root id, live and exported
    assert {s.trace_id for _, s in spans} == {hashlib.sha256(root_id.encode()).digest()[:16]}

    # every exported span is the twin of a live one: same id, name, parent, span events
    for span_id, x in exported.items():
        twin = live.get(span_id)
        assert twin is not None, f"no live span for {x.name}"
        assert (twin.name, twin.parent_span_id) == (x.name, x.parent_span_id)
        assert twin.kind == x.kind, x.name
        # (a live span has ended when a late answer is ignored: that event is export's only)
        before_end = [e.name for e in x.events if e.time_unix_nano <= twin.end_time_unix_nano]
        assert [e.name for e in twin.events] == before_end, x.name
        assert twin.status.code == x.status.code, x.name
    # what only the live trace has: the messaging and worker spans under an attempt
    attempts = {i for i, s in exported.items() if s.kind == Span.SPAN_KIND_CLIENT}
    for span_id, s in live.items():
        if span_id in exported:
            continue
        parent = s.parent_span_id
        while parent not in attempts:
            assert parent in live, f"{s.name} is not under an attempt"
            parent = live[parent].parent_span_id
    names = {s.name for s in exported.values()}
    assert {"invoke_workflow", "task research", "task review", "invoke_agent slow"} <= names

    # the review and the supplementary task sit under the task they serve
    tasks = {s.span_id: s for s in live.values() if s.name.startswith("task ")}
    nested = [s for s in tasks.values() if s.parent_span_id in tasks]
    assert {s.name for s in nested} >= {"task review"}

    # the late first attempt of "gist": an error, timed out, and its task retried
    slow = sorted(
        (
            s
            for s in live.values()
            if s.name == "invoke_agent slow" and s.kind == Span.SPAN_KIND_CLIENT
        ),
        key=lambda s: s.start_time_unix_nano,
    )
    assert len(slow) == 2
    assert slow[0].status.code == Status.STATUS_CODE_ERROR
    assert "task.timed_out" in [e.name for e in slow[0].events]
    assert slow[1].status.code != Status.STATUS_CODE_ERROR
    gist = live[slow[0].parent_span_id]
    assert "task.retry_scheduled" in [e.name for e in gist.events]
    # the worker's own span of that attempt ran past the deadline: an error too
    workers = [
        s for s in live.values() if s.name == "handle slow" and s.kind == Span.SPAN_KIND_INTERNAL
    ]
    assert any(s.status.code == Status.STATUS_CODE_ERROR for s in workers)

    # and the envelopes name the live workflow span
    store_events = asyncio.run(_events(db, root_id))
    (workflow,) = [s for s in live.values() if s.name == "invoke_workflow"]
    tp = f"00-{workflow.trace_id.hex()}-{workflow.span_id.hex()}-"
    end = next(e.position for e in store_events if isinstance(e.data, ev.RunCompleted))
    named = {
        (e.traceparent or "")[:53]
        for e in store_events
        if e.actor == "orchestrator" and e.position <= end
    }
    assert named == {tp}
    assert any(isinstance(e.data, ev.TaskTimedOut) for e in store_events)


async def _events(path: Path, root_id: str) -> list[Any]:
    store = await SqliteEventStore.open(path)
    try:
        return await store.read_correlation(root_id)
    finally:
        await store.close()
