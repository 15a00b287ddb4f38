"""The console as an operator's tool, in headless Chromium (issue 25's "Done when").

One log, written fast through the store API (no agents run): a run of 2,000
tasks, 300 other runs (every fourth failed), a run still running, and the
lifecycle run (a rejection and retry, a revision with its review subtask, a
time-out, a failure, a halt). The runs list filters to the failed ones and pages
past the first 50; the big run opens in under a second into a page under 5,000
px; the running run is cancelled from the page and ``cardbus replay`` names who
did it; the lifecycle run's Gantt draws queued time and each attempt as bars
of their own (checked in the DOM and on a saved screenshot). A second test runs
the demo and shows, on a task's page and in ``replay --json``, the inputs its
agent received ($dep resolved) beside the plan's reference.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from lifecycle_log import RunIds, write_run
from test_ui import Background, Server

from cardbus.agents.demo import DEMO_AGENTS, report_plan
from cardbus.bus.http_guard import local_identity
from cardbus.eventstore import NewEvent, SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.eventstore.store import Append
from cardbus.tools.cli import cli
from tests.cli.chromium import open_page

BIG = "big-run"
LIVE = "live-run"
OTHERS = 300
BIG_TASKS = 2000


def _e(data: ev.Event, root: str, t: float, actor: str = "orchestrator") -> NewEvent:
    return NewEvent(data=data, correlation_id=root, actor=actor, recorded_at=t)


def _done(task: str, root: str, t: float, agent: str, ok: bool, **created: Any) -> Append:
    """One task from creation to completion (or failure after its one attempt)."""
    out = {"n": task}
    events = [
        _e(ev.TaskCreated(root_id=root, capability="work", **created), root, t),
        _e(ev.TaskDispatched(attempt=1, agent_id=agent), root, t + 0.5),
        _e(ev.TaskStarted(attempt=1, agent_id=agent), root, t + 0.6),
        _e(
            ev.TaskResultSubmitted(
                attempt=1, agent_id=agent, status="completed" if ok else "failed", output=out
            ),
            root,
            t + 1.5,
        ),
        _e(
            ev.TaskCompleted(attempt=1, agent_id=agent, output=out)
            if ok
            else ev.TaskFailed(reason="agent_error", error="boom", attempts=1),
            root,
            t + 1.6,
        ),
    ]
    return Append(task, events, 0)


async def _write_log(db: Path) -> RunIds:
    store = await SqliteEventStore.open(db)
    try:
        ids = await write_run(store)  # the lifecycle run, its times in 2027
        t0 = time.time() - 7200
        # 300 runs of one task each, every fourth failed, agents by turns
        appends: list[Append] = []
        ends: list[Append] = []
        for i in range(OTHERS):
            root, t = f"other-{i:03d}", t0 + i
            failed = i % 4 == 0
            task = f"{root}-t"
            appends.append(
                Append(
                    root,
                    [
                        _e(
                            ev.RunStarted(
                                goal=f"other goal {i}", plan_id=f"plan-{i % 7}", task_ids=[task]
                            ),
                            root,
                            t,
                        )
                    ],
                    0,
                )
            )
            appends.append(_done(task, root, t, f"agent-{i % 5}", not failed))
            end = ev.RunFailed(reason="tasks_not_completed") if failed else ev.RunCompleted()
            ends.append(Append(root, [_e(end, root, t + 2)], 1))
        for batch in (appends, ends):
            for chunk in range(0, len(batch), 300):
                for result in await store.append_many(batch[chunk : chunk + 300]):
                    assert not isinstance(result, Exception), result
        # the big run: 2,000 tasks in chains of ten, a few failed
        t = t0 + 3600
        tasks = [f"big-{i:04d}" for i in range(BIG_TASKS)]
        started = ev.RunStarted(goal="the big one", plan_id="plan-big", task_ids=tasks)
        await store.append(BIG, [_e(started, BIG, t)], 0)
        appends = [
            _done(
                task,
                BIG,
                t + 1 + (i % 10) * 2,
                f"agent-{i % 3}",
                i % 97 != 5,
                deps=[tasks[i - 1]] if i % 10 else [],
            )
            for i, task in enumerate(tasks)
        ]
        for chunk in range(0, len(appends), 500):
            for result in await store.append_many(appends[chunk : chunk + 500]):
                assert not isinstance(result, Exception), result
        await store.append(BIG, [_e(ev.RunCompleted(), BIG, t + 30)], 1)
        # a run still running: one task running, one waiting for it
        t = time.time() - 60
        live = ev.RunStarted(goal="still going", plan_id="plan-live", task_ids=["live-a", "live-b"])
        await store.append(LIVE, [_e(live, LIVE, t)], 0)
        a = [
            _e(ev.TaskCreated(root_id=LIVE, capability="work"), LIVE, t),
            _e(ev.TaskDispatched(attempt=1, agent_id="slow"), LIVE, t + 1),
            _e(ev.TaskStarted(attempt=1, agent_id="slow"), LIVE, t + 2),
        ]
        await store.append("live-a", a, 0)
        b = ev.TaskCreated(root_id=LIVE, capability="work", deps=["live-a"])
        await store.append("live-b", [_e(b, LIVE, t)], 0)
        return ids
    finally:
        await store.close()


def _open(page: Any, hash_: str) -> float:
    """Go to ``hash_`` and wait for the view to be drawn; the time it took in the page (ms)."""
    return float(
        page.evaluate(
            """(h) => new Promise((resolve) => {
                const before = document.body.dataset.rendered;
                const t0 = performance.now();
                location.hash = h;
                const check = () => document.body.dataset.rendered !== before
                  && document.querySelector("#view").children.length
                  ? resolve(performance.now() - t0) : requestAnimationFrame(check);
                check();
            })""",
            hash_,
        )
    )


# the colours a screenshot of the Gantt must hold: the hatched queued bar, attempts
QUEUED = (0xC9, 0xD3, 0xDF)
REJECTED, REVISION, COMPLETED = (0xE6, 0x7E, 0x22), (0x8E, 0x44, 0xAD), (0x2E, 0x9D, 0x5B)


def _colours(page: Any, png: bytes) -> list[list[int]]:
    """Every pixel's colour of a PNG, decoded by the browser (no imaging library needed)."""
    data = "data:image/png;base64," + base64.b64encode(png).decode()
    return list(
        page.evaluate(
            """(src) => new Promise((resolve) => {
                const img = new Image();
                img.onload = () => {
                  const c = document.createElement("canvas");
                  c.width = img.width; c.height = img.height;
                  const x = c.getContext("2d");
                  x.drawImage(img, 0, 0);
                  const d = x.getImageData(0, 0, c.width, c.height).data;
                  const seen = new Set();
                  for (let i = 0; i < d.length; i += 4) {
                    seen.add(d[i] + "," + d[i + 1] + "," + d[i + 2]);
                  }
                  resolve([...seen].map((s) => s.split(",").map(Number)));
                };
                img.src = src;
            })""",
            data,
        )
    )


