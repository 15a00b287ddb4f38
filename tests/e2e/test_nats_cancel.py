"""A cancel reaches the handler on NATS: ``cardbus cancel`` during a 5 s handler of an
agent process stops the handler (it sees ``CancelledError``), no handler completes after
the cancel, and the run ends ``cancelled`` (``cardbus runs``)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from click.testing import CliRunner
from natsprocs import FAST_BUS, agent_proc, check_log, read_log, until, verify, write_agents
from natsserver import NatsServer

from cardbus.bus.runtime.nats import NatsRuntime
from cardbus.eventstore import events as ev
from cardbus.eventstore.nats.connection import NatsOptions
from cardbus.tools.cli import cli

ONE_SLOW_TASK = {
    "plan_id": "cancel-me",
    "goal": "be cancelled mid-handler",
    "tasks": [{"id": "b", "capability": "slow", "timeout_s": 30, "inputs": {"n": 1}}],
}


async def cardbus(*args: str) -> str:
    """``cardbus ARGS`` as an operator types it (in a thread: it runs its own loop)."""
    done = await asyncio.to_thread(CliRunner().invoke, cli, list(args), catch_exceptions=False)
    assert done.exit_code == 0, done.output
    return done.stdout


async def test_a_cancel_stops_the_agent_process_handler_and_the_run_says_cancelled(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    write_agents(tmp_path)
    marks, ends = tmp_path / "marks", tmp_path / "ends"
    marks.mkdir()
    ends.mkdir()
    url = nats_server.url
    env = {"CARDBUS_TEST_MARKS": str(marks), "CARDBUS_TEST_ENDS": str(ends)}
    agents = agent_proc(tmp_path, url, ["Slow"], "agents", **env, CARDBUS_TEST_SLOW_S="5")
    try:
        agents.wait_for("serving")
        async with NatsRuntime(NatsOptions(url=url), bus_options=FAST_BUS) as rt:
            root = await rt.submit(ONE_SLOW_TASK, agent_timeout=20)
            # the handler runs in the agent process: its 5 s have begun
            (began,) = await until(lambda: list(marks.iterdir()), what="the handler to begin")
            said = json.loads(
                await cardbus("cancel", root, "--store", url, "--by", "ops-alice", "--json")
            )
            result = await rt.orchestrator.wait(root, timeout=30)
            # the handler's own record: it saw the cancel
            await until(lambda: list(ends.iterdir()), what="the handler to end")
            events = await until(lambda: _ignored_after_cancel(url), what="its answer recorded")
        runs = json.loads(await cardbus("runs", "--store", url, "--json"))
        table = " ".join((await cardbus("runs", "--store", url)).split())
    finally:
        agents.stop()
    (task_id,) = said["cancelled"]
    assert began.name.startswith(f"{task_id}.1.")
    assert [m.name for m in marks.iterdir()] == [began.name]  # no handler ran it again
    # cancelled, never completed: the handler's record, and the log
    assert sorted(m.name for m in ends.iterdir()) == [f"{task_id}.1.cancelled"]
    mine = [e for e in events if e.stream == task_id]
    kinds = [type(e.data) for e in mine]
    assert ev.TaskCompleted not in kinds and ev.TaskResultSubmitted not in kinds, kinds
    (ignored,) = [e.data for e in mine if isinstance(e.data, ev.TaskResultIgnored)]
    assert (ignored.reason, ignored.attempt, ignored.agent_id) == ("handler_cancelled", 1, "slow")
    cancel = next(e for e in mine if isinstance(e.data, ev.TaskCancelled))
    assert cancel.actor == "ops-alice"
    # the run ends as cancelled: its own status and reason, who and why
    assert (result.status, result.reason) == ("cancelled", "cancelled")
    assert result.detail == "by ops-alice: cancelled_by_user"
    row = next(r for r in runs if r["root_id"] == root)
    assert (row["status"], row["reason"]) == ("cancelled", "by ops-alice: cancelled_by_user")
    assert "cancelled: by ops-alice: cancelled_by_user" in table
    check_log(events)
    assert await verify(url) == []


async def _ignored_after_cancel(url: str) -> list[ev.Envelope] | None:
    """The whole log once the stopped handler's answer is recorded (None before)."""
    events = await read_log(url)
    done = any(
        isinstance(e.data, ev.TaskResultIgnored) and e.data.reason == "handler_cancelled"
        for e in events
    )
    return events if done else None
