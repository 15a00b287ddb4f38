"""Rejection: a rejected attempt goes to the next candidate; none left is no_capable_agent."""

from __future__ import annotations

from orchkit import TableEmbedder, ev, make_agent, plan, run_log, task, tid

from cardbus.agents.agent import Reject


def _refuse(t, i, c):  # type: ignore[no-untyped-def]
    raise Reject("busy", "try someone else")


async def test_rejected_attempt_goes_to_the_next_candidate(make_runtime, store):
    emb = TableEmbedder({"picky": 0.9, "fallback": 0.5})
    rt = await make_runtime(
        [
            make_agent("picky", handler=_refuse, description="picky"),
            make_agent("fallback", description="fallback"),
        ],
        embedder=emb,
    )
    r = await rt.run(plan(task("t")))
    assert r.status == "completed"
    log = await run_log(store, r.root_id)
    t = tid(r.root_id, "t")
    assert log.tags(t) == [
        "created",
        "dispatched",
        "result_submitted",
        "rejected",
        "dispatched",
        "result_submitted",
        "completed",
    ]
    rej = log.first(ev.TaskRejected, t).data
    assert (rej.agent_id, rej.attempt, rej.reason, rej.detail) == (
        "picky",
        1,
        "busy",
        "try someone else",
    )
    first, second = log.of(ev.TaskDispatched, t)
    assert first.agent_id == "picky" and second.agent_id == "fallback"
    assert second.attempt == 2
    assert [c.agent_id for c in second.candidates] == ["fallback"]  # the rejector is excluded
    assert not log.of(ev.TaskRetryScheduled, t)  # a rejection is not a failed attempt
    assert log.first(ev.TaskCompleted, t).data.agent_id == "fallback"


async def test_no_candidate_left_fails_with_no_capable_agent(make_runtime, store):
    rt = await make_runtime([make_agent("p1", handler=_refuse), make_agent("p2", handler=_refuse)])
    r = await rt.run(plan(task("t"), task("after", deps=["t"])))
    assert r.status == "failed"
    log = await run_log(store, r.root_id)
    t = tid(r.root_id, "t")
    assert sorted(x.agent_id for x in log.of(ev.TaskRejected, t)) == ["p1", "p2"]
    failed = log.first(ev.TaskFailed, t).data
    assert failed.reason == "no_capable_agent"
    cancelled = log.first(ev.TaskCancelled, tid(r.root_id, "after")).data
    assert cancelled.cause_task_id == t
    assert log.first(ev.RunFailed).data.failed_tasks == sorted([t, tid(r.root_id, "after")])
