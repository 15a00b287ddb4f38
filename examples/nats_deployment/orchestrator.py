"""The orchestrator process: runs the plan on NATS (its agents are elsewhere) and prints
the result as JSON.

    python orchestrator.py nats://127.0.0.1:4222

A second run of the same plan id resumes the run instead of starting another; a
restarted orchestrator replays the log from JetStream and goes on with every open run.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from cardbus import NatsRuntime
from cardbus.eventstore.nats.connection import NatsOptions

PLAN = {
    "plan_id": "nats-deployment-1",
    "goal": "Shout a sentence, then count its words",
    "tasks": [
        {"id": "shout", "capability": "shout", "inputs": {"text": "the log is the truth"}},
        {
            "id": "count",
            "capability": "count",
            "deps": ["shout"],
            "inputs": {"text": {"$dep": "shout", "path": "text"}},
        },
    ],
}


async def main(url: str) -> None:
    async with NatsRuntime(NatsOptions(url=url)) as runtime:
        result = await runtime.run(PLAN, timeout=60, agent_timeout=30)
    print(
        json.dumps(
            {"status": result.status, "outputs": result.outputs, "orchestrator_pid": os.getpid()}
        )
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
