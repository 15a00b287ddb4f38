"""One line, the right one: what a failed run, a timeout and an error say (issue 26, item 5).

Each case asserts exactly one line on stderr (never a traceback) and the exit code
(``cardbus.tools.errors``: 1 an error or a failed run, 124 a timeout); a timeout
also leaves the log with the run ended and the reason of its end. The agents are
tests/cli/oneline_agents.py, named by import path as a user would.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lifecycle_log import RunIds

from cardbus.eventstore import Envelope, SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import AmbiguousId, CardbusError, IdNotFound
from cardbus.projections import resolve_id
from cardbus.projections.outcome import first_failure
from cardbus.tools.cli import cli
from cardbus.tools.errors import EXIT_TIMEOUT, one_line

HERE = Path(__file__).parent


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def only_line(text: str) -> str:
    """The one line of ``text`` (stderr), failing on more, on none, or on a traceback."""
    assert "Traceback" not in text, text
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def write_plan(tmp_path: Path, tasks: list[dict[str, Any]], agents: list[str]) -> str:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"goal": "a test", "tasks": tasks, "agents": agents}))
    return str(plan)


async def _read(db: str, root: str) -> list[Envelope]:
    store = await SqliteEventStore.open(db)
    try:
        return await store.read_correlation(root)
    finally:
        await store.close()


def run_events(db: str, root: str) -> list[Envelope]:
    return asyncio.run(_read(db, root))


def task_id(events: list[Envelope], name: str) -> str:
    return next(
        e.stream for e in events if isinstance(e.data, ev.TaskCreated) and e.data.plan_id == name
    )


FAILING = [
    {"id": "x", "capability": "fix", "inputs": {"n": 1}, "max_attempts": 2},
    {"id": "y", "capability": "inc", "inputs": {"n": {"$dep": "x", "path": "n"}}, "deps": ["x"]},
]
FAILING_AGENTS = ["oneline_agents:Broken", "oneline_agents:Inc"]


def test_a_failed_run_ends_on_the_task_that_failed_it_and_why(tmp_path: Path) -> None:
    db = str(tmp_path / "c.db")
    r = invoke("run", write_plan(tmp_path, FAILING, FAILING_AGENTS), "--store", db)
    assert r.exit_code == 1, r.output
    lines = r.stdout.strip().splitlines()
    root = lines[0].split()[1].rstrip(":")
    x = task_id(run_events(db, root), "x")
    # y never ran (cancelled because x failed): the line names x, the cause, alone
    assert lines[-1] == (
        f"run {root} failed: task {x} (fix) failed: agent_error: RuntimeError: always broken"
        " (attempt 2 of 2)"
    )
    assert r.stderr == ""  # no agent asked a model: no word about models


def test_a_failed_run_in_json_names_the_task_too(tmp_path: Path) -> None:
    db = str(tmp_path / "c.db")
    r = invoke("run", write_plan(tmp_path, FAILING, FAILING_AGENTS), "--store", db, "--json")
    assert r.exit_code == 1, r.output
    out = json.loads(r.stdout)
    x = task_id(run_events(db, out["root_id"]), "x")
    assert out["status"] == "failed"
    assert out["failure"] == {
        "task_id": x,
        "task": "x",
        "capability": "fix",
        "ended": "failed",
        "reason": "agent_error",
        "error": "RuntimeError: always broken",
        "attempts": 2,
        "max_attempts": 2,
    }


def test_a_run_that_found_no_plan_says_the_planners_reason(tmp_path: Path) -> None:
    """Not a task's failure: the run's own reason, with the planner's rejection and hint."""
    db = str(tmp_path / "c.db")
    r = invoke("run", "--goal", "zzz qqq", "--agent", "oneline_agents:Stuck", "--store", db)
    assert r.exit_code == 1, r.output
    root = r.stdout.splitlines()[0].split()[1].rstrip(":")
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith(f"run {root} failed: planning_failed: "), last
    assert "cannot_plan" in last and "--input n=" in last, last


