"""``cardbus ui``: the web console in a real headless Chromium, and its access rules.

The server is ``cardbus ui`` itself, in a subprocess on a free loopback port;
runs are made by an EmbeddedRuntime in this process (a thread) against the
same SQLite file, so the page sees them only through the log. Chromium is the
system one (``/usr/bin/chromium``; ``.ci/run`` installs the Debian package),
driven by playwright, which never downloads a browser here. Without Chromium
the browser tests fail when ``CI`` is set and are skipped (reason shown) elsewhere.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cardbus.agents.demo import DEMO_AGENTS, Researcher, report_plan
from cardbus.bus.http_guard import local_identity
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.tools.cli import cli


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(
        self,
        db: Path,
        env: dict[str, str] | None = None,
        token: str | None = None,
        args: tuple[str, ...] = (),
    ) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cardbus.tools",
                "ui",
                "--db",
                str(db),
                "--port",
                str(self.port),
                *(["--token", token] if token else []),
                *args,
            ],
            env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def wait_ready(self, token: str | None = None) -> None:
        deadline = time.monotonic() + 30
        probe = self.url + "api/runs" + (f"?token={token}" if token else "")
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"cardbus ui exited: {self.proc.stdout.read()}")  # type: ignore[union-attr]
            try:
                with urllib.request.urlopen(probe, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise AssertionError("cardbus ui did not answer within 30 s")

    def stop(self) -> str:
        """Stop the server; what it printed."""
        self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return out or ""


@pytest.fixture
def server(db: Path) -> Iterator[Server]:
    s = Server(db)
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


class Background:
    """Runs on an EmbeddedRuntime in a thread (its own loop), against the same SQLite file."""

    def __init__(self, db: Path, agents: list[Any], plan: dict[str, Any]) -> None:
        self.root: str | None = None
        self.result: Any = None
        self.error: BaseException | None = None
        self.submitted = threading.Event()
        self.thread = threading.Thread(target=self._main, args=(db, agents, plan), daemon=True)
        self.thread.start()

    def _main(self, db: Path, agents: list[Any], plan: dict[str, Any]) -> None:
        async def go() -> None:
            store = await SqliteEventStore.open(db)
            try:
                async with EmbeddedRuntime(store, agents) as rt:
                    self.root = await rt.orchestrator.submit(plan)
                    self.submitted.set()
                    self.result = await rt.orchestrator.wait(self.root, 60)
            finally:
                await store.close()

        try:
            asyncio.run(go())
        except BaseException as e:
            self.error = e
        finally:
            self.submitted.set()

    def join(self) -> Any:
        self.thread.join(60)
        assert not self.thread.is_alive(), "the run did not finish"
        if self.error is not None:
            raise self.error
        return self.result


def _off_loop(fn: Any) -> Any:
    """``asyncio.run(fn())`` in a thread: playwright's sync API holds a loop in this one."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(asyncio.run(fn())))
    t.start()
    t.join(30)
    return out[0]


@pytest.mark.timeout(180)
def test_page_loads_and_a_demo_run_appears_live(server: Server, page: Any, db: Path) -> None:
    page.goto(server.url)
    page.wait_for_selector("body[data-live='yes'][data-view='runs']")
    assert page.locator("#runs tbody tr").count() == 0
    page.evaluate("window.__sameDocument = 1")
    run = Background(db, DEMO_AGENTS, report_plan("ocean tides", plan_id="ui-demo"))
    assert run.submitted.wait(60) and run.root is not None
    row = page.locator(f"#runs tr[data-root='{run.root}']")
    row.wait_for()
    assert run.join().status == "completed"
    page.wait_for_selector(f"#runs tr[data-root='{run.root}'][data-status='completed']")
    assert row.locator("[data-tasks]").inner_text() == "6/6"
    assert run.root in row.inner_text()  # the full id, not cut
    assert "ui-demo" in row.inner_text()
    assert page.evaluate("window.__sameDocument") == 1  # updated in place, never reloaded
    # the run's view: task table and timeline from the log
    row.locator("a").click()
    page.wait_for_selector("#run-status[data-status='completed']")
    assert page.locator("#tasks tbody tr").count() == 6
    # the Gantt of attempts (replay --html's renderer): a revision and a needs_input
    page.wait_for_selector("#gantt .span[data-outcome='revision']")
    assert page.locator("#gantt .span[data-outcome='needs_input']").count() >= 1
    # a task's steps with its inputs, outputs and reasons
    page.locator("#tasks a", has_text="draft-").first.click()
    page.wait_for_selector("#task-status[data-status='completed']")
    assert "ocean tides" in page.locator("#task-input").inner_text()
    assert '"sections"' in page.locator("#task-output").inner_text()
    assert "revision requested (round 1)" in page.locator("#steps").inner_text()


