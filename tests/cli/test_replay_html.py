"""``cardbus replay --html``: the page renders in headless Chromium; its script draws the timeline.

Chromium is installed by ``.ci/run`` (Debian package ``chromium``). Without it
the test fails when ``CI`` is set and is skipped (with the reason shown)
elsewhere.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from lifecycle_log import RunIds

from cardbus.projections.replay_html import COLOURS, OUTCOMES, STATUSES
from cardbus.tools.cli import cli
from tests.cli.chromium import chromium_path


def _chromium() -> str:
    return chromium_path("check the replay HTML")


def render(html_file: Path, profile: Path) -> str:
    result = subprocess.run(
        [
            _chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            f"--user-data-dir={profile}",
            "--dump-dom",
            html_file.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@pytest.mark.timeout(180)
def test_replay_html_renders_in_chromium(run_db: tuple[str, RunIds], tmp_path: Path) -> None:
    db, ids = run_db
    page = tmp_path / "timeline.html"
    r = CliRunner().invoke(cli, ["replay", ids.root, "--db", db, "--html", str(page)])
    assert r.exit_code == 0, r.output
    source = page.read_text()
    assert "<script src" not in source and "http" not in source.split("<body", 1)[1]
    dom = render(page, tmp_path / "profile")
    # everything below exists only once the page's script has run
    assert 'data-rendered="yes"' in dom
    assert f'<h1 id="title">Replay of run {ids.root}</h1>' in dom
    summary = re.search(r'<div id="summary">(.*?)</div>', dom)
    assert summary is not None
    assert summary.group(1).startswith("5 tasks · 42 events · 75.00 s · 2 failed or halted")
    # one Gantt row per task, subtasks included, plus the run row
    rows = re.findall(r'<div class="row (task|run)" data-task="([^"]+)"', dom)
    assert [t for _, t in rows] == [
        ids.root,
        ids.research,
        ids.write,
        ids.review,
        ids.code,
        ids.loop,
    ]
    # attempt bars coloured by outcome, labelled with attempt and agent
    spans = re.findall(r'<div class="span (\w+)"[^>]*>#(\d+) ([\w-]+)</div>', dom)
    assert ("rejected", "1", "writer-1") in spans
    assert ("revision", "2", "writer-2") in spans
    assert ("completed", "3", "writer-2") in spans
    assert ("timed_out", "2", "coder") in spans
    assert ("halted", "3", "planner") in spans
    # the step tables carry every reason
    for reason in (
        "rejected by writer-1: out_of_capability (no prose)",
        "revision requested (round 1): [high] intro: shorter",
        "retry as attempt 2 in 1s: output_schema_mismatch",
        "halted: loop_detected (h-loop seen 3 times)",
    ):
        assert f'<td class="reason">{reason}</td>' in dom, reason
    # full ids in the Gantt labels; the review subtask named by its round
    assert f'<span class="mono task-id">{ids.review}</span>' in dom
    assert "↳ review round 1 " in dom and f"review round 1 — {ids.review} (completed)" in dom
    # inputs and outputs, collapsed by default (<details> without open)
    io = re.search(rf'<div class="io" data-task="{ids.research}">(.*?)</div>', dom, re.S)
    assert io is not None
    assert '<details class="payload"><summary>inputs</summary>' in io.group(1)
    assert '"q": "cats"' in io.group(1) and '"purr"' in io.group(1)
    assert "<details open" not in dom
    # one row per attempt: queue time (pending -> dispatched) apart from run time
    # (started -> result), tokens, model; the write task's second attempt queued
    # from its rejection (+1 s) to the retry's dispatch (+1 s after the retry)
    table = re.search(rf'<table class="attempts" data-task="{ids.write}">(.*?)</table>', dom, re.S)
    assert table is not None
    rows = re.findall(r'<tr class="attempt" data-attempt="(\d)">(.*?)</tr>', table.group(1), re.S)
    cells = {a: re.findall(r"<td[^>]*>(.*?)</td>", row, re.S) for a, row in rows}
    assert cells["2"][1] == "writer-2" and cells["2"][2] == "—"  # no model recorded
    assert "timed_out" not in cells["2"][3] and "revision" in cells["2"][3]
    assert cells["2"][4:9] == ["2.00 s", "4.00 s", "5.00 s", "200", "300"]
    assert '"draft"' in cells["2"][9]
    # failed and timed-out attempts, and every status, have colours of their own
    code = re.search(rf'<table class="attempts" data-task="{ids.code}">(.*?)</table>', dom, re.S)
    assert code is not None and 'class="status timed_out"' in code.group(1)
    legends = re.findall(r'<div class="legend" id="([\w-]+)">(.*?)</div>', dom, re.S)
    shown = {k: re.findall(r"<i class=\"(\w+)\"></i>", v) for k, v in legends}
    assert set(shown["legend-statuses"]) == set(STATUSES)
    assert set(shown["legend-outcomes"]) == {"queued", *OUTCOMES}


def test_every_outcome_and_status_has_its_own_colour() -> None:
    """The span outcomes replay produces and the task states, each a distinct colour."""
    import importlib

    replay_module = importlib.import_module("cardbus.projections.replay")

    # _fold_task's own outcomes, then the ones an event closes every open attempt with
    produced = {"open", "completed", "superseded", "rejected", "timed_out"}
    produced |= set(replay_module._CLOSE_ALL.values())
    assert produced <= set(OUTCOMES), produced - set(OUTCOMES)
    assert set(STATUSES) | set(OUTCOMES) <= set(COLOURS)
    assert len(set(COLOURS.values())) == len(COLOURS)  # no two share a colour


def test_replay_html_escapes_log_content(tmp_path: Path) -> None:
    """A goal containing markup is shown as text, never parsed as HTML."""
    import asyncio

    from cardbus.eventstore import NewEvent, SqliteEventStore
    from cardbus.eventstore import events as ev

    db = tmp_path / "x.db"

    async def populate() -> None:
        store = await SqliteEventStore.open(db)
        evil = "</script><script>document.body.dataset.pwned='1'</script><b>x</b>"
        await store.append(
            "t1",
            [
                NewEvent(
                    data=ev.TaskCreated(root_id="r1", capability="c", goal=evil),
                    correlation_id="r1",
                )
            ],
            0,
        )
        await store.close()

    asyncio.run(populate())
    page = tmp_path / "evil.html"
    r = CliRunner().invoke(cli, ["replay", "r1", "--db", str(db), "--html", str(page)])
    assert r.exit_code == 0, r.output
    dom = render(page, tmp_path / "profile")
    assert 'data-rendered="yes"' in dom
    assert "data-pwned" not in dom  # the injected script never ran
    assert "&lt;/script&gt;&lt;b&gt;x&lt;/b&gt;</td>" in dom  # shown as text
