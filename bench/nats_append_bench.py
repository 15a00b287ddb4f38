"""Client CPU of the NATS log's writes: process CPU per ``append_many`` of one decision.

Each call is what the orchestrator writes for a decision of a 3-task run: three
appends of two events each to new tasks, one JetStream atomic batch with one ack;
``--writers`` of them at once (runs in flight), on a local nats-server (file storage,
its CPU not counted). Printed: µs of this process's CPU per call, for each of
``--repeat`` rounds. The figure moves with the machine's load: measure a baseline
checkout in turn with this one (``PYTHONPATH`` or its own venv) and compare.

    .venv/bin/python bench/nats_append_bench.py [--calls 3200] [--writers 16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from cardbus.bus.runtime.loop import run
from cardbus.bus.runtime.nats import LocalNatsServer
from cardbus.eventstore import events as ev
from cardbus.eventstore.envelope import NewEvent
from cardbus.eventstore.nats.store import NatsEventStore
from cardbus.eventstore.store import Append


def decision(n: int) -> list[Append]:
    root = f"root-{n}"
    return [
        Append(
            f"task-{n}-{k}",
            [
                NewEvent(data=ev.TaskCreated(root_id=root, capability="echo"), correlation_id=root),
                NewEvent(data=ev.TaskStarted(attempt=1, agent_id="a1"), correlation_id=root),
            ],
            0,
        )
        for k in range(3)
    ]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=3200)
    ap.add_argument("--writers", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    server = LocalNatsServer().start()
    try:
        store = await NatsEventStore.connect(server.url)
        numbers = iter(range(1 << 62))

        async def write(calls: int) -> None:
            for _ in range(calls):
                outcomes = await store.append_many(decision(next(numbers)))
                assert all(isinstance(o, list) for o in outcomes), outcomes

        await write(200)  # warm up
        figures = []
        for _ in range(args.repeat):
            cpu = time.process_time()
            per_writer = args.calls // args.writers
            await asyncio.gather(*(write(per_writer) for _ in range(args.writers)))
            figures.append(1e6 * (time.process_time() - cpu) / (per_writer * args.writers))
        await store.close()
    finally:
        server.stop()
    print(
        f"append_many of 3 tasks x 2 events, {args.writers} writers at once:"
        f" {' '.join(f'{f:.0f}' for f in figures)} µs of client CPU a call"
        f" (load {os.getloadavg()[0]:.1f})"
    )


if __name__ == "__main__":
    run(main())
