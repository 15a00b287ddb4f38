"""Telemetry fixtures: a demo run in an SQLite file, and an OTLP/HTTP receiver on loopback."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cardbus.agents.demo import DEMO_AGENTS, report_plan
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import SqliteEventStore


async def _run_demo(path: Path) -> str:
    store = await SqliteEventStore.open(path)
    try:
        async with EmbeddedRuntime(store, DEMO_AGENTS) as rt:
            result = await rt.run(report_plan("ocean tides"), timeout=30)
        assert result.status == "completed"
        return result.root_id
    finally:
        await store.close()


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(db path, root id) of one finished demo run."""
    path = tmp_path_factory.mktemp("demo") / "cardbus.db"
    root_id = asyncio.run(_run_demo(path))
    return str(path), root_id


@dataclass
class Received:
    """What the receiver got: (path, content type, body) per request."""

    requests: list[tuple[str, str, bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def requests_to(self, path: str) -> list[tuple[str, str, bytes]]:
        with self.lock:
            return [r for r in self.requests if r[0] == path]


@dataclass
class Receiver:
    url: str
    received: Received


@pytest.fixture
def otlp_receiver() -> Iterator[Receiver]:
    """A real OTLP/HTTP endpoint on 127.0.0.1 (free port) that keeps every request body."""
    received = Received()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            with received.lock:
                received.requests.append((self.path, self.headers.get("Content-Type", ""), body))
            from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

            reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Receiver(f"http://127.0.0.1:{server.server_address[1]}", received)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


_EXPORTER = InMemorySpanExporter()
_PROVIDER = TracerProvider()
_PROVIDER.add_span_processor(SimpleSpanProcessor(_EXPORTER))


@pytest.fixture
def sdk_spans() -> Iterator[InMemorySpanExporter]:
    """cardbus traced into an SDK provider with an in-memory exporter, for this test only.

    The provider is not made global (``bus.telemetry.use_tracer_provider``), so
    other tests in this process run without tracing, as they expect.
    """
    from cardbus.bus import telemetry

    _EXPORTER.clear()
    telemetry.use_tracer_provider(_PROVIDER)
    try:
        yield _EXPORTER
    finally:
        telemetry.use_tracer_provider(None)
        _EXPORTER.clear()
