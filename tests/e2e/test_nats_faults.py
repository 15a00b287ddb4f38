"""Faults survived on a real nats-server: agent SIGKILL, server restart, orchestrator SIGKILL.

Agents and orchestrators run as real ``cardbus`` processes (``python -m cardbus.tools``)
where the fault is a process dying; AckWait is 1 s so a lost card comes back fast.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from click.testing import CliRunner
from natsprocs import (
    FAST_BUS,
    Proc,
    agent_proc,
    chain_plan,
    check_log,
    count,
    env_for,
    per_task,
    read_log,
    result_json,
    until,
    verify,
    write_agents,
)
from natsserver import NatsServer

from cardbus.bus.orchestrator.plan import decode_plan
from cardbus.bus.runtime.nats import NatsRuntime
from cardbus.eventstore import events as ev
from cardbus.eventstore.nats.connection import NatsOptions
from cardbus.tools.cli import cli


async def test_sigkill_an_agent_mid_task_another_replica_finishes_it(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    """The card of the killed replica is redelivered by JetStream (not re-dispatched by the
    orchestrator) to the other replica process; the task completes exactly once."""
    write_agents(tmp_path)
    marks = tmp_path / "marks"
    marks.mkdir()
    url = nats_server.url
    env = {"CARDBUS_TEST_MARKS": str(marks), "CARDBUS_TEST_SLOW_S": "1.5"}
    replicas = [agent_proc(tmp_path, url, ["Quick", "Slow"], f"agent{i}", **env) for i in (1, 2)]
    try:
        for p in replicas:
            p.wait_for("serving")
        plan = decode_plan(json.dumps(chain_plan("agent-kill")).encode())
        async with NatsRuntime(NatsOptions(url=url), bus_options=FAST_BUS) as rt:
            root = await rt.submit(plan, agent_timeout=20)
            first = await until(lambda: list(marks.iterdir()), what="task b to start")
            victim_pid = int(first[0].name.rsplit(".", 1)[1])
            victim = next(p for p in replicas if p.pid == victim_pid)
            victim.kill()
            result = await rt.orchestrator.wait(root, timeout=30)
        assert result.status == "completed", result
        assert result.outputs["c"] == {"n": 13}
    finally:
        for p in replicas:
            p.stop()
    handlers = sorted(m.name for m in marks.iterdir())
    # attempt 1 of b started in the victim, then again (same attempt) in the survivor
    assert len(handlers) == 2 and all(".1." in h for h in handlers), handlers
    assert len({h.rsplit(".", 1)[1] for h in handlers}) == 2
    events = await read_log(url)
    check_log(events)
    assert await verify(url) == []
    tasks = per_task(events, root)
    assert {k: count(v, ev.TaskCompleted) for k, v in tasks.items()} == {"a": 1, "b": 1, "c": 1}
    assert count(tasks["b"], ev.TaskDispatched) == 1  # redelivered by the bus, no retry
    assert count(tasks["b"], ev.TaskTimedOut) == 0
    # the incident is in the log: the redelivery, and the replica that finished the task
    survivor = next(p for p in replicas if p.pid != victim_pid)
    (again,) = [e for e in tasks["b"] if isinstance(e, ev.TaskRedelivered)]
    assert again.attempt == 1 and again.delivery >= 2 and again.pid == survivor.pid
    (answered,) = [e for e in tasks["b"] if isinstance(e, ev.TaskResultSubmitted)]
    assert answered.pid == survivor.pid and answered.replica_id == again.replica_id
    assert answered.delivery == again.delivery and answered.host
    # ... and cardbus replay shows them (the tree, and --json)
    b = f"b-{root[-12:]}"
    shown = await asyncio.to_thread(
        CliRunner().invoke, cli, ["replay", b, "--store", url, "--json"], catch_exceptions=False
    )
    assert shown.exit_code == 0, shown.output
    (node,) = json.loads(shown.stdout)["tasks"]
    (redelivered,) = [s for s in node["steps"] if s["kind"] == "redelivered"]
    assert f"delivery {again.delivery}" in redelivered["detail"]
    assert again.replica_id in redelivered["detail"]
    (span,) = node["spans"]
    assert span["replica"] == again.replica_id and span["deliveries"] == again.delivery
    assert span["outcome"] == "completed"
    tree = await asyncio.to_thread(
        CliRunner().invoke, cli, ["replay", b, "--store", url], catch_exceptions=False
    )
    assert "redelivered" in tree.stdout and f"-{survivor.pid}-" in tree.stdout, tree.stdout


async def test_nats_server_stopped_and_restarted_mid_run(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    """Everything reconnects; the runs in flight complete and the log has every event."""
    write_agents(tmp_path)
    url = nats_server.url
    env = {"CARDBUS_TEST_SLOW_S": "1.0"}
    agents = agent_proc(tmp_path, url, ["Quick", "Slow"], "agents", **env)
    try:
        agents.wait_for("serving")
        async with NatsRuntime(NatsOptions(url=url), bus_options=FAST_BUS) as rt:
            roots = []
            for i in range(3):
                plan = decode_plan(json.dumps(chain_plan(f"restart-{i}", 4.0)).encode())
                roots.append(await rt.submit(plan, agent_timeout=20))

            def b_running() -> bool:
                # dispatched or running: a NATS worker says Started only for a card still
                # running after 1 s (NATS_STARTED_AFTER_S), and the slow task takes 1 s
                return any(
                    t.state.value in ("dispatched", "running") and t.task_id.startswith("b-")
                    for t in rt.orchestrator.state.tasks.values()
                )

            await until(b_running, what="a slow task to be sent or run")
            nats_server.stop()
            nats_server.start()
            results = [await rt.orchestrator.wait(r, timeout=40) for r in roots]
    finally:
        agents.stop()
    assert [r.status for r in results] == ["completed"] * 3
    assert all(r.outputs["c"] == {"n": 13} for r in results)
    events = await read_log(url)
    check_log(events)
    assert await verify(url) == []
    for root in roots:
        tasks = per_task(events, root)
        assert {k: count(v, ev.TaskCompleted) for k, v in tasks.items()} == {
            "a": 1,
            "b": 1,
            "c": 1,
        }
        assert sum(isinstance(e.data, ev.RunCompleted) for e in events if e.stream == root) == 1


async def test_sigkill_the_orchestrator_a_new_one_resumes_from_the_log(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    write_agents(tmp_path)
    url = nats_server.url
    (tmp_path / "plan.json").write_text(json.dumps(chain_plan("orch-kill")))
    agents = agent_proc(tmp_path, url, ["Quick", "Slow"], "agents", CARDBUS_TEST_SLOW_S="1.5")
    cmd = ["orchestrator", "--nats", url, "--plan", "plan.json", "--json", "--ack-wait", "1"]
    try:
        agents.wait_for("serving")
        first = Proc(cmd, tmp_path, env_for(tmp_path), "orch1")

        async def b_started() -> bool:
            try:
                events = await read_log(url)
            except Exception:
                return False
            return any(
                e.stream.startswith("b-") and isinstance(e.data, ev.TaskStarted) for e in events
            )

        await until(b_started, timeout=30, what="task b to start")
        first.kill()
        assert first.proc.returncode == -9
        before = await read_log(url)
        assert not any(isinstance(e.data, ev.RunCompleted) for e in before)
        second = Proc(cmd, tmp_path, env_for(tmp_path), "orch2")
        assert second.wait(60) == 0, second.output()
    finally:
        agents.stop()
    result = result_json(second)
    assert result["status"] == "completed"
    assert result["outputs"]["c"] == {"n": 13}
    events = await read_log(url)
    check_log(events)
    assert await verify(url) == []
    tasks = per_task(events, result["root_id"])
    assert {k: count(v, ev.TaskCompleted) for k, v in tasks.items()} == {"a": 1, "b": 1, "c": 1}
    # finished work is not redone; b's result, sent while no orchestrator ran, was kept
    assert count(tasks["a"], ev.TaskDispatched) == 1
    assert count(tasks["b"], ev.TaskDispatched) == 1
    assert sum(isinstance(e.data, ev.RunCompleted) for e in events) == 1
    assert os.path.exists(tmp_path / "orch2.log")