def _has(colours: list[list[int]], want: tuple[int, int, int]) -> bool:
    return any(all(abs(c[i] - want[i]) <= 6 for i in range(3)) for c in colours)


def _cli(*args: str) -> Any:
    """``cardbus ARGS`` in a thread: playwright's sync API holds a loop in this one."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(CliRunner().invoke(cli, list(args))))
    t.start()
    t.join(60)
    return out[0]


@pytest.fixture
def ops_log(tmp_path: Path) -> tuple[Path, RunIds]:
    db = tmp_path / "ops.db"
    return db, asyncio.run(_write_log(db))


@pytest.mark.timeout(300)
def test_operator_console_at_scale(
    tmp_path: Path, ops_log: tuple[Path, RunIds], browser: Any
) -> None:
    db, ids = ops_log
    server = Server(db)
    try:
        server.wait_ready()
        page, errors = open_page(browser, wide=True, timeout_ms=60_000)
        page.goto(server.url)
        page.wait_for_selector("body[data-view='runs'] #runs-count[data-total='303']")
        assert page.locator("#runs tbody tr").count() == 50  # paged: 50 of 303
        # the runs list filters to the failed ones (75 others and the lifecycle run) ...
        page.select_option("#filters select[name='status']", "failed")
        page.locator("#filters button[type='submit']").click()
        page.wait_for_selector("#runs-count[data-total='76']")
        statuses = page.eval_on_selector_all(
            "#runs tbody tr", "rs => rs.map(r => r.dataset.status)"
        )
        assert len(statuses) == 50 and set(statuses) == {"failed"}
        # ... and pages beyond them, the filter kept
        page.locator(".pager button[data-page='50']").first.click()
        page.wait_for_selector(".pager[data-offset='50']")
        assert page.locator("#runs tbody tr").count() == 26
        assert "other-000" in page.locator("#runs").inner_text()  # the oldest, last
        # by goal text, plan and agent (an agent that handled one of the run's tasks)
        page.goto(server.url + "#/?q=goal%20299")
        page.wait_for_selector("#runs-count[data-total='1']")
        page.goto(server.url + "#/?plan=plan-big")
        page.wait_for_selector(f"#runs tr[data-root='{BIG}']")
        page.wait_for_selector("#runs-count[data-total='1']")
        page.goto(server.url + "#/?agent=agent-3&status=failed")
        page.wait_for_selector("#runs-count[data-total='15']")

        # the 2,000-task run opens in under a second, its page a screen or a few tall.
        # Measured in the page (performance.now: from the navigation to the view drawn) on
        # the second open: the first also pays one-off costs (the server's read model
        # catching up, the page's first layout) that say nothing of the run's size. The
        # product bound is 1 s; the assertion keeps it, measured on a warm open.
        page.goto(server.url + "#/")
        page.wait_for_selector("body[data-view='runs'] #runs tbody tr")
        _open(page, f"#/run/{BIG}")
        page.wait_for_selector("#gantt .row.task")
        _open(page, "#/")
        took = _open(page, f"#/run/{BIG}")
        print(f"the big run opened in {took:.0f} ms")
        assert took < 1000, f"the big run took {took:.0f} ms to open"
        height = page.evaluate("document.documentElement.scrollHeight")
        assert height < 5000, height
        assert page.locator("#tasks tbody tr").count() == 50
        assert page.locator("#gantt .row.task").count() == 50
        assert page.locator(".pager").first.get_attribute("data-total") == str(BIG_TASKS)
        # the failed-only filter: the 21 failed tasks (i % 97 == 5)
        page.locator("#show button[data-show='failed']").click()
        # the table is redrawn when the filtered page arrives: wait for the redrawn one
        # (a failed row of the unfiltered page would satisfy a wait for any failed row)
        page.wait_for_function(
            """() => {
                const rows = [...document.querySelectorAll('#tasks tbody tr')];
                return rows.length > 0 && rows.every(r => r.dataset.status === 'failed');
            }"""
        )
        statuses = page.eval_on_selector_all(
            "#tasks tbody tr", "rs => rs.map(r => r.dataset.status)"
        )
        assert set(statuses) == {"failed"} and len(statuses) == 21
        # a task's events are fetched when opened
        first = page.locator("#tasks tbody tr details[data-events]").first
        first.locator("summary").click()
        first.locator("table.steps").wait_for()
        assert "task.failed.v1" in first.inner_text()

        # cancel the running run from its page, as a named operator
        page.fill("#operator", "ops-tester")
        page.dispatch_event("#operator", "change")
        _open(page, f"#/run/{LIVE}")
        page.wait_for_selector("#run-status[data-status='running']")
        # the running task's duration ticks with no event (a minute and more so far)
        tick = page.locator("#tasks tr[data-task='live-a'] [data-since]")
        first_text = tick.inner_text()
        page.wait_for_function(
            "(t) => document.querySelector(\"#tasks tr[data-task='live-a'] [data-since]\")"
            ".textContent !== t",
            arg=first_text,
        )
        page.fill("#cancel-note", "not needed")
        page.locator("#cancel").click()
        # a loopback console without a token: the actor is the account it runs as
        me = local_identity().name
        page.wait_for_selector(f"#action-result:has-text('cancelled 2 task(s) as {me}')")
        page.wait_for_selector("#tasks tr[data-task='live-a'][data-status='cancelled']")
        out = _cli("replay", LIVE, "--store", str(db))
        assert out.exit_code == 0, out.output
        assert out.stdout.count(f"(by {me})") == 2, out.stdout
        assert "cancelled_by_user: not needed" in out.stdout

        # the lifecycle run: queued time and each attempt as bars of their own
        _open(page, f"#/run/{ids.root}")
        row = page.locator(f"#gantt .row.task[data-task='{ids.write}']")
        row.wait_for()
        bars = row.locator(".span")
        assert bars.count() == 3  # rejected, then revision, then completed
        assert [bars.nth(i).get_attribute("data-outcome") for i in range(3)] == [
            "rejected",
            "revision",
            "completed",
        ]
        # the retry's queued bar ends where its attempt's bar begins, and they do not overlap;
        # measured in one script run, as the live view may redraw its rows between two calls
        q, a = page.evaluate(
            """(task) => {
                const row = document.querySelector(`#gantt .row.task[data-task="${task}"]`);
                const queued = row.querySelector(".queued");
                if (!queued) return [null, null];
                const attempt = row.querySelector(
                    `.span[data-attempt="${queued.dataset.attempt}"]`);
                const box = (e) => { const r = e.getBoundingClientRect();
                                     return {x: r.x, width: r.width}; };
                return [box(queued), attempt ? box(attempt) : null];
            }""",
            ids.write,
        )
        assert q is not None and a is not None, (q, a)
        assert abs((q["x"] + q["width"]) - a["x"]) <= 2 and q["width"] > 3
        # the time-out, the review subtask and the failure are there too
        code = page.locator(f"#gantt .row.task[data-task='{ids.code}']")
        assert code.locator(".span[data-outcome='timed_out']").count() == 1
        assert page.locator(f"#gantt .row.task[data-task='{ids.review}'] .span").count() == 1
        shot = tmp_path / "lifecycle-gantt.png"
        # page shots clipped to the elements: the live view redraws its rows (durations
        # tick), and an element shot fails when its element is replaced meanwhile
        gantt_box, row_box = page.evaluate(
            """(task) => [".cb-gantt", `#gantt .row.task[data-task="${task}"]`].map((s) => {
                const r = document.querySelector(s).getBoundingClientRect();
                return {x: r.x + scrollX, y: r.y + scrollY, width: r.width, height: r.height};
            })""",
            ids.write,
        )
        page.screenshot(path=str(shot), clip=gantt_box, full_page=True)
        row_png = page.screenshot(
            path=str(tmp_path / "write-row.png"), clip=row_box, full_page=True
        )
        assert shot.stat().st_size > 0
        colours = _colours(page, row_png)
        for want in (QUEUED, REJECTED, REVISION, COMPLETED):
            assert _has(colours, want), (want, len(colours))
        assert errors == [], errors
    finally:
        out = server.stop()
    assert "Traceback" not in out, out


@pytest.fixture
def demo_run(tmp_path: Path) -> tuple[Path, str]:
    db = tmp_path / "demo.db"
    asyncio.run(_create(db))
    run = Background(db, DEMO_AGENTS, report_plan("ocean tides", plan_id="received"))
    assert run.join().status == "completed" and run.root is not None
    return db, run.root


@pytest.mark.timeout(180)
def test_a_task_page_shows_the_inputs_its_agent_received(
    demo_run: tuple[Path, str], browser: Any
) -> None:
    db, root = demo_run
    task = f"outline-{root[-12:]}"
    # replay --json: the dispatch's payload holds what was sent, $dep resolved
    out = _cli("replay", task, "--store", str(db), "--json")
    assert out.exit_code == 0, (out.output, out.exception)
    timeline = json.loads(out.stdout)
    [node] = timeline["tasks"]
    dispatched = [s for s in node["steps"] if s["kind"] == "dispatched"]
    received = dispatched[0]["payload"]["received"]
    assert "$dep" in json.dumps(node["inputs"])  # the plan's reference
    assert "$dep" not in json.dumps(received) and received["facts"]  # what the agent got
    assert node["spans"][0]["received"] == received
    server = Server(db)
    try:
        server.wait_ready()
        page = browser.new_page()
        page.goto(f"{server.url}#/task/{task}")
        page.wait_for_selector("body[data-view='task'] #task-received .received")
        assert "$dep" in page.locator("#task-input").inner_text()
        got = page.locator("#task-received").inner_text()
        assert "$dep" not in got
        assert json.dumps(received["facts"][0])[1:-1][:20] in got
        assert page.locator("#task-goal").inner_text().strip() != ""
    finally:
        server.stop()


async def _create(db: Path) -> None:
    await (await SqliteEventStore.open(db)).close()
