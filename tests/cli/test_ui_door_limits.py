"""``cardbus ui``'s door (issue 30, items 8 and 10), over real sockets.

The console is ``cardbus ui`` in a subprocess on a free loopback port, with a
token file of named tokens and a short body deadline (``--request-body-timeout
0.5``). A request is told the name it acts as (its token's); a client that
trickles its body is answered 408 and its connection closed; a body nested too
deep or not UTF-8 is a 400 with a short error of the console's own.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from cardbus.tools.cli import cli

pytest.importorskip("starlette")

OPS = "ops-console-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    tmp = Path(tmp_path_factory.mktemp("ui-limits"))
    (tmp / "tokens").write_text(f"ops {OPS}\nbob bob-console-token\n")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARDBUS_UI_TOKEN")}
    cmd = [sys.executable, "-m", "cardbus.tools", "ui", "--db", str(tmp / "ui.db")]
    cmd += ["--port", str(port), "--token-file", str(tmp / "tokens")]
    cmd += ["--request-body-timeout", "0.5"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/api/console?token={OPS}", timeout=2)
                if r.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "cardbus ui did not answer within 30 s"
            time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _post(port: int, body: bytes) -> httpx.Response:
    return httpx.post(
        f"http://127.0.0.1:{port}/api/runs/x/cancel",
        content=body,
        headers={"Content-Type": "application/json", "X-Cardbus-Token": OPS},
        timeout=30,
    )


def test_each_request_acts_as_its_tokens_name(console: int) -> None:
    base = f"http://127.0.0.1:{console}/api/console"
    assert httpx.get(base, headers={"X-Cardbus-Token": OPS}).json()["you"] == "ops"
    assert httpx.get(base + "?token=bob-console-token").json()["you"] == "bob"
    assert httpx.get(base + "?token=alice").status_code == 401


def test_a_body_that_trickles_in_is_answered_408_and_closed(console: int) -> None:
    body = json.dumps({"by": "x", "note": "n" * 1000}).encode()
    head = (
        f"POST /api/runs/x/cancel HTTP/1.1\r\nHost: 127.0.0.1:{console}\r\n"
        f"Content-Type: application/json\r\nX-Cardbus-Token: {OPS}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", console), timeout=30) as s:
        s.sendall(head)
        for byte in body:  # a byte every 50 ms, until the console answers
            if select.select([s], [], [], 0.05)[0]:
                break
            try:
                s.sendall(bytes([byte]))
            except OSError:  # the console answered and closed meanwhile: read its answer
                break
        got = b""
        while not got.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        try:  # closed: an end of stream, or a reset (the body's rest was never read)
            closed = s.recv(1) == b""
        except ConnectionResetError:
            closed = True
    assert got.startswith(b"HTTP/1.1 408"), got[:200]
    answer = json.loads(got.split(b"\r\n\r\n", 1)[1])
    assert answer == {"error": "the request body did not arrive within 0.5 s"}
    assert closed
    assert _post(console, b"{}").status_code == 404  # still serving (no run x)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "the JSON body is nested over 64 levels"),
        (b'{"by": "' + b"\xff" + b'"}', "the body is not UTF-8 text"),
        (b"{nope", "the body is not JSON"),
    ],
)
def test_a_body_the_parser_cannot_take_is_a_short_400(console: int, body: bytes, says: str) -> None:
    r = _post(console, body)
    assert r.status_code == 400
    assert r.json() == {"error": says}


def test_token_options_are_checked_before_serving(tmp_path: Path) -> None:
    bad = tmp_path / "tokens"
    bad.write_text("ops one two\n")
    r = CliRunner().invoke(cli, ["ui", "--db", str(tmp_path / "x.db"), "--token-file", str(bad)])
    assert r.exit_code == 2 and "a line is `name token`" in r.output, r.output
    shared = tmp_path / "shared"
    shared.write_text("ops same\nbob same\n")
    r = CliRunner().invoke(cli, ["ui", "--db", str(tmp_path / "x.db"), "--token-file", str(shared)])
    assert r.exit_code == 2 and "two names" in r.output, r.output
    r = CliRunner().invoke(cli, ["ui", "--host", "0.0.0.0", "--db", str(tmp_path / "x.db")])
    assert r.exit_code == 2 and "--token-file" in r.output, r.output
