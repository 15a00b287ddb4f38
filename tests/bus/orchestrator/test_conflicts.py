"""Conflicts: a task fanned out to k candidates; highest confidence wins; ties per policy."""

from __future__ import annotations

import asyncio

from orchkit import TextOut, ev, make_agent, plan, run_log, task, tid, wait_for

from cardbus.bus import Policy
from cardbus.bus.orchestrator import RetryPolicy


def _confident(value: float | list[float], text: str):  # type: ignore[no-untyped-def]
    def handler(t, i, c):  # type: ignore[no-untyped-def]
        c.confidence = value if isinstance(value, float) else value[t.attempt - 1]
        return TextOut(text=text)

    return handler


async def test_fanout_highest_confidence_wins(make_runtime, store):
    rt = await make_runtime(
        [
            make_agent("low", handler=_confident(0.4, "low answer")),
            make_agent("high", handler=_confident(0.9, "high answer")),
            make_agent("spare", handler=_confident(1.0, "never asked")),
        ],
    )
    r = await rt.run(plan(task("t", fanout=2)))
    assert r.status == "completed"
    log = await run_log(store, r.root_id)
    t = tid(r.root_id, "t")
    dispatched = log.of(ev.TaskDispatched, t)
    assert len(dispatched) == 2 and {d.attempt for d in dispatched} == {1}
    asked = {d.agent_id for d in dispatched}
    assert len(asked) == 2
    results = {x.agent_id: x.confidence for x in log.of(ev.TaskResultSubmitted, t)}
    assert set(results) == asked
    done = log.first(ev.TaskCompleted, t).data
    winner = max(results, key=lambda a: results[a])
    assert done.agent_id == winner
    assert done.confidence == results[winner]
    assert log.first(ev.TaskCompleted, t).position > max(
        x.position for x in log.e(ev.TaskResultSubmitted, t)
    )


async def test_a_tie_is_retried_by_default(make_runtime, store):
    rt = await make_runtime(
        [
            make_agent("x", handler=_confident([0.7, 0.6], "x")),
            make_agent("y", handler=_confident([0.7, 0.8], "y")),
        ]
    )
    r = await rt.run(plan(task("t", fanout=2)))
    assert r.outputs["t"] == {"text": "y"}
    log = await run_log(store, r.root_id)
    t = tid(r.root_id, "t")
    retry = log.first(ev.TaskRetryScheduled, t).data
    assert retry.attempt == 2 and retry.reason.startswith("conflict_tie")
    assert [d.attempt for d in log.of(ev.TaskDispatched, t)] == [1, 1, 2, 2]
    assert log.first(ev.TaskCompleted, t).data.attempt == 2


async def test_a_tie_asks_for_approval_with_tie_policy_approval(make_runtime, store):
    policy = Policy(tie_policy="approval", retry=RetryPolicy(initial_interval_s=0.01), tick_s=0.01)
    rt = await make_runtime(
        [
            make_agent("x", handler=_confident(0.7, "x")),
            make_agent("y", handler=_confident(0.7, "y")),
        ],
        policy=policy,
    )
    root = await rt.orch.submit(plan(task("t", fanout=2)))
    t = tid(root, "t")
    asked = await wait_for(store, lambda e: isinstance(e.data, ev.ApprovalRequested))
    assert asked.stream == t
    assert asked.data.reason == "conflict_tie"
    proposed = asked.data.proposed_output
    assert proposed in ({"text": "x"}, {"text": "y"})
    await asyncio.sleep(0.1)
    log = await run_log(store, root)
    assert not log.of(ev.TaskCompleted, t)  # it waits for a human
    await rt.orch.approve(t, by="alice")
    r = await rt.orch.wait(root, 5)
    assert r.status == "completed" and r.outputs["t"] == proposed
    log = await run_log(store, root)
    assert log.first(ev.ApprovalGranted, t).data.resume == "running"
    done = log.first(ev.TaskCompleted, t).data
    assert done.output == proposed
    assert done.agent_id == proposed["text"]  # the agent that produced the approved output
    assert not log.of(ev.TaskRetryScheduled, t)


