"""Snapshots of the orchestrator's state: a start from one folds exactly what a full fold does."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lifecycle_log import write_run
from orchkit import (
    CARDS,
    FAST,
    Runtime,
    TextOut,
    ev,
    is_,
    make_agent,
    plan,
    run_log,
    task,
    tid,
    wait_for,
)

from cardbus.bus import InProcessBus, Orchestrator
from cardbus.bus.orchestrator import snapshot as snap
from cardbus.bus.orchestrator.runstate import RunState
from cardbus.eventstore import Envelope, MemoryEventStore, NewEvent, SqliteEventStore


def _fold(events: list[Envelope], retain: int | None) -> RunState:
    state = RunState(retain_finished=retain)
    for env in events:
        state.apply(env)
    return state


def _from_snapshot(events: list[Envelope], p: int, retain: int | None) -> RunState:
    """Fold up to position ``p``, snapshot (through its encoding), restore, fold the rest."""
    data = snap.decode_state(
        snap.encode_state(_fold([e for e in events if e.position <= p], retain))
    )
    state = snap.restore(data, RunState(retain_finished=retain))
    for env in events:
        if env.position > p:
            state.apply(env)
    return state


def _same(a: RunState, b: RunState) -> None:
    """``a`` (from a snapshot) holds what ``b`` (a full fold) holds, finished runs aside."""
    assert list(a.open) == list(b.open)
    for root, run in b.open.items():
        assert a.open[root] == run
        for task_id in run.tasks:
            assert a.tasks[task_id] == b.tasks[task_id]
            assert a.versions.get(task_id) == b.versions.get(task_id)
        assert a.versions.get(root) == b.versions.get(root)
    assert a.agents == b.agents
    for agent in b.agents:
        for cap in {c.name for c in b.agents[agent].capabilities}:
            assert a.get(agent, cap) == b.get(agent, cap)
    assert a.position == b.position
    # everything a snapshot carries (sets compared as sets, so through decoding)
    assert snap.decode_state(snap.encode_state(a)) == snap.decode_state(snap.encode_state(b))


_RUNS: list[list[Envelope]] = []


def _lifecycle_runs() -> list[list[Envelope]]:
    """Events of lifecycle_log runs (each one finishes failed), four of them."""
    if not _RUNS:

        async def write() -> None:
            for i in range(4):
                store = MemoryEventStore()
                await write_run(store, prefix=f"r{i}-")
                _RUNS.append(await store.read_all(1, 10_000))

        asyncio.run(write())
    return _RUNS


async def _interleave(runs: list[list[Envelope]], order: list[int]) -> list[Envelope]:
    """The runs' events appended to a new log, in the order ``order`` picks runs."""
    store = MemoryEventStore()
    queues = [list(r) for r in runs]
    versions: dict[str, int] = {}
    picks = iter(order)
    while any(queues):
        live = [i for i, q in enumerate(queues) if q]
        env = queues[live[next(picks, 0) % len(live)]].pop(0)
        v = versions.get(env.stream, 0)
        new = NewEvent(
            data=env.data,
            correlation_id=env.correlation_id,
            actor=env.actor,
            recorded_at=env.recorded_at,
        )
        await store.append(env.stream, [new], v)
        versions[env.stream] = v + 1
    return await store.read_all(1, 100_000)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cuts=st.lists(st.floats(0, 1), min_size=1, max_size=4),
    order=st.lists(st.integers(0, 7), max_size=200),
    at=st.floats(0, 1),
    retain=st.sampled_from([None, 0, 1, 1000]),
)
def test_a_start_from_a_snapshot_folds_what_a_full_fold_does(cuts, order, at, retain):
    runs = [r[: round(c * len(r))] for r, c in zip(_lifecycle_runs(), cuts, strict=False)]
    events = asyncio.run(_interleave(runs, order))
    p = round(at * len(events))
    _same(_from_snapshot(events, p, retain), _fold(events, retain))


