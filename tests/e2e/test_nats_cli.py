"""The NATS commands through click's CliRunner (and real nats-servers)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from click.testing import CliRunner
from natsprocs import Proc, env_for
from natsserver import NatsServer

from cardbus.eventstore.nats.connection import NatsOptions
from cardbus.tools.cli import cli


def test_demo_start_nats_runs_the_demo_on_a_throwaway_server() -> None:
    result = CliRunner().invoke(cli, ["demo", "--start-nats"])
    assert result.exit_code == 0, result.output
    assert "started nats-server on nats://127.0.0.1:" in result.output
    assert re.search(r"Timeline of run \S+ \(completed", result.output)
    # the researcher's doc_search is served on NATS too, as on the embedded default
    assert re.search(r"tool\.called +#1 researcher +tool doc_search\n", result.output)


def test_demo_across_an_agent_process_and_a_serving_orchestrator(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    url = nats_server.url
    demo_agents = [
        f"cardbus.agents.demo:{a}"
        for a in ("Researcher", "Planner", "Writer", "Reviewer", "Merger")
    ]
    serve = ["agent", "serve", *demo_agents, "--nats", url, "--replicas", "2"]
    agents = Proc(serve, tmp_path, env_for(tmp_path), "a")
    orch = Proc(["orchestrator", "--nats", url], tmp_path, env_for(tmp_path), "o")
    try:
        agents.wait_for("(2 replica(s))")
        orch.wait_for("open run(s) resumed")
        runner = CliRunner()
        result = runner.invoke(cli, ["demo", "--nats", url, "--external-agents", "--parallel"])
        assert result.exit_code == 0, result.output
        root = re.search(r"cardbus replay (\S+) --store " + re.escape(url), result.output)
        assert root is not None, result.output
        replayed = runner.invoke(cli, ["replay", root.group(1), "--store", url])
        assert replayed.exit_code == 0, replayed.output
        assert "merge-" in replayed.output and "completed" in replayed.output
        # the old command is a deprecated alias printing the same timeline
        alias = runner.invoke(cli, ["nats", "replay", root.group(1), "--nats", url])
        assert alias.exit_code == 0 and alias.stdout == replayed.stdout
        assert "deprecated: use cardbus replay" in alias.stderr
        dead = runner.invoke(cli, ["nats", "dead", "--nats", url])
        assert dead.exit_code == 0 and "no dead letters" in dead.output
        # the demo's own reply consumer went away with it; the serving orchestrator's stays
        assert asyncio.run(_reply_consumers(url)) == ["cardbus-orchestrator"]
    finally:
        orch.stop()
        agents.stop()
    assert orch.proc.returncode == 0  # SIGTERM ends it cleanly


async def _reply_consumers(url: str) -> list[str]:
    nc = await NatsOptions(url=url).connect("check")
    try:
        infos = await nc.jetstream().consumers_info("CARDBUS_REPLIES")
        return sorted(i.name for i in infos)
    finally:
        await nc.close()


def test_permissions_and_connection_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    out = runner.invoke(cli, ["nats", "permissions", "--agent", "researcher"]).output
    assert '"cardbus.announce.researcher"' in out and '"_INBOX.researcher.>"' in out
    # replies only under its own id: the orchestrator refuses one naming another agent
    assert '"cardbus.reply.researcher.>"' in out and '"cardbus.reply.>"' not in out
    assert "allow_responses: true" in out
    # an agents file that is not a list of agent cards: refused before connecting
    agents_file = tmp_path / "agents.json"
    agents_file.write_text('{"agents": [{"agent_id": 1}]}')
    bad_file = runner.invoke(
        cli, ["orchestrator", "--agents", str(agents_file), "--nats", "nats://127.0.0.1:1"]
    )
    assert bad_file.exit_code == 1 and "agents file" in bad_file.output, bad_file.output
    # nobody listens on port 1: a clear one-line error, exit code 1
    bad = runner.invoke(cli, ["nats", "dead", "--nats", "nats://127.0.0.1:1"])
    assert bad.exit_code == 1
    assert "cannot connect to NATS at nats://127.0.0.1:1" in bad.output


# -- cardbus head / verify --store nats://... -------------------------------------------


def test_head_and_verify_on_a_jetstream_log_name_each_tamper(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    """A kept head, then a message deleted, the tail cut: verify exits 1 naming each."""
    import json

    import lifecycle_log
    import nats

    from cardbus.eventstore.nats import NatsEventStore

    url = nats_server.url

    async def write() -> None:
        async with await NatsEventStore.connect(url, deny_delete=False) as store:
            await lifecycle_log.write_run(store, "a-")

    async def delete(*seqs: int) -> None:
        nc = await nats.connect(url)
        try:
            for seq in seqs:
                await nc.jetstream().delete_msg("CARDBUS_EVENTS", seq)
        finally:
            await nc.close()

    asyncio.run(write())
    runner = CliRunner()
    r = runner.invoke(cli, ["head", "--store", url])
    assert r.exit_code == 0, r.output
    kept = tmp_path / "head.json"
    kept.write_text(r.stdout)
    assert json.loads(r.stdout)["position"] == 42
    ok = runner.invoke(cli, ["verify", "--store", url, "--head", str(kept)])
    assert ok.exit_code == 0, ok.output
    assert "(42 events, up to the kept head at position 42, unsigned, not checked)" in ok.output

    asyncio.run(delete(7))
    r = runner.invoke(cli, ["verify", "--store", url])
    assert r.exit_code == 1
    assert "at position 7 (stream (log), version 0): positions 7 missing (deleted)" in r.stdout
    assert "verify failed" in r.stderr

    asyncio.run(delete(40, 41, 42))
    r = runner.invoke(cli, ["verify", "--store", url, "--head", str(kept)])
    assert r.exit_code == 1
    assert "positions 40..42 missing at the end (deleted or purged)" in r.stdout, r.stdout
    assert "events 40..42 missing (truncated)" in r.stdout
    # one run's streams on NATS: position 7 was a-task-write's first event
    r = runner.invoke(cli, ["verify", "a-run-1", "--store", url])
    assert r.exit_code == 1
    assert "position 8 (stream a-task-write, version 2): version 2, expected 1" in r.stdout
    # refused schemes and an absent stream: one line, exit 1, nothing created
    r = runner.invoke(cli, ["verify", "--store", "memory:"])
    assert r.exit_code == 2 and "give a SQLite file (PATH, sqlite:///PATH)" in r.output
    other = NatsServer(tmp_path / "empty").start()
    try:
        r = runner.invoke(cli, ["verify", "--store", other.url])
        assert r.exit_code == 1 and "does not exist" in r.output, r.output
        assert asyncio.run(_streams(other.url)) == []
    finally:
        other.stop()


async def _streams(url: str) -> list[str]:
    nc = await NatsOptions(url=url).connect("check")
    try:
        return sorted(s.config.name or "" for s in await nc.jetstream().streams_info())
    finally:
        await nc.close()