LEAD_PLAN = {
    "goal": "A lead delegates research to a department",
    "tasks": [
        {
            "id": "dept",
            "capability": "department",
            "child": {
                "plan": {
                    "goal": "research tides",
                    "tasks": [
                        {"id": "find", "capability": "research", "inputs": {"topic": "tides"}}
                    ],
                }
            },
        }
    ],
}


@pytest.mark.timeout(180)
def test_a_run_page_links_its_child_runs_and_a_child_its_parent(
    server: Server, page: Any, db: Path
) -> None:
    run = Background(db, DEMO_AGENTS, LEAD_PLAN)
    assert run.join().status == "completed"
    page.goto(f"{server.url}#/run/{run.root}")
    page.wait_for_selector("#run-status[data-status='completed']")
    children = page.locator("#child-runs a")
    assert children.count() == 1 and "completed" in page.locator("#child-runs").inner_text()
    child_root = children.first.inner_text()
    tree = page.locator("#tree-spend").inner_text()  # the lead's spending with its child's
    assert "with its child runs:" in tree and "(2 runs)" in tree, tree
    tokens = int(tree.split("with its child runs:")[1].split("tokens")[0].replace(",", ""))
    assert tokens > 0  # the researcher's model call, in the child, counted for the lead
    children.first.click()
    page.wait_for_selector(f"#run-parent a[title='{run.root}']")
    assert "started by its task dept-" in page.locator("#run-parent").inner_text()
    assert page.locator("#tasks tbody tr").count() == 1  # the child's own task, find
    assert child_root in page.locator("h2").first.inner_text()


APPROVAL_PLAN = {
    "goal": "Research tides, once a human agrees",
    "plan_id": "ui-approval",
    "tasks": [
        {
            "id": "research",
            "capability": "research",
            "inputs": {"topic": "tides"},
            "requires_approval": True,
        }
    ],
}


@pytest.mark.timeout(180)
def test_an_approval_click_completes_a_waiting_run(server: Server, page: Any, db: Path) -> None:
    page.goto(server.url)
    page.wait_for_selector("body[data-live='yes']")
    run = Background(db, [Researcher], APPROVAL_PLAN)
    assert run.submitted.wait(60) and run.root is not None
    page.wait_for_selector(f"#runs tr[data-root='{run.root}'][data-status='awaiting_approval']")
    page.locator(f"#runs tr[data-root='{run.root}'] a").click()
    page.wait_for_selector("#run-status[data-status='awaiting_approval']")
    task_id = f"research-{run.root[-12:]}"
    page.wait_for_selector(f"#tasks tr[data-task='{task_id}'][data-status='awaiting_approval']")
    assert run.thread.is_alive()  # the run waits for the answer
    page.locator(f"button[data-approve='{task_id}']").click()
    result = run.join()
    assert result.status == "completed"
    # the page follows the run to its end without a reload
    page.wait_for_selector("#run-status[data-status='completed']")
    page.wait_for_selector(f"#tasks tr[data-task='{task_id}'][data-status='completed']")
    # the task's events, fetched when opened
    page.locator(f"#tasks tr[data-task='{task_id}'] details[data-events] summary").click()
    events = page.locator(f"#tasks tr[data-task='{task_id}'] details[data-events] table.steps")
    events.wait_for()
    assert "approval_granted" in events.inner_text()

    async def granted() -> list[Any]:
        store = await SqliteEventStore.open(db, create=False)
        try:
            return [e.data for e in await store.read_stream(task_id)]
        finally:
            await store.close()

    answers = [d for d in _off_loop(granted) if isinstance(d, ev.ApprovalGranted)]
    # the same event `cardbus approve` appends, by who the console knows it is: on loopback
    # without a token, the account it runs as (a name the page gives is a note)
    assert [a.by for a in answers] == [local_identity().name]


# -- access rules (no browser needed) ---------------------------------------------


def test_refuses_a_non_loopback_host_without_a_token(db: Path) -> None:
    r = CliRunner().invoke(cli, ["ui", "--db", str(db), "--host", "0.0.0.0"])
    assert r.exit_code == 2
    assert "not loopback" in r.output and "--token" in r.output


def test_a_token_is_required_on_every_request(db: Path) -> None:
    from starlette.testclient import TestClient

    from cardbus.tools.ui import create_app

    with TestClient(create_app(str(db), token="s3cret"), base_url="http://127.0.0.1") as c:
        assert c.get("/").status_code == 401
        assert c.get("/api/runs").status_code == 401
        assert c.get("/api/runs?token=wrong").status_code == 401
        assert c.get("/?token=s3cret").status_code == 200
        listed = c.get("/api/runs", headers={"Authorization": "Bearer s3cret"}).json()
        assert (listed["runs"], listed["total"], listed["position"]) == ([], 0, 0)
        assert c.get("/api/runs", headers={"X-Cardbus-Token": "s3cret"}).status_code == 200


