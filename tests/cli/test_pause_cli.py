"""``cardbus approve RUN`` / ``cardbus deny RUN``: a person answers a run paused on a loop,
and ``cardbus approve TASK`` by someone a deadline did not escalate to is refused.

Real parts: ``EmbeddedRuntime`` on a SQLite file, the ``cardbus`` command through click's
runner (another writer on the same file, as a shell would be).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

from click.testing import CliRunner, Result

from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore.events import WaitPolicy, WaitStep
from cardbus.tools.cli import cli
from tests.bus.orchestrator.orchkit import FAST, ev, make_agent, plan, run_log, task, tid, wait_for

PAUSE = dataclasses.replace(FAST, on_loop="pause", loop_threshold=2)
LOOP = plan(*[task(n, text="same") for n in ("a", "b", "c")], plan_id="looping")


def _cardbus(db: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, [*args, "--store", str(db)])


async def test_deny_run_stops_a_paused_run_and_bad_inputs_are_refused(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    async with (
        await SqliteEventStore.open(db, poll_interval=0.01) as store,
        EmbeddedRuntime(store, [make_agent("echo")], PAUSE) as rt,
    ):
        root = await rt.orchestrator.submit(LOOP)
        await wait_for(store, lambda e: isinstance(e.data, ev.RunPaused))
        junk = await asyncio.to_thread(_cardbus, db, "approve", "looping", "--inputs", "nope")
        assert junk.exit_code == 2 and "not JSON" in junk.output
        listed = await asyncio.to_thread(_cardbus, db, "approve", "looping", "--inputs", "[1]")
        assert listed.exit_code == 2 and "a JSON object" in listed.output
        a_task = await asyncio.to_thread(
            _cardbus, db, "approve", tid(root, "a"), "--inputs", '{"text": "x"}'
        )
        assert a_task.exit_code == 1 and "inputs go with a paused run" in a_task.output
        stopped = await asyncio.to_thread(_cardbus, db, "deny", "looping", "--by", "bob", "--json")
        assert stopped.exit_code == 0, stopped.output
        assert json.loads(stopped.output) | {"task_id": ""} == {
            "task_id": "",
            "answer": "stopped",
            "by": "bob",
            "note": "",
        }
        r = await rt.orchestrator.wait(root, 10)
        again = await asyncio.to_thread(_cardbus, db, "approve", "looping")
        assert again.exit_code == 1 and "is not paused" in again.output
    assert r.status == "halted" and "stopped by bob" in r.detail


async def test_approve_by_someone_the_deadline_did_not_ask_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    waits = {"approval": WaitPolicy(deadline_s=0.2, then=[WaitStep(action="escalate", to=["bea"])])}
    async with (
        await SqliteEventStore.open(db, poll_interval=0.01) as store,
        EmbeddedRuntime(store, [make_agent("echo")], FAST) as rt,
    ):
        root = await rt.orchestrator.submit(plan(task("gate", requires_approval=True), waits=waits))
        await wait_for(store, lambda e: isinstance(e.data, ev.WaitExpired))
        gate = tid(root, "gate")
        refused = await asyncio.to_thread(_cardbus, db, "approve", gate, "--by", "ada")
        assert refused.exit_code == 1 and "'ada' may not answer" in refused.output
        taken = await asyncio.to_thread(_cardbus, db, "approve", gate, "--by", "bea")
        assert taken.exit_code == 0, taken.output
        assert (await rt.orchestrator.wait(root, 10)).status == "completed"
        shown = await asyncio.to_thread(_cardbus, db, "replay", gate)
    assert "approval deadline passed (step 1): escalated to bea" in shown.output
    assert "approved by bea" in shown.output
    assert len((await _log(db, root)).of(ev.WaitExpired)) == 1


async def _log(db: Path, root: str):  # type: ignore[no-untyped-def]
    async with await SqliteEventStore.open(db) as store:
        return await run_log(store, root)


def _console(db: Path, path: str, body: dict) -> tuple[int, dict]:
    from starlette.testclient import TestClient

    from cardbus.tools.ui import create_app

    with TestClient(create_app(str(db)), base_url="http://127.0.0.1") as c:
        r = c.post(path, json=body)
        return r.status_code, r.json()


async def test_the_console_resumes_a_paused_run_with_inputs_and_refuses_a_non_approver(
    tmp_path: Path,
) -> None:
    db = tmp_path / "log.db"
    waits = {"approval": WaitPolicy(deadline_s=0.2, then=[WaitStep(action="escalate", to=["bea"])])}
    async with (
        await SqliteEventStore.open(db, poll_interval=0.01) as store,
        EmbeddedRuntime(store, [make_agent("echo")], PAUSE) as rt,
    ):
        root = await rt.orchestrator.submit(LOOP)
        await wait_for(store, lambda e: isinstance(e.data, ev.RunPaused))
        status, body = await asyncio.to_thread(
            _console, db, f"/api/tasks/{root}/approve", {"inputs": {"text": "fresh"}}
        )
        assert status == 200 and body["approved"] is True, body
        r = await rt.orchestrator.wait(root, 10)
        assert r.status == "completed" and r.outputs["c"] == {"text": "fresh"}
        gated = await rt.orchestrator.submit(
            plan(task("gate", requires_approval=True), waits=waits, plan_id="gated")
        )
        await wait_for(store, lambda e: isinstance(e.data, ev.WaitExpired))
        gate = tid(gated, "gate")
        status, body = await asyncio.to_thread(_console, db, f"/api/tasks/{gate}/approve", {})
    # the console's actor (the account it runs as) is not bea: refused, 403, by type
    assert status == 403 and body["type"] == "NotAnApprover", body
