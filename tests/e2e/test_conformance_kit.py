"""``cardbus agent check`` against a cardbus Python agent (``cardbus agent serve``): the
reference the kit is judged by passes every clause, the journal's too (the demo's
researcher makes a model call, on the mock LLM)."""

from __future__ import annotations

import json
from pathlib import Path

from agentprocs import cardbus
from natsprocs import Proc, env_for
from natsserver import NatsServer

from cardbus.bus.conformance import CLAUSES


def test_a_cardbus_agent_passes_every_clause(tmp_path: Path, nats_server: NatsServer) -> None:
    url = nats_server.url
    serve = ["agent", "serve", "cardbus.agents.demo:Researcher", "--nats", url]
    agent = Proc(serve, tmp_path, env_for(tmp_path), "researcher")
    try:
        agent.wait_for("serving researcher")
        check = cardbus(
            "agent", "check", "--nats", url, "--agent", "researcher", "--json", cwd=tmp_path
        )
    finally:
        agent.stop()
    assert check.returncode == 0, check.stdout + check.stderr
    report = json.loads(check.stdout)
    assert report["passed"] and report["agent_id"] == "researcher"
    outcomes = {c["name"]: c["outcome"] for c in report["clauses"]}
    assert outcomes == dict.fromkeys(CLAUSES, "pass"), report
    journal = next(c for c in report["clauses"] if c["name"] == "journal")
    assert journal["detail"] == "2 model call(s) journaled"
