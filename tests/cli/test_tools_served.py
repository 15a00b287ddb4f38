"""An agent's tools are served wherever it runs; a tool nobody serves refuses the run at
its start; a call to a tool nothing serves fails the attempt.

Each test runs ``cardbus run`` in a subprocess (its working directory holds the agents'
module and the plan), the LLM agents' model being the loopback OpenAI stub, and reads
the run's SQLite log.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cardbus.eventstore import events as ev
from cardbus.tools.cli import cli
from tests.agents.openai_stub import OpenAIStub, Reply
from tests.cli.doors import log_of
from tests.mcpservers import SCRIPT as MCP_SCRIPT

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "tutorials" / "llm-agents.md"


def tutorial_file(title: str) -> str:
    """The code block of the llm-agents tutorial titled ``title``, as the reader copies it."""
    found = re.search(rf'```python title="{re.escape(title)}"\n(.*?)```', PAGE.read_text(), re.S)
    assert found is not None, f"no {title} block in {PAGE}"
    return found.group(1)


def cardbus_run(
    folder: Path, plan: dict[str, Any], stub: OpenAIStub
) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    (folder / "plan.json").write_text(json.dumps(plan))
    env = {**os.environ, "OPENAI_BASE_URL": stub.url, "CARDBUS_MODEL": "stub-model"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "cardbus.tools", "run", "plan.json", "--store", "log.db"]
    return subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=120)


def test_the_tutorials_explainer_calls_its_tool_under_cardbus_run(tmp_path: Path) -> None:
    (tmp_path / "glossary.py").write_text(tutorial_file("glossary.py"))
    plan = {
        "plan_id": "explain-1",
        "goal": "Explain a term",
        "agents": ["glossary:Explainer"],
        "tasks": [{"id": "explain", "capability": "explain", "inputs": {"term": "tide"}}],
    }
    with OpenAIStub() as stub:
        stub.script(
            Reply(tool_calls=[("glossary", {"term": "tide"})]),
            Reply(content=json.dumps({"term": "tide", "sentence": "The sea rises and falls."})),
        )
        done = cardbus_run(tmp_path, plan, stub)
        bodies = stub.bodies()
    assert done.returncode == 0, done.stdout + done.stderr
    # the model was offered the tool with its schema, and got its result back
    (offered,) = bodies[0]["tools"]
    assert offered["function"]["name"] == "glossary"
    assert offered["function"]["parameters"]["properties"] == {"term": {"type": "string"}}
    (answer,) = [m for m in bodies[1]["messages"] if m["role"] == "tool"]
    assert json.loads(answer["content"]) == {"term": "tide", "meaning": "what tide means"}
    # the log has the call before it ran, and its result
    events = [e.data for e in log_of(tmp_path)]
    (requested,) = [e for e in events if isinstance(e, ev.ToolRequested)]
    (called,) = [e for e in events if isinstance(e, ev.ToolCalled)]
    assert (requested.tool, requested.arguments) == ("glossary", {"term": "tide"})
    assert called.error is None
    assert called.result == {"term": "tide", "meaning": "what tide means"}
    assert any(isinstance(e, ev.RunCompleted) for e in events)


UNSERVED = """
import msgspec
from cardbus import LLMAgent


class Term(msgspec.Struct):
    term: str


class Lonely(LLMAgent):
    agent_id = "lonely"
    description = "Declares a tool that nothing serves."
    capability = "explain"
    input_type = Term
    output_type = Term
    tools = ["nowhere"]
"""


def test_a_tool_nobody_serves_refuses_the_run_at_its_start(tmp_path: Path) -> None:
    (tmp_path / "lonely.py").write_text(UNSERVED)
    plan = {
        "goal": "Explain a term",
        "agents": ["lonely:Lonely"],
        "tasks": [{"id": "explain", "capability": "explain", "inputs": {"term": "tide"}}],
    }
    with OpenAIStub() as stub:
        done = cardbus_run(tmp_path, plan, stub)
        asked = len(stub.requests)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    # the agent, the tool and how to provide it
    assert "'lonely'" in lines[0] and "'nowhere'" in lines[0], lines[0]
    assert "Tool.define" in lines[0] and "--mcp" in lines[0], lines[0]
    # nothing ran: no run in the log, no model asked
    assert asked == 0
    assert not any(isinstance(e.data, ev.RunStarted) for e in log_of(tmp_path))


@pytest.mark.parametrize(
    "command",
    [["a2a", "serve", "--port", "0"], ["ui", "--port", "0"]],
    ids=["a2a serve", "ui"],
)
def test_a_server_whose_agent_declares_a_tool_nobody_serves_refuses_to_start(
    tmp_path: Path, command: list[str]
) -> None:
    (tmp_path / "lonely.py").write_text(UNSERVED)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    cmd = [sys.executable, "-m", "cardbus.tools", *command, "--agent", "lonely:Lonely"]
    cmd += ["--store", str(tmp_path / "log.db")]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "'lonely'" in line and "'nowhere'" in line and "--mcp" in line, line


UNKNOWN = """
import msgspec
from cardbus import AgentConstraints, LLMAgent


