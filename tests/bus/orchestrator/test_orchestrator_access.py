"""Requests through the orchestrator, end to end: an agent that tries everything.

The agents run on the in-process bus against a real orchestrator and SQLite
log. Every allowed request is recorded (``memory.read``, ``tool.called``);
every abuse - reading another task's output, writing outside its own task,
a tool not on its allow-list, an oversized result, a hanging tool - is a
typed error for the agent and an event in its task's stream. None of it
disturbs the task's lifecycle, the projections or the hash chain.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec

from cardbus.agents.agent import Agent, Capability, TaskContext
from cardbus.agents.cards import AgentConstraints, TaskCard
from cardbus.agents.tools import Tool, ToolRegistry
from cardbus.bus.orchestrator.plan import Plan, PlanTask
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import SqliteEventStore, TaskState
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import CardbusError
from cardbus.projections import ProjectionRunner, TaskTable, replay


class Text(msgspec.Struct, frozen=True):
    text: str


class Anything(msgspec.Struct, frozen=True):
    text: str = ""


class Source(Agent):
    agent_id = "source"
    capabilities = [Capability("source", Text, Text)]

    async def handle(self, task: TaskCard, inputs: Text, ctx: TaskContext) -> Text:
        return Text(text=f"{inputs.text} from {task.task_id}")


async def _attempt(label: str, coro: Any, outcomes: dict[str, Any]) -> None:
    try:
        outcomes[label] = {"ok": await coro}
    except CardbusError as e:
        outcomes[label] = {"error": type(e).__name__}


class Nosy(Agent):
    """Tries every request, allowed and not; reports what happened to each."""

    agent_id = "nosy"
    capabilities = [Capability("nosy", Anything, dict)]
    constraints = AgentConstraints(tools=["echo", "big", "hang"])
    received: list[TaskCard] = []

    async def handle(self, task: TaskCard, inputs: Anything, ctx: TaskContext) -> dict:
        type(self).received.append(task)
        (dep,) = task.deps
        other = "b" + task.task_id.removeprefix("probe")  # a sibling it does not depend on
        out: dict[str, Any] = {}
        await _attempt("read_dep", ctx.read_output(dep), out)
        await _attempt("read_other", ctx.read_output(other), out)
        await _attempt("write_other", ctx.write_output(other, {"text": "overwritten"}), out)
        await _attempt("write_own", ctx.write_output(task.task_id, {"x": 1}), out)
        await _attempt("tool_echo", ctx.tool("echo", q="hi"), out)
        await _attempt("tool_not_allowed", ctx.tool("shell", cmd="rm -rf /"), out)
        await _attempt("tool_big", ctx.tool("big"), out)
        await _attempt("tool_hang", ctx.tool("hang"), out)
        await _attempt("memory_search", ctx.long_term.search("favourite colour"), out)
        return out


def _tools() -> ToolRegistry:
    async def echo(args: dict) -> dict:
        return {"echo": args}

    async def big(args: dict) -> dict:
        return {"blob": "x" * 5000}

    async def hang(args: dict) -> dict:
        await asyncio.sleep(3600)
        return {}

    def shell(args: dict) -> dict:
        raise AssertionError("must never run")

    return ToolRegistry(
        [
            Tool.define("echo", echo),
            Tool.define("big", big, max_result_bytes=1000),
            Tool.define("hang", hang, timeout_s=0.1),
            Tool.define("shell", shell),
        ]
    )


def _plan() -> Plan:
    return Plan(
        goal="probe",
        tasks=[
            PlanTask(id="a", capability="source", inputs={"text": "A"}),
            PlanTask(id="b", capability="source", inputs={"text": "B"}),
            PlanTask(
                id="probe",
                capability="nosy",
                deps=["a"],
                inputs={"text": {"$dep": "a", "path": "text"}},
            ),
        ],
    )


async def test_every_request_is_checked_recorded_and_typed(tmp_path: Path) -> None:
    Nosy.received = []
    store = await SqliteEventStore.open(tmp_path / "cardbus.db", poll_interval=0.01)
    try:
        async with EmbeddedRuntime(store, [Source, Nosy], tools=_tools()) as rt:
            await rt.memory.remember("colour/ann", "green", text="ann's favourite colour is green")
            root = await rt.orchestrator.submit(_plan())
            ids = rt.orchestrator.state.runs[root].names
            result = await rt.orchestrator.wait(root, timeout=30)
        assert result.status == "completed", result
        out = result.outputs["probe"]
        assert out["read_dep"] == {"ok": {"text": f"A from {ids['a']}"}}
        assert out["read_other"] == {"error": "AccessDenied"}
        assert out["write_other"] == {"error": "AccessDenied"}
        assert out["write_own"] == {"ok": None}
        assert out["tool_echo"] == {"ok": {"echo": {"q": "hi"}}}
        assert out["tool_not_allowed"] == {"error": "AccessDenied"}
        assert out["tool_big"] == {"error": "ToolResultTooLarge"}
        assert out["tool_hang"] == {"error": "ToolTimeout"}
        hit = out["memory_search"]["ok"][0]
        assert hit["record"]["key"] == "colour/ann"

        stream = await store.read_stream(ids["probe"])
        side = [e.data for e in stream if not e.type.startswith("task.")]
        refused = [(d.action, d.reason) for d in side if isinstance(d, ev.AccessRefused)]
        assert refused == [
            ("read_output", "not_a_dependency"),
            ("write_output", "not_own_task"),
            ("tool", "tool_not_allowed"),
        ]
        tools = [(d.tool, d.error_type) for d in side if isinstance(d, ev.ToolCalled)]
        assert tools == [("echo", None), ("big", "result_too_large"), ("hang", "timeout")]
        reads = [(d.mode, d.keys) for d in side if isinstance(d, ev.MemoryRead)]
        assert reads == [("output", [ids["a"]]), ("search", ["colour/ann"])]
        assert all(d.agent_id == "nosy" and d.attempt == 1 for d in side)  # type: ignore[union-attr]
        # the other task's output is untouched; the probe's lifecycle is the usual one
        b_done = (await store.read_stream(ids["b"]))[-1].data
        assert isinstance(b_done, ev.TaskCompleted) and b_done.output == {
            "text": f"B from {ids['b']}"
        }
        lifecycle = [e.type for e in stream if e.type.startswith("task.")]
        assert lifecycle[0] == "task.created.v1" and lifecycle[-1] == "task.completed.v1"
        # projections and the chain are fine with the extra events
        runner = ProjectionRunner.open(store, ":memory:", [TaskTable()])
        await runner.catch_up()
        row = TaskTable().get(runner.conn, ids["probe"])
        assert row is not None and row["status"] == TaskState.COMPLETED.value
        assert await store.verify() == []
        # the replay shows them under the task
        timeline = await replay(store, root)
        (node,) = [n for _, n in timeline.walk() if n.task_id == ids["probe"]]
        kinds = [s.kind for s in node.steps]
        assert kinds.count("tool.called") == 3 and kinds.count("memory.read") == 2
        assert kinds.count("access.refused") == 3
        assert node.status == "completed"
    finally:
        await store.close()


class Big(Agent):
    agent_id = "big"
    capabilities = [Capability("big", Text, dict)]

    async def handle(self, task: TaskCard, inputs: Text, ctx: TaskContext) -> dict:
        return {"facts": [f"Fact number {i}. " + "more words " * 10 for i in range(60)]}


class Facts(msgspec.Struct, frozen=True):
    facts: list[str]


class Small(Agent):
    agent_id = "small"
    capabilities = [Capability("small", Facts, dict)]
    constraints = AgentConstraints(max_input_bytes=800)
    received: list[TaskCard] = []

    async def handle(self, task: TaskCard, inputs: Facts, ctx: TaskContext) -> dict:
        type(self).received.append(task)
        return {"n": len(inputs.facts)}


async def test_upstream_outputs_are_fitted_to_the_agents_budget(tmp_path: Path) -> None:
    Small.received = []
    plan = Plan(
        goal="budget",
        tasks=[
            PlanTask(id="big", capability="big", inputs={"text": "x"}),
            PlanTask(
                id="small",
                capability="small",
                deps=["big"],
                inputs={"facts": {"$dep": "big", "path": "facts"}},
            ),
        ],
    )
    store = await SqliteEventStore.open(tmp_path / "cardbus.db", poll_interval=0.01)
    try:
        async with EmbeddedRuntime(store, [Big, Small]) as rt:
            result = await rt.run(plan, timeout=30)
        assert result.status == "completed", result
        (card,) = Small.received
        assert len(msgspec.json.encode(card.inputs)) <= 800
        assert 0 < result.outputs["small"]["n"] < 60
        task_id = card.task_id
        events = [e.data for e in await store.read_stream(task_id)]
        (trimmed,) = [d for d in events if isinstance(d, ev.ContextTrimmed)]
        assert trimmed.policy == "trim" and trimmed.limit_bytes == 800
        assert trimmed.final_bytes <= 800 < trimmed.original_bytes
        assert trimmed.fields == ["facts"] and trimmed.attempt == 1
        kinds = [type(d).__name__ for d in events]
        assert kinds.index("ContextTrimmed") < kinds.index("TaskDispatched")  # recorded first
    finally:
        await store.close()


def test_an_orchestrator_serves_requests_when_given_tools_memory_or_asked() -> None:
    from cardbus.bus.orchestrator.core import Orchestrator
    from cardbus.bus.transport.inprocess import InProcessBus
    from cardbus.eventstore import MemoryEventStore

    store, bus = MemoryEventStore(), InProcessBus()
    assert not Orchestrator(store, bus).serve_requests  # another server may own the path
    assert Orchestrator(store, bus, tools=ToolRegistry()).serve_requests
    assert Orchestrator(store, bus, serve_requests=True).serve_requests
    assert not Orchestrator(store, bus, tools=ToolRegistry(), serve_requests=False).serve_requests
