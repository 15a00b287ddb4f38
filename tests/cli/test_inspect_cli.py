"""``cardbus tasks / tail / verify / stats / rebuild / replay`` with CliRunner on a real log."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from lifecycle_log import RunIds

from cardbus.tools.cli import cli


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def one_line_error(result: Result) -> str:
    assert result.exit_code != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


# --- tasks --------------------------------------------------------------------


def test_tasks_table_and_filters(run_db: tuple[str, RunIds]) -> None:
    db, ids = run_db
    r = invoke("tasks", "--db", db, "--wide")  # full ids, whole reasons
    assert r.exit_code == 0, r.output
    assert "5 tasks" in r.stdout
    for t in (ids.research, ids.write, ids.review, ids.code, ids.loop):
        assert t in r.stdout
    assert "failed: attempts_exhausted" in r.stdout
    r = invoke("tasks", "--db", db, "--status", "failed", "--json")
    rows = json.loads(r.stdout)
    assert [x["task_id"] for x in rows] == [ids.code]
    assert rows[0]["input"] == {} and rows[0]["attempts"] == 2
    rows = json.loads(invoke("tasks", "--db", db, "--agent", "writer-2", "--json").stdout)
    assert [x["task_id"] for x in rows] == [ids.write]
    rows = json.loads(invoke("tasks", "--db", db, "--capability", "review", "--json").stdout)
    assert rows[0]["parent_task_id"] == ids.write
    rows = json.loads(invoke("tasks", "--db", db, "--root", ids.root, "--json").stdout)
    assert len(rows) == 5
    assert json.loads(invoke("tasks", "--db", db, "--root", "nope", "--json").stdout) == []
    # the read model is kept beside the log and reused
    assert Path(db + ".proj").exists()


def test_tasks_as_of(run_db: tuple[str, RunIds]) -> None:
    db, ids = run_db
    # position 9: the write task was just rejected (positions 1..6 are the run + research)
    rows = json.loads(invoke("tasks", "--db", db, "--as-of", "9", "--json").stdout)
    by_id = {x["task_id"]: x for x in rows}
    assert set(by_id) == {ids.research, ids.write}
    assert by_id[ids.write]["status"] == "pending"
    assert by_id[ids.write]["reason"].startswith("rejected by writer-1")
    rows = json.loads(
        invoke("tasks", "--db", db, "--as-of", "2027-01-15T08:00:04Z", "--json").stdout
    )
    assert [(x["task_id"], x["status"]) for x in rows] == [(ids.research, "running")]
    r = invoke("tasks", "--db", db, "--as-of", "9")
    assert "as of position 9" in r.stdout


def test_env_var_db(run_db: tuple[str, RunIds]) -> None:
    db, _ = run_db
    r = CliRunner(env={"CARDBUS_DB": db}).invoke(cli, ["tasks", "--json"])
    assert r.exit_code == 0 and len(json.loads(r.stdout)) == 5


def test_missing_db_is_one_line(tmp_path: Path) -> None:
    for cmd in ("tasks", "tail", "verify", "stats", "rebuild"):
        r = invoke(cmd, "--db", str(tmp_path / "missing.db"))
        line = one_line_error(r)
        assert "no event store" in line and "missing.db" in line
    assert not (tmp_path / "missing.db").exists()
    r = invoke("replay", "x", "--db", str(tmp_path / "missing.db"))
    assert "no event store" in one_line_error(r)


def test_bad_as_of_is_one_line(run_db: tuple[str, RunIds]) -> None:
    db, _ = run_db
    assert "--as-of" in one_line_error(invoke("tasks", "--db", db, "--as-of", "yesterday"))


# --- replay -------------------------------------------------------------------


def test_replay_run_text(run_db: tuple[str, RunIds]) -> None:
    db, ids = run_db
    r = invoke("replay", ids.root, "--db", db)
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert f"replay of run {ids.root}" in out
    for needle in (
        "rejected by writer-1: out_of_capability (no prose)",
        "retry as attempt 2 in 0.5s: rejected",
        "revision requested (round 1): [high] intro: shorter",
        "retry as attempt 2 in 1s: output_schema_mismatch",
        "attempt 2 by coder timed out",
        "failed: attempts_exhausted (timed out)",
        "halted: loop_detected (h-loop seen 3 times)",
        "run.failed",
        ids.review,
    ):
        assert needle in out, needle
    # the review subtask is drawn under the write task
    lines = out.splitlines()
    write_line = next(i for i, x in enumerate(lines) if f"write {ids.write}" in x)
    review_line = next(i for i, x in enumerate(lines) if f"review {ids.review}" in x)
    assert review_line > write_line
    assert lines[review_line].index("review") > lines[write_line].index("write")
    # a task's status is shown where a step changed it: a result leaves it as it was
    results = [x for x in lines if "result_submitted" in x]
    assert results and not any(" -> " in x for x in results), results
    assert any("dispatched" in x and "-> dispatched" in x for x in lines)
    assert any("completed" in x and "-> completed" in x for x in lines)


def test_replay_task_json(run_db: tuple[str, RunIds]) -> None:
    db, ids = run_db
    r = invoke("replay", ids.write, "--db", db, "--json")
    t = json.loads(r.stdout)
    assert t["id"] == ids.write and t["root_id"] == ids.root and t["run"] == []
    [node] = t["tasks"]
    assert node["status"] == "completed" and node["attempts"] == 3
    assert [c["task_id"] for c in node["children"]] == [ids.review]
    kinds = [s["kind"] for s in node["steps"]]
    assert kinds[:4] == ["created", "dispatched", "rejected", "retry_scheduled"]
    assert "revision_requested" in kinds
    rejected = node["steps"][2]
    assert rejected["agent_id"] == "writer-1" and rejected["attempt"] == 1
    assert rejected["status"] == "pending" and rejected["duration_s"] == 1.0
    spans = [(s["attempt"], s["agent_id"], s["outcome"]) for s in node["spans"]]
    assert spans == [
        (1, "writer-1", "rejected"),
        (2, "writer-2", "revision"),
        (3, "writer-2", "completed"),
    ]
    assert node["spans"][1]["latency_s"] == 5.0
    assert t["events"] == 12 + 5  # the write task's steps plus its review subtask's


def test_replay_as_of(run_db: tuple[str, RunIds]) -> None:
    db, ids = run_db
    t = json.loads(invoke("replay", ids.root, "--db", db, "--as-of", "9", "--json").stdout)
    assert t["as_of"] == "position 9"
    assert [n["task_id"] for n in t["tasks"]] == [ids.research, ids.write]
    assert t["tasks"][1]["status"] == "pending"
    # a task that did not exist yet
    r = invoke("replay", ids.code, "--db", db, "--as-of", "9")
    assert ids.code in one_line_error(r)


def test_replay_unknown_task(run_db: tuple[str, RunIds]) -> None:
    db, _ = run_db
    line = one_line_error(invoke("replay", "no-such-task", "--db", db))
    assert "no-such-task" in line


# --- verify -------------------------------------------------------------------


def _rows(db: str, stream: str) -> list[tuple[int, bytes, str]]:
    with sqlite3.connect(db) as c:
        return c.execute(
            "SELECT position, body, hash FROM events WHERE stream = ? ORDER BY version", (stream,)
        ).fetchall()


def test_verify_ok(run_db: tuple[str, RunIds]) -> None:
    db, ids = run_db
    r = invoke("verify", "--db", db)
    assert r.exit_code == 0 and r.stdout.startswith("OK")
    r = invoke("verify", ids.write, "--db", db)
    assert r.exit_code == 0 and "12 events" in r.stdout
    r = invoke("verify", ids.root, "--db", db, "--json")
    assert json.loads(r.stdout)["ok"] is True
    assert ids.write in one_line_error(invoke("verify", ids.write + "x", "--db", db))


def test_verify_names_edited_event(run_db: tuple[str, RunIds]) -> None:
    db, ids = run_db
    position, body, _ = _rows(db, ids.write)[2]  # the rejection
    event_id = json.loads(body)["event_id"]
    edited = bytes(body).replace(b"out_of_capability", b"out_of_kapability")
    with sqlite3.connect(db) as c:
        c.execute("UPDATE events SET body = ? WHERE position = ?", (edited, position))
    for args in (("verify",), ("verify", ids.write), ("verify", ids.root)):
        r = invoke(*args, "--db", db)
        assert r.exit_code == 1
        assert event_id in r.stdout and "edited" in r.stdout
        assert "verify failed: 1 problem(s)" in r.stderr
    # other tasks are still fine
    assert invoke("verify", ids.code, "--db", db).exit_code == 0
    problems = json.loads(invoke("verify", "--db", db, "--json").stdout)["problems"]
    assert [p["event_id"] for p in problems] == [event_id]


def test_verify_names_deleted_and_reordered(run_db: tuple[str, RunIds]) -> None:
    db, ids = run_db
    rows = _rows(db, ids.code)
    after_deleted = json.loads(rows[3][1])["event_id"]
    with sqlite3.connect(db) as c:
        c.execute("DELETE FROM events WHERE position = ?", (rows[2][0],))
    r = invoke("verify", ids.code, "--db", db)
    assert r.exit_code == 1
    assert after_deleted in r.stdout and "deleted" in r.stdout
    # reorder two events of the research task: swap their stored rows' positions
    rows = _rows(db, ids.research)
    (p1, _, _), (p2, b2, _) = rows[1], rows[2]
    with sqlite3.connect(db) as c:
        c.execute("UPDATE events SET position = -1 WHERE position = ?", (p1,))
        c.execute("UPDATE events SET position = ? WHERE position = ?", (p1, p2))
        c.execute("UPDATE events SET position = ? WHERE position = -1", (p2,))
    r = invoke("verify", "--db", db)
    assert r.exit_code == 1
    assert json.loads(b2)["event_id"] in r.stdout
    assert "out of order" in r.stdout or "prev_hash" in r.stdout


# --- tail ---------------------------------------------------------------------


def test_tail(run_db: tuple[str, RunIds]) -> None:
    db, ids = run_db
    r = invoke("tail", "--db", db, "-n", "3")
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 3 and "run.failed.v1" in lines[-1] and "task.halted.v1" in lines[-2]
    r = invoke("tail", "--db", db, "--type", "task.rejected", "--type", "task.halted")
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 2
    assert "out_of_capability" in lines[0] and "loop_detected" in lines[1]
    r = invoke("tail", "--db", db, "--agent", "coder", "--json")
    events = [json.loads(x) for x in r.stdout.strip().splitlines()]
    assert events and all(e["data"].get("agent_id") == "coder" for e in events)
    r = invoke("tail", "--db", db, "--task", ids.research, "-n", "100")
    assert len(r.stdout.strip().splitlines()) == 5
    r = invoke("tail", "--db", db, "--root", ids.root, "--type", "run.", "-n", "100")
    assert len(r.stdout.strip().splitlines()) == 2
    r = invoke("tail", "--db", db, "--from", "40", "--limit", "2")
    assert [x.split()[0] for x in r.stdout.strip().splitlines()] == ["40", "41"]


def test_tail_follow_is_bounded(run_db: tuple[str, RunIds]) -> None:
    db, _ = run_db
    r = invoke("tail", "--db", db, "-n", "2", "--follow", "--timeout", "0.3")
    assert r.exit_code == 0 and len(r.stdout.strip().splitlines()) == 2
    r = invoke("tail", "--db", db, "-n", "5", "--follow", "--limit", "3")
    assert r.exit_code == 0 and len(r.stdout.strip().splitlines()) == 3


# --- stats / rebuild ------------------------------------------------------------


def test_stats(run_db: tuple[str, RunIds]) -> None:
    db, ids = run_db
    r = invoke("stats", "--db", db)
    assert r.exit_code == 0
    for needle in ("Agents", "Cost (tokens)", "Quality", "writer-2", "h-loop", "590"):
        assert needle in r.stdout, needle
    data = json.loads(invoke("stats", "--db", db, "--json").stdout)
    w2 = next(a for a in data["agents"] if a["agent_id"] == "writer-2")
    assert (w2["runs"], w2["success_rate"], w2["p50_s"]) == (2, 1.0, 4.0)
    root = next(c for c in data["cost"] if c["scope"] == "root")
    assert (root["key"], root["input_tokens"], root["output_tokens"]) == (ids.root, 590, 645)
    coder = next(q for q in data["quality"] if q["agent_id"] == "coder")
    assert coder["schema_compliance"] == 0.0
    assert data["loops"][0]["loop_hash"] == "h-loop"
    only = json.loads(invoke("stats", "--db", db, "--agent", "coder", "--json").stdout)
    assert [a["agent_id"] for a in only["agents"]] == ["coder"]
    early = json.loads(invoke("stats", "--db", db, "--as-of", "6", "--json").stdout)
    assert [a["agent_id"] for a in early["agents"]] == ["researcher"]


def test_rebuild(run_db: tuple[str, RunIds]) -> None:
    db, _ = run_db
    before = invoke("tasks", "--db", db, "--json").stdout
    r = invoke("rebuild", "--db", db)
    assert r.exit_code == 0 and "rebuilt tasks, loops, agent_stats, cost, quality" in r.stdout
    assert invoke("tasks", "--db", db, "--json").stdout == before
    data = json.loads(invoke("rebuild", "tasks", "--db", db, "--json").stdout)
    assert data["projections"] == ["tasks"] and data["position"] == 42
    r = invoke("rebuild", "nonsense", "--db", db)
    assert r.exit_code == 2 and "nonsense" in r.stderr


@pytest.mark.parametrize("cmd", ["tasks", "stats", "replay", "tail", "verify", "rebuild"])
def test_help(cmd: str) -> None:
    r = invoke(cmd, "--help")
    assert r.exit_code == 0 and "--db" in r.stdout and "--json" in r.stdout


def test_on_the_demo_database(tmp_path: Path) -> None:
    """The issue's check: replay shows the whole demo run with its revision round; verify passes."""
    import re

    db = str(tmp_path / "demo.db")
    r = invoke("demo", "--db", db)
    assert r.exit_code == 0, r.output
    # the demo's own output: the report (revised: it has a conclusion) and the run summed up
    for needle in (
        "# Report: ocean tides",
        "## Conclusion",
        "The run, read back from the log",
        "needs input",
        "revised after review",
        "review2",
    ):
        assert needle in r.stdout, needle
    found = re.search(r"cardbus replay (\S+)", r.stdout)
    assert found is not None
    root = found.group(1)
    out = invoke("replay", root, "--db", db).stdout
    for needle in ("run.started", "run.completed", "revision_requested", "revision requested"):
        assert needle in out, needle
    t = json.loads(invoke("replay", root, "--db", db, "--json").stdout)
    caps = {n["capability"] for n in t["tasks"]}
    assert {"research", "outline", "write"} <= caps
    assert all(n["status"] == "completed" for n in t["tasks"])
    assert invoke("verify", "--db", db).exit_code == 0
    assert invoke("verify", root, "--db", db).exit_code == 0
    tasks = json.loads(invoke("tasks", "--db", db, "--root", root, "--json").stdout)
    assert {x["status"] for x in tasks} == {"completed"}


