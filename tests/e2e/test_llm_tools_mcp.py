"""An LLM agent with tools, end to end: the model (the OpenAI-compatible stub on
loopback) calls a tool of a real MCP server started over stdio and a cardbus tool;
every model turn and both tool calls are in the log, and ``cardbus replay`` shows them.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
from click.testing import CliRunner

from cardbus.agents import LLMAgent
from cardbus.agents.llm import OpenAIChatLLM
from cardbus.agents.tools import Tool, ToolRegistry
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import events as ev
from cardbus.eventstore.sqlite import SqliteEventStore
from cardbus.tools.cli import cli
from tests.agents.openai_stub import OpenAIStub, Reply
from tests.mcpservers import stdio_server


class Question(msgspec.Struct):
    question: str


class Answer(msgspec.Struct):
    answer: str
    total: int


class Calculator(LLMAgent):
    agent_id = "calculator"
    description = "Answers with sums, using an MCP server's add tool and a cardbus tool."
    capability = "calculate"
    input_type = Question
    output_type = Answer
    instructions = "Use the tools; answer with the total."
    tools = ("calc__add", "shout")


async def test_an_llm_agent_calls_an_mcp_tool_and_a_cardbus_tool(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    registry = ToolRegistry(
        [Tool.define("shout", lambda a: {"loud": str(a["text"]).upper()}, idempotent=True)]
    )
    with OpenAIStub() as stub:
        stub.script(
            Reply(tool_calls=[("calc__add", {"a": 2, "b": 3}), ("shout", {"text": "five"})]),
            Reply(content=json.dumps({"answer": "FIVE", "total": 5})),
        )
        llm = OpenAIChatLLM(stub.url, "stub-model")
        async with (
            await SqliteEventStore.open(db) as store,
            EmbeddedRuntime(
                store, [Calculator], llm=llm, tools=registry, mcp_servers=[stdio_server("calc")]
            ) as rt,
        ):
            result = await rt.run(
                {
                    "plan_id": "llm-mcp",
                    "goal": "add two and three",
                    "tasks": [
                        {"id": "sum", "capability": "calculate", "inputs": {"question": "2+3?"}}
                    ],
                },
                timeout=60,
            )
            events = [e.data for e in await store.read_correlation(result.root_id)]
        bodies = stub.bodies()
    assert result.status == "completed", result
    assert result.outputs["sum"] == {"answer": "FIVE", "total": 5}
    # the model was offered both tools and got both results back in its second turn
    offered = {t["function"]["name"] for t in bodies[0]["tools"]}
    assert offered == {"calc__add", "shout"}
    tool_messages = [m for m in bodies[1]["messages"] if m["role"] == "tool"]
    assert len(tool_messages) == 2 and "5" in tool_messages[0]["content"]
    assert "FIVE" in tool_messages[1]["content"]
    # in the log: two model turns and the two tool calls, each requested before it ran
    answered = [e for e in events if isinstance(e, ev.ModelAnswered)]
    assert len(answered) == 2 and answered[0].answer["tool_calls"]
    called = {e.tool: e for e in events if isinstance(e, ev.ToolCalled)}
    assert called.keys() == {"calc__add", "shout"}
    assert called["shout"].result == {"loud": "FIVE"} and called["calc__add"].error is None
    # the CLI runs its own event loop: in a thread, as from a terminal
    args = ["replay", result.root_id, "--store", str(db)]
    replay = await asyncio.to_thread(CliRunner().invoke, cli, args)
    assert replay.exit_code == 0, replay.output
    assert replay.output.count("model.answered") == 2
    assert "calc__add" in replay.output and "shout" in replay.output
