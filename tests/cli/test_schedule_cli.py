"""``cardbus schedule`` (issue 32 item 3): create, list, pause, resume, trigger and delete,
each an event of the schedule's stream in a real SQLite log; bad input is one line."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from click.testing import CliRunner

from cardbus.bus.orchestrator.scheduler import create_schedule, trigger_schedule
from cardbus.bus.orchestrator.schedules import stream_of
from cardbus.eventstore.sqlite import SqliteEventStore
from cardbus.tools.cli import cli


def types_of(db: Path, sid: str) -> list[tuple[str, str]]:
    async def go() -> list[tuple[str, str]]:
        store = await SqliteEventStore.open(db)
        try:
            return [(e.type, e.actor) for e in await store.read_stream(stream_of(sid))]
        finally:
            await store.close()

    return asyncio.run(go())


def test_a_schedule_from_create_to_delete(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"goal": "weekly digest"}))
    r = CliRunner()
    created = r.invoke(
        cli,
        ["schedule", "create", "--plan", str(plan), "--cron", "0 9 * * mon", "--tz",
         "Europe/Paris", "--overlap", "buffer_one", "--by", "ops", "--db", str(db)],
    )  # fmt: skip
    assert created.exit_code == 0, created.output
    sid = created.output.strip()
    listed = r.invoke(cli, ["schedule", "list", "--json", "--db", str(db)])
    [row] = json.loads(listed.output)
    assert row["schedule_id"] == sid and row["when"] == "0 9 * * mon"
    assert (row["timezone"], row["overlap"], row["state"]) == (
        "Europe/Paris",
        "buffer_one",
        "active",
    )
    for verb in ("pause", "resume", "trigger", "delete"):
        out = r.invoke(cli, ["schedule", verb, sid, "--by", "ops", "--db", str(db)])
        assert out.exit_code == 0, out.output
    assert r.invoke(cli, ["schedule", "list", "--json", "--db", str(db)]).output.strip() == "[]"
    assert types_of(db, sid) == [
        ("schedule.created.v1", "ops"),
        ("schedule.paused.v1", "ops"),
        ("schedule.resumed.v1", "ops"),
        ("schedule.fired.v1", "ops"),
        ("schedule.deleted.v1", "ops"),
    ]


def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    r = CliRunner()
    for args, words in [
        (["--goal", "g", "--cron", "61 * * * *"], "minute"),
        (["--goal", "g"], "cron expression or an interval"),
        (["--cron", "* * * * *"], "--plan FILE or --goal TEXT"),
        (["--goal", "g", "--every", "5", "--tz", "Nowhere/Land"], "time zone"),
        (["--goal", "g", "--every", "5", "--input", "novalue"], "KEY=VALUE"),
    ]:
        out = r.invoke(cli, ["schedule", "create", *args, "--db", str(db)])
        assert out.exit_code == 1 and words in out.output, out.output
    assert r.invoke(cli, ["schedule", "list", "--json", "--db", str(db)]).output.strip() == "[]"
    out = r.invoke(cli, ["schedule", "pause", "nosuch", "--db", str(db)])
    assert out.exit_code == 1 and "no schedule 'nosuch'" in out.output


def test_a_command_that_runs_one_plan_fires_no_schedule(tmp_path: Path) -> None:
    """``cardbus run`` runs its plan and exits: a schedule due meanwhile is left to the
    processes that stay (an orchestrator, the console with agents), not fired here for a
    run nobody would stay to run."""
    db = tmp_path / "log.db"
    r = CliRunner()
    # fired by hand: any scheduler that looks starts its run at once

    async def create() -> str:
        store = await SqliteEventStore.open(db)
        try:
            sid = await create_schedule(store, {"goal": "research tides"}, cron="0 3 * * *")
            return await trigger_schedule(store, sid, actor="ops")
        finally:
            await store.close()

    plan_id = asyncio.run(create())
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "goal": "research tides",
                "agents": ["cardbus.agents.demo:Researcher"],
                "tasks": [{"id": "r", "capability": "research", "inputs": {"topic": "tides"}}],
            }
        )
    )
    out = r.invoke(cli, ["run", str(plan), "--db", str(db), "--json"])
    assert out.exit_code == 0, out.output
    assert not stream_exists(db, f"plan-{plan_id}")  # its run was not started here


def stream_exists(db: Path, stream: str) -> bool:
    async def go() -> bool:
        store = await SqliteEventStore.open(db)
        try:
            return bool(await store.read_stream(stream))
        finally:
            await store.close()

    return asyncio.run(go())
