"""HttpGuard alone: a streamed body (no Content-Length) over the limit is refused as soon as
it passes it, the rest unread; what passes reaches the app whole."""

from __future__ import annotations

from typing import Any

from cardbus.bus.http_guard import HttpGuard, host_names, is_loopback, load_tokens

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
