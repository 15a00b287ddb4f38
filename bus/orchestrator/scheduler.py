"""Schedules at work: the operations that write a schedule's life to the log, and the
``Scheduler`` loop every orchestrator process runs (the embedded runtime, each NATS member).

The loop is thin: it folds each live schedule's stream, asks ``schedules.next_step`` what
is due now, and writes that step with the stream's expected version. Between two looks it
sleeps: until the next due time (``schedules.next_due_at``), or until the orchestrator
folds a ``schedule.*`` event (``Scheduler.observe``: a new schedule, a pause, a manual
trigger, another member's firing) or the end of a run a buffered firing waits for. An
idle runtime's scheduler makes no call at all but one look every ``sweep``.

A ``ConcurrencyError`` means another member wrote first: the
loop reads the stream again and goes on from what it says, so each due time fires once
across members and restarts. The member whose firing was written submits its run (plan
id ``<schedule>@<due>``: the same plan id runs once); a firing whose run no member
submitted (its writer died in between, or a manual trigger from the command line) is
submitted by any member that finds it so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import msgspec

from cardbus.bus.orchestrator.plan import Plan
from cardbus.bus.orchestrator.schedules import (
    ScheduleState,
    check_spec,
    fold,
    next_due_at,
    next_step,
    stream_of,
)
from cardbus.eventstore import ConcurrencyError, Envelope, EventStore, NewEvent, new_id
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import (
    CardbusError,
    InvalidSchedule,
    StreamNotFound,
    ValidationError,
)

__all__ = [
    "Scheduler",
    "create_schedule",
    "delete_schedule",
    "list_schedules",
    "pause_schedule",
    "read_schedule",
    "resume_schedule",
    "schedule_summary",
    "trigger_schedule",
]

log = logging.getLogger(__name__)

Submit = Callable[[Plan], Awaitable[str]]
_ENDED = ("run.completed.v1", "run.failed.v1", "run.halted.v1")
_RUN_ENDS = (ev.RunCompleted, ev.RunFailed, ev.RunHalted)
_SCHEDULE_EVENTS = (
    ev.ScheduleCreated,
    ev.SchedulePaused,
    ev.ScheduleResumed,
    ev.ScheduleDeleted,
    ev.ScheduleFired,
    ev.ScheduleSkipped,
    ev.ScheduleBuffered,
)


async def create_schedule(
    store: EventStore,
    plan: Plan | dict[str, Any],
    *,
    cron: str = "",
    interval_seconds: float = 0.0,
    start: float | None = None,
    timezone: str = "UTC",
    overlap: str = "skip",
    catchup: str = "one",
    catchup_window_seconds: float = 3600.0,
    jitter_seconds: float = 0.0,
    schedule_id: str | None = None,
    actor: str = "",
) -> str:
    """Write a new schedule of ``plan`` (a Plan or its JSON form; a goal alone is planned
    at each firing); its id. ``InvalidSchedule`` before anything is written when it could
    not run (see ``schedules.check_spec``)."""
    body = msgspec.to_builtins(plan) if isinstance(plan, Plan) else dict(plan)
    try:
        msgspec.convert(body, Plan)
    except msgspec.ValidationError as e:
        raise InvalidSchedule(f"the schedule's plan: {e}") from e
    sid = schedule_id or new_id()
    spec = ev.ScheduleCreated(
        schedule_id=sid,
        plan=body,
        cron=cron,
        interval_seconds=interval_seconds,
        start=time.time() if start is None else start,
        timezone=timezone,
        overlap=overlap,
        catchup=catchup,
        catchup_window_seconds=catchup_window_seconds,
        jitter_seconds=jitter_seconds,
    )
    check_spec(spec)
    try:
        await _write(store, sid, spec, 0, actor)
    except ConcurrencyError as e:
        raise InvalidSchedule(f"schedule {sid!r} exists already") from e
    return sid


async def read_schedule(store: EventStore, schedule_id: str) -> ScheduleState:
    """The schedule's state from the log; ``StreamNotFound`` if there is none."""
    state = fold(await store.read_stream(stream_of(schedule_id)))
    if state is None:
        raise StreamNotFound(f"no schedule {schedule_id!r}")
    return state


async def list_schedules(store: EventStore, deleted: bool = False) -> list[ScheduleState]:
    """Every schedule in the log (the deleted ones too with ``deleted``), oldest first."""
    ids: list[str] = []
    position = 0
    while batch := await store.read_all(position + 1, 5000):
        ids += [e.data.schedule_id for e in batch if isinstance(e.data, ev.ScheduleCreated)]
        position = batch[-1].position
    states = [await read_schedule(store, i) for i in dict.fromkeys(ids)]
    return [s for s in states if deleted or not s.deleted]


