"""Every command that reads or writes the log, the same on SQLite and on NATS (``--store``).

One suite, parametrized over the stores: ``store_url`` is a SQLite file or a
real nats-server's JetStream log, holding the same realistic run
(``tests/lifecycle_log.py``), a run whose two tasks wait for approval, and a
memory record, all written through the ``EventStore`` interface.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from lifecycle_log import RunIds, Writer, write_run

from cardbus.bus.orchestrator.memory import LongTermMemory
from cardbus.eventstore import EventStore, open_store
from cardbus.eventstore import events as ev
from cardbus.tools.cli import cli

GATE_ROOT = "gate-run"
APPROVE, DENY = "gate-approve", "gate-deny"


@dataclass
class Log:
    url: str
    ids: RunIds
    kind: str


@asynccontextmanager
async def opened(url: str) -> AsyncIterator[EventStore]:
    store = await open_store(url)
    try:
        yield store
    finally:
        await store.close()


async def _populate(url: str) -> RunIds:
    async with opened(url) as store:
        ids = await write_run(store)
        w = Writer(store, GATE_ROOT, t0=1_800_000_100.0)
        await w.emit(GATE_ROOT, ev.RunStarted(goal="gated", plan_id="plan-gate"))
        for task in (APPROVE, DENY):
            await w.emit(task, ev.TaskCreated(root_id=GATE_ROOT, capability="research"))
            await w.emit(task, ev.ApprovalRequested(reason="a human must agree"))
        await LongTermMemory(store).remember("fact/tides", "moon", text="tides follow the moon")
        return ids


@pytest.fixture(params=["sqlite", "nats"])
def log(request: pytest.FixtureRequest, tmp_path: Path) -> Log:
    if request.param == "sqlite":
        url = f"sqlite://{tmp_path / 'cardbus.db'}"  # sqlite:///tmp/...
    else:
        url = request.getfixturevalue("nats_url")
    return Log(url, asyncio.run(_populate(url)), request.param)


def cardbus(log: Log, *args: str) -> Result:
    return CliRunner().invoke(cli, [*args, "--store", log.url], catch_exceptions=False)


def ok(result: Result) -> Result:
    assert result.exit_code == 0, result.output
    return result


def test_replay_tree_json_html_and_as_of(log: Log, tmp_path: Path) -> None:
    ids = log.ids
    tree = ok(cardbus(log, "replay", ids.root)).stdout
    assert f"replay of run {ids.root}" in tree and "attempts_exhausted" in tree
    timeline = json.loads(ok(cardbus(log, "replay", ids.root, "--json")).stdout)
    assert timeline["root_id"] == ids.root and timeline["events"] == 42
    # inputs and outputs per task and step; per attempt: queue vs run time, tokens, model
    write = next(t for t in timeline["tasks"] if t["task_id"] == ids.write)
    assert write["deps"] == [ids.research] and write["output"] == "final"
    assert write["steps"][0]["payload"] == {"inputs": {}, "deps": [ids.research]}
    second = write["spans"][1]
    assert (second["queued_s"], second["run_s"], second["latency_s"]) == (2.0, 4.0, 5.0)
    assert (second["input_tokens"], second["output_tokens"], second["output"]) == (
        200,
        300,
        "draft",
    )
    assert second["model"] is None  # the log records no model yet
    review = write["children"][0]
    assert review["task_id"] == ids.review
    revision = next(s for s in write["steps"] if s["kind"] == "revision_requested")
    assert (
        revision["payload"]["round"] == 1 and revision["payload"]["reviewer_task_id"] == ids.review
    )
    page = tmp_path / "t.html"
    ok(cardbus(log, "replay", ids.root, "--html", str(page)))
    assert ids.write in page.read_text()
    past = json.loads(ok(cardbus(log, "replay", ids.root, "--as-of", "9", "--json")).stdout)
    assert [t["task_id"] for t in past["tasks"]] == [ids.research, ids.write]
    # a plan id and a unique prefix work on any store
    by_plan = json.loads(ok(cardbus(log, "replay", "plan-1", "--json")).stdout)
    assert by_plan["root_id"] == ids.root


def test_tasks_stats_runs_rebuild(log: Log) -> None:
    ids = log.ids
    rows = json.loads(ok(cardbus(log, "tasks", "--status", "failed", "--json")).stdout)
    assert [r["task_id"] for r in rows] == [ids.code]
    waiting = json.loads(ok(cardbus(log, "tasks", "--root", "plan-gate", "--json")).stdout)
    assert {r["status"] for r in waiting} == {"awaiting_approval"}
    assert ids.loop in ok(cardbus(log, "tasks")).stdout
    stats = json.loads(ok(cardbus(log, "stats", "--json")).stdout)
    assert {a["agent_id"] for a in stats["agents"]} >= {"researcher", "coder"}
    runs = json.loads(ok(cardbus(log, "runs", "--json")).stdout)
    assert {r["root_id"]: r["status"] for r in runs} == {
        ids.root: "failed",
        GATE_ROOT: "awaiting_approval",
    }
    hint = ok(cardbus(log, "runs")).stdout
    assert f"cardbus approve {APPROVE} --store {log.url}" in hint
    rebuilt = json.loads(ok(cardbus(log, "rebuild", "--json")).stdout)
    assert rebuilt["position"] > 42
    # the read model: beside a SQLite file, in memory for NATS
    sqlite_path = log.url.removeprefix("sqlite://")
    assert rebuilt["path"] == (":memory:" if log.kind == "nats" else sqlite_path + ".proj")


def test_tail_and_tail_follow(log: Log) -> None:
    lines = ok(cardbus(log, "tail", "-n", "3")).stdout.strip().splitlines()
    assert len(lines) == 3 and "memory.written" in lines[-1]
    ids = log.ids
    only = ok(cardbus(log, "tail", "--task", ids.code, "--json", "-n", "100")).stdout
    assert {json.loads(x)["stream"] for x in only.splitlines()} == {ids.code}

    def append_later() -> None:
        time.sleep(1.0)

        async def go() -> None:
            async with opened(log.url) as store:
                await LongTermMemory(store).remember("fact/late", 1)

        asyncio.run(go())

    writer = threading.Thread(target=append_later)
    writer.start()
    try:
        args = ("tail", "-n", "1", "--follow", "--limit", "2", "--timeout", "30", "--json")
        followed = ok(cardbus(log, *args)).stdout.splitlines()
    finally:
        writer.join()
    assert [json.loads(x)["data"]["key"] for x in followed] == ["fact/tides", "fact/late"]


def test_verify_head_export(log: Log) -> None:
    ids = log.ids
    assert "OK: hash chains intact in the whole log" in ok(cardbus(log, "verify")).stdout
    one = json.loads(ok(cardbus(log, "verify", ids.root, "--json")).stdout)
    assert one["ok"] is True and ids.write in one["streams"]
    head = json.loads(ok(cardbus(log, "head")).stdout)
    assert head["position"] == 48
    out = json.loads(ok(cardbus(log, "export", ids.root, "--root", "--console", "--json")).stdout)
    assert out["spans"] > 5 and len(out["traces"]) == 1


def test_approve_deny_and_memory(log: Log) -> None:
    answer = json.loads(ok(cardbus(log, "approve", APPROVE, "--by", "ann", "--json")).stdout)
    assert answer == {"task_id": APPROVE, "answer": "approved", "by": "ann", "note": ""}
    assert f"{DENY}: denied by cli" in ok(cardbus(log, "deny", DENY)).stdout
    again = cardbus(log, "approve", APPROVE)
    assert again.exit_code == 1 and "not awaiting approval" in again.stderr
    rows = json.loads(ok(cardbus(log, "tasks", "--root", GATE_ROOT, "--json")).stdout)
    assert {r["task_id"]: r["status"] for r in rows} == {APPROVE: "pending", DENY: "cancelled"}
    records = json.loads(ok(cardbus(log, "memory", "list", "--json")).stdout)
    assert [r["key"] for r in records] == ["fact/tides"]
    assert json.loads(ok(cardbus(log, "memory", "show", "fact/tides")).stdout)["value"] == "moon"
    hits = json.loads(ok(cardbus(log, "memory", "search", "moon tides", "--json")).stdout)
    assert hits[0]["record"]["key"] == "fact/tides"
    gone = json.loads(ok(cardbus(log, "memory", "forget", "fact/tides", "--json")).stdout)
    assert gone["forgotten"] is True
    assert json.loads(ok(cardbus(log, "memory", "list", "--json")).stdout) == []


def test_fork(log: Log) -> None:
    ids = log.ids
    # fork the failed run just after research completed (position 6)
    out = json.loads(ok(cardbus(log, "fork", ids.root, "--at", "6", "--no-run", "--json")).stdout)
    assert out["forked_from"].startswith(ids.root + "@")
    assert [t.split("~")[0] for t in out["reused"]] == [ids.research]
    forked = json.loads(ok(cardbus(log, "replay", out["root_id"], "--json")).stdout)
    assert forked["root_id"] == out["root_id"]


def test_ui_reads_the_same_store(log: Log) -> None:
    from starlette.testclient import TestClient

    from cardbus.tools.store_option import open_store_option, parse_store
    from cardbus.tools.ui import create_app

    app = create_app(opener=lambda: open_store_option(parse_store(log.url)))
    with TestClient(app, base_url="http://127.0.0.1") as c:
        roots = {r["root_id"] for r in c.get("/api/runs").json()["runs"]}
        assert roots == {log.ids.root, GATE_ROOT}
        r = c.post(f"/api/tasks/{APPROVE}/approve", json={"note": "fine"})
        assert r.status_code == 200, r.text
    rows = json.loads(ok(cardbus(log, "tasks", "--root", GATE_ROOT, "--json")).stdout)
    assert {r["task_id"]: r["status"] for r in rows}[APPROVE] == "pending"
