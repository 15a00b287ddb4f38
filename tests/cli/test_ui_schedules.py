"""The console's schedule endpoints (issue 32 item 3): behind the guard, each change an
event of the schedule's stream signed with the token's name, bad input a 400."""

from __future__ import annotations

import asyncio
from pathlib import Path

from starlette.testclient import TestClient

from cardbus.bus.orchestrator.schedules import stream_of
from cardbus.eventstore.sqlite import SqliteEventStore
from cardbus.tools.ui import create_app

TOKEN = {"X-Cardbus-Token": "s3cret"}


def actors(db: Path, sid: str) -> list[tuple[str, str]]:
    async def go() -> list[tuple[str, str]]:
        store = await SqliteEventStore.open(db)
        try:
            return [(e.type, e.actor) for e in await store.read_stream(stream_of(sid))]
        finally:
            await store.close()

    return asyncio.run(go())


def test_schedules_through_the_console_are_signed_by_the_token(tmp_path: Path) -> None:
    db = tmp_path / "ui.db"

    async def create_log() -> None:
        await (await SqliteEventStore.open(db)).close()

    asyncio.run(create_log())
    app = create_app(str(db), token="s3cret", token_name="ops")
    create = {"goal": "hourly triage", "cron": "0 * * * *", "overlap": "skip", "by": "mallory"}
    with TestClient(app, base_url="http://127.0.0.1") as c:
        assert c.post("/api/schedules", json=create).status_code == 401  # no token
        made = c.post("/api/schedules", json=create, headers=TOKEN)
        assert made.status_code == 200, made.text
        sid = made.json()["schedule_id"]
        [row] = c.get("/api/schedules", headers=TOKEN).json()["schedules"]
        assert (row["schedule_id"], row["when"], row["state"]) == (sid, "0 * * * *", "active")
        for action in ("pause", "resume", "trigger", "delete"):
            done = c.post(f"/api/schedules/{sid}/{action}", json={}, headers=TOKEN)
            assert done.status_code == 200 and done.json()["by"] == "ops", done.text
        assert c.get("/api/schedules", headers=TOKEN).json()["schedules"] == []
        bad = c.post("/api/schedules", json={"goal": "g", "cron": "99 * * * *"}, headers=TOKEN)
        assert bad.status_code == 400 and "minute" in bad.json()["error"]
        nothing = c.post("/api/schedules", json={"cron": "* * * * *"}, headers=TOKEN)
        assert nothing.status_code == 400
        gone = c.post("/api/schedules/nosuch/pause", json={}, headers=TOKEN)
        assert gone.status_code == 404
        odd = c.post(f"/api/schedules/{sid}/explode", json={}, headers=TOKEN)
        assert odd.status_code == 400
    assert {a for _, a in actors(db, sid)} == {"ops"}  # never the name the body claims
    assert [t for t, _ in actors(db, sid)][-1] == "schedule.deleted.v1"
