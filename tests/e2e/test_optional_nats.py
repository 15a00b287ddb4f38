"""An optional task on NATS JetStream (a real nats-server): its agent always fails, its
dependent runs without its output, and the run completes degraded, named so by the
result, the log and ``cardbus replay --json`` read from JetStream."""

from __future__ import annotations

import asyncio
import json

from click.testing import CliRunner
from natsprocs import FAST_BUS

from cardbus.bus.orchestrator import Policy, RetryPolicy
from cardbus.bus.runtime.nats import NatsRuntime
from cardbus.eventstore import events as ev
from cardbus.eventstore.nats import NatsEventStore
from cardbus.eventstore.nats.connection import NatsOptions
from cardbus.tools.cli import cli
from tests.e2e.optional_crash import Search, Write, plan


async def test_a_degraded_run_on_jetstream(nats_url: str) -> None:
    policy = Policy(retry=RetryPolicy(initial_interval_s=0.05, jitter=0.0))
    async with NatsRuntime(
        NatsOptions(url=nats_url), [Search, Write], policy=policy, bus_options=FAST_BUS
    ) as rt:
        root = await rt.submit(plan())
        result = await rt.orchestrator.wait(root, timeout=60)
    assert (result.status, result.reason, result.degraded) == ("completed", "degraded", ["facts"])
    assert result.outputs == {
        "side": {"text": "report on [side]"},
        "report": {"text": "report on []"},
    }
    store = await NatsEventStore.connect(nats_url)
    try:
        log = await store.read_correlation(root)
    finally:
        await store.close()
    (done,) = [e.data for e in log if isinstance(e.data, ev.RunCompleted)]
    assert done.degraded == ["facts"] and done.detail.startswith("facts: failed: agent_error")
    (sent,) = [e.data for e in log if isinstance(e.data, ev.TaskDispatched) and e.data.absent]
    assert sent.inputs == {}  # the report's only input came from the absent facts
    args = ["replay", root, "--store", nats_url, "--json"]
    replay = await asyncio.to_thread(CliRunner().invoke, cli, args)  # it runs its own loop
    assert replay.exit_code == 0, replay.output
    steps = json.loads(replay.stdout)["run"]
    assert [s["reason"] for s in steps if s["kind"] == "run.completed"] == [
        "degraded: without facts"
    ]
