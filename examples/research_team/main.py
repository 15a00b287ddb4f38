"""Run the research team on a plan: research -> write, on a SQLite log in this folder.

    python main.py                 # the deterministic mock: offline, same answer each time
    OPENAI_BASE_URL=http://localhost:8000/v1 CARDBUS_MODEL=NAME python main.py

Then ``cardbus replay research-team-1 --store team.db`` shows every step, the model
calls and the tool calls included.
"""

from __future__ import annotations

import asyncio
import json
import os

from team import NOTES_TOOL, Researcher, Writer

from cardbus import EmbeddedRuntime, MockLLM, SqliteEventStore
from cardbus.agents import LLM, ToolRegistry, configured_llm

PLAN = {
    "plan_id": "research-team-1",
    "goal": "A short article on tides",
    "tasks": [
        {"id": "research", "capability": "research", "inputs": {"topic": "tides"}},
        {
            "id": "write",
            "capability": "write",
            "deps": ["research"],
            "inputs": {"topic": "tides", "facts": {"$dep": "research", "path": "facts"}},
        },
    ],
}


async def main() -> dict[str, object]:
    llm: LLM
    if os.environ.get("OPENAI_BASE_URL"):
        llm = configured_llm()  # the endpoint and model (CARDBUS_MODEL) of the environment
    else:  # the deterministic mock, told which tool call to make
        llm = MockLLM(tool_script=[[("notes", {"term": "tides"})]])
    store = await SqliteEventStore.open("team.db")
    try:
        async with EmbeddedRuntime(
            store, [Researcher, Writer], llm=llm, tools=ToolRegistry([NOTES_TOOL])
        ) as runtime:
            result = await runtime.run(PLAN, timeout=120)
    finally:
        await store.close()
    print(json.dumps({"status": result.status, "article": result.outputs.get("write")}, indent=2))
    if result.status != "completed":
        raise SystemExit(f"the run did not complete: {result.reason}")
    return dict(result.outputs)


if __name__ == "__main__":
    outputs = asyncio.run(main())
    if not os.environ.get("OPENAI_BASE_URL"):  # the mock's answer is known in advance
        assert outputs["write"] == {
            "title": "About tides",
            "text": "Tides are the rise and fall of the sea, driven by the Moon's gravity.",
        }, outputs
