"""On a NATS deployment, as an operator would: a run waits for approval, the CLI answers.

A real nats-server; ``cardbus agent serve`` and ``cardbus orchestrator --plan``
in their own processes; every other step is a ``cardbus ... --store nats://``
command: find the waiting task, approve it, then replay, tasks, verify and
export read the finished run from JetStream.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from cardbus.tools.cli import cli

PLAN = {
    "goal": "Research tides, once a human agrees",
    "plan_id": "nats-approval",
    "tasks": [
        {
            "id": "research",
            "capability": "research",
            "inputs": {"topic": "tides"},
            "requires_approval": True,
        }
    ],
}


class Proc:
    def __init__(self, args: list[str], cwd: Path, name: str) -> None:
        self.log = cwd / f"{name}.log"
        self._out = open(self.log, "wb")  # noqa: SIM115 - closed in stop()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cardbus.tools", *args],
            cwd=cwd,
            env=env,
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


def cardbus(*args: str) -> Result:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


@pytest.mark.timeout(180)
def test_a_waiting_task_is_approved_on_nats_by_the_cli(tmp_path: Path, nats_url: str) -> None:
    url = nats_url
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    agents = Proc(
        ["agent", "serve", "cardbus.agents.demo:Researcher", "--nats", url], tmp_path, "agents"
    )
    orch: Proc | None = None
    try:
        agents.wait_for("serving researcher")
        orch = Proc(
            ["orchestrator", "--nats", url, "--plan", str(plan), "--json", "--timeout", "120"],
            tmp_path,
            "orchestrator",
        )
        # the operator looks for what waits, on the log in JetStream
        deadline = time.monotonic() + 60
        waiting: list[dict[str, object]] = []
        while not waiting:
            assert orch.proc.poll() is None, orch.output()
            assert time.monotonic() < deadline, "no task awaiting approval after 60 s"
            args = ["tasks", "--status", "awaiting_approval", "--json", "--store", url]
            out = CliRunner().invoke(cli, args)
            if out.exit_code == 1:  # the orchestrator has not created the stream yet
                assert "stream 'CARDBUS_EVENTS' does not exist" in out.stderr, out.output
            else:
                assert out.exit_code == 0, out.output
                waiting = json.loads(out.stdout)
            time.sleep(0.2)
        (task,) = waiting
        task_id, root = str(task["task_id"]), str(task["root_id"])
        runs = cardbus("runs", "--store", url).stdout
        assert f"cardbus approve {task_id} --store {url}" in runs
        assert "awaiting_approval" in cardbus("replay", "nats-approval", "--store", url).stdout
        assert orch.proc.poll() is None  # the run waits for the answer

        approved = cardbus("approve", task_id, "--store", url, "--by", "ops", "--json")
        assert json.loads(approved.stdout)["answer"] == "approved"

        assert orch.proc.wait(90) == 0, orch.output()
        result = json.loads(orch.output().strip().splitlines()[-1])
        assert result["status"] == "completed" and result["root_id"] == root
    finally:
        if orch is not None:
            orch.stop()
        agents.stop()

    rows = json.loads(cardbus("tasks", "--root", root, "--json", "--store", url).stdout)
    assert [(r["task_id"], r["status"]) for r in rows] == [(task_id, "completed")]
    timeline = json.loads(cardbus("replay", root, "--json", "--store", url).stdout)
    kinds = [s["kind"] for t in timeline["tasks"] for s in t["steps"]]
    assert "approval_granted" in kinds and kinds[-1] == "completed", kinds
    assert "OK: hash chains intact in the whole log" in cardbus("verify", "--store", url).stdout
    exported = cardbus("export", root, "--root", "--console", "--json", "--store", url)
    assert json.loads(exported.stdout)["spans"] >= 2
