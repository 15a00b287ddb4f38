"""The console's run-making actions from its page, in headless Chromium (issue 25, item 4).

``cardbus ui --agent ...`` (a subprocess, a real SQLite file, a token) hosts the
demo agents and two quick ones (``ui_agents``). From the page, as a named
operator: a run started from a goal, one from a pasted plan and one from an
uploaded plan file, each followed live to its end; the failed task of the last
re-run with another model, completing; a finished run forked from a task with
its inputs overridden, completing with the new inputs. Every new run's creation
is written by the operator. The run page's download links are visible and
answer; without the token each action is refused and nothing is appended. A
console without agents shows the buttons disabled with the line saying how to
enable them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_ui import Server, _off_loop
from ui_agents import count_plan

from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev
from tests.cli.chromium import open_page

TOKEN = "s3cret"
HERE = Path(__file__).resolve().parent
AGENTS = (
    "cardbus.agents.demo:Researcher",
    "cardbus.agents.demo:Planner",
    "cardbus.agents.demo:Writer",
    "cardbus.agents.demo:Reviewer",
    "cardbus.agents.demo:Merger",
    "ui_agents:Counter",
    "ui_agents:Summer",
)
# the agents' module is found on the path; no model endpoint: the demo agents' mock
ENV = {"PYTHONPATH": str(HERE), "OPENAI_BASE_URL": "", "CARDBUS_MODEL": ""}


def _read(db: Path, fn: Any) -> Any:
    """``fn(store)`` on the log, off playwright's loop."""

    async def go() -> Any:
        store = await SqliteEventStore.open(db, create=False)
        try:
            return await fn(store)
        finally:
            await store.close()

    return _off_loop(go)


def _creation_actors(db: Path, root: str) -> dict[str, set[str]]:
    """Who wrote the run's creation: the actors of its run.started and task.created (and,
    as ``note``, run.started's note)."""

    async def fn(store: Any) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for e in await store.read_correlation(root):
            if isinstance(e.data, ev.RunStarted | ev.TaskCreated):
                out.setdefault(type(e.data).__name__, set()).add(e.actor)
            if isinstance(e.data, ev.RunStarted):
                out.setdefault("note", set()).add(e.data.note)
        return out

    return dict(_read(db, fn))


def _last_position(db: Path) -> int:
    async def fn(store: Any) -> int:
        return int(await store.last_position())

    return int(_read(db, fn))


def _written_by(db: Path, after: int, actor: str) -> list[str]:
    """The types of the events after ``after`` written by ``actor`` (the log itself may
    grow meanwhile: the hosted orchestrator and memory keeper write on their own)."""

    async def fn(store: Any) -> list[str]:
        return [e.type for e in await store.read_all(after + 1, 100_000) if e.actor == actor]

    return list(_read(db, fn))


def _new_run(page: Any, before: str) -> str:
    """The root of the run the page went to after an action (its hash left ``before``)."""
    page.wait_for_function(
        "(h) => location.hash !== h && location.hash.startsWith('#/run/')", arg=before
    )
    return str(page.evaluate("decodeURIComponent(location.hash.slice('#/run/'.length))"))


def _task_page(page: Any, url: str, task_id: str, status: str) -> None:
    """Open a task's page and wait for *its* view: going from one task's page to another's
    is a hash change, and until the new view is drawn the old one still matches a bare
    ``#task-status`` (the ops forms are drawn with the view, naming their task)."""
    page.goto(f"{url}#/task/{task_id}")
    page.wait_for_selector(f"#fork[data-task='{task_id}']", state="attached")
    page.wait_for_selector(f"#task-status[data-status='{status}']")


def _run_ends(page: Any, status: str) -> None:
    page.wait_for_selector(f"#run-status[data-status='{status}']")


