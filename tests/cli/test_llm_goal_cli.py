"""Issue 12's done-when, on the command line: with an endpoint (a stub server on loopback)
the LLM planner and LLM agents run a goal end to end, the stub's token usage shows in
``cardbus stats``, and a plan budget below what a call may spend refuses the call before
it is sent (``budget_exceeded``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agents"))
from openai_stub import OpenAIStub

from cardbus.tools.cli import cli

GOAL = "Find facts about tides"
AGENT = "cardbus.agents.demo:Researcher"
PLAN = {
    "goal": GOAL,
    "tasks": [
        {"id": "facts", "capability": "research", "goal": GOAL, "inputs": {"topic": "tides"}}
    ],
}
FACTS = {"facts": ["Tides follow the moon (source: stub)", "Two high tides a day (source: stub)"]}


def _answer(body: Any) -> str | None:
    """The planner gets the plan, the researcher its facts: what a model would write."""
    fmt = json.dumps(body.get("response_format", {}))
    if '"tasks"' in fmt:
        return json.dumps(PLAN)
    if '"facts"' in fmt:
        return json.dumps(FACTS)
    return None


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIStub]:
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "CARDBUS_MODEL"):
        monkeypatch.delenv(name, raising=False)
    with OpenAIStub() as s:
        s.responder = _answer
        s.usage = {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150}
        yield s


def _cli(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args))


def test_the_llm_planner_and_agents_run_a_goal_and_stats_show_the_stubs_tokens(
    tmp_path: Path, stub: OpenAIStub
) -> None:
    db = str(tmp_path / "goal.db")
    endpoint = ["--llm-base-url", stub.url, "--model", "stub-m"]
    r = _cli("run", "--goal", GOAL, "--agent", AGENT, "--planner", "llm", *endpoint, "--db", db)
    assert r.exit_code == 0, r.output
    # both asked the model: the planner for the plan schema, the researcher for its facts
    asked = [json.dumps(b["response_format"]) for b in stub.bodies()]
    assert len(asked) == 2 and '"tasks"' in asked[0] and '"facts"' in asked[1]
    out = json.loads(_cli("replay", r.stdout.split()[1].rstrip(":"), "--db", db, "--json").stdout)
    by_cap = {n["capability"]: n for n in out["tasks"]}
    assert by_cap["plan"]["agent_id"] == "llm-planner"
    assert by_cap["research"]["output"]["facts"][:2] == FACTS["facts"]
    stats = json.loads(_cli("stats", "--db", db, "--json").stdout)
    cost = {(c["scope"], c["key"]): (c["input_tokens"], c["output_tokens"]) for c in stats["cost"]}
    # each call's usage as the stub reported it: 120 in, 30 out
    assert cost[("agent", "llm-planner")] == cost[("agent", "researcher")] == (120, 30)
    assert cost[("root", out["root_id"])] == (240, 60)


def test_a_budget_below_what_a_call_may_spend_refuses_it_before_it_is_sent(
    tmp_path: Path, stub: OpenAIStub
) -> None:
    plan = tmp_path / "goal.json"
    agents = [AGENT, "cardbus.agents.planning:LLMPlanner"]
    plan.write_text(json.dumps({"goal": GOAL, "agents": agents, "budget_tokens": 200}))
    db = str(tmp_path / "b.db")
    args = ["--llm-base-url", stub.url, "--model", "stub-m", "--db", db]
    r = _cli("run", str(plan), "--json", *args)
    assert r.exit_code == 1, r.output
    result = json.loads(r.stdout)
    # the planner's call may spend its prompt plus 1024 tokens (no max_tokens): over 200,
    # so it is refused before it is sent, and the planning fails for the budget
    assert (result["status"], result["reason"]) == ("failed", "planning_failed"), result
    assert "budget_exceeded" in result["detail"]
    assert stub.requests == []
    out = json.loads(_cli("replay", result["root_id"], "--db", db, "--json").stdout)
    steps = [s for n in out["tasks"] for s in n["steps"]]
    (refused,) = [s for s in steps if s["type"] == "budget.refused.v1"]
    assert "over the cap of 200 tokens" in refused["reason"]
