"""Framework pauses across a kill -9, answered from the command line (issue 31 item 5,
its "done when").

``cardbus run`` (a subprocess) runs a pydantic-ai agent whose ``transfer`` tool
requires approval (its own ``FunctionModel``), or an OpenAI Agents SDK agent whose
``transfer`` has ``needs_approval`` (its chat-completions model against the loopback
stub). The model proposes ``transfer(amount=900)``: the attempt pauses on the bus (the
log has ``tool.review_requested``, the task awaits approval), and the process is killed
with SIGKILL. ``cardbus run`` again resumes the run; ``cardbus review TASK edit --args``
answers from another process. The tool runs once, with 450; the model gets its result;
``cardbus replay`` shows 900 proposed, 450 approved and the actor.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cardbus.eventstore import events as ev
from tests.agents.openai_stub import OpenAIStub, Reply
from tests.cli.doors import Runs, cardbus, kill9, log_of
from tests.cli.test_tool_review_doors import assert_edited_to_450_by_ada, until_held

PYDANTIC_AI = """
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import FunctionModel

from cardbus.agents.frameworks import pydantic_ai_agent


def answer(messages, info):
    returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    if not returns:
        return ModelResponse(
            parts=[TextPart("Paying 900 now."), ToolCallPart("transfer", {"amount": 900})]
        )
    return ModelResponse(parts=[TextPart(f"paid: {returns[-1].content}")])


inner = Agent(FunctionModel(answer, model_name="scripted"), name="payer", output_type=str)


@inner.tool_plain(requires_approval=True)
def transfer(amount: float) -> dict:
    \"\"\"Send money.\"\"\"
    with open(Path(__file__).parent / "ran.txt", "a") as f:  # what ran, across processes
        f.write(f"{amount}\\n")
    return {"sent": amount}


Payer = pydantic_ai_agent(inner, capability="pay")
"""

AGENTS_SDK = """
import os
from pathlib import Path

from agents import Agent, OpenAIChatCompletionsModel, function_tool
from openai import AsyncOpenAI

from cardbus.agents.frameworks import openai_agents_agent


@function_tool(needs_approval=True)
def transfer(amount: float) -> dict:
    \"\"\"Send money.\"\"\"
    with open(Path(__file__).parent / "ran.txt", "a") as f:  # what ran, across processes
        f.write(f"{amount}\\n")
    return {"sent": amount}


client = AsyncOpenAI(base_url=os.environ["PAYER_MODEL_URL"], api_key="k", max_retries=0)
inner = Agent(
    name="payer",
    instructions="Pay the order with the transfer tool.",
    tools=[transfer],
    model=OpenAIChatCompletionsModel(model="stub-model", openai_client=client),
)
Payer = openai_agents_agent(inner, capability="pay")
"""

PLAN = {
    "plan_id": "pay-1",
    "goal": "Pay order A-1",
    "agents": ["payer:Payer"],
    "tasks": [{"id": "pay", "capability": "pay", "inputs": {"prompt": "Pay order A-1"}}],
}


def _env(stub: OpenAIStub, folder: Path) -> dict[str, str]:
    # the SDK agent's model has a setting of its own (with OPENAI_BASE_URL cardbus would
    # want an LLM of its own); the folder alone on the path: the repository's root there
    # would make its agents/ folder shadow the SDK's ``agents`` (cardbus is installed)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return env | {"PAYER_MODEL_URL": stub.url, "PYTHONPATH": str(folder)}


@pytest.mark.parametrize("framework", ["pydantic-ai", "openai-agents"])
def test_a_framework_pause_survives_kill_9_and_resumes_after_a_cli_approval(
    tmp_path: Path, framework: str, runs: Runs
) -> None:
    source = PYDANTIC_AI if framework == "pydantic-ai" else AGENTS_SDK
    (tmp_path / "payer.py").write_text(source)
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    with OpenAIStub() as stub:  # the SDK's model (pydantic-ai's is its FunctionModel)
        stub.script(
            Reply(content="Paying 900 now.", tool_calls=[("transfer", {"amount": 900})]),
            Reply(content="paid"),
        )
        env = _env(stub, tmp_path)
        first = runs.start(tmp_path, env)
        held = until_held(tmp_path, first)
        kill9(first)
        assert not (tmp_path / "ran.txt").exists()  # held: the tool never ran
        assert (held.tool, held.arguments, held.text) == (
            "transfer",
            {"amount": 900},
            "Paying 900 now.",
        )
        again = runs.start(tmp_path, env)  # the restart resumes the run, still held
        edit = ("review", held.task_id, "edit", "--by", "ada")
        bad = cardbus(tmp_path, env, *edit, "--args", json.dumps({"amount": "lots"}))
        assert bad.returncode != 0 and "amount" in bad.stdout + bad.stderr
        said = cardbus(tmp_path, env, *edit, "--args", json.dumps({"amount": 450}))
        assert said.returncode == 0, said.stdout + said.stderr
        out, _ = again.communicate(timeout=120)
        bodies = stub.bodies()
    assert again.returncode == 0, out
    assert (tmp_path / "ran.txt").read_text() == "450.0\n"  # once, with the edited amount
    if framework == "openai-agents":  # one live call after the replayed proposal
        assert len(bodies) == 2
        (tool_answer,) = [m for m in bodies[-1]["messages"] if m["role"] == "tool"]
        assert "450" in tool_answer["content"]
    assert_edited_to_450_by_ada(tmp_path, env, held.task_id)
    events = [e.data for e in log_of(tmp_path)]
    (called,) = [e for e in events if isinstance(e, ev.ToolCalled)]
    assert (called.tool, called.arguments, called.result) == (
        "transfer",
        {"amount": 450},
        {"sent": 450.0},
    )
    results = [e for e in events if isinstance(e, ev.TaskResultSubmitted)]
    assert results[-1].status == "completed"
    if framework == "pydantic-ai":  # the model saw the tool's answer
        assert "450" in json.dumps(results[-1].output)
