"""The Node agent (``examples/node_agent``: the ``nats`` client from npm, nothing of
cardbus) passes every clause of ``cardbus agent check`` (the journal's too: with a model,
the loopback OpenAI stub, it journals its calls), serves a plan's tasks run by ``cardbus
orchestrator`` under the documented per-agent permissions, replayed and verified, and
loses no card on a slow link (a card that reaches it after its pull request expired).

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
from typing import Any

import pytest
from agentprocs import REPO, AgentProcess, cardbus, clauses
from natsserver import NatsServer
from slowlink import SlowLink

from cardbus.bus.conformance import CLAUSES
from cardbus.tools.cmd_nats import authorization_config
from tests.agents.openai_stub import OpenAIStub

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


def test_the_node_agent_passes_every_clause_of_the_kit(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    url = nats_server.url
    with OpenAIStub() as stub:
        stub.script("forty-two", "forty-two")
        agent = node_agent(tmp_path, url, "--agent", "asker", "--lease", "1.5", "--llm", stub.url)
        try:
            agent.wait_for("connected")  # it waits for the streams: the kit makes them
            check = cardbus(
                "agent", "check", "--nats", url, "--agent", "asker", "--capability", "text.ask",
                cwd=tmp_path,
            )  # fmt: skip
        finally:
            agent.stop()
    assert check.returncode == 0, check.stdout + check.stderr + agent.output()
    assert clauses(check.stdout) == dict.fromkeys(CLAUSES, "PASS"), check.stdout
    assert "2 model call(s) journaled" in check.stdout
    # one call for each card it took (the take and the partition clauses'), none for the
    # redelivered card: it answers that from what it answered before
    assert len(stub.requests) == 2
    assert stub.requests[0]["body"]["messages"] == [{"role": "user", "content": "conformance"}]


def _journaled(url: str, root: str, cwd: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    """The run's events, as ``cardbus tail --json`` prints them."""
    tail = cardbus("tail", "--store", url, "--json", "-n", "1000", cwd=cwd, env=env)
    assert tail.returncode == 0, tail.stdout + tail.stderr
    events = [json.loads(line) for line in tail.stdout.splitlines() if line.strip()]
    return [e for e in events if e["correlation_id"] == root]


def test_the_node_agent_serves_a_plan_under_its_permissions(tmp_path: Path) -> None:
    config = authorization_config(["shout"], "pw")
    with (
        NatsServer(tmp_path / "nats", extra_config=config) as server,
        OpenAIStub() as stub,
    ):
        stub.script("because")
        url = server.url
        as_orchestrator = {"CARDBUS_NATS_USER": "orchestrator", "CARDBUS_NATS_PASSWORD": "pw"}
        as_shout = ("--agent", "shout", "--user", "agent-shout", "--password", "pw")
        agent = node_agent(tmp_path, url, *as_shout, "--llm", stub.url)
        try:
            agent.wait_for("connected")
            plan = {
                "goal": "shout it, and ask why",
                "tasks": [
                    {"id": "s", "capability": "text.shout", "inputs": {"text": "hey"}},
                    {"id": "q", "capability": "text.ask", "inputs": {"question": "why?"}},
                ],
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
        assert result["status"] == "completed"
        assert result["outputs"] == {"s": {"text": "HEY!"}, "q": {"answer": "because"}}
        # it attempted nothing its user may not do: the server saw no violation from it
        assert "violation" not in server.log_tail(400).lower(), server.log_tail(400)
        replay = cardbus(
            "replay", result["root_id"], "--store", url, cwd=tmp_path, env=as_orchestrator
        )
        assert replay.returncode == 0, replay.stdout + replay.stderr
        assert len(re.findall(r"result_submitted +#1 shout +result completed", replay.stdout)) == 2
        verify = cardbus("verify", "--store", url, cwd=tmp_path, env=as_orchestrator)
        assert verify.returncode == 0, verify.stdout + verify.stderr
        # its model call is in the log like a Python agent's: asked, then answered
        events = _journaled(url, result["root_id"], tmp_path, as_orchestrator)
    calls = [e for e in events if e["data"]["type"].startswith("model.")]
    assert [e["data"]["type"] for e in calls] == ["model.requested.v1", "model.answered.v1"], events
    answered = calls[1]["data"]
    assert (answered["agent_id"], answered["input_tokens"], answered["output_tokens"]) == (
        "shout",
        11,
        7,
    )
    assert answered["answer"]["text"] == "because"


def test_no_card_is_lost_on_a_slow_link(tmp_path: Path, nats_server: NatsServer) -> None:
    """The agent 0.6 s from its server each way: every card reaches it after the pull
    request that fetched it has expired by the agent's own clock, were that one second
    (``next({expires: 1000})`` forgot its pull then and dropped every card; each came
    back only after the 30 s ack wait, to be dropped again). Every card is answered at
    its first delivery. (Each card is late, the first one to a pull waiting on the server
    as the others to one that finds it waiting: three cards show both, and every card
    costs the test two round trips, 2.4 s.)"""
    url = nats_server.url
    with SlowLink(nats_server.port, delay_s=0.6) as link:
        agent = node_agent(tmp_path, link.url, "--agent", "shout", "--lease", "3")
        try:
            agent.wait_for("connected", timeout=60)
            check = cardbus(
                "agent", "check", "--nats", url, "--agent", "shout", "--timeout", "25",
                cwd=tmp_path,
            )  # fmt: skip
            assert check.returncode == 0, check.stdout + check.stderr + agent.output()
            outcomes = clauses(check.stdout)
            assert {c for c, o in outcomes.items() if o != "PASS"} == {"journal"}, check.stdout
            tasks = [
                {"id": f"s{i}", "capability": "text.shout", "inputs": {"text": f"card {i}"}}
                for i in range(3)
            ]
            (tmp_path / "plan.json").write_text(json.dumps({"goal": "far", "tasks": tasks}))
            run = cardbus(
                "orchestrator", "--nats", url, "--plan", "plan.json", "--json",
                "--timeout", "120", cwd=tmp_path,
            )  # fmt: skip
        finally:
            agent.stop()
        assert link.connections >= 1  # it did talk through the link
    assert run.returncode == 0, run.stdout + run.stderr + agent.output()
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["status"] == "completed"
    assert result["outputs"] == {f"s{i}": {"text": f"CARD {i}!"} for i in range(3)}
    events = _journaled(url, result["root_id"], tmp_path, {})
    answered = [e["data"] for e in events if e["data"]["type"] == "task.result_submitted.v1"]
    # each card answered once, at its first attempt and its first delivery: none was lost
    assert sorted((a["attempt"], a["delivery"]) for a in answered) == [(1, 1)] * 3, answered


def test_the_tutorial_writes_the_example_as_it_is() -> None:
    """docs/tutorials/other-language.md runs the agent it shows: that is the example's."""
    page = (REPO / "docs" / "tutorials" / "other-language.md").read_text()
    for name in ("agent.mjs", "package.json"):
        found = re.search(rf'^```\w+ title="{re.escape(name)}"\n(.*?)^```$', page, re.M | re.S)
        assert found is not None, name
        assert found.group(1) == (EXAMPLE / name).read_text(), f"{name} differs from the example"
    assert "import" in page and not re.search(r"from ['\"]cardbus", page)
