"""Crash recovery in-process: a new orchestrator on the same file resumes the run.

(The real-subprocess SIGKILL test lives elsewhere.)
"""

from __future__ import annotations

import asyncio
import dataclasses

import msgspec
from orchkit import CARDS, Runtime, TextOut, ev, is_, make_agent, plan, run_log, task, tid, wait_for

from cardbus.agents.cards import Review
from cardbus.eventstore import SqliteEventStore, StoreUnavailable
from cardbus.eventstore.errors import PrerequisiteNotStored


async def _hang_first(t, i, c):  # type: ignore[no-untyped-def]
    if t.attempt == 1:
        await asyncio.sleep(3600)
    return TextOut(text=i.text.upper())


def _agents():  # type: ignore[no-untyped-def]
    return [make_agent("quick", "quick"), make_agent("stuck", "stuck", _hang_first)]


async def test_restart_after_dispatch_times_out_and_redispatches_without_redoing(db_path):
    p = plan(
        task("a", "quick", "a"),
        task(
            "b", "stuck", deps=["a"], inputs={"text": {"$dep": "a", "path": "text"}}, timeout_s=0.3
        ),
        task("c", "quick", deps=["b"], inputs={"text": {"$dep": "b", "path": "text"}}),
        task("side", "quick", "side"),
    )
    store1 = await SqliteEventStore.open(db_path, poll_interval=0.01)
    rt1 = await Runtime(store1, _agents()).start()
    root = await rt1.orch.submit(p)
    b = tid(root, "b")
    await wait_for(store1, is_(ev.TaskStarted, b))  # b is in the agent's hands
    await rt1.stop()  # the orchestrator "crashes": b's result is never recorded
    await store1.close()
    assert [card.attempt for card in CARDS["stuck"]] == [1]

    store2 = await SqliteEventStore.open(db_path, poll_interval=0.01)
    rt2 = await Runtime(store2, _agents()).start()
    try:
        r = await rt2.orch.wait(root, 5)
    finally:
        await rt2.stop()
    try:
        assert r.status == "completed"
        assert r.outputs["c"] == {"text": "A"}
        log = await run_log(store2, root)
        timed_out = log.first(ev.TaskTimedOut, b).data
        assert timed_out.attempt == 1 and timed_out.agent_id == "stuck"
        assert [d.attempt for d in log.of(ev.TaskDispatched, b)] == [1, 2]
        for name in ("a", "b", "c", "side"):
            assert len(log.of(ev.TaskCompleted, tid(root, name))) == 1, name
        for name in ("a", "side"):  # finished before the crash: not redone
            assert len(log.of(ev.TaskDispatched, tid(root, name))) == 1
        assert sorted(c.task_id for c in CARDS["quick"]) == sorted(
            [tid(root, "a"), tid(root, "side"), tid(root, "c")]
        )
        assert len(log.of(ev.RunCompleted)) == 1
        assert await store2.verify() == []
    finally:
        await store2.close()


async def test_restart_after_the_run_finished_answers_from_the_log(db_path):
    store1 = await SqliteEventStore.open(db_path)
    rt1 = await Runtime(store1, _agents()).start()
    r1 = await rt1.run(plan(task("a", "quick")))
    await rt1.stop()
    await store1.close()
    store2 = await SqliteEventStore.open(db_path)
    rt2 = await Runtime(store2, _agents()).start()
    try:
        before = await store2.last_position()
        r2 = await rt2.orch.wait(r1.root_id, 1)
        await asyncio.sleep(0.1)
        assert r2 == r1
        assert await store2.last_position() == before
    finally:
        await rt2.stop()
        await store2.close()


class ReviewIn(msgspec.Struct, frozen=True):
    draft: TextOut
    goal: str = ""


async def test_a_lost_append_of_a_new_subtask_does_not_strand_its_parent(make_runtime, store):
    """A decision that creates a review task writes two streams; losing one must not hang."""
    real_append_many = store.append_many
    lost: list[str] = []

    async def flaky_append_many(appends):  # type: ignore[no-untyped-def]
        # the orchestrator writes its decisions with append_many: lose the first review's,
        # and (as a store that lost it would) do not store what is to follow it (``after``)
        outcomes: list[object] = []
        kept: dict[int, int] = {}  # index in appends -> index in what is passed on
        passed = []
        for i, a in enumerate(appends):
            if "~review" in a.stream and not lost:
                lost.append(a.stream)
                outcomes.append(StoreUnavailable("disk hiccup"))
            elif any(j not in kept for j in a.after):
                outcomes.append(PrerequisiteNotStored(f"{a.stream}: not attempted"))
            else:
                kept[i] = len(passed)
                passed.append(dataclasses.replace(a, after=tuple(kept[j] for j in a.after)))
                outcomes.append(None)
        stored = iter(await real_append_many(passed))
        return [o if o is not None else next(stored) for o in outcomes]

    store.append_many = flaky_append_many  # type: ignore[method-assign]
    agents = [
        make_agent("writer", "write"),
        make_agent(
            "reviewer",
            "review",
            lambda t, i, c: Review(passed=True),
            input_type=ReviewIn,
            output_type=Review,
        ),
    ]
    rt = await make_runtime(agents)
    r = await rt.run(plan(task("d", "write", timeout_s=0.3, review_by="review")), timeout=5)
    assert lost, "the fault was not injected"
    assert r.status == "completed"
    log = await run_log(store, r.root_id)
    d = tid(r.root_id, "d")
    assert log.first(ev.TaskCompleted, d).data.quality_met is True
    assert len([x for x in log.e(ev.TaskCreated) if x.data.role == "review"]) == 1
