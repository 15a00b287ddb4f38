"""Deadlines of a question to a person (``waits["question"]``): answered with its default
by the policy, declined, failed, escalated to a named person, and a restart across an
expiry that applies it once. Real SQLite files throughout."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from orchkit import FAST, Runtime, TextOut, ev, make_agent, plan, run_log, task, tid, wait_for

from cardbus.agents.questions import AskPerson
from cardbus.bus import answer_approval
from cardbus.bus.orchestrator.questions import answer_question, open_questions
from cardbus.bus.orchestrator.waits import BY, KINDS, kind_of
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore.errors import NotAnApprover
from cardbus.eventstore.events import WaitPolicy, WaitStep
from cardbus.projections.replay import replay

_NONE: Any = object()


def _painter(default: Any = _NONE):  # type: ignore[no-untyped-def]
    def pick(t, i, c):  # type: ignore[no-untyped-def]
        if t.supplement is None:
            if default is _NONE:
                raise AskPerson("Which colour?", choices=["red", "blue"])
            raise AskPerson("Which colour?", choices=["red", "blue"], default=default)
        return TextOut(text=f"painted {t.supplement}")

    return make_agent("painter", "paint", pick)


def _asking(policy: WaitPolicy):  # type: ignore[no-untyped-def]
    return plan(task("paint", "paint"), waits={"question": policy})


def _question_task(log, root: str) -> str:  # type: ignore[no-untyped-def]
    [asked] = [e for e in log.e(ev.ApprovalRequested) if e.data.reason == "question"]
    return asked.stream


async def test_a_2s_deadline_answers_with_the_default_and_the_log_says_so(make_runtime, store):
    rt = await make_runtime([_painter(default="blue")])
    policy = WaitPolicy(deadline_s=2, then=[WaitStep(action="approve")])
    r = await rt.run(_asking(policy), timeout=15)
    assert r.status == "completed", r
    assert r.outputs["paint"] == {"text": "painted blue"}
    log = await run_log(store, r.root_id)
    q_task = _question_task(log, r.root_id)
    assert log.tags(q_task) == [
        "created",
        "approval_requested",
        "wait_expired",
        "question.answered",
        "completed",
    ]
    asked = log.first(ev.ApprovalRequested, q_task)
    expired = log.first(ev.WaitExpired, q_task)
    assert (expired.data.kind, expired.data.step, expired.data.action) == ("question", 1, "approve")
    assert expired.recorded_at >= asked.recorded_at + 2  # not before its deadline
    answered = log.first(ev.QuestionAnswered, q_task)
    # the policy answered, never a person: door deadline, by the policy, written by the bus
    assert answered.data.door == "deadline" and answered.data.by == BY
    assert answered.data.defaulted and answered.data.answer == "blue"
    assert answered.actor == FAST.actor == log.first(ev.TaskCompleted, q_task).actor
    timeline = await replay(store, r.root_id)
    details = [s.detail for _, n in timeline.walk() if n.task_id == q_task for s in n.steps]
    assert "question deadline passed (step 1): approve" in details
    assert f'question answered by its deadline ({BY}): "blue" (the default)' in details


async def test_approve_by_rule_without_a_default_fails_naming_the_missing_default(
    make_runtime, store
):
    rt = await make_runtime([_painter()])
    policy = WaitPolicy(deadline_s=0.2, then=[WaitStep(action="approve")])
    r = await rt.run(_asking(policy), timeout=10)
    assert r.status == "failed"
    log = await run_log(store, r.root_id)
    q_task = _question_task(log, r.root_id)
    failed = log.first(ev.TaskFailed, q_task).data
    assert failed.reason == "wait_expired" and "has no default" in failed.error
    asking = log.first(ev.TaskFailed, tid(r.root_id, "paint")).data
    assert asking.reason == "supplementary_task_failed"
    assert "wait_expired" in asking.error and "no default" in asking.error
    assert not log.of(ev.QuestionAnswered)


@pytest.mark.parametrize(("action", "tail"), [("deny", "approval_denied"), ("fail", "failed")])
async def test_deny_declines_and_fail_fails_the_asking_task(make_runtime, store, action, tail):
    rt = await make_runtime([_painter(default="red")])
    policy = WaitPolicy(deadline_s=0.2, then=[WaitStep(action=action, note="too slow")])
    r = await rt.run(_asking(policy), timeout=10)
    assert r.status == "failed"
    log = await run_log(store, r.root_id)
    q_task = _question_task(log, r.root_id)
    assert log.tags(q_task)[:4] == ["created", "approval_requested", "wait_expired", tail]
    asking = log.first(ev.TaskFailed, tid(r.root_id, "paint")).data
    assert asking.reason == "supplementary_task_failed" and "too slow" in asking.error
    assert not log.of(ev.QuestionAnswered)  # declined or failed: nobody answered


async def test_an_escalated_question_is_answered_only_by_the_named_person(make_runtime, store):
    rt = await make_runtime([_painter(default="red")])
    policy = WaitPolicy(deadline_s=2, then=[WaitStep(action="escalate", to=["bea"])])
    root = await rt.orch.submit(_asking(policy))
    expired = await wait_for(store, lambda e: isinstance(e.data, ev.WaitExpired), timeout=15)
    assert (expired.data.kind, expired.data.approvers) == ("question", ["bea"])
    with pytest.raises(NotAnApprover, match="bea") as refused:
        await answer_question(store, root, "red", by="ada")
    assert refused.value.approvers == ["bea"]
    with pytest.raises(NotAnApprover):  # nor by its default, nor by declining
        await answer_question(store, root, by="ada", use_default=True)
    with pytest.raises(NotAnApprover):
        await answer_approval(store, expired.stream, False, "ada")
    assert [q.task_id for q in await open_questions(store, root)] == [expired.stream]
    await answer_question(store, root, "red", by="bea", door="cli")
    r = await rt.orch.wait(root, 10)
    assert r.status == "completed" and r.outputs["paint"] == {"text": "painted red"}
    log = await run_log(store, root)
    answered = log.first(ev.QuestionAnswered, expired.stream)
    assert answered.actor == "bea" and answered.data.door == "cli"
    assert len(log.of(ev.QuestionAnswered)) == 1


async def test_a_restart_across_the_expiry_answers_it_once(db_path):
    agents = [_painter(default="blue")]
    policy = WaitPolicy(deadline_s=0.5, then=[WaitStep(action="approve")])
    store1 = await SqliteEventStore.open(db_path, poll_interval=0.01)
    rt1 = await Runtime(store1, agents).start()
    root = await rt1.orch.submit(_asking(policy))
    await wait_for(
        store1, lambda e: isinstance(e.data, ev.ApprovalRequested) and e.data.reason == "question"
    )
    await rt1.stop()
    await store1.close()
    await asyncio.sleep(0.6)  # the deadline passes while no orchestrator runs
    for first in (True, False):  # the first start applies it; the second finds it applied
        store = await SqliteEventStore.open(db_path, poll_interval=0.01)
        rt = await Runtime(store, agents).start()
        try:
            if first:
                assert (await rt.orch.wait(root, 10)).status == "completed"
            assert await rt.orch.caught_up(30)
            await asyncio.sleep(3 * FAST.tick_s + 0.05)
        finally:
            await rt.stop()
            await store.close()
    store = await SqliteEventStore.open(db_path, poll_interval=0.01)
    try:
        log = await run_log(store, root)
        q_task = _question_task(log, root)
        assert len(log.of(ev.WaitExpired, q_task)) == 1
        assert [a.door for a in log.of(ev.QuestionAnswered, q_task)] == ["deadline"]
        assert len(log.of(ev.TaskCompleted, q_task)) == 1
    finally:
        await store.close()


def test_a_question_is_a_kind_of_wait_with_a_policy_of_its_own():
    assert kind_of("question") == "question" and "question" in KINDS
