"""What the door tests share (a person answers a paused run from a door: the command
line, the console): ``cardbus run`` in a folder as a subprocess, waited on until the
log says it pauses, killed with SIGKILL, started again; other ``cardbus`` commands on
the same log.

Every command runs in the test's folder on its ``log.db`` with the environment the
test gives (its agents' module on the path, its model endpoint). The ``runs`` fixture
(conftest) reaps the processes a test started, whatever the test does.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from cardbus.eventstore import Envelope, SqliteEventStore

__all__ = ["ROOT", "Runs", "cardbus", "kill9", "log_of", "wait_in_log"]

ROOT = Path(__file__).resolve().parents[2]  # the repository: the demo agents' path

T = TypeVar("T")


class Runs:
    """The ``cardbus run`` processes of one test (see the ``runs`` fixture)."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[str]] = []

    def start(self, folder: Path, env: dict[str, str]) -> subprocess.Popen[str]:
        """``cardbus run plan.json`` in ``folder`` (output piped, read at its end)."""
        cmd = [sys.executable, "-m", "cardbus.tools", "run", "plan.json", "--store", "log.db"]
        proc = subprocess.Popen(
            [*cmd, "--timeout", "120"],
            cwd=folder,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.started.append(proc)
        return proc

    def reap(self) -> None:
        """Kill what still runs and wait for all: none is left holding a pipe."""
        while self.started:
            proc = self.started.pop()
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=30)


def log_of(folder: Path) -> list[Envelope]:
    """The folder's log as it is now (read while another process may write it)."""

    async def read() -> list[Envelope]:
        store = await SqliteEventStore.open(folder / "log.db")
        try:
            return await store.read_all(0, 10_000)
        finally:
            await store.close()

    return asyncio.run(read())


def cardbus(folder: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """One ``cardbus`` command on the folder's log, run to its end."""
    return subprocess.run(
        [sys.executable, "-m", "cardbus.tools", *args, "--store", "log.db"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def wait_in_log(
    folder: Path,
    proc: subprocess.Popen[str],
    found: Callable[[list[Envelope]], T | None],
    what: str,
    timeout: float = 60,
) -> T:
    """What ``found`` picks from the folder's log, once it picks something; the run
    still going meanwhile (one that ended says why, with its output)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0]
        if (folder / "log.db").exists() and (picked := found(log_of(folder))) is not None:
            return picked
        time.sleep(0.05)  # polling the log another process writes: nothing to wait on
    raise AssertionError(f"{what}: not in the log within {timeout:.0f} s")


def kill9(proc: subprocess.Popen[str]) -> None:
    """SIGKILL: nothing closed, nothing flushed; the process is gone when this returns."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
