"""Two cardbus instances talking A2A: one serves its agent (`cardbus a2a serve`), the
other runs a plan whose agent is that server (`"a2a+http://host:port"` in the plan).

    python main.py

Each has its own log: the server's (`server.db`) has the A2A task as a run of its own,
the caller's (`caller.db`) the remote agent's attempts.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
CARDBUS = str(Path(sys.executable).parent / "cardbus")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_card(url: str, server: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"cardbus a2a serve exited {server.returncode}")
        try:
            if httpx.get(f"{url}/.well-known/agent-card.json", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"no A2A card at {url} after {timeout:.0f} s")


def main() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # 1. the serving cardbus: its agent behind A2A, on loopback (no token needed there)
    server = subprocess.Popen(
        [
            CARDBUS,
            "a2a",
            "serve",
            "--port",
            str(port),
            "--store",
            "server.db",
            "--agent",
            "team:Definer",
        ],
        cwd=HERE,
    )
    try:
        wait_for_card(url, server)
        print(f"A2A card at {url}/.well-known/agent-card.json")
        # 2. the calling cardbus: a plan whose agent is the remote one
        plan = {
            "plan_id": "a2a-bridge-1",
            "goal": "Define a term through another cardbus",
            "agents": [f"a2a+{url}"],
            "tasks": [{"id": "define", "capability": "define", "inputs": {"term": "tide"}}],
        }
        (HERE / "plan.json").write_text(json.dumps(plan, indent=2))
        done = subprocess.run(
            [CARDBUS, "run", "plan.json", "--store", "caller.db", "--json"],
            cwd=HERE,
            capture_output=True,
            text=True,
            timeout=90,
        )
        if done.returncode != 0:
            raise SystemExit(f"cardbus run failed:\n{done.stdout}\n{done.stderr}")
        result = json.loads(done.stdout)
        print(json.dumps(result["outputs"], indent=2))
        assert result["status"] == "completed", result
        assert result["outputs"]["define"] == {
            "term": "tide",
            "meaning": "the rise and fall of the sea",
        }, result
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
