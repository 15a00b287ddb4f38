"""A typed question to a person, answered from the command line and from the console's
page (issue 31 item 2, its "done when"; the A2A door is in tests/bus/a2a).

The demo ``Payer`` asks "how much, in which currency?" with the schema
``{amount: number, currency: "EUR"|"USD"}``.

* Command line: ``cardbus run`` (a subprocess, SQLite) waits on the question; it is killed
  with SIGKILL; ``cardbus answer`` shows the question, refuses ``{"amount": "lots"}``
  naming ``amount`` (the question stays open) and takes a good answer by ``ada``; the run
  started again completes with it; ``cardbus replay`` shows the question and the answer.
* Console: ``cardbus ui --agent cardbus.agents.demo:Payer`` (real uvicorn, a named token),
  headless Chromium: the run's page links the question; its page draws a form from the
  schema; "lots" is refused naming ``amount`` (the field marked, nothing written); 12.5 EUR
  is taken, by the token's name, and the run completes.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from cardbus.eventstore import Envelope
from cardbus.eventstore import events as ev
from tests.cli.chromium import open_page
from tests.cli.doors import ROOT, Runs, cardbus, kill9, log_of, wait_in_log
from tests.cli.test_ui import Server, _off_loop

PLAN = {
    "plan_id": "pay-ada",
    "goal": "Pay Ada",
    "agents": ["cardbus.agents.demo:Payer"],
    "tasks": [{"id": "pay", "capability": "pay", "inputs": {"payee": "Ada"}}],
}
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OPENAI_BASE_URL": "", "CARDBUS_MODEL": ""}


def _question(events: list[Envelope]) -> tuple[str, str] | None:
    """(root, question task) once the log says the question waits."""
    for e in events:
        if isinstance(e.data, ev.ApprovalRequested) and e.data.reason == "question":
            return e.correlation_id, e.stream
    return None


def _escalated(events: list[Envelope]) -> Envelope | None:
    return next((e for e in events if isinstance(e.data, ev.WaitExpired)), None)


def _asked(folder: Path, proc: Any) -> tuple[str, str]:
    return wait_in_log(folder, proc, _question, "a question asked")


def test_killed_while_asking_then_answered_from_the_command_line(
    tmp_path: Path, runs: Runs
) -> None:
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    first = runs.start(tmp_path, ENV)
    root, q_task = _asked(tmp_path, first)
    kill9(first)

    shown = cardbus(tmp_path, ENV, "answer", root)
    assert shown.returncode == 0, shown.stderr
    assert "How much should Ada be paid, in which currency?" in shown.stdout
    assert "amount: number, currency: EUR|USD" in shown.stdout

    bad = cardbus(tmp_path, ENV, "answer", root, '{"amount": "lots", "currency": "EUR"}')
    assert bad.returncode == 1, bad.stdout
    assert "'amount'" in bad.stderr and "not of type 'number'" in bad.stderr, bad.stderr
    listed = json.loads(cardbus(tmp_path, ENV, "answer", root, "--json").stdout)
    assert [q["task_id"] for q in listed["questions"]] == [q_task]  # still open

    good = cardbus(
        tmp_path,
        ENV,
        "answer",
        root,
        "--json",
        '{"amount": 12.5, "currency": "USD"}',
        "--by",
        "ada",
    )
    assert good.returncode == 0, good.stderr
    said = json.loads(good.stdout)
    assert said["task_id"] == q_task and said["by"] == "ada"
    assert said["answer"] == {"amount": 12.5, "currency": "USD"}

    again = runs.start(tmp_path, ENV)  # the same command resumes the run: the answer is in the log
    out, _ = again.communicate(timeout=120)
    assert again.returncode == 0, out
    events = log_of(tmp_path)
    outputs = [e.data.output for e in events if isinstance(e.data, ev.TaskCompleted)]
    assert {"text": "pay 12.5 USD to Ada", "payee": "Ada", "amount": 12.5, "currency": "USD"} in (
        outputs
    )
    (answered,) = [e for e in events if isinstance(e.data, ev.QuestionAnswered)]
    assert (answered.actor, answered.data.door) == ("ada", "cli")

    replay = cardbus(tmp_path, ENV, "replay", root)
    assert replay.returncode == 0, replay.stderr
    lines = replay.stdout.splitlines()
    assert any("question to a person: How much should Ada be paid" in ln for ln in lines)
    (line,) = [ln for ln in lines if "question answered by ada" in ln]
    assert '{"amount": 12.5, "currency": "USD"}' in line and "from the cli" in line


def _events(folder: Path) -> list[Any]:
    """The log, read off playwright's loop (its sync API holds one in this thread)."""
    return list(_off_loop(lambda: asyncio.to_thread(log_of, folder)))


