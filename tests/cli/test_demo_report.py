"""The demo's report reads as a report: its facts and figures reach the text, and the
revision fixes what the review found (on the mock model and on an endpoint)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agents"))
from openai_stub import OpenAIStub

from cardbus.agents.demo import Draft, Section, compose_draft
from cardbus.agents.demo.roles import WriteJob
from cardbus.eventstore.events import ReviewIssue
from cardbus.tools.cli import cli

SUGGESTION = "Close with a conclusion that sums up the key facts and figures."


@pytest.fixture(autouse=True)
def no_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "CARDBUS_MODEL"):
        monkeypatch.delenv(name, raising=False)


def _sections(report: str) -> dict[str, str]:
    parts = re.split(r"(?m)^## (.+)$", report.split("\n\n", 1)[1])
    # the paragraphs are wrapped at 100 columns: a section's text is its lines joined
    return {h.strip(): " ".join(t.split()) for h, t in zip(parts[1::2], parts[2::2], strict=True)}


def test_the_demo_report_uses_every_fact_and_writes_its_conclusion(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["demo", "--db", str(tmp_path / "d.db"), "--json"])
    assert result.exit_code == 0, result.output
    outputs = json.loads(result.stdout)["outputs"]
    draft, research = outputs["write"], outputs["research"]
    text = {s["heading"]: s["text"] for s in draft["sections"]}
    assert list(text) == ["Introduction", "Key facts", "Figures", "Outlook", "Conclusion"]
    body = " ".join(text.values())
    # every fact gathered is in the report, the supplementary research (figures) included
    for fact in research["facts"]:
        assert fact in body
    figures = outputs["outline"]["figures"]
    assert figures and all(f in body for f in figures)
    assert [f for f in figures if f in text["Figures"]] == [f for f in figures if "figures" in f]
    # the revision wrote the conclusion the review asked for, from the facts and figures
    assert SUGGESTION not in body
    assert text["Conclusion"].startswith("To sum up ocean tides:")
    assert "overview fact 1" in text["Conclusion"] and "figures fact 1" in text["Conclusion"]


def test_the_printed_report(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["demo", "--db", str(tmp_path / "d.db")])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()  # the run's first and last lines first
    body = "\n".join(line for line in lines if not line.startswith("run "))
    report = body.split("\nThe run, read back from the log", 1)[0].strip()
    sections = _sections(report)
    assert report.startswith("# Report: ocean tides")
    assert "figures fact 2" in sections["Figures"] and SUGGESTION not in report
    assert sections["Conclusion"].startswith("To sum up ocean tides:")
    assert all(len(line) <= 100 for line in report.splitlines())
    # then the run summed up from its replay: who did each task, and the turns it took
    story = body.split("\nThe run, read back from the log", 1)[1].split("\nWhere next:")[0]
    rows = {line.split()[0]: line for line in story.splitlines()[1:] if line.strip()}
    assert rows["planned"].startswith("  planned by rule-planner: research -> outline -> write")
    research = next(v for k, v in rows.items() if k.startswith("research-"))
    assert "researcher" in research and "1 model call, 1 tool call" in research
    outline = next(v for k, v in rows.items() if k.startswith("outline-") and "~" not in k)
    assert "needs input: figures about ocean tides" in outline
    write = next(v for k, v in rows.items() if k.startswith("write-") and "~" not in k)
    assert "revised after review (round 1): [medium] Co" in write
    assert sum("~review" in k for k in rows) == 2


def test_a_revision_edits_the_previous_draft() -> None:
    job = WriteJob(
        topic="tides", outline=["Intro"], facts=["tides: a (source: s)"], figures=["16 m at Fundy"]
    )
    previous = Draft(title="Report: tides", sections=[Section("Intro", "Edited by hand.")])
    missing = ReviewIssue(
        issue_type="missing_section", section="Conclusion", severity="low", suggestion=SUGGESTION
    )
    weak = ReviewIssue(issue_type="missing_facts", section="Intro", severity="low", suggestion="x")
    draft = compose_draft(job, previous, [weak, missing])
    assert [s.heading for s in draft.sections] == ["Intro", "Conclusion"]
    intro, conclusion = draft.sections
    assert intro.text.startswith("Edited by hand.")  # kept, then given the facts it lacked
    assert "tides: a (source: s)" in intro.text and "16 m at Fundy." in intro.text
    assert conclusion.text == "To sum up tides: a; 16 m at Fundy."


def _review(passed: bool) -> str:
    issue = {
        "issue_type": "missing_section",
        "section": "Conclusion",
        "severity": "medium",
        "suggestion": SUGGESTION,
    }
    return json.dumps({"passed": passed, "issues": [] if passed else [issue]})


def _props(body: Any) -> set[str]:
    """The properties of the output schema a request asks for."""
    schema = body.get("response_format", {}).get("json_schema", {}).get("schema", {})
    ref = schema.get("$ref", "")
    if ref:
        schema = schema.get("$defs", {}).get(ref.rsplit("/", 1)[-1], {})
    return set(schema.get("properties", {}))


def test_on_an_endpoint_the_writer_revises_its_draft_with_the_issues(tmp_path: Path) -> None:
    reviews: list[bool] = []

    def respond(body: Any) -> str | None:
        if "passed" in _props(body):  # the reviewer: one round of issues
            reviews.append(bool(reviews))
            return _review(reviews[-1])
        return None  # the others: an instance of their schema

    with OpenAIStub() as stub:
        stub.honour_schema = True
        stub.responder = respond
        args = ["demo", "--db", str(tmp_path / "d.db"), "--json"]
        result = CliRunner().invoke(cli, [*args, "--llm-base-url", stub.url, "--model", "m"])
        bodies = stub.bodies()
    assert result.exit_code == 0, result.output
    assert reviews == [False, True]
    writes = [b for b in bodies if {"title", "sections"} <= _props(b)]
    first, revision = (b["messages"][-1]["content"] for b in writes)
    assert "previous answer" not in first and "reviewer" not in first
    assert "Your previous answer, to revise" in revision and SUGGESTION in revision
    assert '"figures"' in first  # the supplementary research reaches the writer's prompt
    assert "never copy the reviewer's suggestion" in writes[1]["messages"][0]["content"]