@pytest.mark.timeout(300)
def test_start_fork_and_rerun_from_the_page(db: Path, browser: Any, tmp_path: Path) -> None:
    # the token is named ops: every action's actor; the page's "signed" name is a note
    agents = tuple(a for p in AGENTS for a in ("--agent", p))
    server = Server(db, env=ENV, token=TOKEN, args=("--token-name", "ops", *agents))
    try:
        server.wait_ready(TOKEN)
        page, errors = open_page(browser, wide=True, timeout_ms=60_000)
        page.goto(f"{server.url}?token={TOKEN}")
        page.wait_for_selector("body[data-view='runs'] #start-run[data-enabled='yes']")
        page.fill("#operator", "ops-tester")
        page.dispatch_event("#operator", "change")

        # 1. a goal: planned by the rule planner, followed live to its end
        page.fill("#goal", "a short report on ocean tides")
        page.locator("#start-goal-button").click()
        goal_root = _new_run(page, "#/")
        _run_ends(page, "completed")
        # said by the name the token carries, not the one the page gave
        assert "started by ops" in page.locator("#action-result").inner_text()
        assert "ops-tester" not in page.locator("#action-result").inner_text()
        assert page.locator("#tasks tbody tr").count() >= 2

        # 2. a pasted plan: count to 3, then add up
        page.goto(f"{server.url}?token={TOKEN}#/")
        page.wait_for_selector("#start-run[data-enabled='yes']")
        page.fill("#plan-text", json.dumps(count_plan(3)))
        page.locator("#start-plan-button").click()
        pasted_root = _new_run(page, "#/")
        _run_ends(page, "completed")
        page.wait_for_selector(
            f"#tasks tr[data-task='sum-{pasted_root[-12:]}'][data-status='completed']"
        )

        # 3. an uploaded plan file: count to 7, which the counter refuses quickly: it fails
        plan_file = tmp_path / "seven.json"
        plan_file.write_text(json.dumps(count_plan(7)))
        page.goto(f"{server.url}?token={TOKEN}#/")
        page.wait_for_selector("#start-run[data-enabled='yes']")
        page.set_input_files("#plan-file", str(plan_file))
        page.wait_for_selector("#plan-file[data-loaded='seven.json']")
        assert '"n": 7' in page.input_value("#plan-text")
        page.locator("#start-plan-button").click()
        failed_root = _new_run(page, "#/")
        _run_ends(page, "failed")
        count7 = f"count-{failed_root[-12:]}"
        page.wait_for_selector(f"#tasks tr[data-task='{count7}'][data-status='failed']")

        # 4. re-run the failed task, asking for the careful model: a new run completes
        page.locator(f"#tasks tr[data-task='{count7}'] a.rerun-link").click()  # to its page
        page.wait_for_selector(f"#rerun[data-task='{count7}']", state="attached")
        page.wait_for_selector("body[data-view='task'] #task-status[data-status='failed']")
        page.wait_for_selector("#rerun-button:not([disabled])")
        page.fill("#rerun-model", "careful")
        before = page.evaluate("location.hash")
        page.locator("#rerun-button").click()
        rerun_root = _new_run(page, before)
        _run_ends(page, "completed")
        assert f"re-run of {failed_root} by ops" in page.locator("#action-result").inner_text()
        home = f"{server.url}?token={TOKEN}"
        _task_page(page, home, f"sum-{rerun_root[-12:]}", "completed")
        assert json.loads(page.locator("#task-output pre").inner_text()) == {"total": 28}

        # 5. fork the pasted run from its count task, its inputs overridden (n: 4)
        _task_page(page, home, f"count-{pasted_root[-12:]}", "completed")
        page.locator("#fork-panel summary").click()
        page.fill("#fork-inputs", json.dumps({"n": 4}))
        before = page.evaluate("location.hash")
        page.locator("#fork-button").click()
        fork_root = _new_run(page, before)
        _run_ends(page, "completed")
        assert f"forked {pasted_root}@" in page.locator("#action-result").inner_text()
        _task_page(page, home, f"sum-{fork_root[-12:]}", "completed")
        assert json.loads(page.locator("#task-output pre").inner_text()) == {"total": 10}

        # a bad override is refused on the page with its reason; nothing is written
        _task_page(page, home, f"count-{pasted_root[-12:]}", "completed")
        page.locator("#fork-panel summary").click()
        page.fill("#fork-model", "gpt-9")
        at = _last_position(db)
        page.locator("#fork-button").click()
        page.wait_for_selector("#ops-result[data-outcome='error']")
        assert "gpt-9" in page.locator("#ops-result").inner_text()
        assert _written_by(db, at, "ops") == []
        assert page.locator("#fork-button").is_enabled()  # the console is not wedged

        # every new run's creation is by the token's holder (the name the page gave, a note)
        for root in (goal_root, pasted_root, failed_root, rerun_root, fork_root):
            actors = _creation_actors(db, root)
            assert actors["RunStarted"] == {"ops"}, (root, actors)
            assert actors["note"] == {"by ops-tester"}, (root, actors)
            if root != goal_root:  # a goal's tasks are created by the planning's verdict
                assert actors["TaskCreated"] == {"ops"}, (root, actors)

        # the run page's download links: visible, and each answers with an attachment
        page.goto(f"{server.url}?token={TOKEN}#/run/{fork_root}")
        _run_ends(page, "completed")
        links = page.evaluate(
            """async () => {
                const out = {};
                for (const id of ["download-replay", "download-traces"]) {
                  const a = document.getElementById(id);
                  const r = a.getBoundingClientRect();
                  const shown = r.width > 0 && r.height > 0
                    && getComputedStyle(a).visibility === "visible";
                  const got = await fetch(a.href);
                  out[id] = {shown, text: a.textContent, status: got.status,
                             disposition: got.headers.get("content-disposition") || ""};
                }
                return out;
            }"""
        )
        for id_, link in links.items():
            assert link["shown"] and link["status"] == 200, (id_, link)
            assert "attachment" in link["disposition"], (id_, link)

        # without the token each action is refused from the page's origin, nothing appended
        at = _last_position(db)
        refused = page.evaluate(
            """async (paths) => {
                const out = [];
                for (const p of paths) {
                  const body = JSON.stringify({goal: "x", model: "careful", by: "intruder"});
                  const r = await fetch(p, {method: "POST", body,
                                            headers: {"Content-Type": "application/json"}});
                  out.push(r.status);
                }
                return out;
            }""",
            ["/api/runs", f"/api/tasks/{count7}/rerun", f"/api/tasks/{count7}/fork"],
        )
        assert refused == [401, 401, 401]
        assert _written_by(db, at, "ops") == []
        assert errors == [], errors
    finally:
        out = server.stop()
    assert "Traceback" not in out, out


@pytest.mark.timeout(120)
def test_without_agents_the_buttons_are_disabled_and_say_how(db: Path, browser: Any) -> None:
    server = Server(db, env=ENV)
    try:
        server.wait_ready()
        page = browser.new_page()
        page.set_default_timeout(30_000)
        page.goto(server.url)
        page.wait_for_selector("body[data-view='runs'] #start-run[data-enabled='no']")
        shown = page.evaluate(
            """() => ({
                how: document.getElementById("ops-how").textContent,
                disabled: ["start-goal-button", "start-plan-button", "goal", "plan-text",
                           "plan-file"].map((id) => document.getElementById(id).disabled),
            })"""
        )
        assert "cardbus ui --agent module:Class" in shown["how"]
        assert shown["disabled"] == [True] * 5
    finally:
        server.stop()
