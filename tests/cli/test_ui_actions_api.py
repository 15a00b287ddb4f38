"""The console's run-making actions through its HTTP API (no browser): refusals and errors.

The app runs in-process (starlette's TestClient, its lifespan hosting the
embedded runtime) on a real SQLite file. Each action refused (no token, a
cross-site form, another origin) appends nothing; bad input (an unknown task, a
plan that is not JSON, a plan that fails validation, a fork point that does not
exist, an override of a reused result, a model no agent offers) is a 4xx with a
reason and nothing appended, and the console answers the next request.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ui_agents import Counter, Summer, count_plan

from cardbus.eventstore import Envelope, SqliteEventStore
from cardbus.eventstore import events as ev

pytest.importorskip("starlette")
from starlette.testclient import TestClient

from cardbus.tools.ui import create_app

TOKEN = "s3cret"
AUTH = {"X-Cardbus-Token": TOKEN}  # the token named "ops"
BOB = {"Authorization": "Bearer b0b-token"}  # the token named "bob"


@pytest.fixture
def client(db: Path) -> Iterator[TestClient]:
    app = create_app(str(db), tokens={TOKEN: "ops", "b0b-token": "bob"}, agents=[Counter, Summer])
    with TestClient(app, base_url="http://127.0.0.1") as c:
        yield c


def _position(c: TestClient) -> int:
    return int(c.get("/api/runs", headers=AUTH).json()["position"])


def _written_by(db: Path, after: int, actor: str) -> list[str]:
    """The types of the events after position ``after`` written by ``actor``. (The log
    itself may grow meanwhile: the hosted orchestrator and memory keeper write on their
    own, e.g. a failed run's reason once it has ended.)"""
    return [e.type for e in _read(db, after) if e.actor == actor]


def _noted(db: Path, after: int, note: str) -> list[str]:
    """The types of the events after position ``after`` whose note is ``note``."""
    return [e.type for e in _read(db, after) if getattr(e.data, "note", None) == note]


def _read(db: Path, after: int) -> list[Envelope]:
    async def read() -> list[Envelope]:
        store = await SqliteEventStore.open(db, create=False)
        try:
            return list(await store.read_all(after + 1, 100_000))
        finally:
            await store.close()

    return asyncio.run(read())


def _wait_run(c: TestClient, root: str, status: str) -> dict[str, Any]:
    """The run once its status is ``status`` (read through the API, as the page does)."""
    deadline = time.monotonic() + 60
    while True:
        run = c.get(f"/api/runs/{root}", headers=AUTH).json()
        if run["run"] and run["run"]["status"] == status:
            return run
        if run["run"] and run["run"]["status"] not in ("running", status):
            raise AssertionError(f"run {root} ended {run['run']['status']}, not {status}")
        assert time.monotonic() < deadline, f"run {root} not {status}: {run['run']}"
        time.sleep(0.05)


def _actors(c: TestClient, task_id: str) -> set[str]:
    steps = c.get(f"/api/tasks/{task_id}", headers=AUTH).json()["steps"]
    return {s["actor"] for s in steps if s["type"] == "task.created.v1"}


def test_actions_refused_without_the_token_append_nothing(client: TestClient, db: Path) -> None:
    c = client
    failed = c.post("/api/runs", json={"plan": count_plan(7), "by": "ops"}, headers=AUTH)
    assert failed.status_code == 200, failed.text
    root = failed.json()["root_id"]
    _wait_run(c, root, "failed")
    count = f"count-{root[-12:]}"
    before = _position(c)
    refused = {
        "start": ("/api/runs", {"goal": "x", "by": "intruder"}),
        "fork": (f"/api/tasks/{count}/fork", {"by": "intruder"}),
        "rerun": (f"/api/tasks/{count}/rerun", {"model": "careful", "by": "intruder"}),
    }
    for name, (path, body) in refused.items():
        assert c.post(path, json=body).status_code == 401, name  # no token
        assert c.post(path + "?token=nope", json=body).status_code == 401, name
        # what a hostile page could send: a form, another origin (with the token, even)
        form = c.post(path, data={"goal": "x", "by": "intruder"}, headers=AUTH)
        assert form.status_code == 415, name
        other = {**AUTH, "Origin": "http://evil.example"}
        assert c.post(path, json=body, headers=other).status_code == 403, name
    assert _written_by(db, before, "ops") == []  # nothing appended
    assert _noted(db, before, "by intruder") == []
    # the same actions with the token go through, each by the token's holder
    ok = c.post(f"/api/tasks/{count}/rerun", json={"model": "careful", "by": "ops"}, headers=AUTH)
    assert ok.status_code == 200, ok.text
    assert ok.json()["rerun_of"] == root and ok.json()["by"] == "ops"


@pytest.mark.parametrize(
    ("path", "body", "status", "says"),
    [
        ("/api/runs", {"plan": "{not json"}, 400, "not valid JSON"),
        (
            "/api/runs",
            {"plan": {"goal": "g", "tasks": [{"id": "a", "capability": "fly"}]}},
            400,
            "fly",
        ),
        ("/api/runs", {"plan": {"goal": "g", "tasks": "nope"}}, 400, "plan"),
        ("/api/runs", {}, 400, "give a goal"),
        ("/api/runs", {"goal": "g", "plan": "{}"}, 400, "one of them"),
        ("/api/runs", {"goal": 12}, 400, "text"),
        ("/api/tasks/no-such-task/fork", {}, 404, "no-such-task"),
        ("/api/tasks/no-such-task/rerun", {}, 404, "no-such-task"),
        ("/api/tasks/{count}/fork", {"at": "no-such-event"}, 400, "not an event of this run"),
        ("/api/tasks/{count}/fork", {"at": "{first}", "inputs": {"n": 2}}, 400, "is reused"),
        ("/api/tasks/{count}/fork", {"inputs": "{bad"}, 400, "not JSON"),
        ("/api/tasks/{count}/fork", {"inputs": [1, 2]}, 400, "JSON object"),
        ("/api/tasks/{count}/fork", {"model": "gpt-9"}, 400, "gpt-9"),
        ("/api/tasks/{count}/rerun", {"model": "gpt-9"}, 400, "gpt-9"),
        ("/api/tasks/{count}/launch", {}, 404, "launch"),
    ],
)
def test_bad_input_is_a_4xx_with_a_reason_and_appends_nothing(
    client: TestClient, db: Path, path: str, body: dict[str, Any], status: int, says: str
) -> None:
    c = client
    done = c.post("/api/runs", json={"plan": count_plan(3), "by": "ops"}, headers=AUTH)
    assert done.status_code == 200, done.text
    root = done.json()["root_id"]
    run = _wait_run(c, root, "completed")
    count = f"count-{root[-12:]}"
    # the run's last event: both tasks completed by then, so their results are reused
    first = max(s["position"] for t in run["tasks"] for s in _steps(c, t["task_id"]))
    path = path.format(count=count)
    body = {k: (str(first) if v == "{first}" else v) for k, v in body.items()}
    before = _position(c)
    r = c.post(path, json={**body, "by": "bad-input"}, headers=AUTH)
    assert r.status_code == status, r.text
    assert says in r.json()["error"], r.json()
    assert "Traceback" not in r.text
    assert _written_by(db, before, "ops") == []
    assert _noted(db, before, "by bad-input") == []
    assert c.get("/api/runs", headers=AUTH).status_code == 200  # not wedged


def _steps(c: TestClient, task_id: str) -> list[dict[str, Any]]:
    return list(c.get(f"/api/tasks/{task_id}", headers=AUTH).json()["steps"])


def test_a_console_without_agents_refuses_and_says_how(db: Path) -> None:
    with TestClient(create_app(str(db)), base_url="http://127.0.0.1") as c:
        about = c.get("/api/console").json()["actions"]
        assert about["enabled"] is False and "--agent" in about["how"]
        before = c.get("/api/runs").json()["position"]
        r = c.post("/api/runs", json={"goal": "a report on tides"})
        assert r.status_code == 409 and "--agent" in r.json()["error"]
        assert c.post("/api/tasks/x/rerun", json={}).status_code == 409
        assert c.get("/api/runs").json()["position"] == before


def test_each_action_is_written_by_its_tokens_holder(client: TestClient, db: Path) -> None:
    """The actor is the name of the token the request carried; the ``by`` it gives (any
    name at all) is kept as the run's note."""
    c = client
    r = c.post("/api/runs", json={"plan": count_plan(3), "by": "alice"}, headers=AUTH)
    root = r.json()["root_id"]
    assert r.json()["by"] == "ops"
    _wait_run(c, root, "completed")
    count = f"count-{root[-12:]}"
    assert _actors(c, count) == {"ops"}
    f = c.post(
        f"/api/tasks/{count}/fork", json={"inputs": {"n": 4}, "by": "alice"}, headers=BOB
    ).json()
    forked = _wait_run(c, f["root_id"], "completed")
    assert f["forked_from"].startswith(root + "@") and f["by"] == "bob"
    new_count = f"count-{f['root_id'][-12:]}"
    assert _actors(c, new_count) == {"bob"}
    outputs = {t["task_id"]: t["output"] for t in forked["tasks"]}
    assert outputs[new_count] == {"numbers": [1, 2, 3, 4]}  # the override ran

    async def started_by() -> dict[str, tuple[str, str]]:
        store = await SqliteEventStore.open(db, create=False)
        try:
            out = {}
            for r in (root, f["root_id"]):
                [e] = [e for e in await store.read_stream(r) if isinstance(e.data, ev.RunStarted)]
                assert isinstance(e.data, ev.RunStarted)
                out[r] = (e.actor, e.data.note)
            return out
        finally:
            await store.close()

    assert asyncio.run(started_by()) == {
        root: ("ops", "by alice"),
        f["root_id"]: ("bob", "by alice"),
    }


def test_the_nats_console_does_not_host_agents() -> None:
    from click.testing import CliRunner

    from cardbus.tools.cli import cli

    r = CliRunner().invoke(
        cli, ["ui", "--store", "nats://127.0.0.1:1", "--agent", "ui_agents:Counter"]
    )
    assert r.exit_code == 2 and "cardbus agent serve" in r.output, r.output


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
_plans = st.one_of(
    st.text(max_size=40),  # JSON text, mostly not JSON
    st.dictionaries(
        st.sampled_from(["goal", "tasks", "plan_id", "agents", "limits", "budget_tokens"]),
        _json_values,
        max_size=4,
    ),
    _json_values,
)


def test_any_plan_body_is_a_run_or_a_4xx_that_appends_nothing(client: TestClient, db: Path) -> None:
    c = client
    n = [0]

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(plan=_plans)
    def check(plan: Any) -> None:
        before = _position(c)
        n[0] += 1
        by = f"fuzz-{n[0]}"
        r = c.post("/api/runs", json={"plan": plan, "by": by}, headers=AUTH)
        assert "Traceback" not in r.text
        if r.status_code == 200:
            assert r.json()["root_id"]
        else:
            assert r.status_code in (400, 409), r.text
            assert r.json()["error"], r.text
            assert _noted(db, before, f"by {by}") == []

    check()
