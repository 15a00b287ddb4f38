"""Conflicts and reviews set per task in the plan: agreement is no tie, a task's own tie
policy, cross-checking reviewers (all or a majority), the checklist, quality in the result."""

from __future__ import annotations

import msgspec
import pytest
from orchkit import CARDS, TextOut, ev, make_agent, plan, run_log, task, tid, wait_for

from cardbus.agents.cards import Review
from cardbus.bus.orchestrator.plan import as_plan
from cardbus.eventstore.errors import InvalidPlan
from cardbus.eventstore.events import ReviewIssue

ISSUE = ReviewIssue(issue_type="gap", section="end", severity="high", suggestion="add an end")


class ReviewIn(msgspec.Struct, frozen=True):
    draft: TextOut
    goal: str = ""
    checklist: list[str] = []


def _says(text: str, confidence: float):  # type: ignore[no-untyped-def]
    def handler(t, i, c):  # type: ignore[no-untyped-def]
        c.confidence = confidence
        return TextOut(text=text)

    return handler


def _reviewer(agent_id: str, passes: bool | str):  # type: ignore[no-untyped-def]
    """Passes always (True), never (False), or once the draft contains the given text."""

    def review(t, i, c):  # type: ignore[no-untyped-def]
        ok = passes if isinstance(passes, bool) else passes in i.draft.text
        return Review(passed=True) if ok else Review(passed=False, issues=[ISSUE])

    return make_agent(agent_id, "review", review, input_type=ReviewIn, output_type=Review)


def _writer(t, i, c):  # type: ignore[no-untyped-def]
    c.confidence = 0.8
    return TextOut(text=i.text + "".join(f" +{x.section}" for x in t.review))


async def test_equal_fanout_outputs_are_agreement_not_a_tie(make_runtime, store):
    agents = [make_agent(a, handler=_says("same", 0.7)) for a in ("x", "y")]
    rt = await make_runtime(agents)
    r = await rt.run(
        as_plan(
            {
                "goal": "g",
                "tasks": [{"id": "t", "capability": "echo", "inputs": {"text": "q"}, "fanout": 2}],
            }
        )
    )
    assert r.status == "completed" and r.outputs["t"] == {"text": "same"}
    log = await run_log(store, r.root_id)
    t = tid(r.root_id, "t")
    assert {d.agent_id for d in log.of(ev.TaskDispatched, t)} == {"x", "y"}
    assert not log.of(ev.TaskRetryScheduled, t)  # no conflict_tie
    assert log.first(ev.TaskCompleted, t).data.confidence == 0.7


async def test_different_outputs_tie_under_the_tasks_own_tie_policy(make_runtime, store):
    agents = [
        make_agent("x", handler=_says("one", 0.7)),
        make_agent("y", handler=_says("two", 0.7)),
    ]
    rt = await make_runtime(agents)  # Policy.tie_policy is "retry"; the task says approval
    root = await rt.orch.submit(
        {
            "goal": "g",
            "tasks": [
                {
                    "id": "t",
                    "capability": "echo",
                    "inputs": {"text": "q"},
                    "fanout": 2,
                    "tie_policy": "approval",
                }
            ],
        }
    )
    t = tid(root, "t")
    asked = await wait_for(store, lambda e: isinstance(e.data, ev.ApprovalRequested))
    assert asked.stream == t and asked.data.reason == "conflict_tie"
    log = await run_log(store, root)
    assert log.first(ev.TaskCreated, t).data.tie_policy == "approval"
    assert not log.of(ev.TaskRetryScheduled, t)


async def test_two_reviewers_must_both_pass_by_default(make_runtime, store):
    agents = [
        make_agent("writer", "write", _writer),
        _reviewer("r1", True),
        _reviewer("r2", "+end"),
    ]
    rt = await make_runtime(agents)
    r = await rt.run(plan(task("d", "write", text="v", review_by="review", reviewers=2)))
    assert r.status == "completed" and r.outputs["d"] == {"text": "v +end"}
    log = await run_log(store, r.root_id)
    d = tid(r.root_id, "d")
    review1 = log.of(ev.TaskDispatched, f"{d}~review1")
    assert {x.agent_id for x in review1} == {"r1", "r2"}  # cross-checked by two agents
    revision = log.first(ev.RevisionRequested, d).data
    assert revision.issues == [ISSUE]  # r2's issues; r1 passed
    assert len(log.of(ev.RevisionRequested, d)) == 1
    assert log.first(ev.TaskCompleted, d).data.quality_met is True


async def test_a_majority_of_reviewers_is_enough_when_the_plan_says_so(make_runtime, store):
    agents = [
        make_agent("writer", "write", _writer),
        _reviewer("r1", True),
        _reviewer("r2", True),
        _reviewer("r3", False),
    ]
    rt = await make_runtime(agents)
    r = await rt.run(
        plan(
            task("d", "write", text="v", review_by="review", reviewers=3, review_quorum="majority")
        )
    )
    assert r.status == "completed" and r.outputs["d"] == {"text": "v"}
    log = await run_log(store, r.root_id)
    d = tid(r.root_id, "d")
    assert len(log.of(ev.TaskDispatched, f"{d}~review1")) == 3
    assert not log.of(ev.RevisionRequested, d)
    assert r.quality_met is True and r.open_issues == {}


async def test_the_reviewer_sees_the_checklist_and_the_result_shows_open_issues(
    make_runtime, store
):
    checklist = ["has an ending", "names its sources"]
    agents = [make_agent("writer", "write", _writer), _reviewer("critic", False)]
    rt = await make_runtime(agents)
    r = await rt.run(
        plan(
            task(
                "d",
                "write",
                text="v",
                goal="a short story",
                review_by="review",
                max_review_rounds=1,
                checklist=checklist,
            )
        )
    )
    assert r.status == "completed"
    assert r.quality_met is False and r.open_issues == {"d": [ISSUE]}
    log = await run_log(store, r.root_id)
    d = tid(r.root_id, "d")
    done = log.first(ev.TaskCompleted, d).data
    assert done.quality_met is False and done.open_issues == [ISSUE]
    assert done.confidence == 0.8  # the producer's, not the reviewer's or 0.0
    for card in CARDS["critic"]:
        assert card.checklist == checklist
        assert card.inputs["checklist"] == checklist and card.inputs["goal"] == "a short story"
    # the revision saw the draft it was asked to improve
    revision = CARDS["writer"][1]
    assert revision.review == [ISSUE] and revision.previous_output == {"text": "v"}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("tie_policy", "coin", "tie_policy must be"),
        ("reviewers", 0, "reviewers must be"),
        ("review_quorum", "most", "review_quorum must be"),
    ],
)
def test_conflict_settings_out_of_range_are_refused(field, value, message):  # type: ignore[no-untyped-def]
    from cardbus.bus.orchestrator.plan import validate_plan

    p = as_plan({"goal": "g", "tasks": [{"id": "t", "capability": "echo", field: value}]})
    with pytest.raises(InvalidPlan, match=message):
        validate_plan(p)
