"""Schedules (issue 32 item 3): the cron parser, the pure "what is due" step, and the
loop of two members on one log driven by a fake clock: each due time fires once, missed
ones follow the catch-up policy, an overlap follows its policy, with the reason logged."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from cardbus.bus.orchestrator.cron import parse_cron, zone
from cardbus.bus.orchestrator.plan import Plan
from cardbus.bus.orchestrator.scheduler import (
    Scheduler,
    create_schedule,
    delete_schedule,
    list_schedules,
    pause_schedule,
    read_schedule,
    resume_schedule,
    trigger_schedule,
)
from cardbus.bus.orchestrator.schedules import next_step, plan_id_of, stream_of
from cardbus.eventstore import InvalidPlan, InvalidSchedule, NewEvent, StoreUnavailable
from cardbus.eventstore import events as ev
from cardbus.eventstore.memory import MemoryEventStore

PLAN = {"goal": "daily report"}
T0 = 1_800_000_000.0  # a fixed instant, far from now: the fake clock's start


def utc(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def iso(t: float, tz: str = "UTC") -> str:
    return datetime.fromtimestamp(t, zone(tz)).isoformat()


# -- cron -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "after", "expected"),
    [
        ("*/15 * * * *", "2026-03-02T10:07:30", "2026-03-02T10:15:00+00:00"),
        ("0 9-17/4 * * mon-fri", "2026-03-06T17:30:00", "2026-03-09T09:00:00+00:00"),
        ("30 2 1 jan,jul *", "2026-02-01T00:00:00", "2026-07-01T02:30:00+00:00"),
        ("0 0 29 2 *", "2026-03-01T00:00:00", "2028-02-29T00:00:00+00:00"),
        # both day fields restricted: either matches (the 13th, or a Friday)
        ("0 12 13 * 5", "2026-03-07T00:00:00", "2026-03-13T12:00:00+00:00"),
        ("0 12 13 * 5", "2026-03-13T13:00:00", "2026-03-20T12:00:00+00:00"),
        ("0 0 * * 7", "2026-03-02T00:00:00", "2026-03-08T00:00:00+00:00"),  # 7 = Sunday
    ],
)
def test_cron_next_due_time(expr: str, after: str, expected: str) -> None:
    assert iso(parse_cron(expr).next_after(utc(after), zone("UTC"))) == expected


def test_cron_reads_wall_clock_time_of_its_zone_across_dst() -> None:
    paris = zone("Europe/Paris")
    cron = parse_cron("0 9 * * *")
    # 09:00 in Paris is 08:00 UTC in winter, 07:00 UTC once summer time began (29 March)
    assert iso(cron.next_after(utc("2026-03-28T12:00:00"), paris)) == "2026-03-29T07:00:00+00:00"
    assert iso(cron.next_after(utc("2026-03-27T12:00:00"), paris)) == "2026-03-28T08:00:00+00:00"
    # 02:30 does not exist on 29 March in Paris: it runs at the shifted instant, once
    t = parse_cron("30 2 * * *").next_after(utc("2026-03-28T12:00:00"), paris)
    assert t > utc("2026-03-28T12:00:00") and iso(t, "Europe/Paris").startswith("2026-03-29")


@pytest.mark.parametrize(
    ("expr", "words"),
    [
        ("* * * *", "5 fields"),
        ("60 * * * *", "minute"),
        ("* 24 * * *", "hour"),
        ("* * 0 * *", "day-of-month"),
        ("* * * foo *", "month"),
        ("*/0 * * * *", "step"),
        ("5-1 * * * *", "minute"),
        ("0 0 31 2 *", "no time"),
    ],
)
def test_a_bad_cron_is_invalid_schedule_naming_the_field(expr: str, words: str) -> None:
    with pytest.raises(InvalidSchedule, match=words):
        parse_cron(expr).next_after(T0, zone("UTC"))


async def test_a_schedule_that_could_not_run_is_refused_before_it_is_written() -> None:
    store = MemoryEventStore()
    bad: list[dict[str, Any]] = [
        {},  # neither cron nor interval
        {"cron": "* * * * *", "interval_seconds": 5},
        {"interval_seconds": 0.1},
        {"interval_seconds": 5, "timezone": "Mars/Olympus"},
        {"interval_seconds": 5, "overlap": "sometimes"},
        {"interval_seconds": 5, "catchup": "most"},
    ]
    for kw in bad:
        with pytest.raises(InvalidSchedule):
            await create_schedule(store, PLAN, **kw)
    with pytest.raises(InvalidSchedule, match="plan"):
        await create_schedule(store, {"goal": "g", "nosuch": 1}, interval_seconds=5)
    assert await store.last_position() == 0


# -- the loop, on a fake clock ------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


class Runs:
    """The runtimes' submit: claims the plan id in the log (the same plan id runs once) and
    keeps the run open until ``end``."""

    def __init__(self, store: MemoryEventStore) -> None:
        self.store = store
        self.started: list[str] = []

    async def submit(self, plan: Plan) -> str:
        assert plan.plan_id and plan.schedule  # the run names its schedule
        root = f"root-{plan.plan_id}"
        claim = ev.PlanSubmitted(plan_id=plan.plan_id, root_id=root, plan_digest="d")
        await self.store.append(
            f"plan-{plan.plan_id}", [NewEvent(data=claim, correlation_id=root)], 0
        )
        self.started.append(plan.plan_id)
        return root

    async def end(self, plan_id: str) -> None:
        root = f"root-{plan_id}"
        await self.store.append(root, [NewEvent(data=ev.RunCompleted(), correlation_id=root)], 0)


async def events_of(store: MemoryEventStore, sid: str) -> list[ev.Event]:
    return [e.data for e in await store.read_stream(stream_of(sid))]


def fired(events: list[ev.Event]) -> list[ev.ScheduleFired]:
    return [e for e in events if isinstance(e, ev.ScheduleFired)]


def skipped(events: list[ev.Event]) -> list[ev.ScheduleSkipped]:
    return [e for e in events if isinstance(e, ev.ScheduleSkipped)]


async def test_two_members_fire_each_due_time_once() -> None:
    store, clock = MemoryEventStore(), Clock()
    runs = Runs(store)
    sid = await create_schedule(
        store, PLAN, interval_seconds=2, start=T0 + 2, overlap="allow_all", catchup="all"
    )
    a = Scheduler(store, runs.submit, "a", grace=1.0, clock=clock)
    b = Scheduler(store, runs.submit, "b", grace=1.0, clock=clock)
    for step in range(60):
        clock.now = T0 + step * 0.5
        # both look at the same instant, in either order: one writes, the other loses
        first, second = (a, b) if step % 3 else (b, a)
        await first.run_once()
        await second.run_once()
    dues = [f.due for f in fired(await events_of(store, sid))]
    assert dues == [T0 + 2 * k for k in range(1, 15)]  # every due time once, in order
    assert {f.member for f in fired(await events_of(store, sid))} == {"a", "b"}
    assert sorted(runs.started) == sorted(plan_id_of(sid, d) for d in dues)  # each run once


async def test_a_member_that_dies_after_firing_leaves_the_run_to_another() -> None:
    store, clock = MemoryEventStore(), Clock()
    runs = Runs(store)
    sid = await create_schedule(store, PLAN, interval_seconds=2, start=T0 + 2)

    async def dies(plan: Plan) -> str:
        raise StoreUnavailable("the process died before it submitted")  # its run not started

    a = Scheduler(store, dies, "a", grace=1.0, clock=clock)
    b = Scheduler(store, runs.submit, "b", grace=1.0, clock=clock)
    clock.now = T0 + 2
    await a.run_once()
    assert len(fired(await events_of(store, sid))) == 1 and runs.started == []
    clock.now = T0 + 2.5
    await b.run_once()  # not yet: the writer may be submitting
    assert runs.started == []
    clock.now = T0 + 3.5
    await b.run_once()
    assert runs.started == [plan_id_of(sid, T0 + 2)]
    assert len(fired(await events_of(store, sid))) == 1


@pytest.mark.parametrize(("catchup", "late_runs"), [("none", 0), ("one", 1), ("all", 4)])
async def test_missed_firings_after_downtime_follow_the_catch_up_policy(
    catchup: str, late_runs: int
) -> None:
    store, clock = MemoryEventStore(), Clock()
    runs = Runs(store)
    sid = await create_schedule(
        store, PLAN, interval_seconds=2, start=T0 + 2, catchup=catchup, overlap="allow_all"
    )
    s = Scheduler(store, runs.submit, "a", grace=1.0, clock=clock)
    clock.now = T0 + 2
    await s.run_once()
    clock.now = T0 + 12.5  # 10 s down: due times T0+4 .. T0+12 passed unseen
    await Scheduler(store, runs.submit, "a2", grace=1.0, clock=clock).run_once()
    events = await events_of(store, sid)
    late = [f for f in fired(events) if f.late]
    assert len(late) == late_runs
    if catchup == "one":
        assert late[0].due == T0 + 10  # the most recent missed one
    on_time = [f.due for f in fired(events) if not f.late]
    assert on_time == [T0 + 2, T0 + 12]  # T0+12 is 0.5 s old: within grace, on time
    missed = sum(
        1 if "due times" not in s.detail else int(s.detail.split()[0]) for s in skipped(events)
    )
    assert missed == 4 - late_runs and all(s.reason == "missed" for s in skipped(events))
    assert len(runs.started) == 2 + late_runs


async def test_skip_overlap_skips_while_the_previous_run_runs_and_says_why() -> None:
    store, clock = MemoryEventStore(), Clock()
    runs = Runs(store)
    sid = await create_schedule(store, PLAN, interval_seconds=2, start=T0 + 2, overlap="skip")
    s = Scheduler(store, runs.submit, "a", grace=1.0, clock=clock)
    for t in (2, 4, 6):
        clock.now = T0 + t
        await s.run_once()
    await runs.end(plan_id_of(sid, T0 + 2))
    clock.now = T0 + 8
    await s.run_once()
    events = await events_of(store, sid)
    assert [f.due for f in fired(events)] == [T0 + 2, T0 + 8]
    assert [(x.due, x.reason) for x in skipped(events)] == [
        (T0 + 4, "overlap"),
        (T0 + 6, "overlap"),
    ]
    assert all(plan_id_of(sid, T0 + 2) in x.detail for x in skipped(events))


async def test_buffer_one_runs_one_firing_when_the_running_one_ends() -> None:
    store, clock = MemoryEventStore(), Clock()
    runs = Runs(store)
    sid = await create_schedule(
        store, PLAN, interval_seconds=2, start=T0 + 2, overlap="buffer_one", catchup="all"
    )
    s = Scheduler(store, runs.submit, "a", grace=1.0, clock=clock)
    for t in (2, 4, 6):
        clock.now = T0 + t
        await s.run_once()
    clock.now = T0 + 7
    await runs.end(plan_id_of(sid, T0 + 2))
    await s.run_once()
    events = await events_of(store, sid)
    assert [(f.due, f.late) for f in fired(events)] == [(T0 + 2, False), (T0 + 4, True)]
    assert [e.due for e in events if isinstance(e, ev.ScheduleBuffered)] == [T0 + 4]
    assert [(x.due, x.reason) for x in skipped(events)] == [(T0 + 6, "overlap")]


async def test_pause_resume_trigger_delete_are_events_of_its_stream() -> None:
    store, clock = MemoryEventStore(), Clock()
    runs = Runs(store)
    clock.now = time.time()  # the log's own clock: no due time between its events
    sid = await create_schedule(store, PLAN, cron="0 0 1 1 *", actor="ops")
    assert [s.schedule_id for s in await list_schedules(store)] == [sid]
    await pause_schedule(store, sid, reason="holiday", actor="ops")
    state = await read_schedule(store, sid)
    assert state.paused
    assert (
        next_step(state, clock.now + 2 * 365 * 86_400, running=False, grace=10) is None
    )  # paused: nothing due
    await resume_schedule(store, sid, actor="ops")
    plan_id = await trigger_schedule(store, sid, actor="ops")
    s = Scheduler(store, runs.submit, "a", grace=1.0, clock=clock)
    await s.run_once()  # a manual firing is started by any member at once
    assert runs.started == [plan_id]
    await delete_schedule(store, sid, actor="ops")
    assert await list_schedules(store) == []
    with pytest.raises(InvalidSchedule, match="deleted"):
        await pause_schedule(store, sid)
    types = [e.type for e in await store.read_stream(stream_of(sid))]
    assert types == [
        "schedule.created.v1",
        "schedule.paused.v1",
        "schedule.resumed.v1",
        "schedule.fired.v1",
        "schedule.deleted.v1",
    ]
    assert {e.actor for e in await store.read_stream(stream_of(sid))} == {"ops"}


def test_jitter_delays_a_firing_by_the_same_amount_everywhere() -> None:
    from cardbus.bus.orchestrator.schedules import jitter_of

    values = [jitter_of("s", T0 + k, 5.0) for k in range(50)]
    assert all(0 <= v < 5 for v in values) and len(set(values)) > 40
    assert values == [jitter_of("s", T0 + k, 5.0) for k in range(50)]
    assert jitter_of("s", T0, 0) == 0


async def test_a_firing_whose_run_is_refused_holds_up_no_later_one() -> None:
    store, clock = MemoryEventStore(), Clock()
    sid = await create_schedule(store, PLAN, interval_seconds=2, start=T0 + 2, overlap="skip")
    tries: list[str] = []

    async def refused(plan: Plan) -> str:
        tries.append(str(plan.plan_id))
        raise InvalidPlan("no agent offers the plan's capability")

    s = Scheduler(store, refused, "a", grace=1.0, clock=clock)
    for t in (2, 3, 4, 5, 6):
        clock.now = T0 + t
        await s.run_once()
    events = await events_of(store, sid)
    # each refusal is in the log, and the next due time fires: nothing is left running
    assert [f.due for f in fired(events)] == [T0 + 2, T0 + 4, T0 + 6]
    assert [(x.due, x.reason) for x in skipped(events)] == [
        (T0 + 2, "refused"),
        (T0 + 4, "refused"),
        (T0 + 6, "refused"),
    ]
    assert "no agent offers" in skipped(events)[0].detail
    assert tries == [plan_id_of(sid, T0 + t) for t in (2, 4, 6)]  # each tried once


# -- the loop at rest: it sleeps until a due time or a schedule's event -----------------


class Counted:
    """A store counting the scheduler's calls to it (its reads and appends)."""

    def __init__(self, store: MemoryEventStore) -> None:
        self.store, self.calls = store, 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.store, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return attr(*args, **kwargs)

        return counted