class Term(msgspec.Struct):
    term: str


class Guesser(LLMAgent):
    agent_id = "guesser"
    description = "May call a tool that nothing serves."
    capability = "explain"
    input_type = Term
    output_type = Term
    constraints = AgentConstraints(tools=["ghost"])
"""


def test_a_call_to_a_tool_nothing_serves_fails_the_attempt(tmp_path: Path) -> None:
    (tmp_path / "guesser.py").write_text(UNKNOWN)
    plan = {
        "goal": "Explain a term",
        "agents": ["guesser:Guesser"],
        "tasks": [{"id": "explain", "capability": "explain", "inputs": {"term": "tide"}}],
    }
    with OpenAIStub() as stub:
        stub.script(
            Reply(tool_calls=[("ghost", {"term": "tide"})]),
            Reply(content=json.dumps({"term": "answered anyway"})),
        )
        done = cardbus_run(tmp_path, plan, stub)
        asked = len(stub.requests)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "tool_not_found" in done.stdout, done.stdout
    # the model was never told: the attempt failed at the call, and was not retried
    assert asked == 1
    events = [e.data for e in log_of(tmp_path)]
    (called,) = [e for e in events if isinstance(e, ev.ToolCalled)]
    assert (called.tool, called.error_type) == ("ghost", "not_found")
    (failed,) = [e for e in events if isinstance(e, ev.TaskFailed)]
    assert failed.reason == "tool_not_found"
    assert not any(isinstance(e, ev.RunCompleted) for e in events)


class Proc:
    """A ``cardbus`` command in its own process, its output in a file."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str], name: str) -> None:
        self.log = cwd / f"{name}.log"
        self._out = open(self.log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cardbus.tools", *args],
            cwd=cwd,
            env={**env, "PYTHONUNBUFFERED": "1"},
            stdout=self._out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            assert self.proc.poll() is None, f"exited ({self.proc.returncode}):\n{self.output()}"
            assert time.monotonic() < deadline, f"no {text!r} after {timeout}s:\n{self.output()}"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()


def on_nats(
    folder: Path,
    nats_url: str,
    stub: OpenAIStub,
    agent_args: list[str],
    plan: dict[str, Any],
    orchestrator_args: tuple[str, ...] = (),
) -> dict[str, Any]:
    """``cardbus agent serve AGENT_ARGS`` and ``cardbus orchestrator --plan`` (each its own
    process, the agents' model the stub); the run's result and its one task's timeline."""
    (folder / "plan.json").write_text(json.dumps(plan))
    env = {**os.environ, "OPENAI_BASE_URL": stub.url, "CARDBUS_MODEL": "stub-model"}
    env["PYTHONPATH"] = os.pathsep.join([str(folder), str(ROOT)])
    agents = Proc(["agent", "serve", *agent_args, "--nats", nats_url], folder, env, "agents")
    orch: Proc | None = None
    try:
        agents.wait_for("serving ")
        args = ["orchestrator", "--nats", nats_url, "--plan", "plan.json", "--json"]
        orch = Proc([*args, "--timeout", "120", *orchestrator_args], folder, env, "orchestrator")
        assert orch.proc.wait(150) == 0, orch.output() + agents.output()
    finally:
        if orch is not None:
            orch.stop()
        agents.stop()
    result = json.loads(orch.output().strip().splitlines()[-1])
    replay = CliRunner().invoke(cli, ["replay", result["root_id"], "--json", "--store", nats_url])
    assert replay.exit_code == 0, replay.output
    (task,) = json.loads(replay.stdout)["tasks"]
    return {"result": result, "task": task}


def tool_steps(task: dict[str, Any]) -> list[dict[str, Any]]:
    return [s["payload"] for s in task["steps"] if s["kind"] == "tool.called"]


@pytest.mark.timeout(180)
def test_agent_serve_runs_the_agents_tool_and_gives_the_model_its_schema(
    tmp_path: Path, nats_url: str
) -> None:
    """On NATS the orchestrator's process has no glossary: the agent's process runs it."""
    (tmp_path / "glossary.py").write_text(tutorial_file("glossary.py"))
    plan = {
        "goal": "Explain a term",
        "tasks": [{"id": "explain", "capability": "explain", "inputs": {"term": "tide"}}],
    }
    with OpenAIStub() as stub:
        stub.script(
            Reply(tool_calls=[("glossary", {"term": "tide"})]),
            Reply(content=json.dumps({"term": "tide", "sentence": "The sea rises and falls."})),
        )
        run = on_nats(tmp_path, nats_url, stub, ["glossary:Explainer"], plan)
        bodies = stub.bodies()
    assert run["result"]["status"] == "completed"
    (offered,) = bodies[0]["tools"]
    assert offered["function"]["parameters"]["properties"] == {"term": {"type": "string"}}
    (answer,) = [m for m in bodies[1]["messages"] if m["role"] == "tool"]
    assert json.loads(answer["content"]) == {"term": "tide", "meaning": "what tide means"}
    assert tool_steps(run["task"]) == [
        {
            "arguments": {"term": "tide"},
            "result": {"term": "tide", "meaning": "what tide means"},
            "error": None,
        }
    ]


ADDER = """
import msgspec
from cardbus import LLMAgent


class Question(msgspec.Struct):
    question: str


class Total(msgspec.Struct):
    total: int


class Adder(LLMAgent):
    agent_id = "adder"
    description = "Adds with an MCP server's tool."
    capability = "add"
    input_type = Question
    output_type = Total
    tools = ["calc__add"]
"""


@pytest.mark.timeout(180)
def test_agent_serve_mounts_mcp_servers_for_its_agents(tmp_path: Path, nats_url: str) -> None:
    """An MCP tool declared by name, its server mounted by `agent serve --mcp`: the agent's
    process runs it and its model is offered its schema; the orchestrator mounts nothing."""
    (tmp_path / "adder.py").write_text(ADDER)
    plan = {
        "goal": "Add",
        "tasks": [{"id": "sum", "capability": "add", "inputs": {"question": "2+3?"}}],
    }
    with OpenAIStub() as stub:
        stub.script(
            Reply(tool_calls=[("calc__add", {"a": 2, "b": 3})]),
            Reply(content=json.dumps({"total": 5})),
        )
        flag = f"calc={sys.executable} {MCP_SCRIPT}"
        run = on_nats(tmp_path, nats_url, stub, ["adder:Adder", "--mcp", flag], plan)
        bodies = stub.bodies()
    assert run["result"]["status"] == "completed", run["result"]
    (offered,) = bodies[0]["tools"]
    assert offered["function"]["name"] == "calc__add"
    assert set(offered["function"]["parameters"]["properties"]) == {"a", "b"}
    (called,) = tool_steps(run["task"])
    assert called["arguments"] == {"a": 2, "b": 3} and called["error"] is None
    assert "5" in json.dumps(called["result"])


@pytest.mark.timeout(180)
def test_agent_serve_offers_the_model_the_orchestrators_tool_schemas(
    tmp_path: Path, nats_url: str
) -> None:
    """The MCP server mounted by the orchestrator: the agent's process asks it the specs
    of the tools the agent declares by name, and its model is offered their schemas."""
    (tmp_path / "adder.py").write_text(ADDER)
    plan = {
        "goal": "Add",
        "tasks": [{"id": "sum", "capability": "add", "inputs": {"question": "2+3?"}}],
    }
    with OpenAIStub() as stub:
        stub.script(
            Reply(tool_calls=[("calc__add", {"a": 2, "b": 3})]),
            Reply(content=json.dumps({"total": 5})),
        )
        mcp = ("--mcp", f"calc={sys.executable} {MCP_SCRIPT}")
        run = on_nats(tmp_path, nats_url, stub, ["adder:Adder"], plan, orchestrator_args=mcp)
        bodies = stub.bodies()
    assert run["result"]["status"] == "completed", run["result"]
    (offered,) = bodies[0]["tools"]
    assert offered["function"]["name"] == "calc__add"
    assert set(offered["function"]["parameters"]["properties"]) == {"a", "b"}
    (called,) = tool_steps(run["task"])
    assert called["arguments"] == {"a": 2, "b": 3} and called["error"] is None
