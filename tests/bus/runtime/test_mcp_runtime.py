"""MCP tools in a run: a plain cardbus agent calls a real MCP server's tools through
``ctx.tool`` on the embedded runtime, which starts the servers with itself; the
orchestrator checks its glob allow-list and records every call and refusal."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from mcpservers import SCRIPT, Ask, Asker, stdio_server

from cardbus.agents.agent import Agent, Capability, TaskContext
from cardbus.agents.cards import AgentConstraints, TaskCard
from cardbus.agents.mcp_config import MCPServer
from cardbus.agents.tools import ToolFailed, ToolRegistry
from cardbus.bus.orchestrator.plan import Plan, PlanTask
from cardbus.bus.orchestrator.reviews import answer_review
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import MemoryEventStore
from cardbus.eventstore import events as ev


def _plan(hang: bool) -> Plan:
    return Plan(
        goal="ask the MCP tools",
        tasks=[PlanTask(id="ask", capability="ask", inputs={"text": "tide", "hang": hang})],
    )


async def test_an_agent_calls_mcp_tools_checked_and_recorded() -> None:
    store = MemoryEventStore()
    registry = ToolRegistry()
    servers = [stdio_server("t", timeout_s=1), stdio_server("u")]
    async with EmbeddedRuntime(store, [Asker], tools=registry, mcp_servers=servers) as rt:
        assert {"t__echo", "u__echo"} <= {s.name for s in registry.specs()}
        result = await rt.run(_plan(hang=True), timeout=120)
        # the runtime stays usable after the timeout: a second run calls the same session
        again = await rt.run(_plan(hang=False), timeout=120)
    assert result.status == "completed", result
    out = result.outputs["ask"]
    assert out["echo"] == {"result": "tide"} and out["add"] == {"sum": 5}
    assert out["hang"] == {"error": "ToolTimeout"}
    assert out["after"] == {"sum": 2}
    assert out["other"] == {"error": "AccessDenied"}  # u__* is not on its allow-list
    assert again.status == "completed" and again.outputs["ask"]["add"] == {"sum": 5}

    events = [e.data for e in await store.read_correlation(result.root_id)]
    requested = [e.tool for e in events if isinstance(e, ev.ToolRequested)]
    called = {e.tool: e for e in events if isinstance(e, ev.ToolCalled)}
    assert requested == ["t__echo", "t__add", "t__hang", "t__add"]
    assert called["t__echo"].result == {"result": "tide"}
    assert called["t__echo"].arguments == {"text": "tide"}
    assert called["t__hang"].error_type == "timeout"
    refused = [e for e in events if isinstance(e, ev.AccessRefused)]
    assert [(r.target, r.reason) for r in refused] == [("u__echo", "tool_not_allowed")]
    # stopped with the runtime: its tools fail at once, typed
    try:
        await asyncio.wait_for(registry.call("t__echo", {"text": "x"}), 30)
    except ToolFailed as e:
        assert "not running" in str(e)
    else:
        raise AssertionError("a stopped server answered")


async def test_the_nats_runtime_mounts_them_too(nats_url: str) -> None:
    from cardbus.bus.runtime.nats import NatsRuntime
    from cardbus.eventstore.nats.connection import NatsOptions

    servers = [stdio_server("t"), stdio_server("u")]
    async with NatsRuntime(NatsOptions(url=nats_url), [Asker], mcp_servers=servers) as rt:
        assert rt.tools is not None and "t__echo" in rt.tools  # a registry of its own
        result = await rt.run(_plan(hang=False), timeout=120)
        events = [e.data for e in await rt.store.read_correlation(result.root_id)]
    assert result.status == "completed", result
    assert result.outputs["ask"]["echo"] == {"result": "tide"}
    assert result.outputs["ask"]["other"] == {"error": "AccessDenied"}
    assert [e.tool for e in events if isinstance(e, ev.ToolCalled)] == [
        "t__echo",
        "t__add",
        "t__add",
    ]


class Adder(Agent):
    """Echoes, then adds: two MCP tools, the second under review (the server's config)."""

    agent_id = "mcp-adder"
    capabilities = [Capability("add", Ask, dict)]
    constraints = AgentConstraints(tools=["t__*"])

    async def handle(self, task: TaskCard, inputs: Ask, ctx: TaskContext) -> dict[str, Any]:
        echo = await ctx.tool("t__echo", text=inputs.text)
        return {"echo": echo, "add": await ctx.tool("t__add", a=2, b=3)}


async def test_an_mcp_tool_under_review_waits_for_a_person() -> None:
    """The server's entry says its ``add`` is reviewed (the config file's ``review`` key):
    the call is held, nothing reaches the server until a person approves, then it runs."""
    store = MemoryEventStore()
    entry = {"command": sys.executable, "args": [SCRIPT], "review": {"add": "always"}}
    server = MCPServer.from_entry("t", entry)
    assert (server.review_of("add"), server.review_of("echo")) == ("always", "never")
    plan = Plan(goal="add", tasks=[PlanTask(id="a", capability="add", inputs={"text": "x"})])
    async with EmbeddedRuntime(store, [Adder], tools=ToolRegistry(), mcp_servers=[server]) as rt:
        root = await rt.submit(plan)
        while not [
            e
            for e in await store.read_correlation(root)
            if e.type.startswith("task.approval_requested")
        ]:
            await asyncio.sleep(0.02)
        [held] = [
            e.data
            for e in await store.read_correlation(root)
            if isinstance(e.data, ev.ToolReviewRequested)
        ]
        assert (held.tool, held.arguments) == ("t__add", {"a": 2, "b": 3})
        called = [
            e.data.tool
            for e in await store.read_correlation(root)
            if isinstance(e.data, ev.ToolCalled)
        ]
        assert called == ["t__echo"]  # the held call never reached the server
        await answer_review(store, held.task_id, "approve", by="ada")
        result = await rt.orchestrator.wait(root, timeout=60)
    assert result.status == "completed", result
    assert result.outputs["a"] == {"echo": {"result": "x"}, "add": {"sum": 5}}
