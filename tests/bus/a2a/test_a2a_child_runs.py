"""A remote department (issue 32 item 4): a plan task done by another cardbus's gateway
(``run_plan`` over ``a2a+http://``) starts a run there that names its parent task (the
lineage in the A2A metadata), and cancelling the parent cancels that remote run.

Real parts: ``cardbus a2a serve`` in a subprocess on its own SQLite file, a2a-sdk's
client and server, the local orchestrator on another SQLite file.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from a2a_support import ServeProcess

from cardbus.bus.a2a import remote_a2a_agent
from cardbus.bus.orchestrator.cancel import cancel_run
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServeProcess]:
    proc = ServeProcess(tmp_path / "remote.db", ["a2a_support:Slow"]).start()
    try:
        yield proc
    finally:
        proc.stop()


def _lead(seconds: float) -> dict[str, Any]:
    """A lead whose department is a plan run by the remote gateway (its ``run_plan``)."""
    return {
        "goal": "lead",
        "tasks": [
            {
                "id": "dept",
                "capability": "run_plan",
                "timeout_s": 60,
                "inputs": {
                    "goal": "the remote department",
                    "tasks": [
                        {
                            "id": "shout",
                            "capability": "shout",
                            "inputs": {"text": "found", "seconds": seconds},
                            "timeout_s": 60,
                        }
                    ],
                },
            }
        ],
    }


async def _remote_runs(db: Path) -> list[Any]:
    async with await SqliteEventStore.open(db) as store:
        return list(await store.read_all())


async def _until(db: Path, found: Any, timeout: float = 30.0) -> list[Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = await _remote_runs(db)
        if found(events):
            return events
        await asyncio.sleep(0.05)
    raise AssertionError("the remote log never showed it")


async def test_the_remote_run_names_its_parent_task(server: ServeProcess, tmp_path: Path) -> None:
    Remote = await remote_a2a_agent("a2a+" + server.url)
    async with (
        await SqliteEventStore.open(tmp_path / "local.db") as store,
        EmbeddedRuntime(store, [Remote]) as rt,
    ):
        result = await rt.run(_lead(0.0), timeout=60)
    assert result.status == "completed", result.detail
    assert result.outputs["dept"] == {"text": "FOUND"}  # the remote run's output
    remote = await _remote_runs(server.db)
    (started,) = [e.data for e in remote if isinstance(e.data, ev.RunStarted)]
    assert (started.parent_root, started.parent_task, started.parent_attempt) == (
        result.root_id,
        f"dept-{result.root_id[-12:]}",
        1,
    )


async def test_cancelling_the_parent_cancels_the_remote_run(
    server: ServeProcess, tmp_path: Path
) -> None:
    Remote = await remote_a2a_agent("a2a+" + server.url)
    async with (
        await SqliteEventStore.open(tmp_path / "local.db", poll_interval=0.01) as store,
        EmbeddedRuntime(store, [Remote]) as rt,
    ):
        root = await rt.orchestrator.submit(_lead(120.0))
        await _until(server.db, lambda es: any(isinstance(e.data, ev.TaskStarted) for e in es))
        await cancel_run(store, root, by="ops")
        assert (await rt.orchestrator.wait(root, timeout=30)).status == "cancelled"
        remote = await _until(
            server.db, lambda es: any(isinstance(e.data, ev.RunFailed) for e in es)
        )
    (ended,) = [e.data for e in remote if isinstance(e.data, ev.RunFailed)]
    assert ended.cancelled, ended


async def test_the_two_logs_export_one_trace(server: ServeProcess, tmp_path: Path) -> None:
    """Each log exported on its own (`cardbus export`): the remote run's spans carry the
    caller's trace id and its run span sits under the caller's task span, so a tracing
    backend that gets both shows one tree (ids are derived from the log's ids)."""
    from cardbus.projections.traces import task_span_id, trace_spans

    Remote = await remote_a2a_agent("a2a+" + server.url)
    async with (
        await SqliteEventStore.open(tmp_path / "local.db") as store,
        EmbeddedRuntime(store, [Remote]) as rt,
    ):
        result = await rt.run(_lead(0.0), timeout=60)
        local = trace_spans(await store.read_all())
    remote = trace_spans(await _remote_runs(server.db))
    assert result.status == "completed", result.detail
    assert len({s.trace_id for s in local + remote}) == 1
    ids = {s.span_id for s in local}
    dept = task_span_id(f"dept-{result.root_id[-12:]}")
    assert dept in ids
    (run_span,) = [s for s in remote if s.parent_span_id == dept]
    assert run_span.attributes["cardbus.root_id"] != result.root_id  # the remote run's own
    remote_ids = {s.span_id for s in remote}
    assert all(s.parent_span_id in remote_ids | {dept} for s in remote if s is not run_span)
