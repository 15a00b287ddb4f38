"""A tool call under review across a kill -9, answered from the console's HTTP API
(issue 31 item 1, its "done when").

``cardbus run`` (a subprocess) runs an agent whose ``transfer`` tool is reviewed over
500; the stub model proposes ``transfer(amount=900)``. The attempt pauses (the log has
``tool.review_requested`` and the task awaits approval); the process is killed with
SIGKILL; ``cardbus run`` again resumes the run, and a person answers from the console
(``cardbus ui``, real uvicorn on loopback, a named token): a bad edit is refused naming
the field, then ``amount=450``. The tool runs once, with 450; the model gets its result;
``cardbus replay`` shows 900 proposed, 450 approved and the actor. The command line
answers a refusal the same way, and the model gets the reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cardbus.eventstore import Envelope
from cardbus.eventstore import events as ev
from tests.agents.openai_stub import OpenAIStub, Reply
from tests.cli.doors import ROOT, Runs, cardbus, kill9, log_of, wait_in_log
from tests.cli.test_ui import Server

PAYER = """
from pathlib import Path

import msgspec
from cardbus import LLMAgent
from cardbus.agents.tools import Tool


class Order(msgspec.Struct):
    order: str


class Paid(msgspec.Struct):
    answer: str


class Transfer(msgspec.Struct):
    amount: float


def transfer(t: Transfer) -> dict:
    with open(Path(__file__).parent / "ran.txt", "a") as f:  # what ran, across processes
        f.write(f"{t.amount}\\n")
    return {"sent": t.amount}


class Payer(LLMAgent):
    agent_id = "payer"
    description = "Pays an order."
    capability = "pay"
    input_type = Order
    output_type = Paid
    instructions = "Pay the order with the transfer tool."
    tools = [
        Tool.define(
            "transfer", transfer, input_type=Transfer, review=lambda a: a["amount"] > 500
        )
    ]
"""

PLAN = {
    "plan_id": "pay-1",
    "goal": "Pay order A-1",
    "agents": ["payer:Payer"],
    "tasks": [{"id": "pay", "capability": "pay", "inputs": {"order": "A-1"}}],
}


def _script(stub: OpenAIStub) -> None:
    stub.script(
        Reply(content="Paying 900 now.", tool_calls=[("transfer", {"amount": 900})]),
        Reply(content=json.dumps({"answer": "paid"})),
    )


def _env(stub: OpenAIStub, folder: Path) -> dict[str, str]:
    env = {**os.environ, "OPENAI_BASE_URL": stub.url, "CARDBUS_MODEL": "stub-model"}
    env["PYTHONPATH"] = os.pathsep.join([str(folder), str(ROOT)])
    return env


def _held(events: list[Envelope]) -> ev.ToolReviewRequested | None:
    """The held call, once the log says so (and that the task asked a person)."""
    asked = [e.data for e in events if isinstance(e.data, ev.ApprovalRequested)]
    held = [e.data for e in events if isinstance(e.data, ev.ToolReviewRequested)]
    if asked and held:
        assert asked[0].reason == "tool_review"
        return held[0]
    return None


def until_held(folder: Path, proc: subprocess.Popen[str]) -> ev.ToolReviewRequested:
    """Wait for the log to say the call is held (the task asked a person)."""
    return wait_in_log(folder, proc, _held, "the call held")


def _post(url: str, body: dict[str, Any], token: str) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _held_then_killed(folder: Path, env: dict[str, str], runs: Runs) -> ev.ToolReviewRequested:
    (folder / "payer.py").write_text(PAYER)
    (folder / "plan.json").write_text(json.dumps(PLAN))
    first = runs.start(folder, env)
    held = until_held(folder, first)
    kill9(first)
    assert not (folder / "ran.txt").exists()  # held: the tool never ran
    return held


@contextlib.contextmanager
def _paused(
    folder: Path, runs: Runs
) -> Iterator[tuple[OpenAIStub, dict[str, str], ev.ToolReviewRequested]]:
    """The stub scripted, the run held on its 900 transfer and killed: (stub, env, held)."""
    with OpenAIStub() as stub:
        _script(stub)
        env = _env(stub, folder)
        yield stub, env, _held_then_killed(folder, env, runs)


def assert_edited_to_450_by_ada(folder: Path, env: dict[str, str], task_id: str) -> None:
    """The log and ``cardbus replay`` say: 900 proposed, 450 approved, by ada."""
    events = [e.data for e in log_of(folder)]
    (answered,) = [e for e in events if isinstance(e, ev.ToolReviewAnswered)]
    assert (answered.proposed, answered.arguments, answered.by) == (
        {"amount": 900},
        {"amount": 450},
        "ada",
    )
    replay = cardbus(folder, env, "replay", task_id)
    assert replay.returncode == 0, replay.stderr
    (line,) = [ln for ln in replay.stdout.splitlines() if "review: edit by" in ln]
    assert '{"amount": 900}' in line and '{"amount": 450}' in line and "ada" in line


def test_killed_while_held_then_approved_with_an_edit_from_the_console(
    tmp_path: Path, runs: Runs
) -> None:
    with _paused(tmp_path, runs) as (stub, env, held):
        assert (held.arguments, held.text) == ({"amount": 900}, "Paying 900 now.")
        again = runs.start(tmp_path, env)  # the restart resumes the run, still held
        console = Server(tmp_path / "log.db", token="s3cret", args=("--token-name", "ada"))
        try:
            console.wait_ready("s3cret")
            url = f"{console.url}api/tasks/{held.task_id}/review"
            status, bad = _post(
                url, {"decision": "edit", "arguments": {"amount": "lots"}}, "s3cret"
            )
            assert status == 400 and "amount" in bad["error"], bad
            status, ok = _post(url, {"decision": "edit", "arguments": {"amount": 450}}, "s3cret")
            assert status == 200 and ok["by"] == "ada", ok
            out, _ = again.communicate(timeout=120)
        finally:
            console.stop()
        bodies = stub.bodies()
    assert again.returncode == 0, out
    assert (tmp_path / "ran.txt").read_text() == "450.0\n"  # once, with the edited amount
    tool_answers = [m for m in bodies[-1]["messages"] if m["role"] == "tool"]
    assert [json.loads(m["content"]) for m in tool_answers] == [{"sent": 450.0}]
    assert_edited_to_450_by_ada(tmp_path, env, held.task_id)


def test_refused_from_the_command_line_the_model_gets_the_reason(
    tmp_path: Path, runs: Runs
) -> None:
    with _paused(tmp_path, runs) as (stub, env, held):
        again = runs.start(tmp_path, env)
        refuse = ("review", held.task_id, "refuse", "--reason", "over the daily limit")
        said = cardbus(tmp_path, env, *refuse, "--by", "bo")
        assert said.returncode == 0, said.stdout + said.stderr
        out, _ = again.communicate(timeout=120)
        bodies = stub.bodies()
    assert again.returncode == 0, out
    assert not (tmp_path / "ran.txt").exists()
    (answer,) = [m for m in bodies[-1]["messages"] if m["role"] == "tool"]
    assert "over the daily limit" in answer["content"] and "bo" in answer["content"]