async def pause_schedule(
    store: EventStore, schedule_id: str, reason: str = "", actor: str = ""
) -> None:
    """The schedule fires no more until resumed."""
    await _change(store, schedule_id, ev.SchedulePaused(reason=reason), actor)


async def resume_schedule(store: EventStore, schedule_id: str, actor: str = "") -> None:
    """The schedule fires again (what was due while paused is not caught up)."""
    await _change(store, schedule_id, ev.ScheduleResumed(), actor)


async def delete_schedule(store: EventStore, schedule_id: str, actor: str = "") -> None:
    """The schedule never fires again (its events stay in the log)."""
    await _change(store, schedule_id, ev.ScheduleDeleted(), actor)


async def trigger_schedule(store: EventStore, schedule_id: str, actor: str = "") -> str:
    """Fire the schedule now, by hand (its due times are untouched); the plan id of the
    run, which a running orchestrator starts."""
    now = time.time()
    fired = ev.ScheduleFired(
        due=now, plan_id=f"{schedule_id}@manual-{new_id()}", manual=True, member=actor
    )
    await _change(store, schedule_id, fired, actor)
    return fired.plan_id


def schedule_summary(s: ScheduleState) -> dict[str, Any]:
    """What ``cardbus schedule list --json`` and the console show of a schedule."""
    spec = s.spec
    last = s.firings[-1] if s.firings else None
    return {
        "schedule_id": s.schedule_id,
        "goal": spec.plan.get("goal", ""),
        "when": spec.cron or f"every {spec.interval_seconds:g}s",
        "timezone": spec.timezone,
        "overlap": spec.overlap,
        "catchup": spec.catchup,
        "state": "deleted" if s.deleted else "paused" if s.paused else "active",
        "firings": len(s.firings),
        "last_plan_id": last.plan_id if last else "",
        "last_fired": _iso(last.due) if last else "",
    }


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")


async def _change(store: EventStore, schedule_id: str, data: ev.Event, actor: str) -> None:
    attempt = 0
    while True:  # a firing written meanwhile: read again, then write after it
        state = await read_schedule(store, schedule_id)
        if state.deleted:
            raise InvalidSchedule(f"schedule {schedule_id!r} is deleted")
        try:
            await _write(store, schedule_id, data, state.version, actor)
            return
        except ConcurrencyError:
            attempt += 1
            if attempt == 5:  # a schedule firing faster than it can be changed
                raise


async def _write(
    store: EventStore, schedule_id: str, data: ev.Event, version: int, actor: str
) -> None:
    new = NewEvent(data=data, correlation_id=stream_of(schedule_id), actor=actor)
    await store.append(stream_of(schedule_id), [new], version)