@pytest.mark.timeout(300)
def test_answered_from_the_console_page_in_chromium(tmp_path: Path, browser: Any) -> None:
    token = "s3cret"
    db = tmp_path / "log.db"
    env = {"PYTHONPATH": str(ROOT), "OPENAI_BASE_URL": "", "CARDBUS_MODEL": ""}
    args = ("--token-name", "ops", "--agent", "cardbus.agents.demo:Payer")
    server = Server(db, env=env, token=token, args=args)
    try:
        server.wait_ready(token)
        page, errors = open_page(browser, wide=True, timeout_ms=60_000)
        page.goto(f"{server.url}?token={token}")
        page.wait_for_selector("#start-run[data-enabled='yes']")
        page.fill("#plan-text", json.dumps(PLAN))
        page.locator("#start-plan-button").click()
        page.wait_for_function("location.hash.startsWith('#/run/')")
        root = str(page.evaluate("decodeURIComponent(location.hash.slice('#/run/'.length))"))
        # the run's page links the question (not approve/deny buttons)
        page.locator("a.answer-link").click()
        page.wait_for_selector("form.question")
        assert "How much should Ada be paid" in page.inner_text("#question-text")
        assert page.locator("form.question [data-field]").count() == 2
        options = page.locator("select[data-field='currency'] option").all_inner_texts()
        assert [o for o in options if o] == ["EUR", "USD"]

        page.fill("input[data-field='amount']", "lots")
        page.select_option("select[data-field='currency']", label="EUR")
        page.locator("button[data-answer]").click()
        page.wait_for_selector("input[data-field='amount'].invalid")
        assert "'amount'" in page.inner_text("#answer-error")
        assert not [e for e in _events(tmp_path) if isinstance(e.data, ev.QuestionAnswered)]
        assert page.locator("form.question").count() == 1  # still open

        page.fill("input[data-field='amount']", "12.5")
        page.locator("button[data-answer]").click()
        page.goto(f"{server.url}?token={token}#/run/{root}")
        page.wait_for_selector("#run-status[data-status='completed']")
        assert not errors, errors
    finally:
        server.stop()
    events = _events(tmp_path)
    (answered,) = [e for e in events if isinstance(e.data, ev.QuestionAnswered)]
    assert answered.actor == "ops" and answered.data.door == "console"
    assert answered.data.answer == {"amount": 12.5, "currency": "EUR"}
    (done,) = [e.data for e in events if isinstance(e.data, ev.RunCompleted)]
    assert done is not None


def test_an_escalated_question_refuses_others_on_the_command_line(
    tmp_path: Path, runs: Runs
) -> None:
    # a deadline (waits, kind question) escalates it to bea: ada is refused, bea answers
    policy = {"deadline_s": 1, "then": [{"action": "escalate", "to": ["bea"]}]}
    (tmp_path / "plan.json").write_text(json.dumps({**PLAN, "waits": {"question": policy}}))
    proc = runs.start(tmp_path, ENV)
    root, q_task = _asked(tmp_path, proc)
    wait_in_log(tmp_path, proc, _escalated, "the question escalated")
    answer = '{"amount": 3, "currency": "EUR"}'
    refused = cardbus(tmp_path, ENV, "answer", root, answer, "--by", "ada")
    assert refused.returncode == 1, refused.stdout
    assert "NotAnApprover" in refused.stderr or "'ada' may not answer" in refused.stderr
    assert "bea" in refused.stderr, refused.stderr
    took = cardbus(tmp_path, ENV, "answer", root, answer, "--by", "bea")
    assert took.returncode == 0, took.stderr
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    (answered,) = [e for e in log_of(tmp_path) if isinstance(e.data, ev.QuestionAnswered)]
    assert (answered.stream, answered.actor, answered.data.door) == (q_task, "bea", "cli")