def _assert_ended_on_timeout(db: str, root: str) -> None:
    """The run is not left running: it was cancelled (by the command), and its tasks say
    why."""
    events = run_events(db, root)
    assert any(isinstance(e.data, ev.RunFailed) for e in events), [e.type for e in events]
    cancelled = [e.data for e in events if isinstance(e.data, ev.TaskCancelled)]
    assert cancelled and all(c.reason.startswith("client_timed_out: ") for c in cancelled)
    failure = first_failure(events)  # what a later look at the run names as its cause
    assert failure is not None and failure.ended == "cancelled"
    assert failure.reason.startswith("client_timed_out: "), failure
    runs = json.loads(invoke("runs", "--store", db, "--json").stdout)
    row = {x["root_id"]: x for x in runs}[root]
    assert row["status"] == "cancelled" and "client_timed_out: " in row["reason"], row


def test_a_run_past_its_timeout_is_cancelled_and_exits_124(tmp_path: Path) -> None:
    db = str(tmp_path / "c.db")
    plan = write_plan(
        tmp_path, [{"id": "w", "capability": "wait", "inputs": {"n": 1}}], ["oneline_agents:Stuck"]
    )
    r = invoke("run", plan, "--store", db, "--timeout", "0.5")
    assert r.exit_code == EXIT_TIMEOUT == 124, r.output
    line = only_line(r.stderr)
    root = r.stdout.splitlines()[0].split()[1].rstrip(":")
    assert line == (
        f"Error: timed out after 0.5 s waiting for run {root}: cancelled it (1 task(s), reason"
        f" client_timed_out); see cardbus replay {root} --store {db}"
    )
    _assert_ended_on_timeout(db, root)

    # a fork of it on the same stuck agent: the same, for the run the fork started
    started = next(e for e in run_events(db, root) if isinstance(e.data, ev.RunStarted))
    f = invoke("fork", root, "--at", started.event_id, "--store", db, "--timeout", "0.5")
    assert f.exit_code == 124, f.output
    line = only_line(f.stderr)
    assert line.startswith("Error: timed out after 0.5 s waiting for run "), line
    forked = line.split("waiting for run ")[1].split(":")[0]
    assert forked != root
    _assert_ended_on_timeout(db, forked)


def test_planning_past_its_timeout_is_one_line_and_124(tmp_path: Path) -> None:
    r = invoke(
        "plan",
        "add one to a number",
        "--agent",
        "oneline_agents:Inc",
        "--agent",
        "oneline_agents:StuckPlanner",
        "--timeout",
        "0.5",
    )
    assert r.exit_code == 124, r.output
    assert only_line(r.stderr) == (
        "Error: timed out after 0.5 s waiting for a plan for 'add one to a number'; nothing"
        " was written (planning runs on a log in memory)"
    )


