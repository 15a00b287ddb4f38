"""Review and revision: structured issues, a re-run with the review, at most N rounds."""

from __future__ import annotations

import msgspec
from orchkit import CARDS, TextOut, ev, make_agent, plan, run_log, task, tid

from cardbus.agents.cards import Review
from cardbus.eventstore.events import ReviewIssue

ISSUE = ReviewIssue(
    issue_type="missing_section", section="end", severity="high", suggestion="add an ending"
)


class ReviewIn(msgspec.Struct, frozen=True):
    draft: TextOut
    goal: str = ""


def _writer(t, i, c):  # type: ignore[no-untyped-def]
    text = i.text + "".join(f" +{x.section}" for x in t.review)
    return TextOut(text=text)


def _reviewer(passes_when: str | None):  # type: ignore[no-untyped-def]
    def review(t, i, c):  # type: ignore[no-untyped-def]
        if passes_when is not None and passes_when in i.draft.text:
            return Review(passed=True)
        return Review(passed=False, issues=[ISSUE])

    return review


def _agents(passes_when: str | None, writer=_writer):  # type: ignore[no-untyped-def]
    return [
        make_agent("writer", "write", writer),
        make_agent(
            "reviewer", "review", _reviewer(passes_when), input_type=ReviewIn, output_type=Review
        ),
    ]


async def test_issues_lead_to_a_revision_with_the_review_as_only_extra_input(make_runtime, store):
    rt = await make_runtime(_agents(passes_when="+end"))
    r = await rt.run(plan(task("draft", "write", "text", review_by="review")))
    assert r.status == "completed"
    assert r.outputs["draft"] == {"text": "text +end"}
    log = await run_log(store, r.root_id)
    d = tid(r.root_id, "draft")
    rev = log.first(ev.RevisionRequested, d).data
    assert rev.round == 1 and rev.issues == [ISSUE]
    assert rev.reviewer_task_id == f"{d}~review1"
    review_task = log.first(ev.TaskCreated, rev.reviewer_task_id).data
    assert review_task.parent_id == d and review_task.role == "review"
    assert review_task.capability == "review"
    assert review_task.inputs["draft"] == {"text": "text"}
    first, second = CARDS["writer"]
    assert first.review == [] and second.review == [ISSUE]
    # the revision carries the draft the issues are about, for targeted edits
    assert first.previous_output is None and second.previous_output == {"text": "text"}
    # nothing else changed between the two cards
    strip = {"attempt", "review", "previous_output"}
    a, b = (
        {k: v for k, v in msgspec.to_builtins(c).items() if k not in strip} for c in (first, second)
    )
    assert a == b
    done = log.first(ev.TaskCompleted, d).data
    assert done.quality_met is True and done.open_issues == []
    assert log.tags(d).count("revision_requested") == 1
    assert len(CARDS["reviewer"]) == 2


async def test_at_most_n_rounds_then_completed_not_meeting_quality(make_runtime, store):
    rt = await make_runtime(_agents(passes_when=None))
    r = await rt.run(plan(task("draft", "write", "v", review_by="review", max_review_rounds=2)))
    assert r.status == "completed"
    log = await run_log(store, r.root_id)
    d = tid(r.root_id, "draft")
    assert [x.round for x in log.of(ev.RevisionRequested, d)] == [1, 2]
    done = log.first(ev.TaskCompleted, d).data
    assert done.quality_met is False
    assert done.open_issues == [ISSUE]
    assert done.output == {"text": "v +end"}  # the last output
    reviews = [x for x in log.e(ev.TaskCreated) if x.data.role == "review"]
    assert len(reviews) == 3
    assert len(CARDS["writer"]) == 3
    assert r.outputs["draft"] == {"text": "v +end"}


async def test_a_failed_revision_attempt_is_retried_with_the_review(make_runtime, store):
    failed_once: list[int] = []

    def writer(t, i, c):  # type: ignore[no-untyped-def]
        if t.review and not failed_once:
            failed_once.append(t.attempt)
            raise RuntimeError("crashed while revising")
        return _writer(t, i, c)

    rt = await make_runtime(_agents(passes_when="+end", writer=writer))
    r = await rt.run(plan(task("draft", "write", "x", review_by="review")))
    assert r.status == "completed"
    assert r.outputs["draft"] == {"text": "x +end"}
    log = await run_log(store, r.root_id)
    d = tid(r.root_id, "draft")
    assert len(log.of(ev.RevisionRequested, d)) == 1
    assert log.first(ev.TaskCompleted, d).data.quality_met is True
    assert [c.review for c in CARDS["writer"]] == [[], [ISSUE], [ISSUE]]


async def test_a_failed_reviewer_leaves_the_output_marked_not_meeting_quality(make_runtime, store):
    def broken(t, i, c):  # type: ignore[no-untyped-def]
        raise RuntimeError("reviewer down")

    agents = [
        make_agent("writer", "write", _writer),
        make_agent("reviewer", "review", broken, input_type=ReviewIn, output_type=Review),
    ]
    rt = await make_runtime(agents)
    r = await rt.run(plan(task("draft", "write", "y", review_by="review", max_attempts=1)))
    assert r.status == "completed"
    log = await run_log(store, r.root_id)
    done = log.first(ev.TaskCompleted, tid(r.root_id, "draft")).data
    assert done.quality_met is False and done.output == {"text": "y"}
