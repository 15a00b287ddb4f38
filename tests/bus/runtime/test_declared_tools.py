"""Who serves an agent's declared tools (bus.runtime.tools_served), on a real runtime."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from cardbus.agents.llm import MockLLM
from cardbus.agents.llm_agent import LLMAgent
from cardbus.agents.tools import Tool, ToolRegistry
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.bus.runtime.tools_served import ToolNotServed, worker_tools
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev


class Term(msgspec.Struct):
    term: str


CALLS: list[str] = []


def look_up(args: Term) -> dict[str, str]:
    CALLS.append(args.term)
    return {"term": args.term, "meaning": "the agent's own"}


OWN = Tool.define("glossary", look_up, Term)
RUNTIMES = Tool.define("glossary", lambda a: {"term": a.term, "meaning": "the runtime's"}, Term)


class Explainer(LLMAgent):
    agent_id = "explainer"
    description = "Looks a term up."
    capability = "explain"
    input_type = Term
    output_type = Term
    tools = [OWN, "doc_search"]


PLAN = {"goal": "g", "tasks": [{"id": "e", "capability": "explain", "inputs": {"term": "t"}}]}


async def _called(db: Path, tools: ToolRegistry | None) -> list[ev.Event]:
    llm = MockLLM(tool_script=[[("glossary", {"term": "tide"})]])
    async with (
        await SqliteEventStore.open(db) as store,
        EmbeddedRuntime(store, [Explainer], llm=llm, tools=tools) as rt,
    ):
        result = await rt.run(PLAN, timeout=30)
        assert result.status == "completed", result
        events = [e.data for e in await store.read_correlation(result.root_id)]
    return [e for e in events if isinstance(e, (ev.ToolRequested, ev.ToolCalled))]


async def test_the_agents_own_tool_runs_in_its_worker(tmp_path: Path) -> None:
    CALLS.clear()
    requested, called = await _called(tmp_path / "a.db", None)
    assert isinstance(requested, ev.ToolRequested) and requested.local  # run by the worker
    assert isinstance(called, ev.ToolCalled) and called.result["meaning"] == "the agent's own"
    assert CALLS == ["tide"]


async def test_the_runtimes_tool_of_that_name_wins(tmp_path: Path) -> None:
    CALLS.clear()
    registry = ToolRegistry([RUNTIMES, Tool.define("doc_search", lambda a: {})])
    requested, called = await _called(tmp_path / "b.db", registry)
    assert isinstance(requested, ev.ToolRequested) and not requested.local
    assert isinstance(called, ev.ToolCalled) and called.result["meaning"] == "the runtime's"
    assert CALLS == []


async def test_a_tool_declared_by_name_that_nothing_serves_refuses_the_start(
    tmp_path: Path,
) -> None:
    registry = ToolRegistry([RUNTIMES])  # no doc_search
    async with await SqliteEventStore.open(tmp_path / "c.db") as store:
        with pytest.raises(ToolNotServed, match="'explainer' declares tool 'doc_search'"):
            async with EmbeddedRuntime(store, [Explainer], tools=registry):
                pass
        assert await store.read_all(0, 10) == []  # refused before anything was written


def test_the_worker_offers_the_specs_of_what_it_and_the_runtime_serve() -> None:
    served = ToolRegistry([Tool.define("doc_search", lambda a: {}), Tool.define("x", print)])
    tools = worker_tools(Explainer, served)
    assert tools.here is not None and "glossary" in tools.here
    assert sorted(tools.specs) == ["doc_search", "glossary"]  # "x" is not on its allow-list
