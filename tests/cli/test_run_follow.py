"""``cardbus run --follow`` prints the steps and the model's text as they come (issue 31).

A real ``cardbus run`` subprocess, its agent asking the loopback stub, which holds
its stream after five pieces: the command has printed those five pieces while the
run is still going (and before the log has the call's answer); let go, the run
completes, the log has one ``model.answered``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev
from tests.agents.openai_stub import OpenAIStub, Reply
from tests.streaming_agents import ANSWER, PIECES, write_plan

TESTS = Path(__file__).resolve().parent.parent


class Output:
    """A process's stdout, read as it comes (its pieces end no line)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.data = b""
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        while piece := os.read(fd, 4096):
            with self._lock:
                self.data += piece

    def text(self) -> str:
        with self._lock:
            return self.data.decode(errors="replace")

    def wait_for(self, want: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while want not in self.text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no {want!r} in: {self.text()}")
            time.sleep(0.05)


def _answered(db: Path) -> list[ev.ModelAnswered]:
    async def go() -> list[ev.ModelAnswered]:
        store = await SqliteEventStore.open(db)
        try:
            return [e.data for e in await store.read_all() if isinstance(e.data, ev.ModelAnswered)]
        finally:
            await store.close()

    return asyncio.run(go())


def _command(
    folder: Path, plan_id: str, stub: OpenAIStub, *flags: str
) -> tuple[list[str], dict[str, str]]:
    """``cardbus run`` of the writer's plan on ``folder``'s log.db with ``flags``, and its
    environment: the agents' module on the path, the stub as the model."""
    plan_file = folder / "plan.json"
    plan_file.write_text(json.dumps(write_plan(plan_id)))
    env = {**os.environ, "PYTHONPATH": str(TESTS), "OPENAI_BASE_URL": stub.url}
    env["CARDBUS_MODEL"] = "stub-model"
    cmd = [sys.executable, "-m", "cardbus.tools", "run", str(plan_file), *flags]
    return [*cmd, "--store", str(folder / "log.db")], env


@pytest.mark.timeout(120)
def test_follow_prints_the_text_while_the_model_writes_it(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    gate = threading.Event()
    with OpenAIStub() as stub:
        stub.script(Reply(content=ANSWER, chunks=PIECES, gate=gate, gate_after=5))
        cmd, env = _command(tmp_path, "follow-1", stub, "--follow")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        out = Output(proc)
        try:
            out.wait_for("writes: " + "".join(PIECES[:5]), proc)
            # five pieces shown, the run still going, the call not answered in the log
            assert proc.poll() is None
            assert "asks its model" in out.text()
            assert _answered(db) == []
        finally:
            gate.set()
            code = proc.wait(60)
    text = out.text()
    assert code == 0, text
    # the whole answer was printed, in order, on its line (a step logged meanwhile, as the
    # task's "running", goes on a line of its own between two parts), after the step that
    # says the model was asked and before the one that logged the answer, then the end
    written = [line.split(" writes: ", 1)[1] for line in text.splitlines() if " writes: " in line]
    assert "".join(written) == ANSWER
    asked, writes = text.index("asks its model"), text.index("writes: ")
    assert asked < writes < text.index("the model answered") < text.index("completed")
    assert len(_answered(db)) == 1


@pytest.mark.timeout(120)
def test_without_follow_nothing_is_streamed_to_the_terminal(tmp_path: Path) -> None:
    with OpenAIStub() as stub:
        stub.script(Reply(content=ANSWER, chunks=PIECES))
        cmd, env = _command(tmp_path, "quiet-1", stub)
        done = subprocess.run(cmd, capture_output=True, env=env, timeout=100)
        assert stub.streamed == 1  # the provider streamed; nobody watched
    text = done.stdout.decode()
    assert done.returncode == 0, text
    assert "writes:" not in text and "asks its model" not in text


@pytest.mark.timeout(180)
def test_a_crash_in_the_middle_of_a_stream_sends_the_call_again_on_resume(
    tmp_path: Path,
) -> None:
    db = tmp_path / "log.db"
    gate = threading.Event()
    with OpenAIStub() as stub:
        # the first call is cut off after five pieces by a kill -9; the resumed run's
        # call is answered whole
        stub.script(
            Reply(content=ANSWER, chunks=PIECES, gate=gate, gate_after=5),
            Reply(content=ANSWER, chunks=PIECES),
        )
        cmd, env = _command(tmp_path, "crash-1", stub, "--follow")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        out = Output(proc)
        try:
            out.wait_for("writes: " + "".join(PIECES[:5]), proc)
            proc.kill()  # SIGKILL: mid-stream, nothing closed
            proc.wait(30)
        finally:
            gate.set()
        assert _answered(db) == []  # the pieces shown were never in the log
        again = subprocess.run(cmd, capture_output=True, env=env, timeout=120)
        assert again.returncode == 0, again.stdout.decode()
        assert stub.streamed == 2  # the call in flight was sent again
    answered = _answered(db)
    assert len(answered) == 1 and answered[0].error is None
