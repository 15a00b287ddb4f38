"""``--llm-base-url`` / ``--model`` and their environment variables on ``run`` and ``demo``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner
from openai_stub import OpenAIStub

from cardbus.agents import Agent, Capability
from cardbus.agents.demo import Researcher
from cardbus.agents.llm import MockLLM, OpenAIChatLLM, configured_llm, describe_llm
from cardbus.eventstore.errors import ConfigError
from cardbus.tools.cli import cli

ENV = ("OPENAI_BASE_URL", "OPENAI_API_KEY", "CARDBUS_MODEL")


@pytest.fixture(autouse=True)
def no_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def stub() -> Iterator[OpenAIStub]:
    with OpenAIStub() as s:
        s.honour_schema = True  # the demo's agents are LLM agents: they ask for their schema
        yield s


def research_plan(tmp_path: Path) -> str:
    plan = {
        "goal": "Find facts about tides",
        "agents": ["cardbus.agents.demo:Researcher"],
        "tasks": [{"id": "research", "capability": "research", "inputs": {"topic": "tides"}}],
    }
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return str(path)


def test_without_an_endpoint_the_mock_is_used_and_said_so(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["run", research_plan(tmp_path), "--db", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("LLM:")]
    assert lines == [describe_llm(MockLLM())]
    assert "no endpoint configured" in lines[0] and "OPENAI_BASE_URL" in lines[0]
    assert "LLM:" not in result.stdout  # stdout stays the result (and --json stays JSON)


def test_run_uses_the_endpoint_and_model_flags(tmp_path: Path, stub: OpenAIStub) -> None:
    args = ["run", research_plan(tmp_path), "--db", str(tmp_path / "d"), "--json"]
    result = CliRunner().invoke(cli, [*args, "--llm-base-url", stub.url, "--model", "tiny-1"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["status"] == "completed"
    assert f"LLM: tiny-1 at {stub.url}" in result.stderr
    (body,) = stub.bodies()
    assert body["model"] == "tiny-1" and "tides" in body["messages"][-1]["content"]


def test_demo_reads_the_environment(
    tmp_path: Path, stub: OpenAIStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", stub.url)
    monkeypatch.setenv("CARDBUS_MODEL", "env-model")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    result = CliRunner().invoke(cli, ["demo", "--db", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    assert f"LLM: env-model at {stub.url}" in result.stderr
    assert stub.requests and {b["model"] for b in stub.bodies()} == {"env-model"}
    assert {r["headers"]["authorization"] for r in stub.requests} == {"Bearer sk-env"}


def test_an_endpoint_without_a_model_is_a_usage_error(tmp_path: Path) -> None:
    args = ["run", research_plan(tmp_path), "--db", str(tmp_path / "d")]
    result = CliRunner().invoke(cli, [*args, "--llm-base-url", "http://127.0.0.1:9/v1"])
    assert result.exit_code == 2
    assert "needs a model: set CARDBUS_MODEL or pass --model" in result.stderr


class N(msgspec.Struct):
    n: int


class Inc(Agent):
    """Asks no model."""

    agent_id = "inc"
    capabilities = [Capability("inc", N, N, "adds one")]

    async def handle(self, task: Any, inputs: Any, ctx: Any) -> Any:
        return N(inputs.n + 1)


class Asker(Agent):
    """Asks the endpoint's default model through ``ctx.llm`` (not an LLMAgent)."""

    agent_id = "asker"
    capabilities = [Capability("ask", N, N, "asks a model")]

    async def handle(self, task: Any, inputs: Any, ctx: Any) -> Any:
        await ctx.llm.complete("a number?")
        return N(inputs.n)


class OwnModelResearcher(Researcher):
    agent_id = "own-model-researcher"
    model = "own-model"


def _plan(tmp_path: Path, capability: str, agent: str) -> str:
    plan = {
        "goal": "g",
        "agents": [f"test_llm_cli:{agent}"],
        "tasks": [{"id": "t", "capability": capability, "inputs": {"n": 1}}],
    }
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return str(path)


def test_an_endpoint_without_a_model_is_no_error_when_no_agent_asks_it(
    tmp_path: Path, stub: OpenAIStub
) -> None:
    """OPENAI_BASE_URL set for another SDK's agent (the OpenAI Agents SDK reads it too) in a
    plan with no cardbus LLM agent: the run runs, and nothing is sent."""
    args = ["run", _plan(tmp_path, "inc", "Inc"), "--db", str(tmp_path / "d"), "--json"]
    result = CliRunner(env={"OPENAI_BASE_URL": stub.url}).invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["outputs"] == {"t": {"n": 2}}
    assert stub.requests == [] and "LLM:" not in result.stderr


def test_a_call_that_names_no_model_fails_its_task_with_where_to_name_one(
    tmp_path: Path, stub: OpenAIStub
) -> None:
    args = ["run", _plan(tmp_path, "ask", "Asker"), "--db", str(tmp_path / "d"), "--json"]
    result = CliRunner(env={"OPENAI_BASE_URL": stub.url}).invoke(cli, args)
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert doc["status"] == "failed"
    assert "needs a model: set CARDBUS_MODEL or pass --model" in json.dumps(doc["failure"])
    assert stub.requests == []  # refused before anything was sent


def test_an_llm_agent_with_its_own_model_needs_no_default(tmp_path: Path, stub: OpenAIStub) -> None:
    plan = {
        "goal": "Find facts about tides",
        "agents": ["test_llm_cli:OwnModelResearcher"],
        "tasks": [{"id": "research", "capability": "research", "inputs": {"topic": "tides"}}],
    }
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    args = ["run", str(path), "--db", str(tmp_path / "d"), "--json"]
    result = CliRunner(env={"OPENAI_BASE_URL": stub.url}).invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert {b["model"] for b in stub.bodies()} == {"own-model"}


def test_configured_llm() -> None:
    assert isinstance(configured_llm(env={}), MockLLM)
    assert configured_llm(model="m", env={}).model == "m"  # type: ignore[attr-defined]
    # a key alone sends nothing anywhere
    assert isinstance(configured_llm(env={"OPENAI_API_KEY": "sk"}), MockLLM)
    llm = configured_llm(env={"OPENAI_BASE_URL": "http://h:1/v1", "CARDBUS_MODEL": "x"})
    assert isinstance(llm, OpenAIChatLLM) and (llm.base_url, llm.model) == ("http://h:1/v1", "x")
    flag = configured_llm("http://flag/v1", "f", env={"OPENAI_BASE_URL": "http://env/v1"})
    assert isinstance(flag, OpenAIChatLLM) and flag.base_url == "http://flag/v1"
    with pytest.raises(ConfigError, match="needs a model"):
        configured_llm(env={"OPENAI_BASE_URL": "http://h:1/v1"})
    lazy = configured_llm(env={"OPENAI_BASE_URL": "http://h:1/v1"}, model_required=False)
    assert isinstance(lazy, OpenAIChatLLM) and lazy.model == ""
    assert describe_llm(lazy).startswith("LLM: (no model named) at http://h:1/v1")


async def test_a_model_less_endpoint_refuses_a_call_that_names_none() -> None:
    llm = configured_llm(env={"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}, model_required=False)
    try:
        with pytest.raises(ConfigError, match="needs a model: set CARDBUS_MODEL"):
            await llm.complete("hello")
    finally:
        await llm.aclose()  # type: ignore[attr-defined]
