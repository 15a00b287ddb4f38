"""Projections against every EventStore backend: values, rebuild == incremental, time travel."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from lifecycle_log import T0, write_run

from cardbus.eventstore import EventStore, MemoryEventStore, NewEvent
from cardbus.eventstore import events as ev
from cardbus.projections import (
    AgentStats,
    AgentStatsFold,
    AsOf,
    Cost,
    LoopCounter,
    LoopHashes,
    ProjectionRunner,
    Quality,
    TaskTable,
    all_projections,
    build_as_of,
    dump_tables,
    percentile,
)


@pytest.fixture(params=["memory", "sqlite", "nats"])
def store(request: pytest.FixtureRequest) -> EventStore:
    """Every EventStore backend (tests/conftest.py): projections use only the interface."""
    backend: EventStore = request.getfixturevalue(f"{request.param}_store")
    return backend


async def test_task_table_values(store: EventStore) -> None:
    ids = await write_run(store)
    with ProjectionRunner.open(store) as runner:
        assert await runner.catch_up() == await store.last_position()
        tasks = {r["task_id"]: r for r in TaskTable().list(runner.conn)}
    assert set(tasks) == {ids.research, ids.write, ids.review, ids.code, ids.loop}
    w = tasks[ids.write]
    assert w["status"] == "completed"
    assert w["agent_id"] == "writer-2"
    assert w["attempts"] == 3
    assert w["reason"] is None
    assert w["output"] == '"final"'
    assert w["root_id"] == ids.root
    assert tasks[ids.review]["parent_task_id"] == ids.write
    assert tasks[ids.research]["input"] == '{"q":"cats"}'
    assert tasks[ids.research]["created_at"] == T0 + 2
    code = tasks[ids.code]
    assert code["status"] == "failed"
    assert code["reason"] == "failed: attempts_exhausted (timed out)"
    assert tasks[ids.loop]["status"] == "halted"
    assert tasks[ids.loop]["reason"].startswith("halted: loop_detected")


async def test_filters(store: EventStore) -> None:
    ids = await write_run(store)
    with ProjectionRunner.open(store) as runner:
        await runner.catch_up()
        t = TaskTable()
        assert [r["task_id"] for r in t.list(runner.conn, status="failed")] == [ids.code]
        assert [r["task_id"] for r in t.list(runner.conn, agent="coder")] == [ids.code]
        assert [r["task_id"] for r in t.list(runner.conn, capability="review")] == [ids.review]
        assert len(t.list(runner.conn, root=ids.root)) == 5
        assert t.list(runner.conn, root="nope") == []


async def test_loop_hashes(store: EventStore) -> None:
    ids = await write_run(store)
    counter = LoopCounter()
    for env in await store.read_all(0, 10_000):
        counter.apply(env)
    with ProjectionRunner.open(store) as runner:
        await runner.catch_up()
        loops = LoopHashes()
        # the orchestrator's rule: count = distinct tasks; retries of one task count once
        assert loops.count(runner.conn, ids.root, "h-loop") == 1
        assert loops.count(runner.conn, ids.root, "h-write") == 1
        assert loops.count(runner.conn, ids.root, "h-research") == 1
        assert loops.count(runner.conn, ids.root, "unknown") == 0
        assert loops.count(runner.conn, "other-root", "h-loop") == 0
        top = loops.list(runner.conn, ids.root)[0]
        assert top["loop_hash"] == "h-loop" and top["dispatches"] == 3
        assert top["first_seen"] < top["last_seen"]
    assert counter.count(ids.root, "h-loop") == 1
    assert counter.hashes(ids.root)["h-code"] == 1


async def test_loop_counts_distinct_tasks() -> None:
    store = MemoryEventStore()
    root = "r"
    for i, task in enumerate(("t1", "t2", "t3")):
        events: list[ev.Event] = [
            ev.TaskCreated(root_id=root, capability="x"),
            ev.TaskDispatched(attempt=1, agent_id="a", loop_hash="h"),
            ev.TaskDispatched(attempt=1, agent_id="b", loop_hash="h"),  # fan-out
        ]
        if i == 0:
            events += [
                ev.TaskRetryScheduled(attempt=2, delay_s=0, reason="timeout"),
                ev.TaskDispatched(attempt=2, agent_id="a", loop_hash="h"),  # retry
            ]
        await store.append(task, [NewEvent(data=d, correlation_id=root) for d in events], 0)
    counter = LoopCounter()
    for env in await store.read_all():
        counter.apply(env)
    assert counter.count(root, "h") == 3
    with ProjectionRunner.open(store, ":memory:", [LoopHashes()]) as runner:
        await runner.catch_up()
        assert LoopHashes().count(runner.conn, root, "h") == 3
        assert LoopHashes().list(runner.conn, root)[0]["dispatches"] == 7


async def test_agent_stats(store: EventStore) -> None:
    await write_run(store)
    fold = AgentStatsFold()
    for env in await store.read_all(0, 10_000):
        fold.apply(env)
    with ProjectionRunner.open(store) as runner:
        await runner.catch_up()
        stats = AgentStats()
        w2 = stats.get(runner.conn, "writer-2", "write")
        # attempt 2 ended in a revision request (delivered: success), attempt 3 completed
        assert (w2.runs, w2.success_rate, w2.rejections) == (2, 1.0, 0)
        # dispatch -> result: 1+4 = 5s for attempt 2, 1+2 = 3s for attempt 3
        assert w2.p50_s == pytest.approx(4.0)
        assert w2.p95_s == pytest.approx(4.9)
        w1 = stats.get(runner.conn, "writer-1", "write")
        assert (w1.runs, w1.rejections, w1.p50_s) == (0, 1, None)
        coder = stats.get(runner.conn, "coder", "code")
        assert (coder.runs, coder.successes, coder.failures, coder.timeouts) == (2, 0, 2, 1)
        planner = stats.get(runner.conn, "planner", "plan")
        assert (planner.runs, planner.timeouts) == (2, 2)  # the halted third attempt: no outcome
        r = stats.get(runner.conn, "researcher")
        assert (r.runs, r.success_rate, r.p50_s) == (1, 1.0, pytest.approx(3.0))
        assert stats.get(runner.conn, "nobody", "x").runs == 0
        sql_all = stats.all(runner.conn)
    # the in-memory fold gives the same numbers
    assert fold.all() == sql_all
    assert fold.get("writer-2", "write") == w2
    assert fold.get("researcher") == r


def test_percentile() -> None:
    assert percentile([], 0.5) is None
    assert percentile([2.0], 0.95) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5


async def test_cost_and_quality(store: EventStore) -> None:
    ids = await write_run(store)
    with ProjectionRunner.open(store) as runner:
        await runner.catch_up()
        cost = Cost()
        root = cost.get(runner.conn, "root", ids.root)
        assert root is not None
        assert (root["input_tokens"], root["output_tokens"]) == (590, 645)
        w2 = cost.get(runner.conn, "agent", "writer-2")
        assert w2 is not None and (w2["input_tokens"], w2["output_tokens"]) == (450, 580)
        cap = cost.get(runner.conn, "capability", "review")
        assert cap is not None and cap["output_tokens"] == 10
        assert {r["scope"] for r in cost.list(runner.conn)} == {"root", "agent", "capability"}
        q = Quality()
        researcher = q.get(runner.conn, "researcher", "research")
        assert researcher is not None
        assert researcher["first_pass_rate"] == 1.0
        assert researcher["schema_compliance"] == 1.0
        writer = q.get(runner.conn, "writer-2", "write")
        assert writer is not None
        assert (writer["results"], writer["revisions"], writer["first_pass"]) == (2, 1, 0)
        assert writer["revision_rate"] == 0.5 and writer["first_pass_rate"] == 0.0
        coder = q.get(runner.conn, "coder", "code")
        assert coder is not None
        assert coder["schema_compliance"] == 0.0 and coder["first_pass_rate"] is None


async def test_rebuild_equals_incremental(store: EventStore) -> None:
    projections = all_projections()
    incremental = ProjectionRunner.open(store, ":memory:", projections, batch_size=3)
    # fold while the log grows, in small batches, across three runs
    await write_run(store, "a-")
    await incremental.catch_up()
    await write_run(store, "b-", t0=T0 + 1000)
    await incremental.catch_up()
    follower = asyncio.create_task(incremental.follow())
    await write_run(store, "c-", t0=T0 + 2000)
    await incremental.wait_for(await store.last_position(), timeout=10)
    follower.cancel()
    with pytest.raises(asyncio.CancelledError):
        await follower
    rebuilt = ProjectionRunner.open(store, ":memory:", all_projections(), batch_size=10_000)
    await rebuilt.catch_up()
    assert dump_tables(incremental.conn, projections) == dump_tables(rebuilt.conn, projections)
    assert len(TaskTable().list(rebuilt.conn)) == 15
    # rebuild in place gives the same again
    await incremental.rebuild()
    assert dump_tables(incremental.conn, projections) == dump_tables(rebuilt.conn, projections)
    await incremental.rebuild(["tasks"])
    assert dump_tables(incremental.conn, projections) == dump_tables(rebuilt.conn, projections)
    assert not incremental.errors and not rebuilt.errors
    incremental.close()
    rebuilt.close()


async def test_checkpoint_survives_reopen_and_crash(tmp_path: Path) -> None:
    store = MemoryEventStore()
    await write_run(store)
    path = tmp_path / "model.proj"
    with ProjectionRunner.open(store, path, batch_size=4) as runner:
        page = await store.read_all(1, 10)
        runner.apply_batch(page)
        assert runner.checkpoint("tasks") == 10

        # a crash in the middle of a batch: rows and checkpoint roll back together
        class Boom(Exception):
            pass

        def explode() -> None:
            raise Boom

        model = runner._models["tasks"]
        original = model.flush
        model.flush = explode  # type: ignore[method-assign]
        with pytest.raises(Boom):
            runner.apply_batch(await store.read_all(11, 10))
        model.flush = original  # type: ignore[method-assign]
        assert runner.checkpoint("tasks") == 10
    with ProjectionRunner.open(store, path) as reopened:
        assert reopened.position == 10
        await reopened.catch_up()
        with ProjectionRunner.open(store) as fresh:
            await fresh.catch_up()
            assert dump_tables(reopened.conn, reopened.projections) == dump_tables(
                fresh.conn, fresh.projections
            )


async def test_two_runners_on_one_file_never_apply_twice(tmp_path: Path) -> None:
    store = MemoryEventStore()
    await write_run(store)
    path = tmp_path / "shared.proj"
    a = ProjectionRunner.open(store, path, batch_size=5)
    b = ProjectionRunner.open(store, path, batch_size=7)
    await a.catch_up(until_position=12)
    await b.catch_up()  # notices a's checkpoint, continues from 12
    await a.catch_up()  # notices b finished
    with ProjectionRunner.open(store) as fresh:
        await fresh.catch_up()
        expected = dump_tables(fresh.conn, fresh.projections)
    assert dump_tables(a.conn, a.projections) == expected
    a.close()
    b.close()


async def test_version_change_rebuilds(tmp_path: Path) -> None:
    store = MemoryEventStore()
    await write_run(store)
    path = tmp_path / "v.proj"
    with ProjectionRunner.open(store, path, [TaskTable()]) as runner:
        await runner.catch_up()

    class TaskTableV2(TaskTable):
        version = TaskTable.version + 1

    with ProjectionRunner.open(store, path, [TaskTableV2()]) as runner:
        assert runner.position == 0
        await runner.catch_up()
        assert len(TaskTable().list(runner.conn)) == 5


async def test_tampered_log_does_not_crash(store: EventStore) -> None:
    root = "r"
    bad: list[ev.Event] = [
        ev.TaskCreated(root_id=root, capability="x"),
        ev.TaskCompleted(attempt=1, agent_id="a"),  # pending -> completed is a reuse: legal
        ev.TaskStarted(attempt=1, agent_id="a"),  # completed -> started: illegal
    ]
    await store.append("t", [NewEvent(data=d, correlation_id=root) for d in bad], 0)
    await store.append(
        "orphan", [NewEvent(data=ev.TaskStarted(attempt=1, agent_id="a"), correlation_id=root)], 0
    )
    with ProjectionRunner.open(store) as runner:
        await runner.catch_up()
        t = TaskTable().get(runner.conn, "t")
        assert t is not None and t["status"] == "completed"
        assert "illegal transition" in t["reason"] and "task.started.v1" in t["reason"]
        orphan = TaskTable().get(runner.conn, "orphan")
        assert orphan is not None and orphan["status"] is None
        assert "illegal transition" in orphan["reason"]
        assert not runner.errors


async def test_time_travel(store: EventStore) -> None:
    ids = await write_run(store)
    # position: just after the write task was rejected (its 3rd event)
    rejected_at = next(
        e.position for e in await store.read_stream(ids.write) if e.type == "task.rejected.v1"
    )
    runner = await build_as_of(store, AsOf.parse(str(rejected_at)))
    row = TaskTable().get(runner.conn, ids.write)
    assert row is not None and row["status"] == "pending"
    assert row["reason"] == "rejected by writer-1: out_of_capability (no prose)"
    assert TaskTable().get(runner.conn, ids.code) is None
    runner.close()
    # timestamp: the same moment, as ISO 8601
    env = next(e for e in await store.read_all(0, 1000) if e.position == rejected_at)
    from datetime import UTC, datetime

    iso = datetime.fromtimestamp(env.recorded_at, UTC).isoformat()
    runner = await build_as_of(store, AsOf.parse(iso))
    row2 = TaskTable().get(runner.conn, ids.write)
    assert row2 == row
    runner.close()


def test_as_of_parse() -> None:
    assert AsOf.parse("42") == AsOf(position=42)
    assert AsOf.parse("2027-01-15T08:00:00Z").timestamp == T0
    assert AsOf.parse("2027-01-15T08:00:00").timestamp == T0
    from cardbus.eventstore import ValidationError

    with pytest.raises(ValidationError):
        AsOf.parse("yesterday")
