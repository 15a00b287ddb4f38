"""The lock on `cardbus a2a serve`: what a hostile page or a stranger sends is refused, and
nothing of it reaches the log (a real server process on a free loopback port)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from a2a.types import SendMessageRequest, TaskState
from a2a_support import ROOT, ServeProcess, a2a_client, collect, data_message, plan
from google.protobuf.json_format import ParseDict

from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev

TOKEN = "t0k3n-for-tests"
SHOUT = plan([{"id": "s", "capability": "shout", "inputs": {"text": "hi"}}])
MAX = 64 * 1024


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    tmp = Path(tmp_path_factory.mktemp("a2a-lock"))
    (tmp / "tokens").write_text(f"# the tokens\n\nold-token\n{TOKEN}\n")
    extra = ("--token-file", str(tmp / "tokens"), "--max-request-bytes", str(MAX))
    proc = ServeProcess(tmp / "log.db", ["a2a_support:Slow"], extra=extra).start()
    try:
        yield proc
    finally:
        proc.stop()


def rpc(method: str, params: dict, id_: int = 1) -> dict:  # type: ignore[type-arg]
    return {"jsonrpc": "2.0", "id": id_, "method": method, "params": params}


def send_params(message_id: str = "m-hostile") -> dict:  # type: ignore[type-arg]
    return {
        "message": {
            "messageId": message_id,
            "role": "ROLE_USER",
            "parts": [{"data": SHOUT}],
        }
    }


async def runs_in(db: Path) -> list[ev.RunStarted]:
    store = await SqliteEventStore.open(db)
    try:
        return [
            e.data for e in await store.read_all(1, 100_000) if isinstance(e.data, ev.RunStarted)
        ]
    finally:
        await store.close()


def post_60mb_declared(port: int) -> bytes:
    """Headers saying 60 MB, then 1 MB of it: the answer must come without the rest."""
    head = (
        f"POST / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {TOKEN}\r\nA2A-Version: 1.0\r\n"
        f"Content-Length: {60 * 1024 * 1024}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        try:
            s.sendall(head + b"[" * (1024 * 1024))
        except (BrokenPipeError, ConnectionResetError):
            pass  # answered and closed before the megabyte was all sent: what is wanted
        got = b""
        while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    return got


async def test_a_hostile_page_and_a_stranger_are_refused(locked: ServeProcess) -> None:
    url, port = locked.url, locked.port
    ok = {"Authorization": f"Bearer {TOKEN}", "A2A-Version": "1.0"}
    body = json.dumps(rpc("SendMessage", send_params()))
    async with httpx.AsyncClient(timeout=30) as http:
        # a cross-site form-like POST (text/plain needs no CORS preflight)
        r = await http.post(url, content=body, headers={**ok, "Content-Type": "text/plain"})
        assert r.status_code == 415 and r.json()["error"]["code"] == -32600
        r = await http.post(
            url,
            content=body,
            headers={**ok, "Content-Type": "application/json", "Origin": "https://evil.example"},
        )
        assert r.status_code == 403 and "cross-origin" in r.json()["error"]["message"]
        # DNS rebinding: a page on another name lists tasks, answers an approval
        for method, params in [("ListTasks", {}), ("SendMessage", send_params())]:
            r = await http.post(
                url, json=rpc(method, params), headers={**ok, "Host": f"evil.example:{port}"}
            )
            assert r.status_code == 400 and "Host" in r.json()["error"]["message"]
        # no token, a wrong one: every method, the extended card too
        for method, params in [
            ("SendMessage", send_params()),
            ("ListTasks", {}),
            ("GetTask", {"id": "x"}),
            ("GetExtendedAgentCard", {}),
            ("message/send", send_params()),  # the v0.3 name
        ]:
            for headers in ({}, {"Authorization": "Bearer nope"}, {"X-API-Key": "nope"}):
                r = await http.post(url, json=rpc(method, params), headers=headers)
                assert r.status_code == 401, (method, headers, r.text)
                assert r.headers["www-authenticate"] == "Bearer"
    # a 60 MB body: refused from its Content-Length, answered before the rest is sent
    answer = post_60mb_declared(port)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == -32600 and str(MAX) in error["message"]
    assert await runs_in(locked.db) == []  # nothing of it in the log
    assert locked.proc is not None and locked.proc.poll() is None  # still serving


async def test_with_the_token_a_resent_message_is_the_same_task(locked: ServeProcess) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(timeout=60, headers=headers) as http:
        card = httpx.get(locked.url + ".well-known/agent-card.json").json()  # public
        assert set(card["securitySchemes"]) == {"bearer", "apiKey"}
        assert card["capabilities"]["extendedAgentCard"] is True
        from a2a.client import ClientConfig, ClientFactory
        from a2a.types import AgentCard

        client = ClientFactory(ClientConfig(streaming=False, httpx_client=http)).create(
            ParseDict(card, AgentCard())
        )
        msg = data_message(SHOUT, message_id="m-resent")
        (first,) = await collect(client, SendMessageRequest(message=msg))
        (again,) = await collect(client, SendMessageRequest(message=msg))
        extended = await http.post(
            locked.url, json=rpc("GetExtendedAgentCard", {}), headers={"A2A-Version": "1.0"}
        )
        key = await http.post(
            locked.url,
            json=rpc("ListTasks", {}),
            headers={"A2A-Version": "1.0", "Authorization": "", "X-API-Key": TOKEN},
        )
    assert first.task.status.state == TaskState.TASK_STATE_COMPLETED
    assert again.task.id == first.task.id
    assert extended.json()["result"]["name"] == card["name"]
    assert key.status_code == 200 and key.json()["result"]["tasks"][0]["id"] == first.task.id
    assert len(await runs_in(locked.db)) == 1  # the resend started nothing


def test_serve_beyond_loopback_without_a_token_refuses_to_start(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARDBUS_A2A_TOKEN")}
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, "-m", "cardbus.tools", "a2a", "serve", "--host", "0.0.0.0"]
    done = subprocess.run(
        [*cmd, "--db", str(tmp_path / "log.db")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "not loopback" in lines[0] and "--token" in lines[0], done.stderr
    assert done.stdout == ""


async def test_a_token_file_without_a_token_refuses_to_start(tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("# nothing\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "cardbus.tools", "a2a", "serve", "--db", str(tmp_path / "l.db")]
    done = await asyncio.to_thread(
        subprocess.run,
        [*cmd, "--token-file", str(tmp_path / "empty")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1
    assert "holds no token" in done.stderr


async def test_the_v1_card_is_strict_and_a_v03_client_gets_its_form(locked: ServeProcess) -> None:
    from a2a.types import AgentCard

    card_url = locked.url + ".well-known/agent-card.json"
    async with a2a_client(locked.url) as _:
        pass  # a2a-sdk's resolver reads it
    v1 = httpx.get(card_url).json()
    ParseDict(v1, AgentCard())  # strict: no key that v1.0 does not know
    assert "url" not in v1 and "protocolVersion" not in v1
    skills = {s["id"]: s for s in v1["skills"]}
    assert {"run_plan", "run_goal", "shout"} <= set(skills)
    assert all(s["examples"] for s in skills.values())
    assert skills["run_goal"]["inputModes"] == ["text/plain"]
    v03 = httpx.get(card_url, headers={"A2A-Version": "0.3"}).json()
    assert v03["url"] == locked.url and v03["protocolVersion"].startswith("0.3")
