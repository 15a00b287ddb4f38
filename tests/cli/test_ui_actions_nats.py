"""The console's run-making actions on NATS: written to the log, decided by the orchestrator.

A real nats-server; an orchestrator with the two quick agents (``ui_agents``) in
a ``NatsRuntime`` of its own, in a thread (its own loop), as ``cardbus
orchestrator`` would be in its own process; the console app (``submit_to_log``,
what ``cardbus ui --store nats://...`` builds) in-process through starlette's
TestClient. A plan started from the console completes, a fork with an override
completes with the new inputs, a failed task re-run with another model
completes, every new run's creation is the operator's, and a plan no registered
agent can take is refused with nothing appended.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ui_agents import Counter, Summer, count_plan

from cardbus.bus.http_guard import local_identity
from cardbus.eventstore.nats import NatsEventStore

pytest.importorskip("starlette")
from starlette.testclient import TestClient

from cardbus.tools.ui import create_app


class Orchestrator:
    """``NatsRuntime`` with the quick agents, in a thread, until stopped."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        from cardbus.bus.runtime.nats import NatsRuntime
        from cardbus.eventstore.nats.connection import NatsOptions

        async def go() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            async with NatsRuntime(NatsOptions(url=self.url), [Counter, Summer]):
                self.ready.set()
                await self._stop.wait()

        try:
            asyncio.run(go())
        except BaseException as e:
            self.error = e
        finally:
            self.ready.set()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(30)


@pytest.fixture
def console(nats_url: str) -> Iterator[TestClient]:
    orchestrator = Orchestrator(nats_url)
    try:
        assert orchestrator.ready.wait(60) and orchestrator.error is None, orchestrator.error

        async def opener() -> NatsEventStore:
            return await NatsEventStore.connect(nats_url)

        app = create_app(opener=opener, submit_to_log=True)
        with TestClient(app, base_url="http://127.0.0.1") as c:
            yield c
    finally:
        orchestrator.stop()
    assert orchestrator.error is None, orchestrator.error


def _wait_run(c: TestClient, root: str, status: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        run = c.get(f"/api/runs/{root}").json()
        if run.get("run") and run["run"]["status"] == status:
            return run
        if run.get("run") and run["run"]["status"] not in ("running", status):
            raise AssertionError(f"run {root} ended {run['run']['status']}, not {status}")
        assert time.monotonic() < deadline, f"run {root} not {status}: {run.get('run')}"
        time.sleep(0.05)


def _output(run: dict[str, Any], name: str) -> Any:
    [task] = [t for t in run["tasks"] if t["task_id"].startswith(name + "-")]
    return task["output"]


@pytest.mark.timeout(180)
def test_actions_on_nats_are_decided_by_the_running_orchestrator(
    console: TestClient, nats_url: str
) -> None:
    c = console
    about = c.get("/api/console").json()["actions"]
    assert about["enabled"] is True and {"ui-counter", "ui-summer"} <= set(about["agents"])

    started = c.post("/api/runs", json={"plan": count_plan(3), "by": "nats-op"})
    assert started.status_code == 200, started.text
    root = started.json()["root_id"]
    assert _output(_wait_run(c, root, "completed"), "sum") == {"total": 6}

    fork = c.post(f"/api/tasks/count-{root[-12:]}/fork", json={"inputs": {"n": 4}, "by": "nats-op"})
    assert fork.status_code == 200, fork.text
    forked = _wait_run(c, fork.json()["root_id"], "completed")
    assert _output(forked, "sum") == {"total": 10}

    failed = c.post("/api/runs", json={"plan": count_plan(7), "by": "nats-op"}).json()["root_id"]
    _wait_run(c, failed, "failed")
    rerun = c.post(
        f"/api/tasks/count-{failed[-12:]}/rerun", json={"model": "careful", "by": "nats-op"}
    )
    assert rerun.status_code == 200, rerun.text
    again = _wait_run(c, rerun.json()["root_id"], "completed")
    assert _output(again, "sum") == {"total": 28}

    # a loopback console without a token: each run is by the account it runs as, and the
    # name the request gave is the run's note
    me = local_identity().name
    for r in (root, fork.json()["root_id"], failed, rerun.json()["root_id"]):
        steps = c.get(f"/api/tasks/count-{r[-12:]}").json()["steps"]
        created = [s["actor"] for s in steps if s["type"] == "task.created.v1"]
        assert created == [me], (r, created)
        run_events = c.get(f"/api/runs/{r}").json()["timeline"]["run"]
        assert [s["actor"] for s in run_events if s["kind"] == "run.started"] == [me]

    bad = {"goal": "g", "tasks": [{"id": "a", "capability": "fly"}]}
    refused = c.post("/api/runs", json={"plan": bad, "by": "nats-bad"})
    assert refused.status_code == 400 and "fly" in refused.json()["error"]

    async def noted(note: str) -> list[str]:
        store = await NatsEventStore.connect(nats_url, create_stream=False)
        try:
            events = await store.read_all(1, 100_000)
            return [e.type for e in events if getattr(e.data, "note", None) == note]
        finally:
            await store.close()

    assert asyncio.run(noted("by nats-bad")) == []
    assert "run.started.v1" in asyncio.run(noted("by nats-op"))  # the check can see


def test_a_run_started_again_with_its_plan_id_is_the_same_run(console: TestClient) -> None:
    c = console
    first = c.post("/api/runs", json={"plan": count_plan(2, plan_id="once"), "by": "a"}).json()
    _wait_run(c, first["root_id"], "completed")
    again = c.post("/api/runs", json={"plan": count_plan(2, plan_id="once"), "by": "b"}).json()
    assert again["root_id"] == first["root_id"]
    other = c.post("/api/runs", json={"plan": count_plan(3, plan_id="once"), "by": "b"})
    assert other.status_code == 400 and "already names another plan" in other.json()["error"]