def _agents():  # type: ignore[no-untyped-def]
    async def hang_first(t, i, c):  # type: ignore[no-untyped-def]
        if t.attempt == 1:
            await asyncio.sleep(3600)
        return TextOut(text=i.text.upper())

    async def flaky(t, i, c):  # type: ignore[no-untyped-def]
        if t.attempt == 1:
            raise RuntimeError("first attempt fails")
        return TextOut(text=i.text)

    return [
        make_agent("quick", "quick"),
        make_agent("stuck", "stuck", hang_first),
        make_agent("flaky", "flaky", flaky),
    ]


def _crash_plan():  # type: ignore[no-untyped-def]
    return plan(
        task("a", "quick", "a"),
        task("f", "flaky", "f"),
        task(
            "b", "stuck", deps=["a"], inputs={"text": {"$dep": "a", "path": "text"}}, timeout_s=30
        ),
        task("c", "quick", deps=["b"], inputs={"text": {"$dep": "b", "path": "text"}}),
        task("side", "quick", "side"),
    )


async def test_every_position_of_a_real_log_snapshots_to_the_same_state(db_path):
    """A real log (finished runs, a retry, a run cut by a crash): a snapshot at any
    position, and the events after it, give the full fold's state."""
    store = await SqliteEventStore.open(db_path, poll_interval=0.01)
    rt = await Runtime(store, _agents()).start()
    try:
        for name in ("x", "y"):
            assert (await rt.run(plan(task(name, "quick"), task("g", "flaky")))).status == (
                "completed"
            )
        root = await rt.orch.submit(_crash_plan())
        await wait_for(store, is_(ev.TaskStarted, tid(root, "b")))
    finally:
        rt.orch.snapshot_path = None
        await rt.stop()
    events = await store.read_all(1, 100_000)
    await store.close()
    for retain in (None, 0, 1000):
        full = _fold(events, retain)
        assert root in full.open
        for p in range(0, len(events) + 1):
            _same(_from_snapshot(events, p, retain), full)


def test_a_snapshot_covers_every_attribute_of_the_run_state():
    # a RunState attribute the snapshot does not carry would be lost on a restart
    attrs = set(vars(RunState(retain_finished=10)))
    assert attrs - snap.HANDLED - set(snap.EXTRAS) == set()


class _Reads:
    """Records where each ``read_all`` of a store began."""

    def __init__(self, store: SqliteEventStore) -> None:
        self.starts: list[int] = []
        real = store.read_all

        async def read_all(from_position: int = 0, limit: int = 1000) -> list[Envelope]:
            self.starts.append(from_position)
            return await real(from_position, limit)

        store.read_all = read_all  # type: ignore[method-assign]


@pytest.mark.parametrize("crash", [False, True])
async def test_restart_mid_run_from_a_snapshot_resumes_it(db_path, crash):
    """The recovery test's crash mid-run, restarted from a snapshot: written on a clean
    stop, or (crash) only the periodic one from before the crash, plus the log after it."""
    policy = dataclasses.replace(FAST, snapshot_every=1)
    store1 = await SqliteEventStore.open(db_path, poll_interval=0.01)
    rt1 = await Runtime(store1, _agents(), policy=policy).start()
    root = await rt1.orch.submit(_crash_plan())
    b = tid(root, "b")
    await wait_for(store1, is_(ev.TaskStarted, b))
    await wait_for(store1, is_(ev.TaskCompleted, tid(root, "f")))
    path = Path(f"{db_path}.snap")
    for _ in range(200):  # a periodic snapshot has been written
        if path.exists():
            break
        await asyncio.sleep(0.01)
    assert path.exists()
    if crash:  # what a crash leaves: the latest periodic snapshot, and the log after it
        rt1.orch.snapshot_path = None
        copy = path.read_bytes()
        # periodic snapshots keep up with the log: one more event, for the log after it
        await rt1.orch.register(make_agent("late", "late").card())
    await rt1.stop()
    await store1.close()
    if crash:
        path.write_bytes(copy)
    assert [card.attempt for card in CARDS["stuck"]] == [1]

    store2 = await SqliteEventStore.open(db_path, poll_interval=0.01)
    events = await store2.read_all(1, 100_000)
    loaded = await snap.load(path, store2)
    assert loaded is not None
    covered = loaded[0].position
    if crash:
        assert 0 < covered < len(events)
    else:
        assert covered == len(events)
    _same(_from_snapshot(events, covered, 1000), _fold(events, 1000))

    reads = _Reads(store2)
    rt2 = Runtime(store2, _agents(), policy=policy)
    # Attempt 1 of b died with rt1's agents: it times out at once on resume (host_lost).
    # Not by its deadline: a 0.3 s deadline passed on resume, but attempt 2 had to answer
    # within 0.3 s too, and under CPU load it did not (attempt 3: [1, 2, 3]).
    rt2.orch.attempts_survive_restart = False
    await rt2.start()
    assert rt2.orch.snapshot_position == covered
    # the event the snapshot names (to check it), then only what follows it
    assert reads.starts[:2] == [covered, covered + 1]
    try:
        r = await rt2.orch.wait(root, 5)
    finally:
        await rt2.stop()
    try:
        assert r.status == "completed"
        assert r.outputs["c"] == {"text": "A"}
        log = await run_log(store2, root)
        assert [d.attempt for d in log.of(ev.TaskDispatched, b)] == [1, 2]
        for name in ("a", "b", "c", "side", "f"):
            assert len(log.of(ev.TaskCompleted, tid(root, name))) == 1, name
        for name in ("a", "side"):  # finished before the crash: not redone
            assert len(log.of(ev.TaskDispatched, tid(root, name))) == 1
        assert len(log.of(ev.RunCompleted)) == 1
        assert await store2.verify() == []
    finally:
        await store2.close()


