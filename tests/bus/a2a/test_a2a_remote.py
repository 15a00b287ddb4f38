"""A remote a2a-sdk agent (not cardbus) doing a task of a cardbus plan."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import msgspec
import pytest
from a2a_support import ROOT, Slow, echo_server, free_port

from cardbus.agents.cards import TaskCard
from cardbus.bus.a2a import remote_a2a_agent
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import ValidationError
from cardbus.projections import replay

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _plan(plan_id: str) -> dict:  # type: ignore[type-arg]
    return {
        "plan_id": plan_id,
        "goal": "shout twice",
        "tasks": [
            {"id": "local", "capability": "shout", "inputs": {"text": "one"}},
            {
                "id": "remote",
                "capability": "echo",
                "deps": ["local"],
                "inputs": {"text": {"$dep": "local", "path": "text"}},
            },
        ],
    }


async def test_a_plan_task_done_by_a_remote_a2a_agent(tmp_path: Path) -> None:
    async with echo_server() as (url, executor):
        Remote = await remote_a2a_agent("a2a+" + url)
        card = Remote.card()
        assert card.agent_id == "echo-agent"  # from the display name, fit for subjects
        assert card.capability("echo").input_schema["required"] == ["text"]  # text-only skill
        store = await SqliteEventStore.open(tmp_path / "log.db")
        try:
            async with EmbeddedRuntime(store, [Slow, Remote]) as rt:
                result = await rt.run(_plan("remote-1"), timeout=30)
            assert result.status == "completed", result
            assert result.outputs["remote"] == {"text": "ONE"}
            timeline = await replay(store, result.root_id)
            events = await store.read_correlation(result.root_id)
        finally:
            await store.close()
    dump = msgspec.json.encode(timeline).decode()
    assert '"agent_id":"echo-agent"' in dump and '"kind":"completed"' in dump
    dispatched = [e for e in events if isinstance(e.data, ev.TaskDispatched)]
    assert [d.data.agent_id for d in dispatched] == ["slow", "echo-agent"]
    # the A2A message named the task and its attempt
    (msg,) = executor.messages
    meta = msgspec.json.decode(json.dumps(dict(msg.metadata["cardbus"])))
    assert meta["capability"] == "echo" and meta["attempt"] == 1


async def test_the_traceparent_and_the_task_travel_with_the_message() -> None:
    async with echo_server() as (url, executor):
        Remote = await remote_a2a_agent(url)
        card = TaskCard(
            task_id="t-1",
            root_id="r-1",
            capability="echo",
            inputs={"text": "quiet"},
            attempt=2,
            traceparent=TRACEPARENT,
        )
        result = await Remote.run(card)
    assert (result.status, result.output, result.attempt) == ("completed", {"text": "QUIET"}, 2)
    assert executor.traceparents == [TRACEPARENT]  # the W3C header
    (msg,) = executor.messages
    assert msg.metadata["traceparent"] == TRACEPARENT
    assert msg.metadata["cardbus"]["task_id"] == "t-1"


async def test_remote_failures_and_timeouts_are_failed_attempts(tmp_path: Path) -> None:
    async with echo_server() as (url, _):
        Remote = await remote_a2a_agent(url)
        plan = {
            "goal": "fail",
            "tasks": [
                {"id": "f", "capability": "echo", "inputs": {"text": "fail"}, "max_attempts": 2}
            ],
        }
        store = await SqliteEventStore.open(tmp_path / "log.db")
        try:
            async with EmbeddedRuntime(store, [Remote]) as rt:
                result = await rt.run(plan, timeout=30)
            events = await store.read_correlation(result.root_id)
        finally:
            await store.close()
    assert result.status == "failed"
    results = [e.data for e in events if isinstance(e.data, ev.TaskResultSubmitted)]
    assert len(results) == 2 and all(r.status == "failed" for r in results)
    assert "TASK_STATE_FAILED" in (results[0].error or "")
    assert "asked to fail" in (results[0].error or "")


async def test_an_unreachable_remote_is_a_failed_attempt_with_the_reason(tmp_path: Path) -> None:
    async with echo_server() as (url, _):
        Remote = await remote_a2a_agent(url)
    # the server is gone now: each attempt fails with the connection error
    plan = {
        "goal": "x",
        "tasks": [{"id": "e", "capability": "echo", "inputs": {"text": "x"}, "max_attempts": 1}],
    }
    store = await SqliteEventStore.open(tmp_path / "log.db")
    try:
        async with EmbeddedRuntime(store, [Remote]) as rt:
            result = await rt.run(plan, timeout=30)
        events = await store.read_correlation(result.root_id)
    finally:
        await store.close()
    (submitted,) = [e.data for e in events if isinstance(e.data, ev.TaskResultSubmitted)]
    assert submitted.status == "failed" and "connection" in (submitted.error or "")


async def test_remote_card_fetch_failure_is_a_validation_error() -> None:
    with pytest.raises(ValidationError, match="cannot fetch the A2A card"):
        await remote_a2a_agent(f"http://127.0.0.1:{free_port()}/")


async def test_cardbus_run_with_an_a2a_agent_in_the_plan_and_replay(tmp_path: Path) -> None:
    async with echo_server() as (url, _):
        plan = _plan("cli-remote")
        plan["agents"] = ["a2a_support:Slow", "a2a+" + url]
        (tmp_path / "plan.json").write_text(json.dumps(plan))
        db = str(tmp_path / "log.db")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(ROOT)])}

        async def cardbus(*args: str) -> tuple[int, str]:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "cardbus.tools",
                *args,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
            )
            out, _ = await proc.communicate()
            return proc.returncode or 0, out.decode()

        code, out = await cardbus("run", str(tmp_path / "plan.json"), "--db", db, "--json")
        assert code == 0, out
        root = json.loads(out.splitlines()[-1])["root_id"]
        code, out = await cardbus("replay", root, "--db", db)
    assert code == 0, out
    assert "echo-agent" in out and "completed" in out
