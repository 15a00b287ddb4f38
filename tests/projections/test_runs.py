"""The runs projection (one row per run) and resolve_id (prefixes and plan ids)."""

from __future__ import annotations

import pytest
from lifecycle_log import T0, Writer, write_run

from cardbus.eventstore import MemoryEventStore
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import AmbiguousId, ConfigError, StreamNotFound, ValidationError
from cardbus.projections import (
    Model,
    ProjectionRunner,
    Runs,
    all_projections,
    dump_tables,
    parse_since,
    resolve_id,
    run_duration,
)


async def _runner(store: MemoryEventStore, **options: int) -> ProjectionRunner:
    runner = ProjectionRunner.open(store, ":memory:", [Runs()], **options)
    await runner.catch_up()
    return runner


async def test_a_run_folds_to_one_row() -> None:
    store = MemoryEventStore()
    ids = await write_run(store)
    with await _runner(store) as runner:
        rows = Runs().list(runner.conn)
    assert len(rows) == 1
    row = rows[0]
    assert row["root_id"] == ids.root
    assert row["goal"] == "write a report"
    assert row["plan_id"] == "plan-1"
    assert row["status"] == "failed"
    assert row["reason"] == "tasks failed"
    assert row["started_at"] == T0 + 1
    assert row["ended_at"] == row["updated_at"] > row["started_at"]
    # research, write, review completed; code failed, loop halted
    assert (row["tasks_total"], row["tasks_done"], row["tasks_failed"]) == (5, 3, 2)
    assert row["input_tokens"] == 100 + 200 + 30 + 250 + 10
    assert row["output_tokens"] == 50 + 300 + 10 + 280 + 5
    assert row["waiting"] == []
    assert run_duration(row) == row["ended_at"] - row["started_at"]


async def test_rebuild_equals_incremental_and_memory_fold() -> None:
    store = MemoryEventStore()
    await write_run(store, "a-", T0)
    await write_run(store, "b-", T0 + 500)
    with await _runner(store, batch_size=7) as small, await _runner(store) as big:
        assert dump_tables(small.conn, [Runs()]) == dump_tables(big.conn, [Runs()])
        rows = {r["root_id"]: r for r in Runs().list(big.conn)}
    model = Model.in_memory(Runs.tables)
    for env in await store.read_all(0, 10_000):
        if type(env.data) in Runs.handles:
            Runs().apply(model, env)
    folded = {k[0]: r for k, r in model["proj_runs"].data.items()}
    assert folded.keys() == rows.keys() == {"a-run-1", "b-run-1"}
    for root, row in folded.items():
        assert row == rows[root]
    assert "runs" in [p.name for p in all_projections()]


async def _approval_run(store: MemoryEventStore, root: str, t0: float) -> Writer:
    w = Writer(store, root, t0)
    await w.emit(root, ev.RunStarted(goal="ship it", plan_id=f"plan-{root}", task_ids=["t"]))
    t = f"{root}-t"
    await w.emit(t, ev.TaskCreated(root_id=root, capability="deploy", requires_approval=True))
    await w.emit(t, ev.ApprovalRequested(reason="requires_approval"))
    return w


async def test_a_task_waiting_for_approval_shows_on_its_run() -> None:
    store = MemoryEventStore()
    w = await _approval_run(store, "r1", T0)
    with await _runner(store) as runner:
        row = Runs().get(runner.conn, "r1")
        assert row is not None
        assert row["status"] == "awaiting_approval"
        assert row["waiting"] == ["r1-t"]
        assert [r["root_id"] for r in Runs().list(runner.conn, status="awaiting_approval")] == [
            "r1"
        ]
        assert Runs().list(runner.conn, status="running") == []
        await w.emit("r1-t", ev.ApprovalGranted(by="test"))
        await runner.catch_up()
        row = Runs().get(runner.conn, "r1")
        assert row is not None
        assert (row["status"], row["waiting"]) == ("running", [])
        assert row["ended_at"] is None
        assert run_duration(row, now=T0 + 10) == pytest.approx(9.0)


async def test_list_filters_newest_first() -> None:
    store = MemoryEventStore()
    await write_run(store, "a-", T0)
    await write_run(store, "b-", T0 + 500)
    await _approval_run(store, "c", T0 + 1000)
    with await _runner(store) as runner:
        runs = Runs()
        assert [r["root_id"] for r in runs.list(runner.conn)] == ["c", "b-run-1", "a-run-1"]
        assert [r["root_id"] for r in runs.list(runner.conn, limit=2)] == ["c", "b-run-1"]
        assert [r["root_id"] for r in runs.list(runner.conn, since=T0 + 400)] == ["c", "b-run-1"]
        assert [r["root_id"] for r in runs.list(runner.conn, status="failed")] == [
            "b-run-1",
            "a-run-1",
        ]
        with pytest.raises(ConfigError, match="known: running"):
            runs.list(runner.conn, status="bogus")


