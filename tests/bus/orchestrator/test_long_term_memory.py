"""Long-term memory: the fold, the write policy and keeper, rebuild and forget, the CLI."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cardbus.agents.embedding import HashingEmbedder
from cardbus.bus.orchestrator.memory import LongTermMemory, MemoryKeeper, ReusablePolicy, derived_id
from cardbus.eventstore import MemoryEventStore, NewEvent, SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.projections.memory import MEMORY_STREAM, MemoryFold, build_memory
from cardbus.tools.cli import cli

ROOT = "root-1"


async def _write(store: MemoryEventStore, stream: str, *data: ev.Event, root: str = ROOT) -> None:
    version = await store.stream_version(stream)
    await store.append(stream, [NewEvent(data=d, correlation_id=root) for d in data], version)


async def _run(store: MemoryEventStore, root: str, session: dict, ok: bool = True) -> None:
    """A minimal run in the log: started, one task created and dispatched, then an outcome."""
    task = f"t-{root}"
    await _write(
        store, root, ev.RunStarted(goal="report", plan_id=f"p-{root}", session=session), root=root
    )
    await _write(
        store,
        task,
        ev.TaskCreated(root_id=root, capability="write", goal="write it"),
        ev.TaskDispatched(attempt=1, agent_id="writer"),
        root=root,
    )
    if ok:
        await _write(
            store, task, ev.TaskCompleted(attempt=1, agent_id="writer", output={"x": 1}), root=root
        )
        await _write(store, root, ev.RunCompleted(outputs={"draft": {"x": 1}}), root=root)
    else:
        await _write(
            store, task, ev.TaskFailed(reason="agent_error", error="boom", attempts=1), root=root
        )
        await _write(
            store, root, ev.RunFailed(reason="tasks_not_completed", failed_tasks=[task]), root=root
        )


async def test_records_get_list_filters_and_overwrite() -> None:
    store = MemoryEventStore()
    mem = LongTermMemory(store)
    await mem.remember(
        "pref/ann/format",
        "markdown",
        text="ann prefers markdown reports",
        tags=["preference", "user:ann"],
        kind="preference",
    )
    await mem.remember(
        "city/paris",
        {"country": "fr", "pop": 2},
        text="Paris is the capital of France",
        tags=["city"],
    )
    await mem.remember(
        "city/rome", {"country": "it", "pop": 3}, text="Rome is the capital of Italy", tags=["city"]
    )
    assert (await mem.get("pref/ann/format")).value == "markdown"  # type: ignore[union-attr]
    assert await mem.get("nope") is None
    assert [r.key for r in await mem.list(tags=["city"])] == ["city/paris", "city/rome"]
    assert [r.key for r in await mem.list(where={"country": "it"})] == ["city/rome"]
    assert [r.key for r in await mem.list(kind="preference")] == ["pref/ann/format"]
    assert [r.key for r in await mem.list(prefix="city/", limit=1)] == ["city/paris"]
    await mem.remember(
        "city/paris", {"country": "fr", "pop": 9}, text="Paris, France", tags=["city"]
    )
    paris = await mem.get("city/paris")
    assert paris is not None and paris.field("pop") == 9
    assert len(await mem.list(tags=["city"])) == 2


async def test_semantic_search_ranks_by_meaning_and_filters() -> None:
    store = MemoryEventStore()
    mem = LongTermMemory(store, embedder=HashingEmbedder())
    await mem.remember(
        "pref/ann/report_format",
        "markdown",
        text="ann prefers report format: markdown",
        kind="preference",
    )
    await mem.remember("fact/tides", "moon", text="tides are caused by the moon's gravity")
    await mem.remember("fact/bees", "pollen", text="bees collect pollen from flowers")
    hits = await mem.search("preferred report format")
    assert hits[0].record.key == "pref/ann/report_format"
    assert hits[0].score > 0
    assert [h.record.key for h in await mem.search("moon gravity tides", k=1)] == ["fact/tides"]
    records_only = await mem.search("report format", kind="record")
    assert all(h.record.kind == "record" for h in records_only)
    assert await mem.search("zzz qqq unrelated") == []


async def test_forget_is_an_event_and_hides_the_record_everywhere() -> None:
    store = MemoryEventStore()
    mem = LongTermMemory(store)
    await mem.remember("secret", "s3cr3t value", text="the launch code is s3cr3t", tags=["t"])
    assert await mem.forget("secret", reason="user asked") is True
    assert await mem.get("secret") is None
    assert await mem.list(tags=["t"]) == []
    assert await mem.search("launch code s3cr3t") == []
    assert await mem.forget("secret") is False  # nothing left to forget
    log = await store.read_stream(MEMORY_STREAM)
    assert [e.type for e in log] == ["memory.written.v1", "memory.forgotten.v1"]
    assert log[1].data == ev.MemoryForgotten(key="secret", reason="user asked", scope="global")
    # a later write of the key brings it back
    await mem.remember("secret", "new")
    assert (await mem.get("secret")).value == "new"  # type: ignore[union-attr]


async def test_read_model_is_rebuilt_from_the_log(tmp_path: Path) -> None:
    path = tmp_path / "m.db"
    store = await SqliteEventStore.open(path)
    mem = LongTermMemory(store)
    for i in range(5):
        await mem.remember(f"k{i}", i, text=f"number {i}", tags=["n"] if i % 2 else [])
    await mem.forget("k2")
    live = dict(mem.fold.records)
    await store.close()
    store = await SqliteEventStore.open(path)
    try:
        rebuilt = await build_memory(store)
        assert rebuilt.records == live
        assert sorted(k for _, k in rebuilt.records) == ["k0", "k1", "k3", "k4"]
        # folding the same events again changes nothing (idempotent by version)
        again = rebuilt.apply_all(await store.read_stream(MEMORY_STREAM))
        assert again.records == live
    finally:
        await store.close()


async def test_fold_ignores_other_streams() -> None:
    store = MemoryEventStore()
    await _write(store, "not-memory", ev.MemoryWritten(key="x", value=1))
    fold = MemoryFold().apply_all(await store.read_all())
    assert fold.records == {}


async def test_keeper_stores_preferences_only_when_the_run_completes() -> None:
    store = MemoryEventStore()
    session = {"request": "a report", "user": "ann", "preferences": {"report_format": "markdown"}}
    await _run(store, "ok-run", session, ok=True)
    await _run(store, "bad-run", {"user": "bob", "preferences": {"report_format": "pdf"}}, ok=False)
    keeper = MemoryKeeper(store)
    await keeper.catch_up()
    mem = LongTermMemory(store)
    pref = await mem.get("pref/ann/report_format")
    assert pref is not None and pref.value == "markdown" and pref.kind == "preference"
    assert pref.root_id == "ok-run" and pref.policy == ReusablePolicy().name
    assert await mem.get("pref/bob/report_format") is None  # the run failed: nothing reusable
    # ... but its failure reason is kept, for selection to learn from
    failures = (await mem.refresh()).failures(capability="write", agent_id="writer")
    assert len(failures) == 1
    assert failures[0].value["reason"] == "agent_error: boom"
    assert failures[0].source_task_id == "t-bad-run"
    # the memory events name their cause
    log = await store.read_stream(MEMORY_STREAM)
    causes = {e.causation_id for e in log}
    assert {e.correlation_id for e in log} == {MEMORY_STREAM}  # a run's own events stay the run's
    run_completed = (await store.read_stream("ok-run"))[-1]
    assert run_completed.event_id in causes


async def test_keeper_forgets_the_facts_of_finished_runs() -> None:
    store = MemoryEventStore()
    await _run(store, "ok-run", {"user": "ann", "preferences": {"tone": "dry"}}, ok=True)
    await _run(store, "bad-run", {"user": "bob"}, ok=False)
    keeper = MemoryKeeper(store)
    await keeper.catch_up()
    assert keeper.tracking == 0  # a long-running keeper does not grow with history
    assert await LongTermMemory(store).get("pref/ann/tone") is not None


async def test_keeper_is_idempotent_and_respects_forget() -> None:
    store = MemoryEventStore()
    await _run(
        store, "r1", {"user": "ann", "preferences": {"report_format": "markdown", "tone": "dry"}}
    )
    keeper = MemoryKeeper(store)
    await keeper.settle("r1")
    await keeper.settle("r1")
    await MemoryKeeper(store).catch_up()  # a second keeper (or a restart) over the same log
    log = await store.read_stream(MEMORY_STREAM)
    assert len(log) == 2
    mem = LongTermMemory(store)
    await mem.forget("pref/ann/tone")
    await MemoryKeeper(store).catch_up()  # re-processing the old run does not resurrect it
    assert await mem.get("pref/ann/tone") is None
    assert await mem.get("pref/ann/report_format") is not None


async def test_concurrent_writers_do_not_lose_writes() -> None:
    store = MemoryEventStore()
    a, b = LongTermMemory(store), LongTermMemory(store)
    await asyncio.gather(
        *(m.remember(f"{n}{i}", i) for i in range(10) for n, m in (("a", a), ("b", b)))
    )
    assert len(await a.list()) == 20


def test_derived_ids_are_stable_uuid7() -> None:
    x = derived_id("seed", 1700000000.5)
    assert x == derived_id("seed", 1700000000.5)
    assert x != derived_id("seed2", 1700000000.5)
    assert x[14] == "7" and len(x) == 36


@pytest.fixture
def memory_db(tmp_path: Path) -> str:
    path = tmp_path / "cardbus.db"

    async def fill() -> None:
        store = await SqliteEventStore.open(path)
        try:
            mem = LongTermMemory(store)
            await mem.remember(
                "pref/ann/report_format",
                "markdown",
                text="ann prefers report format: markdown",
                tags=["preference"],
                kind="preference",
            )
            await mem.remember(
                "fact/tides", "moon", text="tides are caused by the moon", tags=["fact"]
            )
        finally:
            await store.close()

    asyncio.run(fill())
    return str(path)


def test_cli_list_search_show_forget(memory_db: str) -> None:
    runner = CliRunner()
    out = runner.invoke(cli, ["memory", "list", "--db", memory_db])
    assert out.exit_code == 0, out.output
    assert "pref/ann/report_format" in out.output and "fact/tides" in out.output
    out = runner.invoke(
        cli, ["memory", "list", "--db", memory_db, "--kind", "preference", "--json"]
    )
    assert [r["key"] for r in json.loads(out.output)] == ["pref/ann/report_format"]
    out = runner.invoke(
        cli, ["memory", "search", "preferred report format", "--db", memory_db, "--json"]
    )
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)[0]["record"]["key"] == "pref/ann/report_format"
    out = runner.invoke(cli, ["memory", "show", "fact/tides", "--db", memory_db])
    assert json.loads(out.output)["value"] == "moon"
    out = runner.invoke(
        cli, ["memory", "forget", "fact/tides", "--db", memory_db, "--reason", "stale"]
    )
    assert out.exit_code == 0 and "forgot fact/tides" in out.output
    out = runner.invoke(cli, ["memory", "search", "tides moon", "--db", memory_db, "--json"])
    assert all(h["record"]["key"] != "fact/tides" for h in json.loads(out.output))
    out = runner.invoke(cli, ["memory", "show", "fact/tides", "--db", memory_db])
    assert out.exit_code == 1 and "no memory record" in out.output
    out = runner.invoke(cli, ["memory", "forget", "fact/tides", "--db", memory_db])
    assert out.exit_code == 1
    out = runner.invoke(cli, ["memory", "list", "--db", memory_db + ".missing"])
    assert out.exit_code == 1  # a missing log is one clear line, not a traceback
