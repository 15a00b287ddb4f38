"""Crash recovery of a degraded run: kill the process at every write boundary.

A child process runs, on a SQLite file with the embedded runtime, a plan whose
optional task ``facts`` always fails (two attempts), whose ``report`` depends on
it and whose ``side`` does not. The child dies (``os._exit``, as a kill would;
``crashsweep._instrument``) right after its ``k``-th write to the log is durable;
a second child on the same log submits the same plan id again and waits for the
run to end. Every trial must end as a run that was never killed does:
``completed``, degraded without ``facts``, with the same outputs.

``python -m tests.e2e.optional_crash`` tries every kill point and prints the
count; ``tests/e2e/test_optional_crash.py`` runs a sample of them.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, ClassVar

import msgspec

from cardbus.agents import Agent, Capability, TaskCard, TaskContext

ROOT = Path(__file__).resolve().parents[2]
PLAN_ID = "optional-crash"
EXIT_KILLED = 77


class Text(msgspec.Struct):
    text: str = ""


class Search(Agent):
    agent_id = "search"
    capabilities: ClassVar = [Capability("search", Text, Text, "its index is down")]

    async def handle(self, task: TaskCard, inputs: Text, ctx: TaskContext) -> Text:
        raise RuntimeError("index down")


class Write(Agent):
    agent_id = "write"
    capabilities: ClassVar = [Capability("write", Text, Text, "writes with what it has")]

    async def handle(self, task: TaskCard, inputs: Text, ctx: TaskContext) -> Text:
        return Text(text=f"report on [{inputs.text}]")


def plan() -> dict[str, Any]:
    return {
        "plan_id": PLAN_ID,
        "goal": "a report, with facts if there are any",
        "tasks": [
            {"id": "facts", "capability": "search", "optional": True, "max_attempts": 2},
            {"id": "side", "capability": "write", "inputs": {"text": "side"}},
            {
                "id": "report",
                "capability": "write",
                "deps": ["facts", "side"],
                "inputs": {"text": {"$dep": "facts", "path": "text"}},
            },
        ],
    }


async def _child(db: str) -> dict[str, Any]:
    from cardbus.bus.orchestrator import Policy, RetryPolicy
    from cardbus.bus.runtime.embedded import EmbeddedRuntime
    from cardbus.eventstore.sqlite import SqliteEventStore

    policy = Policy(retry=RetryPolicy(initial_interval_s=0.05, jitter=0.0))
    async with (
        await SqliteEventStore.open(db) as store,
        EmbeddedRuntime(store, [Search, Write], policy, default_planner=False) as rt,
    ):
        root = await rt.orchestrator.submit(plan())
        result = await rt.orchestrator.wait(root, timeout=120)
    return {
        "root": root,
        "status": result.status,
        "reason": result.reason,
        "degraded": result.degraded,
        "outputs": result.outputs,
    }


def _spawn(db: str, crash_at: int) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.e2e.optional_crash", "child", db, str(crash_at)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout.strip()
    return proc.returncode, out.splitlines()[-1] if out else proc.stderr[-2000:]


def sweep(workdir: Path, points: list[int] | None = None) -> tuple[dict[str, Any], list[str]]:
    """(the never-killed run's result, a line for each kill point that ended otherwise);
    every point from 1 to the baseline's writes when ``points`` is None."""
    code, out = _spawn(str(workdir / "baseline.db"), 0)
    if code != 0:
        raise RuntimeError(f"the baseline run failed: {out}")
    base = json.loads(out)
    writes = int(base.pop("writes"))
    problems: list[str] = []
    for k in points if points is not None else range(1, writes + 1):
        if k > writes:
            continue
        db = str(workdir / f"k{k}.db")
        code, out = _spawn(db, k)
        if code == EXIT_KILLED:
            code, out = _spawn(db, 0)
        else:
            problems.append(f"k={k}: not killed (exit {code}): {out}")
            continue
        if code != 0:
            problems.append(f"k={k}: the resumed run failed: {out}")
            continue
        got = json.loads(out)
        got.pop("writes")
        if {**got, "root": ""} != {**base, "root": ""}:
            problems.append(f"k={k}: {got} != {base}")
    base["writes"] = writes
    return base, problems


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        from tests.e2e.crashsweep import _instrument

        writes = [0]
        _instrument(writes, int(sys.argv[3]))
        result = asyncio.run(_child(sys.argv[2]))
        result["writes"] = writes[0]
        print(json.dumps(result, default=str))
        return
    with tempfile.TemporaryDirectory(prefix="cardbus-optional-crash-") as tmp:
        base, problems = sweep(Path(tmp))
    for line in problems:
        print(f"FAILED {line}")
    print(
        f"{base['writes']} kill points: {base['writes'] - len(problems)} ended"
        f" {base['status']} ({base['reason'] or 'not degraded'}: {base['degraded']})"
        " as the run never killed"
    )
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
