"""The Node agent (``examples/node_agent``: the ``nats`` client from npm, nothing of
cardbus) passes every clause of ``cardbus agent check``, and serves a plan's task run by
``cardbus orchestrator`` under the documented per-agent permissions, replayed and verified.

It needs ``node`` and ``npm`` (Node 18 or later) and the example's ``node_modules``
(``make install`` runs ``npm ci`` there when npm is present; when they are missing the
test runs it, from npm's cache first). Without node or npm the tests are skipped saying
so (``make test`` lists every skip with its reason: ``-rs``); with them, an install that
cannot be had fails them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from agentprocs import REPO, AgentProcess, cardbus, clauses
from natsserver import NatsServer

from cardbus.bus.conformance import CLAUSES
from cardbus.tools.cmd_nats import authorization_config

EXAMPLE = REPO / "examples" / "node_agent"


def node_ready() -> str:
    """The ``node`` executable, with the example's dependencies installed. Without node
    or npm the test is skipped, naming what is missing; with them, a missing install that
    ``npm ci`` cannot make fails it."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        missing = " and ".join(n for n, p in (("node", node), ("npm", npm)) if p is None)
        pytest.skip(
            f"{missing} not found on PATH: install Node.js 18+ with npm to run the Node agent"
        )
    if not (EXAMPLE / "node_modules" / "nats").is_dir():
        # the set-up step, done here when it was not: from npm's cache, else the registry
        for args in (["--offline"], []):
            done = subprocess.run(
                [npm, "ci", *args, "--no-audit", "--no-fund"],
                cwd=EXAMPLE,
                capture_output=True,
                text=True,
                timeout=300,
            )
            if done.returncode == 0:
                break
        else:
            pytest.fail(
                f"{EXAMPLE}/node_modules is missing and `npm ci` could not install it"
                f" (run `npm install` in {EXAMPLE} once):\n{done.stderr[-2000:]}"
            )
    return node


def node_agent(tmp: Path, url: str, *args: str, name: str = "node") -> AgentProcess:
    return AgentProcess([node_ready(), str(EXAMPLE / "agent.mjs"), "--nats", url, *args], tmp, name)


def test_the_node_agent_passes_the_kit(tmp_path: Path, nats_server: NatsServer) -> None:
    url = nats_server.url
    agent = node_agent(tmp_path, url, "--agent", "shout", "--lease", "1.5")
    try:
        agent.wait_for("connected")  # it waits for the streams: the kit makes them
        check = cardbus("agent", "check", "--nats", url, "--agent", "shout", cwd=tmp_path)
    finally:
        agent.stop()
    assert check.returncode == 0, check.stdout + check.stderr + agent.output()
    outcomes = clauses(check.stdout)
    assert sorted(outcomes) == sorted(CLAUSES), check.stdout
    assert {c for c, o in outcomes.items() if o != "PASS"} == {"journal"}, check.stdout
    assert outcomes["journal"] == "NOT EXERCISED"  # it makes no model call


def test_the_node_agent_serves_a_plan_under_its_permissions(tmp_path: Path) -> None:
    config = authorization_config(["shout"], "pw")
    with NatsServer(tmp_path / "nats", extra_config=config) as server:
        url = server.url
        as_orchestrator = {"CARDBUS_NATS_USER": "orchestrator", "CARDBUS_NATS_PASSWORD": "pw"}
        as_shout = ("--agent", "shout", "--user", "agent-shout", "--password", "pw")
        agent = node_agent(tmp_path, url, *as_shout)
        try:
            agent.wait_for("connected")
            plan = {
                "goal": "shout it",
                "tasks": [{"id": "s", "capability": "text.shout", "inputs": {"text": "hey"}}],
            }
            (tmp_path / "plan.json").write_text(json.dumps(plan))
            run = cardbus(
                "orchestrator", "--nats", url, "--plan", "plan.json", "--json",
                "--timeout", "60", cwd=tmp_path, env=as_orchestrator,
            )  # fmt: skip
        finally:
            agent.stop()
        assert run.returncode == 0, run.stdout + run.stderr + agent.output()
        result = json.loads(run.stdout.strip().splitlines()[-1])
        assert result["status"] == "completed" and result["outputs"]["s"] == {"text": "HEY!"}
        # it attempted nothing its user may not do: the server saw no violation from it
        assert "violation" not in server.log_tail(400).lower(), server.log_tail(400)
        replay = cardbus(
            "replay", result["root_id"], "--store", url, cwd=tmp_path, env=as_orchestrator
        )
        assert replay.returncode == 0, replay.stdout + replay.stderr
        assert re.search(r"result_submitted +#1 shout +result completed", replay.stdout)
        verify = cardbus("verify", "--store", url, cwd=tmp_path, env=as_orchestrator)
        assert verify.returncode == 0, verify.stdout + verify.stderr


def test_the_tutorial_writes_the_example_as_it_is() -> None:
    """docs/tutorials/other-language.md runs the agent it shows: that is the example's."""
    page = (REPO / "docs" / "tutorials" / "other-language.md").read_text()
    for name in ("agent.mjs", "package.json"):
        found = re.search(rf'^```\w+ title="{re.escape(name)}"\n(.*?)^```$', page, re.M | re.S)
        assert found is not None, name
        assert found.group(1) == (EXAMPLE / name).read_text(), f"{name} differs from the example"
    assert "import" in page and not re.search(r"from ['\"]cardbus", page)
