"""A child run traced live: its workflow span under its parent task's span, in its parent's
trace, with the ids the export from the log gives it (issue 32 item 4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import msgspec
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cardbus.agents import Agent, Capability, TaskCard, TaskContext
from cardbus.bus.orchestrator import Policy, RetryPolicy
from cardbus.bus.orchestrator.child_runs import child_root_id
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import SqliteEventStore
from cardbus.projections.lineage import read_tree
from cardbus.projections.traces import task_span_id, trace_spans


class Text(msgspec.Struct):
    text: str


class Echo(Agent):
    agent_id = "echo"
    capabilities: ClassVar = [Capability("echo", Text, Text)]

    async def handle(self, task: TaskCard, inputs: Text, ctx: TaskContext) -> Text:
        return inputs


LEAD: dict[str, Any] = {
    "goal": "lead",
    "tasks": [
        {
            "id": "dept",
            "capability": "department",
            "child": {
                "plan": {
                    "goal": "department",
                    "tasks": [{"id": "find", "capability": "echo", "inputs": {"text": "x"}}],
                }
            },
        }
    ],
}


async def test_a_child_runs_live_spans_are_under_its_parent_task(
    sdk_spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    policy = Policy(retry=RetryPolicy(initial_interval_s=0.01), tick_s=0.01)
    async with (
        await SqliteEventStore.open(tmp_path / "log.db") as store,
        EmbeddedRuntime(store, [Echo], policy, default_planner=False) as rt,
    ):
        result = await rt.run(LEAD, timeout=30)
        child_root = child_root_id(f"dept-{result.root_id[-12:]}", 1)
        await rt.orchestrator.wait(child_root, timeout=30)
        exported = trace_spans(await read_tree(store, result.root_id))
    assert result.status == "completed", result.detail
    live = sdk_spans.get_finished_spans()
    runs = {s.attributes["cardbus.root_id"]: s for s in live if s.name == "invoke_workflow"}
    parent, child = runs[result.root_id], runs[child_root]
    dept = task_span_id(f"dept-{result.root_id[-12:]}")
    assert child.parent is not None and child.parent.span_id == dept
    assert child.context.trace_id == parent.context.trace_id  # one trace
    (find,) = [
        s
        for s in live
        if s.name.startswith("task ") and s.attributes["cardbus.task.id"].startswith("find-")
    ]
    assert find.parent is not None and find.parent.span_id == child.context.span_id
    # the ids the export from the log gives the same spans
    by_id = {s.span_id: s for s in exported}
    assert by_id[child.context.span_id].parent_span_id == dept
    assert by_id[find.context.span_id].parent_span_id == child.context.span_id
    assert {s.trace_id for s in exported} == {parent.context.trace_id}