def test_host_origin_and_json_checks(db: Path) -> None:
    from starlette.testclient import TestClient

    from cardbus.tools.ui import create_app

    with TestClient(create_app(str(db)), base_url="http://127.0.0.1") as c:
        assert c.get("/").status_code == 200
        # DNS rebinding: a Host that is not the loopback interface served
        assert c.get("/api/runs", headers={"Host": "evil.example"}).status_code == 400
        # a cross-site form post cannot approve: JSON only, same origin only
        form = c.post("/api/tasks/x/approve", data={"by": "x"})
        assert form.status_code == 415
        cross = c.post("/api/tasks/x/approve", json={}, headers={"Origin": "http://evil.example"})
        assert cross.status_code == 403
        missing = c.post("/api/tasks/nope/approve", json={})
        assert missing.status_code == 404 and "nope" in missing.json()["error"]
        assert c.post("/api/tasks/nope/launch", json={}).status_code == 404
        assert c.get("/api/runs?status=bogus").status_code == 400


def test_deny_through_the_api_cancels_a_waiting_task(db: Path) -> None:
    from starlette.testclient import TestClient

    from cardbus.tools.ui import create_app

    run = Background(db, [Researcher], {**APPROVAL_PLAN, "plan_id": "ui-deny"})
    assert run.submitted.wait(60) and run.root is not None
    task_id = f"research-{run.root[-12:]}"
    with TestClient(create_app(str(db)), base_url="http://127.0.0.1") as c:
        deadline = time.monotonic() + 30
        while c.get(f"/api/tasks/{task_id}").json().get("task", {}).get("status") != (
            "awaiting_approval"
        ):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        runs = c.get("/api/runs", params={"status": "awaiting_approval"}).json()["runs"]
        assert [r["root_id"] for r in runs] == [run.root]
        # a loopback console without a token: the actor is the account it runs as; the
        # name the request gives is a note
        me = local_identity().name
        assert me.startswith("local:")
        r = c.post(f"/api/tasks/{task_id[:12]}/deny", json={"by": "tester", "note": "no"})
        assert r.status_code == 200, r.text
        assert r.json() == {"task_id": task_id, "approved": False, "by": me}
        assert run.join().status != "completed"
        again = c.post(f"/api/tasks/{task_id}/approve", json={})
        assert again.status_code == 409  # no longer awaiting approval
        steps = c.get(f"/api/tasks/{task_id}").json()["steps"]
        denied = [s for s in steps if s["type"] == "task.approval_denied.v1"]
        assert [(s["actor"], s["data"]["by"], s["data"]["note"], s["reason"]) for s in denied] == [
            (me, me, "no; by tester", f"approval denied by {me}: no; by tester")
        ]


def test_actions_are_refused_without_the_token(db: Path) -> None:
    from starlette.testclient import TestClient

    from cardbus.tools.ui import create_app

    run = Background(db, [Researcher], {**APPROVAL_PLAN, "plan_id": "ui-token"})
    assert run.submitted.wait(60) and run.root is not None
    app = create_app(str(db), token="s3cret", token_name="ops")
    with TestClient(app, base_url="http://127.0.0.1") as c:
        # no token, a wrong one: refused before anything is written
        assert c.post(f"/api/runs/{run.root}/cancel", json={"by": "x"}).status_code == 401
        wrong = c.post(f"/api/runs/{run.root}/cancel?token=nope", json={})
        assert wrong.status_code == 401
        assert c.get(f"/api/runs/{run.root}/replay.html").status_code == 401
        ok = c.post(
            f"/api/runs/{run.root}/cancel",
            json={"by": "alice", "note": "stop"},
            headers={"X-Cardbus-Token": "s3cret"},
        )
        assert ok.status_code == 200, ok.text
        assert ok.json()["by"] == "ops" and ok.json()["root_id"] == run.root
        assert run.join().status != "completed"
        page = c.get(f"/api/runs/{run.root}/replay.html?token=s3cret")
        assert page.status_code == 200 and "attachment" in page.headers["content-disposition"]
        assert run.root in page.text and "cancelled" in page.text
        assert c.get(f"/api/runs/{run.root}/traces.json").status_code == 401
        spans = c.get(f"/api/runs/{run.root}/traces.json?token=s3cret").json()["spans"]
        assert spans and {len(s["trace_id"]) for s in spans} == {32}
        assert len({s["trace_id"] for s in spans}) == 1  # one run, one trace
        steps = c.get(f"/api/tasks/research-{run.root[-12:]}?token=s3cret").json()["steps"]
        cancelled = [s for s in steps if s["type"] == "task.cancelled.v1"]
        # the actor is the token's name, not the name the request gave (kept as a note)
        assert [(s["actor"], s["data"]["reason"], s["data"]["note"]) for s in cancelled] == [
            ("ops", "cancelled_by_user: stop", "by alice")
        ]
