"""The console's events stream (``/api/events``) across quiet intervals.

A heartbeat used to cancel the store's subscription (``wait_for(anext(...))``):
the stream died at its first quiet interval and the server logged a traceback
on every reconnect. Here the heartbeat is 0.05 s (``CARDBUS_UI_HEARTBEAT_S``),
the stream stays open across many of them, then sees the next event; a normal
reconnect and the server's stop log no traceback.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from pathlib import Path

import pytest
from test_ui import Server

from cardbus.eventstore import NewEvent, SqliteEventStore
from cardbus.eventstore import events as ev


def _append(db: Path, stream: str) -> int:
    async def go() -> int:
        store = await SqliteEventStore.open(db)
        try:
            data = ev.TaskCreated(root_id=stream, capability="research", inputs={"q": 1})
            out = await store.append(stream, [NewEvent(data=data, correlation_id=stream)], 0)
            return out[0].position
        finally:
            await store.close()

    return asyncio.run(go())


def _read_until(resp: object, want: bytes, deadline: float) -> list[bytes]:
    lines: list[bytes] = []
    while time.monotonic() < deadline:
        line = resp.readline()  # type: ignore[attr-defined]
        assert line, f"the stream ended: {lines}"
        lines.append(line)
        if want in line:
            return lines
    raise AssertionError(f"no {want!r} in time: {lines}")


@pytest.mark.timeout(120)
def test_the_stream_survives_quiet_intervals_then_sees_the_next_event(tmp_path: Path) -> None:
    db = tmp_path / "ui.db"
    _append(db, "first")
    server = Server(db, env={"CARDBUS_UI_HEARTBEAT_S": "0.05"})
    try:
        server.wait_ready()
        url = server.url + "api/events"
        with urllib.request.urlopen(url, timeout=30) as resp:
            # 10 quiet intervals: each one a heartbeat, the subscription still there
            lines: list[bytes] = []
            for _ in range(10):
                lines += _read_until(resp, b": heartbeat", time.monotonic() + 30)
            assert lines.count(b": heartbeat\n") >= 10
            # an append from another process arrives on the same stream
            position = _append(db, "second")
            seen = _read_until(resp, b"data:", time.monotonic() + 30)
            assert f"id: {position}\n".encode() in seen
            assert b'"stream":"second"' in seen[-1]
        # the page's EventSource reconnects with Last-Event-ID: a normal reconnect
        again = urllib.request.Request(url, headers={"Last-Event-ID": str(position - 1)})
        with urllib.request.urlopen(again, timeout=30) as resp:
            assert b'"stream":"second"' in _read_until(resp, b"data:", time.monotonic() + 30)[-1]
            _read_until(resp, b": heartbeat", time.monotonic() + 30)
    finally:
        out = server.stop()
    assert "Traceback" not in out, out
    assert "Error" not in out, out
