"""``cardbus mcp serve`` driven by the official ``mcp`` SDK's client, over stdio (the
server a subprocess the client starts) and over streamable HTTP (a real server on a
free loopback port, behind the token).

Each transport: start the demo goal and wait for it through ``run_status``, read its
replay, answer two approvals (approve one, deny the other), cancel a run, fork the
demo run; then every one of those actions is found in the real SQLite log with the
right actor: ``local:<user>`` over stdio, the token's name over HTTP. Without the
token, the HTTP server answers 401 and writes nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")
import httpx2
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.tools.mcp_server import local_actor

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "mcp-s3cret"
GOAL = "Write a short report on tide pools"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CARDBUS_"))}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gated_plan(*ids: str) -> dict[str, Any]:
    return {
        "goal": "gated research",
        "agents": ["cardbus.agents.demo:Researcher"],
        "tasks": [
            {"id": i, "capability": "research", "inputs": {"topic": i}, "requires_approval": True}
            for i in ids
        ],
    }


@asynccontextmanager
async def stdio_session(
    folder: Path, db: Path, initialize: bool = True
) -> AsyncIterator[ClientSession]:
    """A client of ``cardbus mcp serve --store DB`` over stdio, run in ``folder`` (its
    stderr in ``folder/stderr.log``); initialized unless told not to."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "cardbus.tools", "mcp", "serve", "--store", str(db)],
        env=_env(),
        cwd=str(folder),
    )
    with (folder / "stderr.log").open("w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            if initialize:
                await session.initialize()
            yield session


async def call(session: ClientSession, tool: str, **args: Any) -> Any:
    result = await session.call_tool(tool, args)
    text = "".join(getattr(c, "text", "") for c in result.content)
    assert not result.is_error, f"{tool}: {text}"
    data = result.structured_content
    if data is None or list(data) == ["result"]:  # a tool that returns text
        return text
    return data


async def settled(session: ClientSession, root: str) -> dict[str, Any]:
    """The run's status once it stops running (the tool waits on the log's appends)."""
    for _ in range(20):
        status = await call(session, "run_status", run=root, wait_s=30)
        if status["status"] != "running":
            return status
    raise AssertionError(f"run {root} still running: {status}")


async def drive(session: ClientSession) -> dict[str, str]:
    """The actions; returns the ids they touched, by name."""
    await session.initialize()
    names = {t.name for t in (await session.list_tools()).tools}
    assert {"start_run", "run_status", "replay", "waiting", "approve", "deny"} <= names

    demo = (await call(session, "start_run", goal=GOAL))["root_id"]
    done = await settled(session, demo)
    assert done["status"] == "completed", done
    assert done["outputs"], done  # the run's result: its tasks' outputs
    assert done["cost"]["text"]
    replay = await call(session, "replay", task=demo)
    assert f"replay of run {demo}" in replay
    assert "task.completed" in replay or "completed" in replay
    listed = await call(session, "list_runs", text="tide pools")
    assert [r["root_id"] for r in listed["runs"]] == [demo]
    res = await session.read_resource(f"cardbus://runs/{demo}")
    assert json.loads(res.contents[0].text)["status"] == "completed"

    gated = (await call(session, "start_run", plan=gated_plan("yes", "no")))["root_id"]
    assert (await settled(session, gated))["status"] == "awaiting_approval"
    waiting = (await call(session, "waiting", run=gated))["waiting"]
    by_topic = {w["input"]["topic"]: w["task_id"] for w in waiting}
    assert sorted(by_topic) == ["no", "yes"], waiting
    yes, no = by_topic["yes"], by_topic["no"]
    assert (await call(session, "approve", task=yes))["answer"] == "approved"
    assert (await call(session, "deny", task=no, note="not now"))["answer"] == "denied"
    ended = await settled(session, gated)
    assert ended["status"] == "failed"  # a denied task is cancelled
    assert yes in ended["outputs"]

    again = await call(session, "rerun", task=no)  # the denied task, as a new run
    assert again["rerun_of"] == gated and again["root_id"] != gated
    assert (await settled(session, again["root_id"]))["status"] == "awaiting_approval"
    assert (await call(session, "cancel_run", run=again["root_id"]))["cancelled"]

    doomed = (await call(session, "start_run", plan=gated_plan("held")))["root_id"]
    assert (await settled(session, doomed))["status"] == "awaiting_approval"
    assert (await call(session, "cancel_run", run=doomed))["cancelled"]

    first = (await call(session, "run_status", run=demo))["outputs"]
    forked = (await call(session, "fork", task=sorted(first)[-1]))["root_id"]
    assert (await settled(session, forked))["status"] == "completed"

    bad = await session.call_tool("approve", {"task": "no-such-task"})
    assert bad.is_error
    return {
        "demo": demo,
        "gated": gated,
        "yes": yes,
        "no": no,
        "doomed": doomed,
        "fork": forked,
        "rerun": again["root_id"],
    }


async def assert_signed(db: Path, ids: dict[str, str], actor: str) -> None:
    store = await SqliteEventStore.open(db)
    try:
        events = await store.read_all(1, 100000)
    finally:
        await store.close()
    by = [e for e in events if e.actor == actor]

    def signed(kind: type, stream: str) -> bool:
        return any(isinstance(e.data, kind) and e.stream == stream for e in by)

    assert signed(ev.RunStarted, ids["demo"])
    assert signed(ev.RunStarted, ids["gated"])
    assert signed(ev.ApprovalGranted, ids["yes"])
    assert signed(ev.ApprovalDenied, ids["no"])
    assert any(
        isinstance(e.data, ev.TaskCancelled) and e.correlation_id == ids["doomed"] for e in by
    )
    assert signed(ev.RunStarted, ids["fork"])
    assert signed(ev.RunStarted, ids["rerun"])
    granted = next(e.data for e in by if isinstance(e.data, ev.ApprovalGranted))
    assert granted.by == actor


async def test_stdio_client_runs_and_answers_as_the_local_user(tmp_path: Path) -> None:
    db = tmp_path / "mcp.db"
    async with stdio_session(tmp_path, db, initialize=False) as session:
        ids = await drive(session)  # it initializes the session
    await assert_signed(db, ids, local_actor())


@asynccontextmanager
async def http_server(db: Path, *extra: str) -> AsyncIterator[str]:
    port = _free_port()
    cmd = [sys.executable, "-m", "cardbus.tools", "mcp", "serve", "--store", str(db)]
    cmd += ["--transport", "http", "--port", str(port), *extra]
    log = db.with_suffix(".log").open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env())
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        async with httpx2.AsyncClient() as probe:
            for _ in range(600):  # the banner is printed once the socket is bound
                assert proc.poll() is None, db.with_suffix(".log").read_text()
                if "cardbus MCP server on" in db.with_suffix(".log").read_text():
                    break
                await asyncio.sleep(0.05)
            r = await probe.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
            assert r.status_code == 401  # no token: refused before the MCP app
            assert r.headers["www-authenticate"] == "Bearer"
        yield url
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()


async def test_http_client_with_the_token_acts_as_its_name(tmp_path: Path) -> None:
    db = tmp_path / "mcp.db"
    async with http_server(db, "--token", TOKEN, "--token-name", "ops-desk") as url:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=60) as http,
            streamable_http_client(url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            ids = await drive(session)
        store = await SqliteEventStore.open(db)
        try:
            before = await store.last_position()
        finally:
            await store.close()
        async with httpx2.AsyncClient(timeout=60) as stranger:
            r = await stranger.post(
                url,
                json={
                    "jsonrpc": "2.0",
                    "id": 2,
                    "method": "tools/call",
                    "params": {"name": "approve", "arguments": {"task": ids["yes"]}},
                },
                headers={"Accept": "application/json, text/event-stream"},
            )
            assert r.status_code == 401
    await assert_signed(db, ids, "ops-desk")
    store = await SqliteEventStore.open(db)
    try:
        assert await store.last_position() == before  # the refused call wrote nothing
    finally:
        await store.close()
