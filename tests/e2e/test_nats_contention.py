"""Two orchestrators on one NATS log, with busy processes beside them: no attempt is ever
dispatched twice, and neither folds an anomaly.

Under CPU load (load ~10) a member's append ended in neither success nor a conflict
while the log follower dropped the other member's ``task.dispatched`` for that busy
stream; ``task.started`` was then folded across the gap, the task looked pending and
attempt 1 was dispatched again (``Orchestrator._follow_log`` now holds such events,
``gaps.fill_gap`` reads a gap). One round by default; ``CARDBUS_CONTENTION_ROUNDS=50``
runs fifty in a row (each with fresh plan ids on the same log).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator

import pytest
from natsprocs import FAST_BUS, Quick, chain, check_log, read_log, slow_agent
from natsserver import NatsServer

from cardbus.bus.runtime.nats import NatsRuntime, serve_agents
from cardbus.eventstore import events as ev
from cardbus.eventstore.nats.connection import NatsOptions

Slow = slow_agent(0.3)
ROUNDS = int(os.environ.get("CARDBUS_CONTENTION_ROUNDS", "1"))


@pytest.fixture
def busy() -> Iterator[None]:
    """Three processes spinning beside the test (2 cores: the orchestrators starve)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.timeout(120 + 60 * ROUNDS)
async def test_two_members_under_cpu_contention_never_dispatch_an_attempt_twice(
    nats_server: NatsServer, busy: None
) -> None:
    url = nats_server.url
    stop = asyncio.Event()
    ready = asyncio.Event()
    serving = asyncio.create_task(
        serve_agents(
            NatsOptions(url=url), [Quick, Slow], stop, replicas=2, bus_options=FAST_BUS, ready=ready
        )
    )
    try:
        await asyncio.wait_for(ready.wait(), 30)
        opts = NatsOptions(url=url)
        async with (
            NatsRuntime(opts, bus_options={**FAST_BUS, "reply_durable": "orch-a"}, name="a") as a,
            NatsRuntime(opts, bus_options={**FAST_BUS, "reply_durable": "orch-b"}, name="b") as b,
        ):
            for n in range(ROUNDS):
                same = await asyncio.gather(
                    a.submit(chain(f"both-{n}", 5.0), agent_timeout=10),
                    b.submit(chain(f"both-{n}", 5.0), agent_timeout=10),
                )
                assert same[0] == same[1]
                roots = [same[0]]
                for i in range(6):
                    rt = a if i % 2 else b
                    roots.append(await rt.submit(chain(f"run-{n}-{i}", 5.0), agent_timeout=10))
                results = await asyncio.gather(
                    *((a if i % 2 else b).orchestrator.wait(r, 60) for i, r in enumerate(roots))
                )
                assert [r.status for r in results] == ["completed"] * len(roots), (n, results)
                assert list(a.orchestrator.state.anomalies) == [], n
                assert list(b.orchestrator.state.anomalies) == [], n
    finally:
        stop.set()
        await serving
    events = await read_log(url)
    check_log(events)
    dispatches = Counter(
        (e.stream, e.data.attempt) for e in events if isinstance(e.data, ev.TaskDispatched)
    )
    assert [k for k, c in dispatches.items() if c > 1] == []  # no attempt dispatched twice
    completions = Counter(e.stream for e in events if isinstance(e.data, ev.TaskCompleted))
    assert [k for k, c in completions.items() if c > 1] == []
