"""A new run's first dispatches are written in the commit that creates it.

Before, a run took one commit to create it and another for its first
dispatches, so every run paid one fsync more before its first agent started.
The first step is now decided on the run folded tentatively
(``RunState.tentatively``) and appended with its creation; if that append
fails, the state keeps no trace of the run.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from orchkit import CARDS, is_, make_agent, plan, run_log, task, tid, wait_for

from cardbus.agents.cards import TaskCard
from cardbus.eventstore import SqliteEventStore, StoreUnavailable
from cardbus.eventstore import events as ev


def _gated(gate: asyncio.Event) -> Any:
    async def handler(card: TaskCard, inputs: Any, ctx: Any) -> dict[str, str]:
        await gate.wait()
        return {"text": inputs.text}

    return handler


async def _cards(n: int) -> None:
    for _ in range(500):
        if sum(len(c) for c in CARDS.values()) >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"fewer than {n} cards arrived: {CARDS}")


async def test_creation_and_first_dispatches_share_one_commit(
    store: SqliteEventStore, make_runtime: Any
) -> None:
    gate = asyncio.Event()
    # a long started_after_s: no task.started commit while the agents wait at the gate
    rt = await make_runtime(
        [make_agent("echo", handler=_gated(gate))], concurrency=2, started_after_s=30
    )
    before = store.commits
    root = await rt.orch.submit(
        plan(task("a"), task("b"), task("c", deps=["a", "b"], inputs={"text": "c"}))
    )
    await _cards(2)  # a and b went out: both were dispatched
    assert store.commits - before == 1  # the creation and both dispatches: one commit
    log = await run_log(store, root)
    for name in ("a", "b"):
        assert log.tags(tid(root, name)) == ["created", "dispatched"]
    assert log.tags(tid(root, "c")) == ["created"]  # waits for its deps
    gate.set()
    result = await rt.orch.wait(root, 10)
    assert result.status == "completed"
    assert [x.version for x in log.e(stream=tid(root, "a"))] == [1, 2]


async def test_a_refused_creation_leaves_no_trace_and_the_next_run_goes(
    store: SqliteEventStore, make_runtime: Any
) -> None:
    rt = await make_runtime([make_agent("echo")])
    loop = asyncio.get_running_loop()

    def limit(pages: int | None) -> None:
        conn = store._writer.conn  # the writer's own connection, on its own thread
        count = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count={count if pages is None else pages}")

    state = rt.orch.state
    seen = (dict(state.versions), set(state.runs), set(state.tasks), dict(state.plans))
    await loop.run_in_executor(store._executor, limit, None)  # the disk is full
    with pytest.raises(StoreUnavailable):
        await rt.orch.submit(plan(task("a"), task("b", deps=["a"])))
    assert (dict(state.versions), set(state.runs), set(state.tasks), dict(state.plans)) == seen
    assert state.open == {}
    await loop.run_in_executor(store._executor, limit, 1_000_000)  # room again
    result = await rt.run(plan(task("a"), task("b", deps=["a"])))
    assert result.status == "completed"
    assert sorted(result.outputs) == ["a", "b"]


async def test_an_approval_asked_at_once_is_written_with_the_creation(
    store: SqliteEventStore, make_runtime: Any
) -> None:
    rt = await make_runtime([make_agent("echo")])
    before = store.commits
    root = await rt.orch.submit(plan(task("a", requires_approval=True)))
    assert store.commits - before == 1  # submit returned: the question is in the log
    a = tid(root, "a")
    assert (await run_log(store, root)).tags(a) == ["created", "approval_requested"]
    await rt.orch.approve(a, by="test")
    result = await rt.orch.wait(root, 10)
    assert result.status == "completed"
    assert (await run_log(store, root)).tags(a)[:3] == [
        "created",
        "approval_requested",
        "approval_granted",
    ]


class _Announcing(SqliteEventStore):
    """The real store, saying when an append has been handed to it."""

    appending: asyncio.Event

    async def append_many(self, appends: Any) -> Any:
        self.appending.set()
        return await super().append_many(appends)


async def test_a_submit_cancelled_during_its_append_still_runs(
    db_path: Any, make_runtime: Any
) -> None:
    store = await _Announcing.open(db_path, poll_interval=0.01)
    try:
        rt = await make_runtime([make_agent("echo")], store=store)
        store.appending = asyncio.Event()
        # timeouts far past the wait below: a card written but never sent would fail it
        slow = plan(task("a", timeout_s=60), task("b", deps=["a"], timeout_s=60))
        submit = asyncio.create_task(rt.orch.submit(slow))
        await store.appending.wait()
        submit.cancel()  # the caller gives up while the creation is being written
        with pytest.raises(asyncio.CancelledError):
            await submit
        started = await wait_for(store, is_(ev.RunStarted))  # written all the same
        result = await rt.orch.wait(started.stream, 5)  # and folded, sent and run
        assert result.status == "completed"
    finally:
        await store.close()


async def test_a_first_step_that_raises_leaves_the_run_to_the_decide_loop(
    store: SqliteEventStore, make_runtime: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cardbus.bus.orchestrator.decisions import Decider

    rt = await make_runtime([make_agent("echo")])
    advance = Decider.advance
    calls = 0

    def broken_once(self: Decider, run: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:  # the first step, decided with the creation
            raise RuntimeError("a bug in deciding")
        advance(self, run)

    monkeypatch.setattr(Decider, "advance", broken_once)
    state = rt.orch.state
    before = (set(state.runs), set(state.tasks))
    result = await rt.run(plan(task("a"), task("b", deps=["a"])))
    assert result.status == "completed" and calls > 1
    assert set(state.runs) - before[0] == {result.root_id}  # folded once, for real
    log = await run_log(store, result.root_id)
    assert log.tags(tid(result.root_id, "a"))[:2] == ["created", "dispatched"]
