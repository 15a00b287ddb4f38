"""Deadlines of a person's word (``waits``): escalation, deny / approve / fail by rule, and
a restart across an expiry that applies it once."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from orchkit import CARDS, FAST, Runtime, ev, make_agent, plan, run_log, task, tid, wait_for

import cardbus.bus as bus
from cardbus.bus.orchestrator.waits import BY
from cardbus.eventstore import CardbusError, InvalidPlan, SqliteEventStore
from cardbus.eventstore.errors import NotAnApprover
from cardbus.eventstore.events import WaitPolicy, WaitStep

GROUP_B = {"B": ["bea", "bo"]}


def _gated(policy: WaitPolicy, kind: str = "approval"):  # type: ignore[no-untyped-def]
    return plan(
        task("gate", requires_approval=True), task("after", deps=["gate"]), waits={kind: policy}
    )


async def test_a_2s_deadline_escalates_to_group_b_and_only_b_may_answer(make_runtime, store):
    rt = await make_runtime([make_agent("echo")])
    policy = WaitPolicy(deadline_s=2, then=[WaitStep(action="escalate", group="B")], groups=GROUP_B)
    root = await rt.orch.submit(_gated(policy))
    gate = tid(root, "gate")
    expired = await wait_for(store, lambda e: isinstance(e.data, ev.WaitExpired), timeout=15)
    log = await run_log(store, root)
    asked = log.first(ev.ApprovalRequested, gate)
    data = expired.data
    assert (data.kind, data.step, data.action, data.group) == ("approval", 1, "escalate", "B")
    assert data.approvers == ["bea", "bo"]
    assert expired.recorded_at >= asked.recorded_at + 2  # not before its deadline
    assert data.deadline == pytest.approx(asked.recorded_at + 2)
    assert "gate" not in [c.task_id for c in CARDS.get("echo", [])]  # still waiting
    with pytest.raises(NotAnApprover, match="bea, bo"):
        await bus.answer_approval(store, gate, True, by="ada")
    await bus.answer_approval(store, gate, True, by="bea", note="fine")
    r = await rt.orch.wait(root, 10)
    assert r.status == "completed"
    log = await run_log(store, root)
    assert log.tags(gate)[:4] == [
        "created",
        "approval_requested",
        "wait_expired",
        "approval_granted",
    ]
    assert log.first(ev.ApprovalGranted, gate).actor == "bea"


@pytest.mark.parametrize(
    ("action", "status", "tail"),
    [
        ("deny", "failed", "approval_denied"),
        ("approve", "completed", "approval_granted"),
        ("fail", "failed", "failed"),
    ],
)
async def test_the_last_step_answers_by_rule(make_runtime, store, action, status, tail):
    rt = await make_runtime([make_agent("echo")])
    policy = WaitPolicy(deadline_s=0.2, then=[WaitStep(action=action)])
    r = await rt.run(_gated(policy), timeout=10)
    assert r.status == status
    gate = tid(r.root_id, "gate")
    log = await run_log(store, r.root_id)
    tags = log.tags(gate)
    assert tags[:4] == ["created", "approval_requested", "wait_expired", tail]
    assert log.first(ev.WaitExpired, gate).data.action == action
    if action == "fail":
        assert log.first(ev.TaskFailed, gate).data.reason == "wait_expired"
    else:
        answer = log.first(ev.ApprovalGranted if action == "approve" else ev.ApprovalDenied, gate)
        assert answer.data.by == BY


async def test_a_chain_escalates_then_denies(make_runtime, store):
    rt = await make_runtime([make_agent("echo")])
    steps = [WaitStep(action="escalate", to=["cy"], deadline_s=0.2), WaitStep(action="deny")]
    r = await rt.run(_gated(WaitPolicy(deadline_s=0.2, then=steps)), timeout=10)
    assert r.status == "failed"
    log = await run_log(store, r.root_id)
    expiries = log.of(ev.WaitExpired, tid(r.root_id, "gate"))
    assert [(x.step, x.action) for x in expiries] == [(1, "escalate"), (2, "deny")]
    assert expiries[0].approvers == ["cy"]


async def test_a_restart_across_an_expiry_applies_it_once(db_path):
    agents = [make_agent("echo")]
    policy = WaitPolicy(deadline_s=0.5, then=[WaitStep(action="escalate", to=["bea"])])
    store1 = await SqliteEventStore.open(db_path, poll_interval=0.01)
    rt1 = await Runtime(store1, agents).start()
    root = await rt1.orch.submit(_gated(policy))
    gate = tid(root, "gate")
    await wait_for(store1, lambda e: isinstance(e.data, ev.ApprovalRequested))
    await rt1.stop()
    await store1.close()
    await asyncio.sleep(0.6)  # the deadline passes while no orchestrator runs
    for _ in range(2):  # the first start applies it; the second finds it applied
        store = await SqliteEventStore.open(db_path, poll_interval=0.01)
        rt = await Runtime(store, agents).start()
        try:
            await wait_for(store, lambda e: isinstance(e.data, ev.WaitExpired), timeout=10)
            assert await rt.orch.caught_up(30)
            await asyncio.sleep(3 * FAST.tick_s + 0.05)
        finally:
            await rt.stop()
            await store.close()
    store = await SqliteEventStore.open(db_path, poll_interval=0.01)
    try:
        log = await run_log(store, root)
        assert len(log.of(ev.WaitExpired, gate)) == 1
        rt = await Runtime(store, agents).start()
        try:
            await bus.answer_approval(store, gate, True, by="bea")
            assert (await rt.orch.wait(root, 10)).status == "completed"
        finally:
            await rt.stop()
        assert len((await run_log(store, root)).of(ev.WaitExpired, gate)) == 1
    finally:
        await store.close()


async def test_an_answer_before_the_deadline_leaves_no_expiry(make_runtime, store):
    rt = await make_runtime([make_agent("echo")])
    policy = WaitPolicy(deadline_s=0.3, then=[WaitStep(action="deny")])
    root = await rt.orch.submit(_gated(policy))
    gate = tid(root, "gate")
    await wait_for(store, lambda e: isinstance(e.data, ev.ApprovalRequested))
    await bus.answer_approval(store, gate, True, by="ada")
    assert (await rt.orch.wait(root, 10)).status == "completed"
    await asyncio.sleep(0.4)  # past the deadline: nothing waits any more
    assert not (await run_log(store, root)).of(ev.WaitExpired)
    with pytest.raises(CardbusError, match="not awaiting approval"):
        await bus.answer_approval(store, gate, False, by="ada")


@pytest.mark.parametrize(
    ("waits", "match"),
    [
        ({"lunch": WaitPolicy(deadline_s=1)}, "a wait is one of"),
        ({"approval": WaitPolicy(deadline_s=0)}, "deadline_s must be"),
        ({"approval": WaitPolicy(deadline_s=1, then=[WaitStep(action="nap")])}, "action is one"),
        ({"approval": WaitPolicy(deadline_s=1, then=[WaitStep(action="escalate")])}, "names who"),
        (
            {"approval": WaitPolicy(deadline_s=1, then=[WaitStep(action="escalate", group="Z")])},
            "group 'Z' is not",
        ),
        (
            {
                "approval": WaitPolicy(
                    deadline_s=1, then=[WaitStep(action="deny"), WaitStep(action="fail")]
                )
            },
            "no step may follow",
        ),
    ],
)
async def test_a_bad_policy_is_refused_naming_it(make_runtime, waits, match):
    rt = await make_runtime([make_agent("echo")])
    with pytest.raises(InvalidPlan, match=match):
        await rt.orch.submit(plan(task("t"), waits=waits))


def test_policy_defaults_keep_halting():
    assert dataclasses.replace(FAST).on_loop == "halt"


def test_a_question_is_a_kind_of_its_own_that_no_approval_policy_answers():
    # its own policy answers it (test_question_deadlines); an approval's never does
    from cardbus.bus.orchestrator.waits import KINDS, kind_of

    kinds = [
        kind_of(r) for r in ("requires_approval", "tool_review", "question", "budget_exceeded")
    ]
    assert kinds == ["approval", "review", "question", "approval"]
    assert "question" in KINDS
