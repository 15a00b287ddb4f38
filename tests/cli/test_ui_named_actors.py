"""The console's actor is who authenticated (issue 30, item 8), through its HTTP API.

The console runs in-process (starlette's TestClient, its lifespan hosting the
embedded runtime with the test agents) on a real SQLite file, with two named
tokens: ``ops`` and ``bob``. Every action is sent claiming ``{"by": "alice"}``;
each event it writes is by the token's name, and the claim is kept as a note
(``by alice``), never as the actor. Each of the six actions: start a run,
approve, deny, cancel, fork, re-run.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ui_agents import Counter, Summer, count_plan

from cardbus.eventstore import Envelope, SqliteEventStore
from cardbus.eventstore import events as ev

pytest.importorskip("starlette")
from starlette.testclient import TestClient

from cardbus.bus.http_guard import load_tokens
from cardbus.tools.ui import create_app

OPS = {"Authorization": "Bearer ops-secret"}
BOB = {"X-Cardbus-Token": "bob-secret"}
CLAIM = {"by": "alice"}


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "actors.db"


@pytest.fixture
def client(db: Path, tmp_path: Path) -> Iterator[TestClient]:
    # the tokens as `cardbus ui --token-file` reads them: `name token` lines
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text("# who may act\nops ops-secret\nbob bob-secret\n")
    tokens = load_tokens(None, tokens_file)
    assert tokens == {"ops-secret": "ops", "bob-secret": "bob"}
    app = create_app(str(db), tokens=tokens, agents=[Counter, Summer])
    with TestClient(app, base_url="http://127.0.0.1") as c:
        yield c


def _log(db: Path, stream: str | None = None) -> list[Envelope]:
    async def read() -> list[Envelope]:
        store = await SqliteEventStore.open(db, create=False)
        try:
            if stream is not None:
                return list(await store.read_stream(stream))
            return list(await store.read_all(1, 100_000))
        finally:
            await store.close()

    return asyncio.run(read())


def _status(c: TestClient, path: str, status: str, auth: dict[str, str]) -> dict[str, Any]:
    """The run or task at ``path`` once its status is ``status`` (as the page reads it)."""
    deadline = time.monotonic() + 60
    while True:
        body = c.get(path, headers=auth).json()
        row = body.get("run") or body.get("task") or {}
        if row.get("status") == status:
            return dict(body)
        assert time.monotonic() < deadline, f"{path} not {status}: {row}"
        time.sleep(0.05)


def _approval_plan() -> dict[str, Any]:
    plan = count_plan(3)
    tasks: list[dict[str, Any]] = plan["tasks"]  # type: ignore[assignment]
    tasks[0]["requires_approval"] = True
    return plan


def _start_waiting(c: TestClient) -> tuple[str, str]:
    """A run started by ``ops`` whose ``count`` task waits for approval: (root, task)."""
    r = c.post("/api/runs", json={"plan": _approval_plan(), **CLAIM}, headers=OPS)
    assert r.status_code == 200, r.text
    root = r.json()["root_id"]
    task = f"count-{root[-12:]}"
    _status(c, f"/api/tasks/{task}", "awaiting_approval", OPS)
    return root, task


def test_approve_deny_and_cancel_are_by_the_tokens_name(client: TestClient, db: Path) -> None:
    c = client
    assert c.get("/api/console", headers=BOB).json()["you"] == "bob"
    approved_root, approved = _start_waiting(c)
    r = c.post(f"/api/tasks/{approved}/approve", json={**CLAIM, "note": "fine"}, headers=OPS)
    assert r.status_code == 200 and r.json()["by"] == "ops", r.text
    _status(c, f"/api/runs/{approved_root}", "completed", OPS)

    _, denied = _start_waiting(c)
    r = c.post(f"/api/tasks/{denied}/deny", json=CLAIM, headers=BOB)
    assert r.status_code == 200 and r.json()["by"] == "bob", r.text

    cancelled_root, cancelled = _start_waiting(c)
    r = c.post(f"/api/runs/{cancelled_root}/cancel", json={**CLAIM, "note": "stop"}, headers=OPS)
    assert r.status_code == 200 and r.json()["by"] == "ops", r.text
    _status(c, f"/api/tasks/{cancelled}", "cancelled", OPS)

    def answers(task: str) -> list[tuple[str, str, Any, str]]:
        kinds = (ev.ApprovalGranted, ev.ApprovalDenied, ev.TaskCancelled)
        return [
            (e.type, e.actor, getattr(e.data, "by", None), e.data.note)  # type: ignore[union-attr]
            for e in _log(db, task)
            if isinstance(e.data, kinds)
        ]

    assert answers(approved) == [("task.approval_granted.v1", "ops", "ops", "fine; by alice")]
    assert answers(denied) == [("task.approval_denied.v1", "bob", "bob", "by alice")]
    assert answers(cancelled) == [("task.cancelled.v1", "ops", None, "by alice")]
    [reason] = [e.data.reason for e in _log(db, cancelled) if isinstance(e.data, ev.TaskCancelled)]
    assert reason == "cancelled_by_user: stop"
    # and nothing anywhere is signed with the name the requests gave
    assert "alice" not in {e.actor for e in _log(db)}
    # the run made from the console is by its token's name too, the claim its note
    [started] = [e for e in _log(db, approved_root) if isinstance(e.data, ev.RunStarted)]
    assert isinstance(started.data, ev.RunStarted)
    assert (started.actor, started.data.note) == ("ops", "by alice")


def test_start_fork_and_rerun_are_by_the_tokens_name(client: TestClient, db: Path) -> None:
    c = client
    failed = c.post("/api/runs", json={"plan": count_plan(7), **CLAIM}, headers=OPS)
    assert failed.status_code == 200 and failed.json()["by"] == "ops", failed.text
    root = failed.json()["root_id"]
    _status(c, f"/api/runs/{root}", "failed", OPS)
    count = f"count-{root[-12:]}"

    rerun = c.post(f"/api/tasks/{count}/rerun", json={"model": "careful", **CLAIM}, headers=BOB)
    assert rerun.status_code == 200 and rerun.json()["by"] == "bob", rerun.text
    _status(c, f"/api/runs/{rerun.json()['root_id']}", "completed", OPS)

    fork = c.post(f"/api/tasks/{count}/fork", json={"inputs": {"n": 2}, **CLAIM}, headers=OPS)
    assert fork.status_code == 200 and fork.json()["by"] == "ops", fork.text
    _status(c, f"/api/runs/{fork.json()['root_id']}", "completed", OPS)

    def creation(run: str) -> set[tuple[str, str, str]]:
        """(type, actor, note) of a run's creation events (its run.started, task.created)."""
        out = set()
        for e in _log(db):
            if e.correlation_id == run and isinstance(e.data, ev.RunStarted | ev.TaskCreated):
                out.add((e.type, e.actor, getattr(e.data, "note", "")))
        return out

    assert creation(root) == {
        ("run.started.v1", "ops", "by alice"),
        ("task.created.v1", "ops", ""),
    }
    assert creation(rerun.json()["root_id"]) == {
        ("run.started.v1", "bob", "by alice"),
        ("task.created.v1", "bob", ""),
    }
    assert creation(fork.json()["root_id"]) == {
        ("run.started.v1", "ops", "by alice"),
        ("task.created.v1", "ops", ""),
    }
    assert "alice" not in {e.actor for e in _log(db)}


def test_a_request_cannot_name_itself_past_the_guard(client: TestClient) -> None:
    """Only the guard says who a request is: a token it does not know is refused, and
    what the page is told it acts as is its token's name."""
    c = client
    assert c.post("/api/runs", json={"goal": "x", **CLAIM}).status_code == 401
    bad = {"Authorization": "Bearer alice"}
    assert c.post("/api/runs", json={"goal": "x", **CLAIM}, headers=bad).status_code == 401
    assert c.get("/api/console", headers=OPS).json()["you"] == "ops"
