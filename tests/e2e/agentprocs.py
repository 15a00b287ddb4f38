"""Agents that are not cardbus's, as subprocesses (``examples/foreign_agent``,
``examples/node_agent``), and the ``cardbus`` commands run against them."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CLAUSE = re.compile(r"^  (PASS|FAIL|NOT EXERCISED) +(\S+)", re.M)


class AgentProcess:
    """A process (``argv``) with its output in ``<name>.log`` under ``cwd``."""

    def __init__(
        self, argv: Sequence[str], cwd: Path, name: str, env: dict[str, str] | None = None
    ) -> None:
        self.log = cwd / f"{name}.log"
        self._out = open(self.log, "wb")  # noqa: SIM115 - closed in stop
        self.proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            if self.proc.poll() is not None:
                raise AssertionError(f"agent exited ({self.proc.returncode}):\n{self.output()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} after {timeout}s:\n{self.output()}")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()


def cardbus(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``cardbus ARGS`` in a process of its own; its exit code and output."""
    return subprocess.run(
        [sys.executable, "-m", "cardbus.tools", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )


def clauses(check_output: str) -> dict[str, str]:
    """``cardbus agent check``'s outcome of each clause, by clause."""
    return {clause: outcome for outcome, clause in CLAUSE.findall(check_output)}
