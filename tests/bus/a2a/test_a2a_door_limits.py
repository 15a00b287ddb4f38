"""The A2A gateway's door limits (issue 30, item 10), over real sockets.

``cardbus a2a serve`` in a real process on a free loopback port, locked with a
token and a short body deadline (``--request-body-timeout 0.5``). A client
that trickles its body a byte at a time is answered 408 and its connection
closed, however many do it at once, and the server goes on serving. A body
nested too deep, one that is not UTF-8 and one that is not JSON get a short
JSON-RPC error of the gateway's own (-32600 / -32700), nothing of Python's
text. An internal error a2a-sdk's dispatcher would answer with ``str(e)`` says
"internal error".
"""

from __future__ import annotations

import json
import select
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a_support import ServeProcess

from cardbus.bus.a2a.server import ShortInternalErrors

TOKEN = "limits-token"
PYTHON_WORDS = ("recursion", "codec", "decode", "Expecting", "Traceback", "line 1", "char ")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    tmp = Path(tmp_path_factory.mktemp("a2a-limits"))
    extra = ("--token", TOKEN, "--request-body-timeout", "0.5")
    proc = ServeProcess(tmp / "log.db", ["a2a_support:Slow"], extra=extra).start()
    try:
        yield proc
    finally:
        proc.stop()


def _head(port: int, length: int) -> bytes:
    return (
        f"POST / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {TOKEN}\r\nA2A-Version: 1.0\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def trickle(port: int) -> tuple[bytes, bool]:
    """Send a body of 1,000 bytes a byte at a time (one every 50 ms) until the server
    answers; (the answer, whether the server then closed the connection)."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {}})
    body = body.ljust(1000)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(_head(port, len(body)))
        got = b""
        for byte in body.encode():
            readable, _, _ = select.select([s], [], [], 0.05)
            if readable:
                break
            try:
                s.sendall(bytes([byte]))
            except OSError:  # the server answered and closed meanwhile: read its answer
                break
        while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        closed = _closed(s)
    return got, closed


def _closed(s: socket.socket) -> bool:
    """Whether the server closed the connection: an end of stream, or a reset (the server
    closed it with bytes of the body it never read, as it should: it does not read them)."""
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def post_raw(port: int, body: bytes) -> tuple[int, dict[str, Any]]:
    """POST ``body`` as it is (bytes, not re-encoded); the status and the JSON answer."""
    r = httpx.post(
        f"http://127.0.0.1:{port}/",
        content=body,
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {TOKEN}",
            "A2A-Version": "1.0",
        },
        timeout=30,
    )
    return r.status_code, r.json()


def test_a_body_that_trickles_in_is_answered_408_and_closed(server: ServeProcess) -> None:
    answer, closed = trickle(server.port)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == -32600 and "did not arrive within 0.5 s" in error["message"]
    assert closed
    # twenty at once: each is let go the same way, and the server answers the next request
    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(trickle, [server.port] * 20))
    assert [a.split(b" ", 2)[1] for a, _ in answers] == [b"408"] * 20
    assert all(closed for _, closed in answers)
    status, ok = post_raw(
        server.port, json.dumps({"jsonrpc": "2.0", "id": 2, "method": "ListTasks"}).encode()
    )
    assert status == 200 and "result" in ok, ok


@pytest.mark.parametrize(
    ("body", "status", "code", "message"),
    [
        # deeper than Python's recursion limit: json.loads raised RecursionError, answered
        # as "maximum recursion depth exceeded while decoding a JSON array..."
        (
            b'{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":'
            + b"[" * 100_000
            + b"]" * 100_000
            + b"}",
            400,
            -32600,
            "the JSON body is nested over 64 levels",
        ),
        # deep, but not past Python's limit: protobuf's parser would recurse on it
        (
            b'{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":'
            + b'{"a":' * 500
            + b"1"
            + b"}" * 500
            + b"}}",
            400,
            -32600,
            "the JSON body is nested over 64 levels",
        ),
        # not UTF-8: "'utf-8' codec can't decode byte 0xff..."
        (
            b'{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"x":"\xff\xfe"}}',
            400,
            -32700,
            "the body is not UTF-8 text",
        ),
        # not JSON: "Expecting value: line 1 column 1 (char 0)"
        (b"{nope", 400, -32700, "the body is not JSON"),
    ],
)
def test_a_body_the_parser_cannot_take_gets_a_short_error_of_ours(
    server: ServeProcess, body: bytes, status: int, code: int, message: str
) -> None:
    got_status, answer = post_raw(server.port, body)
    assert got_status == status
    assert answer["error"]["code"] == code
    assert answer["error"]["message"] == message
    text = json.dumps(answer)
    assert not [w for w in PYTHON_WORDS if w in text], text
    assert len(text) < 200
    assert server.proc is not None and server.proc.poll() is None  # still serving


async def test_an_internal_error_says_internal_error_not_pythons_words() -> None:
    """What a2a-sdk's dispatcher answers for an exception it did not expect (``str(e)``),
    through the layer ``build_app`` puts in front of it."""

    def app_answering(error: dict[str, Any]) -> Any:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            body = json.dumps({"jsonrpc": "2.0", "id": 7, "error": error}).encode()
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(body)),
            ]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        return app

    async def call(error: dict[str, Any]) -> dict[str, Any]:
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        await ShortInternalErrors(app_answering(error))({"type": "http"}, receive, send)
        length = dict(sent[0]["headers"])[b"content-length"]
        body = sent[1]["body"]
        assert int(length) == len(body)
        return dict(json.loads(body))

    python = {"code": -32603, "message": "maximum recursion depth exceeded while decoding"}
    assert (await call(python))["error"] == {"code": -32603, "message": "internal error"}
    assert (await call(python))["id"] == 7
    ours = {"code": -32603, "message": "internal error (KeyError)"}
    assert (await call(ours))["error"] == ours
    other = {"code": -32602, "message": "message.parts[0] has no content"}
    assert (await call(other))["error"] == other