@pytest.mark.parametrize("command", [["ui"], ["a2a", "serve"]])
def test_a_port_in_use_is_one_line(tmp_path: Path, command: list[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = invoke(*command, "--port", str(port), "--store", str(tmp_path / "c.db"))
    assert r.exit_code == 1, r.output
    assert only_line(r.stderr) == (
        f"Error: port {port} is in use on 127.0.0.1: pass --port with another port"
    )
    assert r.stdout == ""  # no banner for a server that never served


# a CLI run in which ``import MODULE`` fails as it does when its package is not installed
# (None in sys.modules: ``import`` raises ModuleNotFoundError, ``find_spec`` is None)
WITHOUT = """
import sys
sys.modules[sys.argv[1]] = None
sys.argv = ["cardbus", *sys.argv[2:]]
from cardbus.tools.cli import main
main()
"""


@pytest.mark.parametrize(
    ("module", "extra", "args"),
    [
        ("mcp", "mcp", ["run", "{plan}", "--mcp", "t=python -m server"]),
        ("a2a", "a2a", ["a2a", "serve", "--port", "0"]),
        ("a2a", "a2a", ["run", "{plan}", "--agent", "a2a+http://127.0.0.1:9"]),
        ("uvicorn", "ui", ["ui", "--port", "0"]),
        ("openai", "openai", ["run", "{plan}", "--llm-base-url", "http://127.0.0.1:9/v1"]),
        (
            "pydantic_ai",
            "pydantic-ai",
            ["run", "{plan}", "--agent", "cardbus.agents.frameworks.pydantic_ai:PydanticAIAgent"],
        ),
        (
            "agents",
            "openai-agents",
            [
                "run",
                "{plan}",
                "--agent",
                "cardbus.agents.frameworks.openai_agents:OpenAIAgentsAgent",
            ],
        ),
    ],
)
def test_a_missing_extra_is_one_line_naming_it(
    tmp_path: Path, module: str, extra: str, args: list[str]
) -> None:
    plan = write_plan(tmp_path, [{"id": "i", "capability": "inc", "inputs": {"n": 1}}], [])
    argv = [a.replace("{plan}", plan) for a in args]
    env = {**os.environ, "PYTHONPATH": str(HERE), "CARDBUS_MODEL": "m"}
    done = subprocess.run(
        [sys.executable, "-P", "-c", WITHOUT, module, *argv, "--store", str(tmp_path / "c.db")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    line = only_line(done.stderr)
    assert line.startswith(f"Error: cardbus[{extra}] is not installed"), line
    assert line.endswith(f": pip install 'cardbus[{extra}]'"), line


def test_unknown_and_ambiguous_ids_are_one_line(run_db: tuple[str, RunIds]) -> None:
    db, ids = run_db
    r = invoke("replay", "xyz", "--store", db)
    assert r.exit_code == 1
    assert only_line(r.stderr) == "Error: no task or run matches 'xyz'"
    r = invoke("cancel", "task-re", "--store", db)  # task-research, task-review
    assert r.exit_code == 1
    line = only_line(r.stderr)
    assert line.startswith("Error: 'task-re' matches 2 ids: "), line
    assert ids.research in line and ids.review in line


async def _resolve(db: str, text: str) -> str | CardbusError:
    store = await SqliteEventStore.open(db)
    try:
        return await resolve_id(store, text)
    except CardbusError as e:
        return e
    finally:
        await store.close()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40))
def test_any_id_text_resolves_or_is_one_line(run_db: tuple[str, RunIds], text: str) -> None:
    """Whatever a user types as an id: an id containing it, or one line saying why not."""
    db, _ = run_db
    found = asyncio.run(_resolve(db, text))
    typed = text.strip()
    if isinstance(found, str):  # a whole id, a unique prefix, or a unique end
        assert found.startswith(typed) or found.endswith(typed), (typed, found)
        return
    assert isinstance(found, (IdNotFound, AmbiguousId)) or not typed, repr(found)
    said = one_line(found)
    assert said is not None and "\n" not in said.message and said.exit_code == 1


def test_a_store_that_cannot_exist_is_one_line(tmp_path: Path) -> None:
    plan = write_plan(tmp_path, [{"id": "i", "capability": "inc", "inputs": {"n": 1}}], [])
    where = str(tmp_path / "no" / "such" / "dir" / "c.db")
    r = invoke("run", plan, "--agent", "oneline_agents:Inc", "--store", where)
    assert r.exit_code == 1, r.output
    assert only_line(r.stderr).startswith(f"Error: cannot open event store '{where}'")


def test_a_nats_server_that_refuses_is_one_line() -> None:
    with socket.socket() as s:  # a port nothing listens on (bound, never listening)
        s.bind(("127.0.0.1", 0))
        url = f"nats://127.0.0.1:{s.getsockname()[1]}"
        r = invoke("runs", "--store", url)
    assert r.exit_code == 1, r.output
    assert only_line(r.stderr).startswith(f"Error: cannot connect to NATS at {url}")


def test_the_model_line_is_said_once_and_only_when_a_model_is_asked(tmp_path: Path) -> None:
    r = CliRunner(env={"OPENAI_BASE_URL": None, "CARDBUS_MODEL": None}).invoke(
        cli, ["demo", "--store", str(tmp_path / "d.db")]
    )
    assert r.exit_code == 0, r.output
    said = [x for x in r.stderr.splitlines() if x.startswith("LLM:")]
    assert said == [
        "LLM: deterministic mock (mock-1); no endpoint configured (set OPENAI_BASE_URL"
        " and CARDBUS_MODEL)"
    ], r.stderr
    # agents that never ask a model: nothing about models
    plan = write_plan(tmp_path, [{"id": "i", "capability": "inc", "inputs": {"n": 1}}], [])
    r = invoke("run", plan, "--agent", "oneline_agents:Inc", "--store", str(tmp_path / "r.db"))
    assert r.exit_code == 0 and r.stderr == "", r.output


def test_agents_offering_the_same_capability_are_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = str(tmp_path / "c.db")
    tasks = [{"id": f"t{i}", "capability": "inc", "inputs": {"n": i}} for i in range(4)]
    plan = write_plan(tmp_path, tasks, ["oneline_agents:Inc", "oneline_agents:IncToo"])

    def warned() -> list[str]:  # the warnings logged (a user sees them on stderr)
        said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        caplog.clear()
        return said

    first = invoke("run", plan, "--store", db)
    assert first.exit_code == 0, first.output
    # four tasks, one warning: at the registration of the second agent, not per task
    assert warned() == ["agent inc-too: 100% of its capabilities are offered by inc too"]
    again = invoke("run", plan, "--store", db)
    assert again.exit_code == 0, again.output
    assert warned() == []  # registered already, with the same card
    listed = invoke("agents", "--store", db, "--json")
    assert listed.exit_code == 0, listed.output
    assert warned() == ["agent inc overlaps inc-too (100%)"]  # the pair, once


def with_sigint_default(cmd: list[str]) -> list[str]:
    """``cmd`` started with SIGINT's default action, as a terminal's foreground command has it.

    A suite started from a shell's background job (``make test &``, a CI runner's
    subshell) inherits SIGINT *ignored* (bash ignores it in asynchronous commands without
    job control), every child down to ``cardbus run`` inherits that, and Python keeps an
    ignored SIGINT: the Ctrl-C this test sends would never arrive, whatever cardbus does.
    """
    reset = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    return [sys.executable, "-c", reset, *cmd]


def test_an_interrupted_run_is_cancelled_with_the_reason(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT) while the run waits: the run ends, its task says why."""
    db = str(tmp_path / "c.db")
    plan = write_plan(
        tmp_path, [{"id": "w", "capability": "wait", "inputs": {"n": 1}}], ["oneline_agents:Stuck"]
    )
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    cmd = [sys.executable, "-P", "-m", "cardbus.tools", "run", plan, "--store", db]
    with subprocess.Popen(
        with_sigint_default(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    ) as p:
        assert p.stdout is not None
        first = p.stdout.readline()
        root = first.split()[1].rstrip(":")
        for line in p.stdout:  # interrupted once its agent works on the task
            if "running on stuck" in line:
                p.send_signal(signal.SIGINT)
                break
        _, err = p.communicate(timeout=120)
    assert p.returncode == 1 and only_line(err) == "Aborted!", err  # click's word for it
    events = run_events(db, root)
    assert any(isinstance(e.data, ev.RunFailed) for e in events), [e.type for e in events]
    failure = first_failure(events)
    assert failure is not None and failure.ended == "cancelled"
    assert failure.reason == "client_interrupted: cardbus run was interrupted"


def test_a_cancelled_run_ends_saying_who_cancelled_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = str(tmp_path / "c.db")
    monkeypatch.setenv("CARDBUS_TEST_DB", db)
    tasks = [{"id": "c", "capability": "cancel", "inputs": {"n": 1}, "timeout_s": 30}]
    r = invoke("run", write_plan(tmp_path, tasks, ["oneline_agents:Canceller"]), "--store", db)
    assert r.exit_code == 1, r.output  # it did not complete
    root = r.stdout.splitlines()[0].split()[1].rstrip(":")
    assert r.stdout.strip().splitlines()[-1] == (
        f"run {root} cancelled: by ops: cancelled_by_user: wrong"
    )
    events = run_events(db, root)
    (end,) = [e.data for e in events if isinstance(e.data, ev.RunFailed)]
    assert (end.reason, end.cancelled, end.cancelled_by) == ("cancelled", True, "ops")
    # no result of the cancelled task counts (its handler is stopped: the runtime's tests)
    assert not [e for e in events if isinstance(e.data, (ev.TaskCompleted, ev.TaskResultSubmitted))]
