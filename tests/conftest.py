"""Shared fixtures: every EventStore backend, made fresh per test."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

# The repository's folders (agents, bus, tools, ...) install as cardbus.<folder>; at the
# front of sys.path they would shadow installed packages of the same names (openai-agents
# installs `agents`). `python -m pytest` puts the cwd first (the Makefile runs it with -P,
# which does not): the root goes last instead, where it still serves the tests' own
# helpers (`tests.agents.openai_stub`, ...) and shadows nothing installed.
ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT] + [str(ROOT)]

import asyncio  # noqa: E402

import pytest  # noqa: E402
import uvloop  # noqa: E402

from cardbus.eventstore import MemoryEventStore, SqliteEventStore  # noqa: E402


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SqliteEventStore]:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    yield store
    await store.close()


@pytest.fixture
async def memory_store() -> AsyncIterator[MemoryEventStore]:
    yield MemoryEventStore()


# -- NATS JetStream: a real nats-server per test (tests/natsserver.py) ----------
# Never mocked, never skipped: a missing nats-server binary fails the test.
# Every server picks its own free loopback port (safe under xdist) and keeps its
# JetStream store in the test's tmp_path.

from collections.abc import Callable, Iterator  # noqa: E402
from typing import Any  # noqa: E402

from natsserver import NatsCluster, NatsServer  # noqa: E402

from cardbus.eventstore.nats import NatsEventStore  # noqa: E402


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A private nats-server with JetStream; the test may stop, kill or restart it."""
    server = NatsServer(tmp_path / "nats").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_url(nats_server: NatsServer) -> str:
    """``nats://127.0.0.1:<port>`` of this test's ``nats_server``."""
    return nats_server.url


@pytest.fixture
async def nats_store(nats_url: str) -> AsyncIterator[NatsEventStore]:
    """A fresh NatsEventStore (stream CARDBUS_EVENTS) on this test's own server."""
    store = await NatsEventStore.connect(nats_url, request_timeout=10.0)
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    """Three JetStream nodes routed on loopback (for R3 streams); ``.url`` lists them all."""
    cluster = NatsCluster(tmp_path / "cluster").start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def nats_server_factory(tmp_path: Path) -> Iterator[Callable[..., NatsServer]]:
    """``make(**NatsServer options)`` -> a started server (own store dir), stopped after the test.

    For servers with a special configuration, e.g.
    ``make(extra_config='authorization { token: "s3cret" }')``.
    """
    made: list[NatsServer] = []

    def make(**options: Any) -> NatsServer:
        server = NatsServer(tmp_path / f"nats-{len(made)}", **options)
        made.append(server)
        return server.start()

    try:
        yield make
    finally:
        for server in made:
            server.stop()


# -- event loops ------------------------------------------------------------------


def pytest_asyncio_loop_factories(config: Any, item: pytest.Item) -> dict[str, Any]:
    """The event loops a test runs on: asyncio's; and uvloop's too for a test marked
    ``both_loops``. The ``cardbus`` commands and the benches run on uvloop (the ``fast``
    extra, in ``dev``), which differs where it matters: a call due within half a
    millisecond comes back as a plain ``Handle`` without ``when()`` (that broke the NATS
    reply reader once, and only the benches showed it)."""
    if item.get_closest_marker("both_loops"):
        return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
    return {"asyncio": asyncio.new_event_loop}
