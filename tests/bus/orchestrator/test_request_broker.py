"""The request broker on its own: each request checked, done, recorded, answered.

State is folded from a real log (MemoryEventStore); ``record`` appends to the
task's stream like the orchestrator's decision loop does. Requests go through
the in-process bus and ``TaskServices`` (what ``ctx`` offers), so the typed
errors are the ones an agent sees.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
import pytest

from cardbus.agents.cards import AgentCard, AgentConstraints, CapabilitySpec, TaskCard
from cardbus.agents.requests import AgentRequest, TaskServices
from cardbus.agents.tools import Tool, ToolNotFound, ToolRegistry, ToolResultTooLarge, ToolTimeout
from cardbus.bus.orchestrator.access import AccessPolicy, RequestBroker, access_problem, digest
from cardbus.bus.orchestrator.memory import LongTermMemory
from cardbus.bus.orchestrator.runstate import RunState
from cardbus.bus.transport.inprocess import InProcessBus
from cardbus.eventstore import MemoryEventStore, NewEvent
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import AccessDenied, BusError, ValidationError

ROOT = "root-x"


class Ctx(TaskServices):
    def __init__(self, task: TaskCard, agent_id: str, bus: InProcessBus) -> None:
        self.task = task
        self.agent_id = agent_id
        self.requester = bus.request


class World:
    def __init__(self) -> None:
        self.store = MemoryEventStore()
        self.state = RunState()
        self.bus = InProcessBus()
        self.memory = LongTermMemory(self.store)

        async def hang(args: dict) -> dict:
            await asyncio.sleep(3600)
            return {}

        async def big(args: dict) -> dict:
            return {"blob": "x" * 10_000}

        async def echo(args: dict) -> dict:
            return {"echo": args}

        async def denies(args: dict) -> dict:
            raise AccessDenied("host 'evil.example' is not on the allow-list")

        self.tools = ToolRegistry(
            [
                Tool.define("echo", echo),
                Tool.define("hang", hang, timeout_s=0.05),
                Tool.define("big", big, max_result_bytes=1000),
                Tool.define("fetch", denies),
            ]
        )
        self.broker = RequestBroker(self.state, self.record, self.tools, self.memory)

    async def record(self, stream: str, events: list[ev.Event]) -> None:
        version = self.state.versions.get(stream, 0)
        task = self.state.tasks.get(stream)
        root = task.created.root_id if task else stream
        stored = await self.store.append(
            stream,
            [NewEvent(data=e, correlation_id=root, actor="orchestrator") for e in events],
            version,
        )
        for env in stored:
            self.state.apply(env)

    async def add(self, stream: str, *events: ev.Event) -> None:
        await self.record(stream, list(events))

    async def setup(self) -> None:
        await self.bus.serve_requests(self.broker.handle)
        card = AgentCard(
            agent_id="writer",
            name="writer",
            capabilities=[CapabilitySpec(name="write")],
            constraints=AgentConstraints(tools=["echo", "hang", "big", "fetch"]),
        )
        await self.add(
            "agent-writer", ev.AgentRegistered(agent_id="writer", card=msgspec.to_builtins(card))
        )
        await self.add(
            "agent-other",
            ev.AgentRegistered(agent_id="other", card={"agent_id": "other", "name": "other"}),
        )
        for tid, output in (
            ("outline", {"sections": ["A", "B"]}),
            ("research", {"facts": ["f"]}),
            ("secret", {"s": 1}),
        ):
            await self.add(
                tid,
                ev.TaskCreated(root_id=ROOT, capability="x"),
                ev.TaskDispatched(attempt=1, agent_id="other"),
                ev.TaskCompleted(attempt=1, agent_id="other", output=output),
            )
        await self.add(
            "draft",
            ev.TaskCreated(root_id=ROOT, capability="write", deps=["outline", "research"]),
            ev.TaskDispatched(attempt=1, agent_id="writer"),
            ev.TaskStarted(attempt=1, agent_id="writer"),
        )
        await self.memory.remember(
            "pref/ann/report_format",
            "markdown",
            text="ann prefers report format: markdown",
            kind="preference",
        )

    def ctx(self, agent_id: str = "writer", attempt: int = 1, task_id: str = "draft") -> Ctx:
        card = TaskCard(
            task_id=task_id,
            root_id=ROOT,
            capability="write",
            attempt=attempt,
            deps=["outline", "research"],
        )
        return Ctx(card, agent_id, self.bus)

    async def own_events(self, stream: str = "draft") -> list[Any]:
        return [
            e.data for e in await self.store.read_stream(stream) if not e.type.startswith("task.")
        ]


@pytest.fixture
async def world() -> World:
    w = World()
    await w.setup()
    return w


async def test_reads_a_declared_dependency_and_records_it(world: World) -> None:
    assert await world.ctx().read_output("outline") == {"sections": ["A", "B"]}
    (read,) = await world.own_events()
    assert isinstance(read, ev.MemoryRead)
    assert (read.mode, read.query, read.keys, read.agent_id, read.attempt) == (
        "output",
        "outline",
        ["outline"],
        "writer",
        1,
    )


async def test_reading_another_tasks_output_is_refused_and_recorded(world: World) -> None:
    with pytest.raises(AccessDenied, match="not_a_dependency"):
        await world.ctx().read_output("secret")
    (refused,) = await world.own_events()
    assert refused == ev.AccessRefused(
        task_id="draft",
        agent_id="writer",
        action="read_output",
        target="secret",
        reason="not_a_dependency",
        attempt=1,
    )


async def test_writing_outside_its_own_task_is_refused(world: World) -> None:
    await world.ctx().write_output("draft", {"ok": 1})  # its own task: accepted
    with pytest.raises(AccessDenied, match="not_own_task"):
        await world.ctx().write_output("outline", {"sections": []})
    (refused,) = await world.own_events()
    assert isinstance(refused, ev.AccessRefused) and refused.action == "write_output"
    assert world.state.tasks["outline"].output == {"sections": ["A", "B"]}  # untouched


async def test_an_agent_not_on_the_task_or_a_stale_attempt_is_refused(world: World) -> None:
    with pytest.raises(AccessDenied, match="not_assigned"):
        await world.ctx(agent_id="other").read_output("outline")
    with pytest.raises(AccessDenied, match="not_assigned"):
        await world.ctx(attempt=2).read_output("outline")
    reasons = [e.reason for e in await world.own_events()]
    assert reasons == ["not_assigned", "not_assigned"]
    with pytest.raises(AccessDenied, match="unknown_task"):
        await world.ctx(task_id="nope").read_output("outline")
    (on_agent,) = [
        e.data
        for e in await world.store.read_stream("agent-writer")
        if isinstance(e.data, ev.AccessRefused)
    ]
    assert on_agent.task_id == "nope"


async def test_tool_call_is_recorded_with_arguments_result_and_duration(world: World) -> None:
    result = await world.ctx().tool("echo", q="tides", k=2)
    assert result == {"echo": {"q": "tides", "k": 2}}
    requested, called = await world.own_events()  # the request first: before the effect
    assert isinstance(requested, ev.ToolRequested) and isinstance(called, ev.ToolCalled)
    assert requested.request_id and called.request_id == requested.request_id
    assert requested.arguments == {"q": "tides", "k": 2} and requested.tool == "echo"
    assert called.tool == "echo" and called.arguments == {"q": "tides", "k": 2}
    assert called.result == result and called.error is None and called.duration_s >= 0
    assert called.arguments_digest == digest({"q": "tides", "k": 2})
    assert called.result_bytes == len(msgspec.json.encode(result))


async def test_digest_policy_keeps_only_digests(world: World) -> None:
    world.broker.policy = AccessPolicy(arguments="digest", max_inline_bytes=10)
    await world.ctx().tool("echo", secret="hunter2")
    requested, called = await world.own_events()
    assert requested.arguments is None and requested.arguments_digest == called.arguments_digest
    assert called.arguments is None and called.result is None
    assert called.arguments_digest == digest({"secret": "hunter2"}) and called.result_digest


async def test_a_crash_during_a_tool_call_leaves_its_request_in_the_log(world: World) -> None:
    """Invariant 2: the side effect comes after the log knows of it."""
    effects: list[str] = []

    async def crash(args: dict) -> dict:  # type: ignore[type-arg]
        effects.append("charged the card")
        raise asyncio.CancelledError  # the process going down mid-call

    world.tools.register(Tool.define("pay", crash))
    world.state.agents["writer"] = msgspec.structs.replace(
        world.state.agents["writer"], constraints=AgentConstraints(tools=["pay"])
    )
    with pytest.raises(asyncio.CancelledError):
        await world.ctx().tool("pay", amount=5)
    assert effects == ["charged the card"]
    events = await world.own_events()
    assert [type(e) for e in events] == [ev.ToolRequested]  # requested, never called
    assert events[0].tool == "pay" and events[0].arguments == {"amount": 5}


async def test_tool_not_on_the_allow_list_is_refused(world: World) -> None:
    world.tools.register(Tool.define("shell", lambda a: {"pwned": True}))
    with pytest.raises(AccessDenied, match="tool_not_allowed"):
        await world.ctx().tool("shell", cmd="rm -rf /")
    (refused,) = await world.own_events()
    assert (
        isinstance(refused, ev.AccessRefused)
        and refused.target == "shell"
        and refused.action == "tool"
    )


async def test_oversized_tool_result_is_a_typed_error_and_an_event(world: World) -> None:
    with pytest.raises(ToolResultTooLarge):
        await world.ctx().tool("big")
    _, called = await world.own_events()
    assert called.error_type == "result_too_large" and called.result is None


async def test_a_hanging_tool_times_out_cleanly(world: World) -> None:
    started = time.monotonic()
    with pytest.raises(ToolTimeout):
        await world.ctx().tool("hang")
    assert time.monotonic() - started < 1
    _, called = await world.own_events()
    assert called.error_type == "timeout" and called.tool == "hang"


async def test_a_tool_refusing_a_host_is_access_denied_twice_recorded(world: World) -> None:
    with pytest.raises(AccessDenied):
        await world.ctx().tool("fetch", url="http://evil.example/")
    _, called, refused = await world.own_events()
    assert called.error_type == "access_denied"
    assert isinstance(refused, ev.AccessRefused) and refused.action == "tool"


async def test_unknown_tool_on_the_allow_list_is_not_found(world: World) -> None:
    world.state.agents["writer"] = msgspec.structs.replace(
        world.state.agents["writer"], constraints=AgentConstraints(tools=["ghost"])
    )
    with pytest.raises(ToolNotFound):
        await world.ctx().tool("ghost")


async def test_tool_specs_are_those_of_the_allow_list_and_nothing_is_recorded(
    world: World,
) -> None:
    world.tools.register(Tool.define("not_for_writer", lambda a: a))
    before = len(await world.own_events())
    specs = await world.ctx().request("tool.specs")
    assert sorted(specs) == ["big", "echo", "fetch", "hang"]
    assert specs["hang"]["timeout_s"] == 0.05 and specs["echo"]["name"] == "echo"
    assert len(await world.own_events()) == before  # a read of the registry, not an act
    # only for the agent whose task it is
    with pytest.raises(AccessDenied):
        await world.ctx(agent_id="other").request("tool.specs")


async def test_memory_reads_are_recorded(world: World) -> None:
    ctx = world.ctx()
    record = await ctx.long_term.get("pref/ann/report_format")
    assert record is not None and record["value"] == "markdown"
    assert await ctx.long_term.get("missing") is None
    hits = await ctx.long_term.search("preferred report format")
    assert hits[0]["record"]["key"] == "pref/ann/report_format" and hits[0]["score"] > 0
    listed = await ctx.long_term.list(kind="preference")
    assert [r["key"] for r in listed] == ["pref/ann/report_format"]
    reads = await world.own_events()
    assert [(r.mode, r.keys) for r in reads] == [
        ("get", ["pref/ann/report_format"]),
        ("get", []),
        ("search", ["pref/ann/report_format"]),
        ("list", ["pref/ann/report_format"]),
    ]
    assert reads[2].query == "preferred report format"


async def test_bad_request_args_are_a_typed_error(world: World) -> None:
    with pytest.raises(ValidationError):
        await world.ctx().request("memory.search", "", {"text": 42})


async def test_memory_reads_can_be_turned_off(world: World) -> None:
    world.broker.policy = AccessPolicy(memory_reads=False)
    with pytest.raises(AccessDenied, match="memory_not_allowed"):
        await world.ctx().long_term.search("anything")


async def test_without_a_server_or_bus_support_the_agent_gets_bus_error() -> None:
    bus = InProcessBus()
    ctx = Ctx(TaskCard(task_id="t", root_id="r", capability="c"), "a", bus)
    with pytest.raises(BusError):
        await ctx.read_output("x")
    ctx.requester = None
    with pytest.raises(BusError):
        await ctx.tool("x")


def test_access_problem_is_pure_over_the_state() -> None:
    state = RunState()
    req = AgentRequest(
        request_id="1", task_id="t", attempt=1, agent_id="a", kind="read_output", target="d"
    )
    assert access_problem(state, req) == "unknown_task"