def test_parse_since() -> None:
    assert parse_since("90s", now=1000.0) == 910.0
    assert parse_since("2h", now=10_000.0) == 10_000.0 - 7200
    assert parse_since("1d", now=100_000.0) == 100_000.0 - 86400
    assert parse_since("2027-01-15T08:00:00Z") == T0
    assert parse_since("2027-01-15T08:00:00") == T0  # naive is UTC
    with pytest.raises(ConfigError, match="--since 'yesterday'"):
        parse_since("yesterday")


async def test_resolve_id() -> None:
    store = MemoryEventStore()
    await write_run(store, "0190aaaa-1111-", T0)
    await write_run(store, "0190aaaa-2222-", T0 + 100)
    root = "0190aaaa-1111-run-1"
    assert await resolve_id(store, root) == root  # a full id
    assert await resolve_id(store, "0190aaaa-1111-r") == root  # a unique prefix
    assert await resolve_id(store, "0190aaaa-1111") == root  # the run and its own tasks
    assert await resolve_id(store, "  0190aaaa-2222-run  ") == "0190aaaa-2222-run-1"
    with pytest.raises(AmbiguousId, match="2 ids"):  # both runs have plan id plan-1
        await resolve_id(store, "plan-1")
    # task ids resolve too
    assert await resolve_id(store, "0190aaaa-1111-task-wr") == "0190aaaa-1111-task-write"
    with pytest.raises(AmbiguousId) as info:
        await resolve_id(store, "0190aaaa")
    assert info.value.candidates[:2] == ["0190aaaa-1111-run-1", "0190aaaa-1111-task-code"]
    assert len(info.value.candidates) == 12
    assert "0190aaaa-2222-run-1" in str(info.value)
    assert isinstance(info.value, ValidationError)
    with pytest.raises(StreamNotFound):
        await resolve_id(store, "zzz")
    with pytest.raises(ValidationError):
        await resolve_id(store, " ")


async def test_resolve_id_prefers_a_task_over_the_subtasks_named_after_it() -> None:
    store = MemoryEventStore()
    w = Writer(store, "root-x")
    for t in ("draft-1", "draft-1~review1", "draft-1~review2"):
        await w.emit(t, ev.TaskCreated(root_id="root-x", capability="c"))
    assert await resolve_id(store, "draft") == "draft-1"
    with pytest.raises(AmbiguousId):
        await resolve_id(store, "draft-1~r")


async def test_resolve_id_plan_stream_names_its_run() -> None:
    store = MemoryEventStore()
    w = Writer(store, "root-y")
    await w.emit("plan-p9", ev.PlanSubmitted(plan_id="p9", root_id="root-y"))
    await w.emit("root-y", ev.RunStarted(goal="g", plan_id="p9"))
    assert await resolve_id(store, "p9") == "root-y"
    assert await resolve_id(store, "plan-p9") == "root-y"
    assert await resolve_id(store, "root") == "root-y"
    z = Writer(store, "root-z")
    await z.emit("root-z", ev.RunStarted(goal="g", plan_id="solo"))  # no plan stream
    assert await resolve_id(store, "solo") == "root-z"


async def test_resolve_id_by_the_end_when_no_id_begins_so() -> None:
    store = MemoryEventStore()
    for root in ("01a230c1-f5d9-7001-b966-97485808139f", "01a230c1-f6df-7001-96af-966afe1ebac5"):
        w = Writer(store, root)
        await w.emit(root, ev.RunStarted(goal="g", plan_id=root[::-1]))
        await w.emit(f"draft-{root[-12:]}", ev.TaskCreated(root_id=root, capability="write"))
    with pytest.raises(AmbiguousId):  # same minute, same first 8 characters
        await resolve_id(store, "01a230c1")
    # the random end of the id: the run (its tasks' ids end the same)
    assert await resolve_id(store, "5808139f") == "01a230c1-f5d9-7001-b966-97485808139f"
    assert await resolve_id(store, "draft-9748") == "draft-97485808139f"  # a prefix first
    with pytest.raises(StreamNotFound):
        await resolve_id(store, "nothing-ends-so")
