"""Schedules, pure: a schedule's state folded from its stream (``schedule-<id>``), its due
times, and the one next step due at a given instant. No I/O and no clock: the loop that
writes the steps (``bus.orchestrator.scheduler``) passes ``now``, so a test drives it with
a fake clock.

A step is one event for the schedule's stream: ``schedule.fired`` (a run starts),
``schedule.skipped`` (with the reason) or ``schedule.buffered``. The loop writes it with
the stream's expected version, so of several members that find the same step due the
first writer wins and the others fold what it wrote: exactly once per due time comes
from the log's optimistic concurrency, not from a lock.

Due times are handled in order. One is *missed* when it is more than ``grace`` seconds
old (every member was down, or the schedule was busy catching up): the catch-up policy
says which missed ones run (``none``, the most recent ``one``, or ``all``), and none older
than the catch-up window does. A due time that comes while the previous firing's run is
still running follows the overlap policy: ``skip`` it, ``buffer_one`` (run it when the
running one ends; later ones meanwhile are skipped) or ``allow_all``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from cardbus.bus.orchestrator.cron import parse_cron, zone
from cardbus.eventstore import Envelope
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import InvalidSchedule

__all__ = [
    "CATCHUP",
    "OVERLAP",
    "ScheduleState",
    "check_spec",
    "due_times",
    "fold",
    "jitter_of",
    "next_due_at",
    "next_step",
    "plan_id_of",
    "stream_of",
]

OVERLAP = ("skip", "buffer_one", "allow_all")
CATCHUP = ("none", "one", "all")
_MAX_DUE = 10_000  # due times looked at in one step (a long downtime skips in batches)


def stream_of(schedule_id: str) -> str:
    return f"schedule-{schedule_id}"


def plan_id_of(schedule_id: str, due: float) -> str:
    """The plan id of the firing for ``due``: the same on every member, so a run is
    submitted once however many members submit it (the same plan id runs once)."""
    return f"{schedule_id}@{due:.3f}"


def check_spec(spec: ev.ScheduleCreated) -> None:
    """``InvalidSchedule`` for a schedule that could never run as meant."""
    if bool(spec.cron) == (spec.interval_seconds > 0):
        raise InvalidSchedule("a schedule needs a cron expression or an interval, not both")
    if spec.cron:
        parse_cron(spec.cron)
    elif spec.interval_seconds < 0.5:
        raise InvalidSchedule(f"interval {spec.interval_seconds}s: at least 0.5 s")
    zone(spec.timezone)
    if spec.overlap not in OVERLAP:
        raise InvalidSchedule(f"overlap {spec.overlap!r}: one of {', '.join(OVERLAP)}")
    if spec.catchup not in CATCHUP:
        raise InvalidSchedule(f"catch-up {spec.catchup!r}: one of {', '.join(CATCHUP)}")
    if spec.catchup_window_seconds < 0 or spec.jitter_seconds < 0:
        raise InvalidSchedule("the catch-up window and the jitter are not negative")
    if not spec.plan.get("goal"):
        raise InvalidSchedule("a schedule's plan needs a goal")


def jitter_of(schedule_id: str, due: float, jitter: float) -> float:
    """The delay of the firing for ``due`` in ``[0, jitter)``: a hash, the same everywhere."""
    if jitter <= 0:
        return 0.0
    h = hashlib.sha256(f"{schedule_id}@{due:.3f}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64 * jitter


def due_times(spec: ev.ScheduleCreated, after: float, until: float) -> list[float]:
    """The due times in ``(after, until]`` (at most ``_MAX_DUE``), in order."""
    out: list[float] = []
    if spec.interval_seconds > 0:
        k = max(0, int((after - spec.start) // spec.interval_seconds))
        while len(out) < _MAX_DUE:
            t = spec.start + k * spec.interval_seconds
            if t > until:
                break
            if t > after:
                out.append(t)
            k += 1
        return out
    cron, tz = parse_cron(spec.cron), zone(spec.timezone)
    t = after
    while len(out) < _MAX_DUE:
        t = cron.next_after(t, tz)
        if t > until:
            break
        out.append(t)
    return out


def first_due_after(spec: ev.ScheduleCreated, after: float) -> float:
    """The first due time strictly after ``after``."""
    if spec.interval_seconds > 0:
        k = max(0, int((after - spec.start) // spec.interval_seconds))
        while (t := spec.start + k * spec.interval_seconds) <= after:
            k += 1
        return t
    return parse_cron(spec.cron).next_after(after, zone(spec.timezone))


@dataclass
class ScheduleState:
    """What the stream of one schedule says (``fold``)."""

    schedule_id: str
    spec: ev.ScheduleCreated
    version: int = 0
    paused: bool = False
    deleted: bool = False
    handled: float = 0.0  # due times up to it are handled (fired, skipped, buffered)
    buffered: float | None = None  # a due time waiting for the running run to end
    last_plan_id: str = ""  # the run of the last firing (what an overlap waits for)
    firings: list[ev.ScheduleFired] = field(default_factory=list)
    refused: set[str] = field(default_factory=set)  # plan ids of firings whose run was refused


def fold(events: Sequence[Envelope]) -> ScheduleState | None:
    """The state of a schedule from its stream's events (None: no ``schedule.created``)."""
    state: ScheduleState | None = None
    for env in events:
        match env.data:
            case ev.ScheduleCreated() as spec:
                # due times before its creation are not missed ones; an interval's first
                # firing is at ``start`` when that is later
                handled = env.recorded_at
                if spec.interval_seconds > 0:
                    handled = max(handled, spec.start - spec.interval_seconds / 2)
                state = ScheduleState(spec.schedule_id, spec, handled=handled)
            case _ if state is None:
                continue
            case ev.SchedulePaused():
                state.paused = True
            case ev.ScheduleResumed():
                # due times while it was paused are not caught up
                state.paused, state.handled = False, max(state.handled, env.recorded_at)
            case ev.ScheduleDeleted():
                state.deleted = True
            case ev.ScheduleFired(due=due, manual=manual) as fired:
                state.firings.append(fired)
                state.last_plan_id = fired.plan_id
                if not manual:
                    state.handled = max(state.handled, due)
                    if state.buffered == due:
                        state.buffered = None
            case ev.ScheduleSkipped(due=due, reason=reason, plan_id=plan_id):
                state.handled = max(state.handled, due)
                if reason == "refused":
                    state.refused.add(plan_id)
            case ev.ScheduleBuffered(due=due):
                state.buffered, state.handled = due, max(state.handled, due)
        state.version = env.version
    return state


