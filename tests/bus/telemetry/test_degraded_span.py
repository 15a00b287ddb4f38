"""A degraded run's live workflow span says so, as the span exported from its log does."""

from __future__ import annotations

from pathlib import Path

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cardbus.bus.orchestrator import Policy, RetryPolicy
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import SqliteEventStore
from tests.e2e.optional_crash import Search, Write, plan


async def test_the_live_run_span_names_the_optional_tasks_done_without(
    sdk_spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    policy = Policy(retry=RetryPolicy(initial_interval_s=0.01), tick_s=0.01)
    async with (
        await SqliteEventStore.open(tmp_path / "log.db") as store,
        EmbeddedRuntime(store, [Search, Write], policy, default_planner=False) as rt,
    ):
        result = await rt.run(plan(), timeout=30)
    assert result.degraded == ["facts"]
    (run,) = [s for s in sdk_spans.get_finished_spans() if s.name == "invoke_workflow"]
    assert run.attributes is not None
    assert run.attributes["cardbus.run.status"] == "completed"
    assert list(run.attributes["cardbus.run.degraded"]) == ["facts"]