async def test_fanout_with_a_hanging_candidate_settles_at_the_deadline(make_runtime, store):
    async def hang(t, i, c):  # type: ignore[no-untyped-def]
        await asyncio.sleep(3600)

    rt = await make_runtime(
        [make_agent("hanger", handler=hang), make_agent("ok", handler=_confident(0.5, "ok"))]
    )
    r = await rt.run(plan(task("t", fanout=2, timeout_s=0.3)), timeout=5)
    assert r.status == "completed" and r.outputs["t"] == {"text": "ok"}
    log = await run_log(store, r.root_id)
    t = tid(r.root_id, "t")
    assert log.first(ev.TaskCompleted, t).data.agent_id == "ok"
    # settled with the answers in at the deadline: the attempt itself did not time out
    assert not log.of(ev.TaskTimedOut, t) and not log.of(ev.TaskRetryScheduled, t)
    first = log.first(ev.TaskDispatched, t).data
    # the hanging candidate's deadline: its start plus the task's limit (deadlines)
    (hung,) = [e for e in log.e(ev.TaskStarted) if e.stream == t and e.data.agent_id == "hanger"]
    assert log.first(ev.TaskCompleted, t).recorded_at >= hung.recorded_at + first.timeout_s


async def test_equal_null_outputs_agree_and_need_no_approval(make_runtime, store):
    def nothing(t, i, c):  # type: ignore[no-untyped-def]
        c.confidence = 0.5

    agents = [make_agent(a, handler=nothing, output_type=type(None)) for a in ("x", "y")]
    policy = Policy(tie_policy="approval", retry=RetryPolicy(initial_interval_s=0.01), tick_s=0.01)
    rt = await make_runtime(agents, policy=policy)
    r = await rt.run(plan(task("t", fanout=2)))
    assert r.status == "completed" and r.outputs["t"] is None
    log = await run_log(store, r.root_id)
    t = tid(r.root_id, "t")
    assert not log.of(ev.ApprovalRequested, t)
    assert [d.attempt for d in log.of(ev.TaskDispatched, t)] == [1, 1]
    assert log.first(ev.TaskCompleted, t).data.confidence == 0.5


async def test_an_approved_tie_still_goes_to_its_reviewer(make_runtime, store):
    import msgspec

    from cardbus.agents.cards import Review

    class ReviewIn(msgspec.Struct, frozen=True):
        draft: TextOut
        goal: str = ""

    reviewed: list[object] = []

    def reviewer(t, i, c):  # type: ignore[no-untyped-def]
        reviewed.append(i.draft)
        return Review(passed=True)

    agents = [
        make_agent("x", handler=_confident(0.7, "x")),
        make_agent("y", handler=_confident(0.7, "y")),
        make_agent("rev", "review", reviewer, input_type=ReviewIn, output_type=Review),
    ]
    policy = Policy(tie_policy="approval", retry=RetryPolicy(initial_interval_s=0.01), tick_s=0.01)
    rt = await make_runtime(agents, policy=policy)
    root = await rt.orch.submit(plan(task("t", fanout=2, review_by="review")))
    t = tid(root, "t")
    asked = await wait_for(store, lambda e: isinstance(e.data, ev.ApprovalRequested))
    proposed = asked.data.proposed_output
    await rt.orch.approve(t, by="alice")
    r = await rt.orch.wait(root, 5)
    assert r.status == "completed" and r.outputs["t"] == proposed
    log = await run_log(store, root)
    review = [c for c in log.e(ev.TaskCreated) if c.data.role == "review"]
    assert len(review) == 1 and review[0].data.parent_id == t  # the approval did not skip it
    assert reviewed == [TextOut(**proposed)]
    done = log.first(ev.TaskCompleted, t)
    assert done.position > log.first(ev.TaskCompleted, review[0].stream).position
    assert done.data.agent_id == proposed["text"]  # the proposer, not the first candidate