def test_tail_follow_sees_new_events(run_db: tuple[str, RunIds]) -> None:
    """Events appended by another writer while ``tail --follow`` runs are printed live."""
    import asyncio
    import threading
    import time

    from cardbus.eventstore import NewEvent, SqliteEventStore
    from cardbus.eventstore import events as ev

    db, ids = run_db

    async def append_later() -> None:
        await asyncio.sleep(0.4)
        store = await SqliteEventStore.open(db)
        try:
            created = ev.TaskCreated(root_id=ids.root, capability="late")
            await store.append("late-task", [NewEvent(data=created, correlation_id=ids.root)], 0)
            dispatched = ev.TaskDispatched(attempt=1, agent_id="late-agent")
            await store.append("late-task", [NewEvent(data=dispatched, correlation_id=ids.root)], 1)
        finally:
            await store.close()

    writer = threading.Thread(target=lambda: asyncio.run(append_later()))
    writer.start()
    t0 = time.monotonic()
    r = invoke(
        "tail", "--db", db, "-n", "0", "--follow", "--limit", "1", "--type", "task.dispatched",
        "--timeout", "20",
    )  # fmt: skip
    writer.join()
    assert r.exit_code == 0
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1 and "late-agent" in lines[0] and "late-task" in lines[0]
    assert time.monotonic() - t0 < 15


def test_tail_as_of(run_db: tuple[str, RunIds]) -> None:
    db, _ = run_db
    r = invoke("tail", "--db", db, "-n", "2", "--as-of", "9")
    assert [x.split()[0] for x in r.stdout.strip().splitlines()] == ["8", "9"]
    r = invoke("tail", "--db", db, "-n", "1", "--as-of", "2027-01-15T08:00:04Z")
    assert r.stdout.split()[0] == "4"  # recorded at T0+4: task.started of research
    r = invoke("tail", "--db", db, "--as-of", "9", "--follow")
    assert r.exit_code == 2 and "--follow" in r.stderr


def test_damaged_read_model_falls_back_to_memory(run_db: tuple[str, RunIds]) -> None:
    db, _ = run_db
    Path(db + ".proj").write_bytes(b"this is not a database" * 100)
    r = invoke("tasks", "--db", db, "--json")
    assert r.exit_code == 0 and len(json.loads(r.stdout)) == 5