class Scheduler:
    """The loop of one orchestrator process: fires what is due, once across members.

    It sleeps until the next due time of the schedules it knows, or until the log says
    something it must look at: ``observe`` is given every event the process folds (the
    runtime adds it to the orchestrator's observers), and wakes it for a ``schedule.*``
    event (created, paused, triggered, another member's firing) and for the end of a run
    a buffered firing waits for. Idle, it costs nothing but a look every ``sweep``.

    ``submit`` starts a firing's run (the runtime's own submit); ``member``: who fires
    (the actor of its events); ``grace``: how late a due time may fire and still be on
    time (later: a missed one, under the catch-up policy); ``tick``: how often a
    buffered firing looks whether the run it waits for has ended, when that end may not
    be observed (a partitioned member does not fold every run); ``sweep``: the longest
    sleep; each one ends with a look at every schedule, and, where ``observe`` is not
    given the whole log (``follows_log`` False), a read of the log's new events;
    ``clock``: epoch seconds (a test passes its own).
    """

    def __init__(
        self,
        store: EventStore,
        submit: Submit,
        member: str,
        grace: float = 10.0,
        tick: float = 0.25,
        sweep: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store, self.submit, self.member = store, submit, member
        self.grace, self.tick, self.sweep, self.clock = grace, tick, sweep, clock
        # True when ``observe`` is given every event of the log (the orchestrator follows
        # all of it); then the loop never reads the log after its first look
        self.follows_log = False
        self.states: dict[str, ScheduleState] = {}
        self._position = 0  # how far the log was read for schedule events
        self._read_once = False  # the log was read to its end once
        self._task: asyncio.Task[None] | None = None
        self._tried: set[str] = set()  # the plan ids this process submitted (or tried to)
        self._started: set[str] = set()  # plan ids whose run was found started
        self._due: dict[str, float] = {}  # schedule -> when it next needs a look
        self._touched: set[str] = set()  # schedules whose stream changed since the look
        self._watch: dict[str, str] = {}  # the root of a run a buffered firing waits for
        self._wake = asyncio.Event()
        self._stopping = False  # set by stop: the loop ends at its next step

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=f"scheduler-{self.member}")

    async def stop(self) -> None:
        """Stop the loop and wait for it (an outer cancel still goes through)."""
        task, self._task = self._task, None
        if task is None:
            return
        # a flag as well as the cancel: a store call may swallow the cancel, or a timeout
        # inside it take it for its own (``cancelling()`` back to 0 under load), and the
        # loop would then wait a whole ``sweep`` (30 s) before it looked again
        self._stopping = True
        self._wake.set()
        task.cancel()
        await asyncio.wait([task])
        if not task.cancelled() and task.exception() is not None:
            log.error("scheduler %s ended: %r", self.member, task.exception())

    def observe(self, env: Envelope) -> None:
        """An event the process folded: a look at its schedule soon, if it says something
        new (this loop's own writes come back here too, and change nothing)."""
        data = env.data
        if isinstance(data, _SCHEDULE_EVENTS):
            sid = env.stream.removeprefix("schedule-")
            known = self.states.get(sid)
            if known is not None and env.version <= known.version:
                return
            self._touched.add(sid)
            self._wake.set()
        elif isinstance(data, _RUN_ENDS) and env.stream in self._watch:
            self._touched.add(self._watch.pop(env.stream))
            self._wake.set()

    async def _loop(self) -> None:
        swept = -math.inf  # (monotonic) the latest look at everything
        me = asyncio.current_task()
        while True:
            # A stop's cancel that a store call swallowed (a NATS read returns what it has
            # when cancelled) is still pending on the task: honoured here, or the loop
            # waits on and keeps its runtime from closing
            if self._stopping or (me is not None and me.cancelling()):
                raise asyncio.CancelledError
            try:
                if time.monotonic() - swept >= self.sweep:
                    swept = time.monotonic()
                    if self.follows_log and self._read_once:
                        await self._look(set(self.states) | self._take_touched())
                    else:
                        await self.run_once()
                else:
                    now = self.clock()
                    due = {sid for sid, at in self._due.items() if at <= now}
                    await self._look(due | self._take_touched())
            except Exception as e:  # the log unreachable for a moment (or a bug): look again
                if me is not None and me.cancelling():
                    # stopped while a store call turned the cancel into its own error (a
                    # NATS read does): looking again would keep the runtime from closing
                    raise asyncio.CancelledError from e
                if isinstance(e, CardbusError):
                    log.warning("scheduler %s: %s", self.member, e)
                else:  # not to end the loop: this process would fire nothing any more
                    log.exception("scheduler %s failed a look", self.member)
                swept = -math.inf
                await asyncio.sleep(min(self.sweep, 1.0))
                continue
            delay = min(self._due.values(), default=math.inf) - self.clock()
            delay = max(0.0, min(delay, self.sweep - (time.monotonic() - swept)))
            if self._stopping or (me is not None and me.cancelling()):
                # a stop's cancel swallowed by this turn's look: honoured before the wait,
                # which may last a whole ``sweep`` (a runtime closed just after it started
                # took 30 s to close)
                raise asyncio.CancelledError
            if not self._wake.is_set():
                # 1 ms more: the loop's timers may end a little early (then nothing is due)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay + 0.001)

    def _take_touched(self) -> set[str]:
        self._wake.clear()
        touched, self._touched = self._touched, set()
        return touched

    async def run_once(self) -> None:
        """One look at everything: new schedule events read from the log, every live
        schedule's due steps written. (The loop starts with it and sweeps with it; a
        test drives it with its own clock.)"""
        while batch := await self.store.read_all(self._position + 1, 1000):
            for env in batch:
                if isinstance(env.data, ev.ScheduleCreated):
                    self.states.setdefault(env.data.schedule_id, await self._read(env.stream))
            self._position = batch[-1].position
        self._read_once = True
        await self._look(set(self.states) | self._take_touched())

    async def _look(self, sids: set[str]) -> None:
        for sid in sids:
            await self._advance(sid)

    async def _read(self, stream: str) -> ScheduleState:
        state = fold(await self.store.read_stream(stream))
        assert state is not None  # read because its schedule.created was seen
        return state

    async def _advance(self, sid: str) -> None:
        folded = fold(await self.store.read_stream(stream_of(sid)))
        if folded is None or folded.deleted:  # gone, or an event of no schedule
            self.states.pop(sid, None)
            self._due.pop(sid, None)
            return
        state = self.states[sid] = folded
        await self._submit_unstarted(state)
        running, wrote = False, False
        for _ in range(100):  # each step re-folds; a long downtime skips in batches
            running = await self._running(state)
            step = next_step(state, self.clock(), running, self.grace)
            if step is None:
                break
            if isinstance(step, ev.ScheduleFired):
                step = msgspec.structs.replace(step, member=self.member)
            try:
                await _write(self.store, sid, step, state.version, self.member)
            except ConcurrencyError:  # another member wrote first: go on from what it wrote
                state = self.states[sid] = await self._read(stream_of(sid))
                continue
            wrote = True
            state = self.states[sid] = await self._read(stream_of(sid))
            if isinstance(step, ev.ScheduleFired):
                await self._start_run(state, step)
        at = self._next_look(state, running)
        if at <= self.clock() and not wrote:  # due, yet nothing to write: never a busy loop
            at = self.clock() + self.tick
        self._due[sid] = at

    def _next_look(self, state: ScheduleState, running: bool) -> float:
        """When the schedule needs a look again: its next due time, the grace's end of
        another member's firing whose run may not start, or (a buffered firing behind a
        running run) a ``tick`` from now."""
        try:
            at = next_due_at(state)
        except InvalidSchedule as e:  # a cron that matches no time: nothing is ever due
            log.warning("schedule %s: %s", state.schedule_id, e)
            at = None
        times = [math.inf if at is None else at]
        if state.buffered is not None and not (state.deleted or state.paused):
            times.append(self.clock() + self.tick if running else self.clock())
        for fired in state.firings[-3:]:
            if self._may_submit(fired):
                times.append(fired.due + self.grace if not fired.manual else self.clock())
        return min(times)

    def _may_submit(self, fired: ev.ScheduleFired) -> bool:
        """A firing whose run this member may have to start (another member's, or a
        manual one) and has not found started nor tried."""
        if fired.member == self.member and not fired.manual:
            return False
        return fired.plan_id not in self._tried and fired.plan_id not in self._started

    async def _running(self, state: ScheduleState) -> bool:
        """The run of the last firing has not ended (or is not started yet)."""
        if not state.last_plan_id or state.spec.overlap == "allow_all":
            return False
        if state.last_plan_id in state.refused:  # its run never started
            return False
        claim = await self.store.read_stream(f"plan-{state.last_plan_id}")
        if not claim or not isinstance(claim[0].data, ev.PlanSubmitted):
            # fired, its run about to start; after the grace, a run that never started
            # (its plan refused: no agent for it now) holds up no later firing
            last = state.firings[-1] if state.firings else None
            return last is not None and self.clock() - last.due < 2 * self.grace
        root = claim[0].data.root_id
        stream = await self.store.read_stream(root, max(1, await self.store.stream_version(root)))
        running = not (stream and stream[-1].type in _ENDED)
        if running:  # its end (folded here) wakes the loop: a buffered firing may go
            self._watch[root] = state.schedule_id
        else:
            self._watch.pop(root, None)
        return running

    async def _submit_unstarted(self, state: ScheduleState) -> None:
        """Firings whose run nobody started: another member's after ``grace`` (it died
        between the two), a manual trigger's at once."""
        now = self.clock()
        for fired in state.firings[-3:]:
            # not one this member tried (refused once here: not again at each look)
            if not self._may_submit(fired):
                continue
            if not fired.manual and now - fired.due < self.grace:
                continue
            if await self.store.read_stream(f"plan-{fired.plan_id}"):
                self._started.add(fired.plan_id)  # not read again at each look
            else:
                await self._start_run(state, fired)

    async def _refused(self, sid: str, fired: ev.ScheduleFired, why: str) -> None:
        """``schedule.skipped`` (reason ``refused``) for a firing whose run was refused,
        once: a member that finds it written already writes nothing."""
        refused = ev.ScheduleSkipped(
            due=fired.due, reason="refused", detail=why[:2000], plan_id=fired.plan_id
        )
        for _ in range(3):
            state = await self._read(stream_of(sid))
            if fired.plan_id in state.refused:
                return
            try:
                await _write(self.store, sid, refused, state.version, self.member)
                return
            except ConcurrencyError:
                continue

    async def _start_run(self, state: ScheduleState, fired: ev.ScheduleFired) -> None:
        plan = msgspec.convert(
            {**state.spec.plan, "plan_id": fired.plan_id, "schedule": state.schedule_id}, Plan
        )
        self._tried.add(fired.plan_id)
        try:
            await self.submit(plan)
        except ValidationError as e:  # the plan refused (no agent for it now): said in the log
            log.warning("schedule %s: run %s refused: %s", state.schedule_id, fired.plan_id, e)
            await self._refused(state.schedule_id, fired, str(e))
        except CardbusError as e:  # another member started it meanwhile, or it is refused
            log.warning("schedule %s: run %s not started: %s", state.schedule_id, fired.plan_id, e)