def next_due_at(state: ScheduleState) -> float | None:
    """The first moment ``next_step`` may have a step to write (None: never, until the
    stream changes): the first due time not handled yet, with its jitter. A loop sleeps
    until then. A firing ``buffered`` behind a running run is due when that run ends,
    which no time says: the loop looks at it on the run's end."""
    if state.deleted or state.paused:
        return None
    due = first_due_after(state.spec, state.handled)
    return due + jitter_of(state.schedule_id, due, state.spec.jitter_seconds)


def next_step(
    state: ScheduleState, now: float, running: bool, grace: float
) -> ev.ScheduleFired | ev.ScheduleSkipped | ev.ScheduleBuffered | None:
    """The next event of the schedule at ``now`` (None: nothing is due). ``running``: the
    run of its last firing has not ended; ``grace``: how late a due time may be handled
    and still be on time."""
    if state.deleted or state.paused:
        return None
    sid, spec = state.schedule_id, state.spec
    if state.buffered is not None and not running:
        return ev.ScheduleFired(
            due=state.buffered, plan_id=plan_id_of(sid, state.buffered), late=True
        )
    dues = [
        d
        for d in due_times(spec, state.handled, now)
        if d + jitter_of(sid, d, spec.jitter_seconds) <= now
    ]
    if not dues:
        return None
    due = dues[0]
    missed = [d for d in dues if now - d > grace]
    if due in missed:
        window = [d for d in missed if now - d <= spec.catchup_window_seconds]
        if due not in window:
            old = [d for d in missed if d not in window]
            return _skipped(old, "missed", "older than the catch-up window")
        if spec.catchup == "none":
            return _skipped(missed, "missed", "catch-up none")
        if spec.catchup == "one" and len(missed) > 1:
            return _skipped(missed[:-1], "missed", "catch-up one: the latest missed one runs")
    if running and spec.overlap != "allow_all":
        if spec.overlap == "buffer_one" and state.buffered is None:
            return ev.ScheduleBuffered(due=due, plan_id=state.last_plan_id)
        detail = f"the run of {state.last_plan_id} is still running"
        if spec.overlap == "buffer_one":
            detail += " and one firing is buffered"
        return ev.ScheduleSkipped(
            due=due, reason="overlap", detail=detail, plan_id=state.last_plan_id
        )
    return ev.ScheduleFired(due=due, plan_id=plan_id_of(sid, due), late=due in missed)


def _skipped(dues: list[float], reason: str, detail: str) -> ev.ScheduleSkipped:
    """One event for a batch of skipped due times (the last one is ``due``)."""
    n = len(dues)
    text = detail if n == 1 else f"{n} due times from {dues[0]:.3f}: {detail}"
    return ev.ScheduleSkipped(due=dues[-1], reason=reason, detail=text)
