"""``cardbus schedule``: create, list, pause, resume, trigger and delete schedules, on any
store (SQLite or NATS). Each is an event on the schedule's stream; the orchestrators on the
log fire it (``bus.orchestrator.scheduler``)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import msgspec

from cardbus.bus.orchestrator import scheduler as ops
from cardbus.bus.orchestrator.plan import decode_plan
from cardbus.bus.orchestrator.schedules import CATCHUP, OVERLAP
from cardbus.bus.runtime.loop import run as run_loop
from cardbus.eventstore import EventStore
from cardbus.eventstore.errors import InvalidSchedule
from cardbus.tools.cli import cli
from cardbus.tools.store_option import StoreRef, open_store_option, store_option

T = TypeVar("T")


def _with_store(
    db: StoreRef, work: Callable[[EventStore], Awaitable[T]], create: bool = False
) -> T:
    async def go() -> T:
        store = await open_store_option(db, create=create)
        try:
            return await work(store)
        finally:
            await store.close()

    return run_loop(go())


def _by(f: Any) -> Any:
    f = click.option("--json", "as_json", is_flag=True, help="The outcome as JSON.")(f)
    return click.option("--by", default="cli", show_default=True, help="The events' actor.")(f)


def _say(as_json: bool, schedule_id: str, **what: str) -> None:
    if as_json:
        click.echo(json.dumps({"schedule_id": schedule_id, **what}))
    else:
        click.echo(f"{schedule_id}: " + ", ".join(f"{v}" for v in what.values()))


@cli.group("schedule")
def schedule_group() -> None:
    """Runs on a schedule: a cron expression or an interval, kept in the log."""


@schedule_group.command("create")
@click.option("--plan", "plan_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--goal", help="A goal alone, planned at each firing (instead of --plan).")
@click.option("--input", "inputs", multiple=True, help="KEY=VALUE kept in the run's session.")
@click.option("--cron", default="", help='5 fields: "minute hour day month weekday".')
@click.option("--every", "interval", type=float, default=0.0, help="An interval, in seconds.")
@click.option("--tz", "timezone", default="UTC", show_default=True, help="The cron's time zone.")
@click.option("--overlap", type=click.Choice(OVERLAP), default="skip", show_default=True)
@click.option("--catchup", type=click.Choice(CATCHUP), default="one", show_default=True)
@click.option("--catchup-window", type=float, default=3600.0, show_default=True, help="Seconds.")
@click.option("--jitter", type=float, default=0.0, help="Each firing waits up to this (s).")
@click.option("--id", "schedule_id", default=None, help="Its id (default: a new one).")
@_by
@store_option
def create(
    plan_file: str | None,
    goal: str | None,
    inputs: tuple[str, ...],
    cron: str,
    interval: float,
    timezone: str,
    overlap: str,
    catchup: str,
    catchup_window: float,
    jitter: float,
    schedule_id: str | None,
    by: str,
    as_json: bool,
    db: StoreRef,
) -> None:
    """Create a schedule of a plan file or a goal; prints its id."""
    if (plan_file is None) == (goal is None):
        raise InvalidSchedule("give --plan FILE or --goal TEXT")
    plan: dict[str, Any] = (
        msgspec.to_builtins(decode_plan(Path(plan_file).read_bytes()))
        if plan_file
        else {"goal": goal}
    )
    session: dict[str, Any] = dict(plan.get("session") or {})
    for item in inputs:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise InvalidSchedule(f"--input {item!r}: KEY=VALUE expected")
        session[key] = value
    if session:
        plan["session"] = session
    sid = _with_store(
        db,
        lambda store: ops.create_schedule(
            store,
            plan,
            cron=cron,
            interval_seconds=interval,
            timezone=timezone,
            overlap=overlap,
            catchup=catchup,
            catchup_window_seconds=catchup_window,
            jitter_seconds=jitter,
            schedule_id=schedule_id,
            actor=by,
        ),
        create=True,  # a schedule may come before any run
    )
    if as_json:
        click.echo(json.dumps({"schedule_id": sid}))
    else:
        click.echo(sid)


@schedule_group.command("list")
@click.option("--all", "everything", is_flag=True, help="The deleted ones too.")
@click.option("--json", "as_json", is_flag=True, help="One JSON list.")
@store_option
def list_(everything: bool, as_json: bool, db: StoreRef) -> None:
    """The schedules in the log, oldest first."""
    rows = [
        ops.schedule_summary(s)
        for s in _with_store(db, lambda store: ops.list_schedules(store, deleted=everything))
    ]
    if as_json:
        click.echo(json.dumps(rows))
        return
    for r in rows:
        click.echo(
            f"{r['schedule_id']}  {r['state']:<7}  {r['when']} ({r['timezone']})  "
            f"{r['firings']} firing(s)  {r['goal']}"
        )


@schedule_group.command("pause")
@click.argument("schedule_id")
@click.option("--note", default="", help="Why (kept in schedule.paused).")
@_by
@store_option
def pause(schedule_id: str, note: str, by: str, as_json: bool, db: StoreRef) -> None:
    """Pause SCHEDULE_ID: it fires no more until resumed."""
    _with_store(db, lambda store: ops.pause_schedule(store, schedule_id, note, by))
    _say(as_json, schedule_id, state="paused")


@schedule_group.command("resume")
@click.argument("schedule_id")
@_by
@store_option
def resume(schedule_id: str, by: str, as_json: bool, db: StoreRef) -> None:
    """Resume SCHEDULE_ID (what was due while paused is not caught up)."""
    _with_store(db, lambda store: ops.resume_schedule(store, schedule_id, by))
    _say(as_json, schedule_id, state="active")


@schedule_group.command("trigger")
@click.argument("schedule_id")
@_by
@store_option
def trigger(schedule_id: str, by: str, as_json: bool, db: StoreRef) -> None:
    """Fire SCHEDULE_ID now; a running orchestrator starts the run (prints its plan id)."""
    plan_id = _with_store(db, lambda store: ops.trigger_schedule(store, schedule_id, by))
    _say(as_json, schedule_id, plan_id=plan_id)


@schedule_group.command("delete")
@click.argument("schedule_id")
@_by
@store_option
def delete(schedule_id: str, by: str, as_json: bool, db: StoreRef) -> None:
    """Delete SCHEDULE_ID: it never fires again (its events stay in the log)."""
    _with_store(db, lambda store: ops.delete_schedule(store, schedule_id, by))
    _say(as_json, schedule_id, state="deleted")
