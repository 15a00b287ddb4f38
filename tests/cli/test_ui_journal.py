"""The console's task page lists what each attempt asked models and tools (the journal).

The log holds two real runs (tests/journal_log.py); ``cardbus ui`` serves it in a
subprocess and headless Chromium (driven by playwright, as in test_ui.py) opens the
task pages: model calls with the prompt and the answer expandable, tool calls with
their key, the unknown effect with its decision, and replayed calls marked with the
event they replay.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from journal_log import JournalRuns, write_journal_runs
from test_ui import Server


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[JournalRuns, Server]]:
    runs = asyncio.run(write_journal_runs(tmp_path_factory.mktemp("ui-journal") / "log.db"))
    server = Server(runs.db)
    try:
        server.wait_ready()
        yield runs, server
    finally:
        server.stop()


def _rows(page: Any) -> list[dict[str, str]]:
    return page.eval_on_selector_all(
        "#calls tr.call",
        "rows => rows.map(r => ({...r.dataset, text: r.innerText}))",
    )


@pytest.mark.timeout(180)
def test_the_task_page_lists_model_and_tool_calls_by_attempt(
    logged: tuple[JournalRuns, Server], page: Any
) -> None:
    runs, server = logged
    page.goto(f"{server.url}#/task/{runs.retry_task}")
    page.wait_for_selector("body[data-view='task'] #calls tr.call")
    rows = _rows(page)
    assert [(r["kind"], r["attempt"], r["replayed"]) for r in rows] == [
        ("model", "1", "no"),
        ("model", "1", "no"),
        ("model", "2", "yes"),
        ("model", "2", "yes"),
        ("tool", "2", "no"),
        ("model", "2", "no"),
    ]
    groups = page.eval_on_selector_all("#calls tr.call-attempt", "rs => rs.map(r => r.innerText)")
    assert groups == ["attempt #1 · asker", "attempt #2 · asker"]
    assert "101+11" in rows[0]["text"] and "live" in rows[0]["text"]
    assert "0+0" in rows[2]["text"] and "replayed from" in rows[2]["text"]
    assert "charge" in rows[4]["text"] and "live" in rows[4]["text"]
    # the replayed call names attempt 1's answer and shows its prompt and answer
    replay = page.locator("#calls tr.call").nth(2)
    with urllib.request.urlopen(f"{server.url}api/tasks/{runs.retry_task}") as r:
        calls = json.loads(r.read())["calls"]
    assert calls[0]["answered_event_id"] in replay.inner_text()
    summaries = replay.locator("summary").all_inner_texts()
    assert summaries == ["one: tides", "answer one"]
    prompt = replay.locator("details").nth(0)
    assert not prompt.locator("pre").is_visible()  # folded until asked
    prompt.locator("summary").click()
    assert prompt.locator("pre").is_visible()
    assert '"content": "one: tides"' in prompt.locator("pre").inner_text()
    answer = replay.locator("details").nth(1)
    answer.locator("summary").click()
    assert '"text": "answer one"' in answer.locator("pre").inner_text()
    tool = page.locator("#calls tr.call").nth(4)
    tool.locator("details").nth(1).locator("summary").click()
    assert '"charged": 5' in tool.locator("details").nth(1).locator("pre").inner_text()


@pytest.mark.timeout(180)
def test_the_task_page_shows_an_unknown_effect_and_its_decision(
    logged: tuple[JournalRuns, Server], page: Any
) -> None:
    runs, server = logged
    page.goto(f"{server.url}#/task/{runs.unknown_task}")
    page.wait_for_selector("body[data-view='task'] #calls tr.call")
    rows = _rows(page)
    assert [(r["kind"], r["attempt"], r["status"]) for r in rows] == [
        ("tool", "1", "unknown"),
        ("effect_unknown", "2", "ask"),
        ("effect_unknown", "3", "repeat"),
        ("tool", "3", "ok"),
    ]
    assert "no result recorded" in rows[0]["text"] and "effect unknown" in rows[0]["text"]
    assert "decision ask" in rows[1]["text"] and "waits for an operator" in rows[1]["text"]
    assert "decision repeat" in rows[2]["text"]
    key = page.locator("#calls tr.call").nth(0).locator("td.id").inner_text()
    assert key and key in rows[3]["text"]  # repeated with the same idempotency key
    steps = page.locator("#steps").inner_text()
    assert "tool.effect_unknown.v1" in steps and "awaiting approval: tool_effect_unknown" in steps