async def _logged_run(db_path: Path) -> None:
    store = await SqliteEventStore.open(db_path, poll_interval=0.01)
    rt = await Runtime(store, [make_agent("quick", "quick")]).start()
    root = await rt.orch.submit(plan(task("a", "quick")))
    await rt.orch.wait(root, 5)
    await rt.stop()
    await store.close()


@pytest.mark.parametrize("damage", ["other log", "cut short", "garbage", "other version"])
async def test_a_snapshot_that_does_not_match_the_log_is_rebuilt_from_it(db_path, damage):
    await _logged_run(db_path)
    path = Path(f"{db_path}.snap")
    good = path.read_bytes()
    store = await SqliteEventStore.open(db_path)
    n = await store.last_position()
    await store.close()
    if damage == "other log":  # the same length, other events: another log's snapshot
        other = db_path.with_name("other.db")
        await _logged_run(other)
        path.write_bytes(Path(f"{other}.snap").read_bytes())
    elif damage == "cut short":  # the snapshot names a position past the log's end
        body = msgspec.json.decode(good)
        body["position"] = n + 5
        path.write_bytes(msgspec.json.encode(body))
    elif damage == "garbage":
        path.write_bytes(good[: len(good) // 2])
    else:
        body = msgspec.json.decode(good)
        body["fingerprint"] = "0" * 64
        path.write_bytes(msgspec.json.encode(body))
    store = await SqliteEventStore.open(db_path)
    try:
        assert await snap.load(path, store) is None
        reads = _Reads(store)
        rt = Runtime(store, [make_agent("quick", "quick")])
        await rt.start()
        try:
            assert rt.orch.snapshot_position == 0
            assert reads.starts[0] == 1  # the whole log, folded again
            assert rt.orch.state.position >= n  # (and what the start registered)
        finally:
            await rt.stop()
        loaded = await snap.load(path, store)  # the stop wrote a good one again
        assert loaded is not None and loaded[0].position == await store.last_position()
    finally:
        await store.close()


async def test_a_log_hash_that_differs_at_the_position_refuses_the_snapshot(db_path):
    """The event at the position matches, but the log before it is another one."""
    await _logged_run(db_path)
    path = Path(f"{db_path}.snap")
    body = msgspec.json.decode(path.read_bytes())
    assert body["log_hash"] and len(body["log_hash"]) == 64
    body["log_hash"] = "f" * 64
    path.write_bytes(msgspec.json.encode(body))
    store = await SqliteEventStore.open(db_path)
    try:
        assert await snap.load(path, store) is None
        assert not path.exists()
    finally:
        await store.close()


def test_snapshot_every_is_checked():
    from cardbus.bus import Policy
    from cardbus.eventstore.errors import ConfigError

    with pytest.raises(ConfigError, match="snapshot_every"):
        Policy(snapshot_every=-1)


async def test_where_the_snapshot_lives(db_path):
    assert snap.snapshot_path_for(MemoryEventStore()) is None  # nowhere to keep one
    store = await SqliteEventStore.open(db_path)
    try:
        assert snap.snapshot_path_for(store) == Path(f"{db_path}.snap")
    finally:
        await store.close()


async def test_no_snapshot_covers_an_event_the_state_has_not_folded(db_path):
    """Another writer's event seen by the log follower but not folded yet (still queued
    for the decision loop): a snapshot must not be taken past it, even when an own
    append after it is folded (it would be lost on the next start)."""
    store = await SqliteEventStore.open(db_path, poll_interval=0.01)
    orch = Orchestrator(store, InProcessBus(), dataclasses.replace(FAST, snapshot_every=1))
    await orch.start()
    path = Path(f"{db_path}.snap")
    # the start's own events come back to the follower (it starts where the start's fold
    # ended), and a snapshot of them alone is fair: taken, then removed, so that the one
    # this test is about would show
    for _ in range(500):
        if orch._followed >= orch.state.position and orch._saving is None:
            break
        await asyncio.sleep(0.01)
    path.unlink(missing_ok=True)
    held: list[object] = []
    real = orch._queue.put_nowait

    def hold(item: object) -> None:  # the decision loop does not get to the log's news
        (held.append if isinstance(item, Envelope) else real)(item)

    orch._queue.put_nowait = hold  # type: ignore[method-assign]
    try:
        other = make_agent("other", "other").card()
        data = ev.AgentRegistered(agent_id="other", card=msgspec.to_builtins(other))
        [theirs] = await store.append(
            "agent-other", [NewEvent(data=data, correlation_id="agent-other", actor="cli")], 0
        )
        await orch.register(make_agent("quick", "quick").card())  # own, folded at once
        assert orch.state.position > theirs.position
        for _ in range(500):  # the follower sees both
            if orch._followed >= orch.state.position:
                break
            await asyncio.sleep(0.01)
        assert orch._followed >= orch.state.position and held
        await asyncio.sleep(0.05)
        assert not path.exists()  # nothing covers the unfolded event
        for item in held:
            real(item)
        orch._queue.put_nowait = real  # type: ignore[method-assign]
        for _ in range(500):
            if "other" in orch.state.agents:
                break
            await asyncio.sleep(0.01)
        await orch.register(make_agent("third", "third").card())
        loaded = None
        for _ in range(2000):  # the next own event, once the follower sees it, is covered
            # (a generous bound: the snapshot is written in the background, late on a busy box)
            loaded = await snap.load(path, store) if path.exists() else None
            if loaded is not None and "other" in loaded[1].agents:
                break
            await asyncio.sleep(0.01)
        assert loaded is not None and "other" in loaded[1].agents
    finally:
        await orch.stop()
        await store.close()


async def test_periodic_snapshots_are_written_while_runs_go_one_after_another(db_path):
    """Runs one after the other: the log follower is quicker than the appender (it sees
    each commit before the appender has folded it), so the moment when exactly the
    events up to the state's position are folded is found by the fold, not the
    follower. Each snapshot written then loads, checked against the log, and covers a
    position at least snapshot_every past the one before."""
    store = await SqliteEventStore.open(db_path, poll_interval=0.01)
    rt = await Runtime(
        store, [make_agent("echo")], policy=dataclasses.replace(FAST, snapshot_every=20)
    ).start()
    path = Path(f"{db_path}.snap")
    covered: list[int] = []
    try:
        for i in range(12):
            r = await rt.orch.run(
                plan(task("a", text=f"x{i}"), task("b", deps=["a"], text="y")), 30
            )
            assert r.status == "completed"
            for _ in range(100):  # written in the background
                if rt.orch._saving is None:
                    break
                await asyncio.sleep(0.01)
            if path.exists():
                loaded = await snap.load(path, store)
                assert loaded is not None  # it names a position, an event and a hash the log has
                if not covered or loaded[0].position != covered[-1]:
                    covered.append(loaded[0].position)
    finally:
        await rt.stop()
        await store.close()
    assert len(covered) >= 2, covered  # written as the runs went, not only on the stop
    assert all(b - a >= 20 for a, b in itertools.pairwise(covered))
