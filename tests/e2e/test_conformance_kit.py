"""``cardbus agent check`` against a cardbus Python agent (``cardbus agent serve``): the
reference the kit is judged by passes every clause, the journal's too (the demo's
researcher makes a model call, on the mock LLM)."""

from __future__ import annotations

from pathlib import Path

from agentprocs import cardbus, clauses
from natsprocs import Proc, env_for
from natsserver import NatsServer

from cardbus.bus.conformance import CLAUSES


def test_a_cardbus_agent_passes_every_clause(tmp_path: Path, nats_server: NatsServer) -> None:
    url = nats_server.url
    serve = ["agent", "serve", "cardbus.agents.demo:Researcher", "--nats", url]
    agent = Proc(serve, tmp_path, env_for(tmp_path), "researcher")
    try:
        agent.wait_for("serving researcher")
        check = cardbus("agent", "check", "--nats", url, "--agent", "researcher", cwd=tmp_path)
    finally:
        agent.stop()
    assert check.returncode == 0, check.stdout + check.stderr
    assert clauses(check.stdout) == dict.fromkeys(CLAUSES, "PASS"), check.stdout
    assert "2 model call(s) journaled" in check.stdout
