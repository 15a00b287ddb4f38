"""``cardbus run PLAN.json`` with framework agents named by import path: an OpenAI Agents
SDK agent and a pydantic-ai agent, both on the loopback OpenAI-compatible stub, beside a
plain cardbus agent. The process dies (``os._exit``) in the SDK agent's tool call, after
two model calls; the same command run again resumes the run from the log, and the
completed model calls are not sent to the stub again.

Deterministic: the process kills itself at a given point (a marker file), no timer; the
dead attempt is noticed by its task's timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev
from tests.agents.openai_stub import OpenAIStub, Reply

AGENTS = """
import os
from pathlib import Path

import msgspec
import pydantic
from agents import Agent as SDKAgent
from agents import OpenAIChatCompletionsModel, function_tool
from openai import AsyncOpenAI
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from cardbus.agents import Agent, Capability
from cardbus.agents.frameworks import openai_agents_agent
from cardbus.agents.frameworks import pydantic_ai_agent

URL = os.environ["FW_STUB_URL"]
MARKER = Path(os.environ["FW_MARKER"])


class Topic(msgspec.Struct):
    topic: str


class Term(msgspec.Struct):
    term: str


class Explanation(pydantic.BaseModel):
    term: str
    sentence: str


class Topics(Agent):
    agent_id = "topics"
    capabilities = [Capability("topic", Topic, Term)]

    async def handle(self, task, inputs, ctx):
        return Term(term=inputs.topic.lower())


@function_tool
def note(text: str) -> str:
    \"\"\"Keep a note.\"\"\"
    if not MARKER.exists():
        MARKER.write_text("died here")
        os._exit(9)  # the process dies during the tool call
    return "kept"


client = AsyncOpenAI(base_url=URL, api_key="k", max_retries=0)
Explainer = openai_agents_agent(
    SDKAgent(
        name="explainer",
        instructions="Keep a note, then explain the term.",
        output_type=Explanation,
        tools=[note],
        model=OpenAIChatCompletionsModel(model="stub-model", openai_client=client),
    ),
    capability="explain",
    input_type=Term,
    idempotent_tools=["note"],  # so the call the crash cut off may be made again
)
Shortener = pydantic_ai_agent(
    PydanticAgent(
        OpenAIChatModel("stub-model", provider=OpenAIProvider(base_url=URL, api_key="k")),
        name="shortener",
        instructions="Shorten the sentence.",
    ),
    capability="shorten",
)
"""

PLAN: dict[str, Any] = {
    "plan_id": "framework-agents-crash",
    "goal": "explain a term, then shorten it",
    "agents": ["fw_agents:Topics", "fw_agents:Explainer", "fw_agents:Shortener"],
    "tasks": [
        {"id": "pick", "capability": "topic", "inputs": {"topic": "Tide"}},
        {
            "id": "explain",
            "capability": "explain",
            "deps": ["pick"],
            "timeout_s": 8.0,
            "inputs": {"term": {"$dep": "pick", "path": "term"}},
        },
        {
            "id": "shorten",
            "capability": "shorten",
            "deps": ["explain"],
            "inputs": {"prompt": {"$dep": "explain", "path": "sentence"}},
        },
    ],
}


async def test_run_dies_in_a_framework_agent_and_resumes_without_asking_again(
    tmp_path: Path,
) -> None:
    (tmp_path / "fw_agents.py").write_text(AGENTS)
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    db = tmp_path / "run.db"
    cmd = [sys.executable, "-m", "cardbus.tools", "run", "plan.json", "--db", str(db), "--json"]
    with OpenAIStub() as stub:
        stub.script(
            Reply(content=None, tool_calls=[("note", {"text": "tide"})]),
            Reply(content='{"term": "tide", "sentence": "The sea rises and falls."}'),
            Reply(content="The sea rises."),
        )
        # only the agents' folder: the SDK's `agents` is the installed one; cardbus is installed
        env = {
            **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
            "PYTHONPATH": str(tmp_path),
            "FW_STUB_URL": stub.url,
            "FW_MARKER": str(tmp_path / "died"),
        }
        first = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, timeout=120)
        assert first.returncode == 9, first.stderr.decode()
        assert len(stub.requests) == 1  # the SDK agent's first model call, then death
        second = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, timeout=120)
        assert second.returncode == 0, second.stderr.decode()
        bodies = stub.bodies()
    result = json.loads(second.stdout)
    assert result["status"] == "completed", result
    assert result["outputs"]["explain"] == {"term": "tide", "sentence": "The sea rises and falls."}
    assert result["outputs"]["shorten"] == "The sea rises."
    # after the restart: the first model call answered from the log, the note made, then
    # the SDK agent's second call and the pydantic-ai agent's one: 3 requests in all
    assert len(bodies) == 3
    assert bodies[2]["messages"][-1]["content"] == "The sea rises and falls."
    async with await SqliteEventStore.open(db, create=False) as store:
        events = [e.data for e in await store.read_correlation(result["root_id"])]
    answered = [e for e in events if isinstance(e, ev.ModelAnswered)]
    assert [(e.agent_id, e.attempt, e.replayed_from is not None) for e in answered] == [
        ("explainer", 1, False),
        ("explainer", 2, True),
        ("explainer", 2, False),
        ("shortener", 1, False),
    ]
    # the note's effect was unknown (no tool.called before the crash): made again, as the
    # agent declared it idempotent, with the same idempotency key
    (unknown,) = [e for e in events if isinstance(e, ev.ToolEffectUnknown)]
    assert (unknown.tool, unknown.decision) == ("note", "repeat")
    called = [e for e in events if isinstance(e, ev.ToolCalled) and e.tool == "note"]
    assert [(e.attempt, e.local, e.result) for e in called] == [(2, True, "kept")]
