"""An agent process: serves the team's agents on NATS until SIGTERM or Ctrl-C.

    python agent_process.py nats://127.0.0.1:4222

The same as ``cardbus agent serve team:Shouter team:Counter --nats URL``. Start as many
as you like: replicas of an agent share its inbox, each card goes to one of them.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from team import Counter, Shouter

from cardbus.bus.runtime.nats import serve_agents
from cardbus.eventstore.nats.connection import NatsOptions


async def main(url: str) -> None:
    stop = asyncio.Event()
    ready = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    serving = asyncio.create_task(
        serve_agents(NatsOptions(url=url), [Shouter, Counter], stop, ready=ready)
    )
    await ready.wait()
    print("agents ready", flush=True)
    await serving


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
