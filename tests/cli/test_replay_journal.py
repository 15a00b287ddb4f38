"""``cardbus replay`` shows what each attempt asked models and tools (the journal).

Two real runs (tests/journal_log.py): a retry answered from the journal for its
first two model calls, and a tool call whose effect became unknown. The text lists
each call under its attempt on one line, ``--json`` carries prompts and answers whole,
and the ``--html`` page (rendered in headless Chromium) has them in ``<details>``.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from journal_log import JournalRuns, write_journal_runs
from test_replay_html import render

from cardbus.tools.cli import cli


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> JournalRuns:
    return asyncio.run(write_journal_runs(tmp_path_factory.mktemp("journal") / "log.db"))


def _replay(runs: JournalRuns, *args: str) -> str:
    out = CliRunner().invoke(cli, ["replay", *args, "--db", str(runs.db)], terminal_width=400)
    assert out.exit_code == 0, out.output
    return out.output


def _answered_ids(doc: dict[str, Any]) -> dict[tuple[int, int], str]:
    """(attempt, seq) -> the model.answered event id of each live model call."""
    return {
        (c["attempt"], c["seq"]): c["answered_event_id"]
        for s in doc["tasks"][0]["spans"]
        for c in s["calls"]
        if c["kind"] == "model" and c["replayed_from"] is None
    }


def test_text_lists_each_call_under_its_attempt(runs: JournalRuns) -> None:
    text = _replay(runs, runs.retry_task)
    doc = json.loads(_replay(runs, runs.retry_task, "--json"))
    ids = _answered_ids(doc)
    block = text[text.index("attempt #1 asker") :]
    first, second = block.split("attempt #2 asker")
    assert "2 model call(s), 0 tool call(s)" in first
    assert re.search(
        r'model #0 +stub-model-2024  101\+11 tokens .* live  "one: tides" -> "answer one"', first
    )
    assert "3 model call(s), 1 tool call(s), 2 replayed" in second
    assert re.search(
        rf'model #0 +stub-model-2024  0\+0 tokens .*replayed from {ids[(1, 0)]}  "one: tides"'
        r' -> "answer one"',
        second,
    )
    assert f"replayed from {ids[(1, 1)]}" in second
    key = next(
        c["idempotency_key"] for c in doc["tasks"][0]["spans"][1]["calls"] if c["kind"] == "tool"
    )
    assert re.search(
        rf'tool  #2 +charge\(\{{"amount":5\}}\) -> \{{"charged":5\}}  live  key {key}', second
    )
    assert re.search(r'model #3 .* 103\+13 tokens .* live  "three: ', second)


def test_text_shows_an_unknown_effect_and_its_decision(runs: JournalRuns) -> None:
    text = _replay(runs, runs.unknown_root)
    one, rest = text[text.index("attempt #1 payer") :].split("attempt #2 payer")
    two, three = rest.split("attempt #3 payer")
    assert "charge" in one and "no result recorded  effect unknown" in one
    assert re.search(r"effect unknown #0 charge  call \S+  key \S+  decision ask", two)
    assert re.search(r"effect unknown #0 charge .* decision repeat", three)
    assert re.search(r'tool  #0 +charge\(\{"amount":7\}\) -> \{"charged":7\}  live', three)
    # the approval says which call it is about
    assert "awaiting approval: tool_effect_unknown (EffectUnknown: the effect of charge" in text


def test_json_has_prompts_and_answers_whole_and_replays_resolved(runs: JournalRuns) -> None:
    doc = json.loads(_replay(runs, runs.retry_root, "--json"))
    (task,) = doc["tasks"]
    one, two = task["spans"]
    assert [c["kind"] for c in one["calls"]] == ["model", "model"]
    assert [c["kind"] for c in two["calls"]] == ["model", "model", "tool", "model"]
    live = one["calls"][0]
    assert live["prompt"]["messages"] == [{"role": "user", "content": "one: tides"}]
    assert live["answer"]["text"] == "answer one"
    assert (live["input_tokens"], live["output_tokens"], live["status"]) == (101, 11, "answered")
    assert live["latency_s"] > 0 and live["requested_event_id"]
    replayed = two["calls"][0]
    assert replayed["status"] == "replayed"
    assert replayed["replayed_from"] == live["answered_event_id"]
    assert (replayed["input_tokens"], replayed["output_tokens"]) == (0, 0)
    assert replayed["prompt"] == live["prompt"] and replayed["answer"] == live["answer"]
    tool = two["calls"][2]
    assert tool["tool"] == "charge" and tool["arguments"] == {"amount": 5}
    assert tool["result"] == {"charged": 5} and tool["error"] is None
    assert tool["replayed_from"] is None
    assert tool["idempotency_key"] == tool["requested_event_id"]

    doc = json.loads(_replay(runs, runs.unknown_root, "--json"))
    spans = doc["tasks"][0]["spans"]
    (cut,) = spans[0]["calls"]
    assert (cut["kind"], cut["status"], cut["end"]) == ("tool", "unknown", None)
    assert [(c["kind"], c.get("decision")) for c in spans[1]["calls"]] == [
        ("effect_unknown", "ask")
    ]
    effect, again = spans[2]["calls"]
    assert (effect["decision"], effect["requested_event_id"]) == (
        "repeat",
        cut["requested_event_id"],
    )
    assert again["idempotency_key"] == cut["idempotency_key"] == effect["idempotency_key"]
    assert again["result"] == {"charged": 7}


def test_html_lists_the_calls_with_expandable_prompts_and_answers(
    runs: JournalRuns, tmp_path: Path
) -> None:
    page = tmp_path / "replay.html"
    _replay(runs, runs.retry_root, "--html", str(page))
    dom = render(page, tmp_path / "profile")
    assert 'data-rendered="yes"' in dom
    rows = re.findall(
        r'<tr class="call k-(\w+)"[^>]*data-attempt="(\d)"[^>]*data-replayed="(\w+)"', dom
    )
    assert rows == [
        ("model", "1", "no"),
        ("model", "1", "no"),
        ("model", "2", "yes"),
        ("model", "2", "yes"),
        ("tool", "2", "no"),
        ("model", "2", "no"),
    ]
    assert "attempt #1 \u2014 asker (retry)" in dom and "attempt #2 \u2014 asker (completed)" in dom
    # the Gantt marks each call on its attempt's bar: the same calls, live or replayed
    marks = re.findall(r'<div class="callmark call_(\w+)"[^>]*data-kind="(\w+)"', dom)
    assert marks == [
        ("live", "model"),
        ("live", "model"),
        ("replayed", "model"),
        ("replayed", "model"),
        ("live", "tool"),
        ("live", "model"),
    ]
    assert "legend-calls" in dom
    # prompt and answer: one line in the summary, whole in the folded <pre>
    assert '<summary>one: tides</summary><pre class="mono">{\n  "op": "chat"' in dom
    assert "<summary>answer one</summary>" in dom
    doc = json.loads(_replay(runs, runs.retry_root, "--json"))
    source = doc["tasks"][0]["spans"][0]["calls"][0]["answered_event_id"]
    assert f'<td class="replayed">replayed from {source}</td>' in dom

    page = tmp_path / "unknown.html"
    _replay(runs, runs.unknown_root, "--html", str(page))
    dom = render(page, tmp_path / "profile2")
    statuses = re.findall(r'<tr class="call k-(\w+)"[^>]*data-status="(\w+)"', dom)
    assert statuses == [
        ("tool", "unknown"),
        ("effect_unknown", "ask"),
        ("effect_unknown", "repeat"),
        ("tool", "ok"),
    ]
    assert "no result recorded" in dom and "asks an operator before repeating" in dom
