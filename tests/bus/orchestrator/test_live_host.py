"""A second process starting on the log leaves a live process's attempts to it (issue 30).

An embedded start counts the attempts in flight as host losses: they died with the
process that ran them. Not when that process still runs: two ``cardbus run`` on one
file, the second starting while the first's agent works on a task. Counting that
attempt lost wrote an untrue ``host_lost`` (the process was alive), spent a host
loss and dispatched the task again, and the first agent's answer was then ignored
(``stale_attempt``). Modelled in one process as the other tests of two processes on
one file are: two runtimes, each with its own connection to the file.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from orchkit import FAST, TextOut, is_, make_agent, plan, run_log, task, tid, wait_for

from cardbus.bus import EmbeddedRuntime
from cardbus.bus.orchestrator.live_hosts import process_alive
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev


class _Gate:
    release: asyncio.Event | None = None


async def _held(task: Any, inputs: Any, ctx: Any) -> Any:
    assert _Gate.release is not None
    await _Gate.release.wait()  # works until the test lets it answer
    return TextOut(text=inputs.text.upper())


AGENT = make_agent("held", "echo", _held)


async def test_a_start_beside_a_live_process_leaves_its_attempt_to_it(db_path: Path) -> None:
    _Gate.release = asyncio.Event()
    store_a = await SqliteEventStore.open(db_path, poll_interval=0.01)
    store_b = await SqliteEventStore.open(db_path, poll_interval=0.01)
    try:
        async with EmbeddedRuntime(store_a, [AGENT], FAST) as a_rt:
            root = await a_rt.orchestrator.submit(plan(task("a", timeout_s=60)))
            a = tid(root, "a")
            await wait_for(store_a, is_(ev.TaskStarted, a))  # A's agent works on it
            async with EmbeddedRuntime(store_b, [AGENT], FAST) as b_rt:
                # what B's start decided about the attempt is written by the time start
                # returns: its orchestrator.started and the run.resumed name the losses
                mine = b_rt.orchestrator.orchestrator_id
                (started,) = [
                    e.data
                    for e in await store_b.read_stream(f"orchestrator-{mine}")
                    if isinstance(e.data, ev.OrchestratorStarted)
                ]
                assert started.resumed == [root]
                assert started.lost_attempts == []  # A lives: its attempt is not lost
                _Gate.release.set()
                r = await a_rt.orchestrator.wait(root, 30)
                assert await b_rt.orchestrator.caught_up(30)
        assert r.status == "completed" and r.outputs["a"] == {"text": "A"}
        log = await run_log(store_a, root)
        (resumed,) = log.of(ev.RunResumed)
        assert resumed.lost_attempts == []
        assert log.of(ev.TaskTimedOut, a) == []  # no untrue host_lost
        assert log.of(ev.TaskRetryScheduled, a) == []  # no host loss spent
        assert log.of(ev.TaskResultIgnored, a) == []  # A's answer counted
        assert [d.attempt for d in log.of(ev.TaskDispatched, a)] == [1]
        (done,) = log.of(ev.TaskCompleted, a)
        assert done.attempt == 1
    finally:
        await store_b.close()
        await store_a.close()


def test_a_process_is_alive_only_if_it_is_the_one_that_wrote_the_record() -> None:
    now = time.time()
    assert process_alive(os.getpid(), now)
    # the same pid, a process started after the record: pids are reused, it is not that one
    assert not process_alive(os.getpid(), now - 3600 * 24 * 365 * 30)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert process_alive(child.pid, time.time())
    finally:
        child.kill()
    # killed and not yet reaped: a zombie holds the pid, and is dead (WNOWAIT: waits for
    # the exit and leaves the zombie)
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    assert Path(f"/proc/{child.pid}/stat").exists()
    assert not process_alive(child.pid, time.time())
    child.wait()
    assert not process_alive(child.pid, time.time())
