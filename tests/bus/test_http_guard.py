"""HttpGuard alone: a streamed body (no Content-Length) over the limit is refused as soon as
it passes it, the rest unread; what passes reaches the app whole."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from cardbus.bus.http_guard import (
    HttpGuard,
    Identity,
    host_names,
    identity_of,
    is_loopback,
    load_tokens,
    local_identity,
)
from cardbus.eventstore.errors import ConfigError

CHUNK = 64 * 1024


async def _call(guard: HttpGuard, chunks: int, headers: list[tuple[bytes, bytes]]) -> Any:
    sent: list[dict[str, Any]] = []
    read = {"n": 0}
    seen: dict[str, Any] = {}

    async def receive() -> dict[str, Any]:
        read["n"] += 1
        more = read["n"] < chunks
        return {"type": "http.request", "body": b"x" * CHUNK, "more_body": more}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen["body"] = (await receive())["body"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    guard.app = app
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/",
        "query_string": b"",
        "headers": [(b"host", b"127.0.0.1:1"), (b"content-type", b"application/json"), *headers],
    }
    await guard(scope, receive, send)
    return sent[0]["status"], read["n"], seen.get("body")


async def test_a_streamed_body_over_the_limit_is_refused_unread() -> None:
    guard = HttpGuard(lambda *a: None, max_body=4 * CHUNK, max_depth=None)  # type: ignore[arg-type,return-value]
    status, read, body = await _call(guard, 960, [])  # 60 MB in 64 KiB chunks
    assert status == 413 and read == 5 and body is None  # stopped one chunk past the limit
    status, read, body = await _call(guard, 4, [])
    assert status == 200 and read == 4 and body == b"x" * 4 * CHUNK


async def test_tokens_hosts_and_loopback() -> None:
    guard = HttpGuard(lambda *a: None, tokens=["a", "b"], max_depth=None)  # type: ignore[arg-type,return-value]
    assert (await _call(guard, 1, []))[0] == 401
    assert (await _call(guard, 1, [(b"authorization", b"Bearer b")]))[0] == 200
    assert (await _call(guard, 1, [(b"x-cardbus-token", b"a")]))[0] == 200
    assert host_names("0.0.0.0") == ["*"]
    assert "a2a.example" in host_names("0.0.0.0", "https://a2a.example/")
    assert is_loopback("::1") and not is_loopback("0.0.0.0")
    assert load_tokens(" x ", None) == {"x": "token"}


def test_a_token_file_names_its_tokens(tmp_path: Path) -> None:
    f = tmp_path / "tokens"
    f.write_text("# who\nops 0ps\n\nbob b0b\nops 0ps-next\nl0ne\n")
    assert load_tokens("cli", f, "shared") == {
        "cli": "shared",
        "0ps": "ops",
        "b0b": "bob",
        "0ps-next": "ops",  # two tokens of one name: the new one let in before the old goes
        "l0ne": "shared",  # a token alone (the format before names): --token-name
    }
    for text, says in [
        ("ops a b\n", "two words"),
        ("ops same\nbob same\n", "two names"),
        ("# nothing\n", "holds no token"),
    ]:
        f.write_text(text)
        with pytest.raises(ConfigError, match=says):
            load_tokens(None, f)
    with pytest.raises(ConfigError, match="one printable word"):
        load_tokens("x", None, "two words")


async def _identity(guard: HttpGuard, headers: list[tuple[bytes, bytes]]) -> Any:
    seen: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen["user"] = identity_of(scope)

    guard.app = app
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/",
        "query_string": b"",
        # a user an earlier layer (or the client) put there is not taken
        "user": Identity("alice"),
        "headers": [(b"host", b"127.0.0.1:1"), *headers],
    }
    await guard(scope, None, None)  # type: ignore[arg-type]
    return seen.get("user")


async def test_the_guard_says_who_a_request_is() -> None:
    named = HttpGuard(lambda *a: None, tokens={"0ps": "ops", "b0b": "bob"})  # type: ignore[arg-type,return-value]
    assert await _identity(named, [(b"authorization", b"Bearer b0b")]) == Identity("bob")
    assert await _identity(named, [(b"x-cardbus-token", b"0ps")]) == Identity("ops")
    listed = HttpGuard(lambda *a: None, tokens=["t"])  # type: ignore[arg-type,return-value]
    assert await _identity(listed, [(b"authorization", b"Bearer t")]) == Identity("token")
    open_door = HttpGuard(lambda *a: None)  # type: ignore[arg-type,return-value]
    local = await _identity(open_door, [])
    assert local == local_identity() and local.name.startswith("local:")
    assert not local.is_authenticated and local.name != "alice"


async def test_a_body_deadline_is_a_408() -> None:
    guard = HttpGuard(lambda *a: None, body_timeout_s=0.05)  # type: ignore[arg-type,return-value]
    never = asyncio.Event()
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        await never.wait()  # a client that never sends the rest
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/",
        "query_string": b"",
        "headers": [(b"host", b"127.0.0.1:1"), (b"content-type", b"application/json")],
    }
    await guard(scope, receive, send)
    assert sent[0]["status"] == 408
    assert (b"connection", b"close") in sent[0]["headers"]
    with pytest.raises(ConfigError):
        HttpGuard(lambda *a: None, body_timeout_s=0)  # type: ignore[arg-type,return-value]
