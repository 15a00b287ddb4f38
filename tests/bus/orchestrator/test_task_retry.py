"""A plan task's own `retry` settings: in the plan format, in the log, and in what happens."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import msgspec
import pytest
from orchkit import TextOut, ev, make_agent, plan, run_log, task, tid

from cardbus.agents.cards import ResultCard, Review
from cardbus.bus.orchestrator import PlanTask, Policy, RetryPolicy, decode_plan, validate_plan
from cardbus.bus.orchestrator.decisions import Decider
from cardbus.bus.orchestrator.plan import task_retry
from cardbus.bus.orchestrator.runstate import RunState
from cardbus.eventstore import NewEvent
from cardbus.eventstore.envelope import GENESIS_HASH, seal
from cardbus.eventstore.errors import InvalidPlan
from cardbus.eventstore.taskspec import RetryOverride


class ReviewIn(msgspec.Struct, frozen=True):
    draft: TextOut
    goal: str = ""


def _always_fails(t, i, c):  # type: ignore[no-untyped-def]
    raise RuntimeError(f"boom {t.attempt}")


def _plan_json(**retry: object) -> bytes:
    return json.dumps(
        {"goal": "g", "tasks": [{"id": "a", "capability": "echo", "retry": retry}]}
    ).encode()


def test_the_plan_format_reads_a_task_retry() -> None:
    p = decode_plan(_plan_json(max_attempts=5, initial_interval_s=0.5, non_retryable_reasons=[]))
    assert p.tasks[0].retry == RetryOverride(
        max_attempts=5, initial_interval_s=0.5, non_retryable_reasons=[]
    )
    assert p.tasks[0].max_attempts is None  # not given: the policy's (or retry's)
    assert decode_plan(b'{"goal":"g","tasks":[{"id":"a","capability":"c"}]}').tasks[0].retry is None


def test_a_misspelt_retry_field_is_an_invalid_plan() -> None:
    with pytest.raises(InvalidPlan, match="initial_interval"):
        decode_plan(_plan_json(initial_interval=0.5))


@pytest.mark.parametrize(
    ("retry", "message"),
    [
        ({"jitter": -1}, r"task 'a': retry: RetryPolicy\.jitter must be a finite number >= 0"),
        ({"max_attempts": 0}, "max_attempts must be an integer >= 1"),
        ({"non_retryable_reasons": ["boom"]}, "'boom' not allowed; each must be one of"),
    ],
)
def test_a_bad_retry_setting_is_an_invalid_plan_naming_the_task(
    retry: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidPlan, match=message):
        validate_plan(decode_plan(_plan_json(**retry)))


def test_max_attempts_and_retry_max_attempts_must_agree() -> None:
    validate_plan(plan(task("a", max_attempts=2, retry=RetryOverride(max_attempts=2))))
    with pytest.raises(InvalidPlan, match=r"max_attempts \(2\) and retry.max_attempts \(4\)"):
        validate_plan(plan(task("a", max_attempts=2, retry=RetryOverride(max_attempts=4))))


async def test_a_task_retry_changes_the_backoff_and_attempts_in_the_log(make_runtime, store):
    policy = Policy(retry=RetryPolicy(initial_interval_s=0.01, jitter=0.0), tick_s=0.005)
    rt = await make_runtime([make_agent("broken", handler=_always_fails)], policy=policy)
    own = RetryOverride(max_attempts=4, initial_interval_s=0.02, backoff_coefficient=3.0)
    r = await rt.run(plan(task("own", retry=own), task("default")))
    log = await run_log(store, r.root_id)
    mine, default = tid(r.root_id, "own"), tid(r.root_id, "default")

    created = log.first(ev.TaskCreated, mine).data
    assert (created.retry, created.max_attempts) == (own, 4)  # recorded as given
    assert log.first(ev.TaskCreated, default).data.retry is None

    assert [x.delay_s for x in log.of(ev.TaskRetryScheduled, mine)] == [0.02, 0.06, 0.18]
    assert len(log.of(ev.TaskDispatched, mine)) == 4
    assert log.first(ev.TaskFailed, mine).data.attempts == 4
    # the other task keeps the policy's: 3 attempts, 0.01 doubling
    assert [x.delay_s for x in log.of(ev.TaskRetryScheduled, default)] == [0.01, 0.02]
    assert len(log.of(ev.TaskDispatched, default)) == 3


async def test_a_non_retryable_reason_fails_the_task_at_once(make_runtime, store):
    rt = await make_runtime([make_agent("broken", handler=_always_fails)])
    stop = RetryOverride(non_retryable_reasons=["agent_error"])
    r = await rt.run(plan(task("a", retry=stop)))
    log = await run_log(store, r.root_id)
    a = tid(r.root_id, "a")
    assert len(log.of(ev.TaskDispatched, a)) == 1 and not log.of(ev.TaskRetryScheduled, a)
    assert log.first(ev.TaskFailed, a).data.reason == "agent_error"


async def test_the_policy_default_max_attempts_applies_to_tasks_that_give_none(make_runtime, store):
    policy = Policy(retry=RetryPolicy(max_attempts=2, initial_interval_s=0.01), tick_s=0.005)
    rt = await make_runtime([make_agent("broken", handler=_always_fails)], policy=policy)
    r = await rt.run(plan(task("a"), task("b", max_attempts=1)))
    log = await run_log(store, r.root_id)
    assert log.first(ev.TaskCreated, tid(r.root_id, "a")).data.max_attempts == 2
    assert len(log.of(ev.TaskDispatched, tid(r.root_id, "a"))) == 2
    assert len(log.of(ev.TaskDispatched, tid(r.root_id, "b"))) == 1


async def test_a_review_inherits_the_task_retry(make_runtime, store):
    def no_review(t, i, c):  # type: ignore[no-untyped-def]
        raise RuntimeError("reviewer down")

    reviewer = make_agent("reviewer", "review", no_review, input_type=ReviewIn, output_type=Review)
    rt = await make_runtime([make_agent("writer"), reviewer])
    own = RetryOverride(max_attempts=2, initial_interval_s=0.01)
    r = await rt.run(plan(task("draft", review_by="review", retry=own)))
    log = await run_log(store, r.root_id)
    review = next(e for e in log.e(ev.TaskCreated) if e.data.role == "review")
    assert (review.data.retry, review.data.max_attempts) == (own, 2)
    assert len(log.of(ev.TaskDispatched, review.stream)) == 2


def test_a_logged_retry_no_submit_would_write_fails_the_task_with_a_reason() -> None:
    """A hand-written event with settings out of range: the task fails, it does not hang."""
    state = RunState()
    now = time.time()
    bad = RetryOverride(jitter=-1.0)
    for position, (stream, version, data) in enumerate(
        [
            ("root", 1, ev.RunStarted(goal="g", plan_id="p", task_ids=["t"])),
            ("t", 1, ev.TaskCreated(root_id="root", capability="echo", retry=bad, plan_id="t")),
            ("t", 2, ev.TaskDispatched(attempt=1, agent_id="a", deadline=now + 60)),
        ],
        start=1,
    ):
        new = NewEvent(data=data, correlation_id="root")
        env, _ = seal(new, stream, version, GENESIS_HASH, position=position)
        state.apply(env)
    decider = Decider(state, Policy(), now)
    decider.on_reply(ResultCard(task_id="t", attempt=1, agent_id="a", status="failed", error="x"))
    failed = [e for e in decider.d.events["t"] if isinstance(e, ev.TaskFailed)]
    assert [f.reason for f in failed] == ["invalid_retry_policy"]
    assert "RetryPolicy.jitter" in failed[0].error


def test_the_retries_how_to_example_is_a_valid_plan_task() -> None:
    page = Path(__file__).resolve().parents[3] / "docs" / "how-to" / "retries.md"
    blocks = re.findall(r"```json[^\n]*\n(.*?)```", page.read_text(), re.S)
    (snippet,) = [b for b in blocks if '"retry"' in b]
    plan = msgspec.json.decode(snippet.encode())
    (task,) = [t for t in plan["tasks"] if "retry" in t]
    t = msgspec.json.decode(msgspec.json.encode(task), type=PlanTask)
    assert task_retry(t, RetryPolicy()) == RetryPolicy(
        max_attempts=5,
        initial_interval_s=0.1,
        non_retryable_reasons=frozenset({"output_schema_mismatch"}),
    )