async def until(condition: Any, timeout: float = 30.0) -> None:
    """Wait for ``condition()`` (a condition on state, not a sleep to hope by)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not condition():
        assert loop.time() < end, "timed out waiting"
        await asyncio.sleep(0.01)


async def test_an_idle_scheduler_sleeps_until_a_due_time_or_an_event() -> None:
    store = MemoryEventStore()
    runs = Runs(store)
    counted = Counted(store)
    s = Scheduler(counted, runs.submit, "a", sweep=3600)  # type: ignore[arg-type]
    s.follows_log = True  # what it is told of comes through observe, as in a runtime
    await s.start()
    try:
        await until(lambda: s._read_once)
        await asyncio.sleep(0.3)  # no schedule: it looks at nothing
        at_rest = counted.calls
        later = await create_schedule(store, PLAN, interval_seconds=3600, start=time.time() + 900)
        for env in await store.read_stream(stream_of(later)):
            s.observe(env)  # the orchestrator passes it every event it folds
        await until(lambda: later in s._due)
        looked = counted.calls
        assert looked > at_rest  # the new schedule was looked at once
        await asyncio.sleep(0.3)  # its due time is 15 minutes away: no look meanwhile
        assert counted.calls == looked
        # a due time a moment away fires with no event: the loop woke for it
        soon = await create_schedule(
            store, PLAN, interval_seconds=3600, start=time.time() + 0.3, catchup="all"
        )
        for env in await store.read_stream(stream_of(soon)):
            s.observe(env)
        await until(lambda: len(runs.started) == 1)
        assert [f.plan_id for f in fired(await events_of(store, soon))] == runs.started
        # a manual trigger (another process's write) wakes it at once: its run starts
        plan_id = await trigger_schedule(store, later, actor="ops")
        for env in (await store.read_stream(stream_of(later)))[-1:]:
            s.observe(env)
        await until(lambda: plan_id in runs.started)
    finally:
        await s.stop()
    assert s._task is None
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("scheduler-")]


class SwallowsCancel:
    """A store whose ``read_all`` turns a cancel into an empty answer, as a NATS read does
    (it returns what it has when cancelled); ``reading`` is set once a read waits."""

    def __init__(self, store: MemoryEventStore) -> None:
        self.store = store
        self.reading = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def read_all(self, position: int = 1, limit: int | None = None) -> list[Any]:
        self.reading.set()
        try:
            await asyncio.Event().wait()  # a read that takes its time
        except asyncio.CancelledError:
            return []
        raise AssertionError("unreachable")


async def test_a_stop_whose_cancel_a_read_swallowed_does_not_wait_for_the_next_sweep() -> None:
    """Stopped while its first look reads (a runtime closed just after it started): the
    read swallows the cancel, and the loop goes on to wait for its next turn, a whole
    ``sweep`` away (30 s by default: every NatsRuntime closed that soon took 30 s). The
    stop is honoured before that wait."""
    store = SwallowsCancel(MemoryEventStore())
    s = Scheduler(store, Runs(store.store).submit, "a", sweep=3600)  # type: ignore[arg-type]
    await s.start()
    await store.reading.wait()
    # (bounded only so that the bug fails the test rather than hang it for the sweep)
    await asyncio.wait_for(s.stop(), 60)
    assert s._task is None
