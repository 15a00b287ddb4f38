"""CLI conventions, one test each: --json wherever data is printed, exit codes (0 ok,
1 error or failed run, 2 usage), enumerated options validated, env variables shown
in --help, --store everywhere the log is read or written, demo honouring CARDBUS_STORE.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from lifecycle_log import RunIds

from cardbus.tools.cli import cli

#: commands that print no data of their own (servers, groups, a status line)
NO_DATA = {"agent serve", "ui", "a2a serve", "mcp serve"}
#: commands that read or write no log
NO_LOG = {
    "nats permissions",
    "nats dead",
    "nats replay",
    "agent serve",
    "agent check",
    "orchestrator",
    "plan",
    "schema",
}


def _commands() -> dict[str, click.Command]:
    ctx = click.Context(cli)
    out: dict[str, click.Command] = {}

    def walk(group: click.Group, prefix: str) -> None:
        for name in group.list_commands(ctx):
            cmd = group.get_command(ctx, name)
            assert cmd is not None, name
            path = f"{prefix}{name}"
            if isinstance(cmd, click.Group):
                walk(cmd, path + " ")
            else:
                out[path] = cmd

    walk(cli, "")
    return out


def test_every_command_has_help_and_json_and_store() -> None:
    commands = _commands()
    assert {"replay", "tasks", "approve", "memory forget", "nats dead", "head"} <= set(commands)
    for path, cmd in commands.items():
        r = CliRunner().invoke(cli, [*path.split(), "--help"])
        assert r.exit_code == 0, (path, r.output)
        flags = {o for p in cmd.params for o in getattr(p, "opts", [])}
        if path not in NO_DATA and path != "head":  # head prints JSON only
            assert "--json" in flags, f"{path} prints data but has no --json"
        if path not in NO_LOG:
            assert {"--store", "--db"} <= flags, f"{path} has no --store"
            assert "CARDBUS_STORE" in r.output, path


#: commands that run agents: each takes the same model endpoint and MCP servers
RUNS_AGENTS = {"run", "demo", "orchestrator", "agent serve", "ui", "a2a serve", "fork"}


def test_every_command_that_runs_agents_takes_the_llm_and_mcp_options() -> None:
    commands = _commands()
    for path in sorted(RUNS_AGENTS):
        params = {p.name: p for p in commands[path].params if isinstance(p, click.Option)}
        assert params["llm_base_url"].envvar == "OPENAI_BASE_URL", path
        assert params["model"].envvar == "CARDBUS_MODEL", path
        assert {"mcp", "mcp_config"} <= set(params), path


def test_env_variables_are_shown_in_help() -> None:
    for path, cmd in _commands().items():
        for p in cmd.params:
            if isinstance(p, click.Option) and p.envvar:
                assert p.show_envvar, f"{path} {p.opts[0]} hides its {p.envvar}"


BROKEN = """
import msgspec
from cardbus import Agent, Capability

class N(msgspec.Struct):
    n: int

class Broken(Agent):
    agent_id = "broken"
    capabilities = [Capability("fix", N, N, "never works")]

    async def handle(self, task, inputs, ctx):
        raise RuntimeError("always broken")
"""


def test_a_failed_run_exits_1_and_a_usage_error_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "brokenagent.py").write_text(BROKEN)
    monkeypatch.syspath_prepend(str(tmp_path))
    plan = tmp_path / "plan.json"
    task = {"id": "x", "capability": "fix", "inputs": {"n": 1}, "max_attempts": 1}
    plan.write_text(
        json.dumps({"goal": "fails", "tasks": [task], "agents": ["brokenagent:Broken"]})
    )
    r = CliRunner().invoke(cli, ["run", str(plan), "--store", str(tmp_path / "l.db"), "--json"])
    assert r.exit_code == 1, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["status"] == "failed"
    assert CliRunner().invoke(cli, ["tasks", "--no-such-flag"]).exit_code == 2


def test_enumerated_options_are_validated(run_db: tuple[str, RunIds]) -> None:
    db, _ = run_db
    r = CliRunner().invoke(cli, ["tasks", "--db", db, "--status", "bogus"])
    assert r.exit_code == 2 and "'bogus' is not one of" in r.stderr
    bad = CliRunner().invoke(cli, ["tasks", "--store", "postgres://x/y"])
    assert bad.exit_code == 2 and "nats://HOST:PORT" in bad.stderr


def test_a_missing_log_is_one_line_and_exit_1(tmp_path: Path) -> None:
    none = str(tmp_path / "none.db")
    for args in (
        ["replay", "x"],
        ["approve", "x"],
        ["memory", "list"],
        ["runs"],
        ["export", "x", "--console"],
    ):
        r = CliRunner().invoke(cli, [*args, "--store", none])
        assert r.exit_code == 1, (args, r.output)
        assert len(r.stderr.strip().splitlines()) == 1 and "no event store" in r.stderr
    assert not (tmp_path / "none.db").exists()


def test_demo_honours_cardbus_store(tmp_path: Path) -> None:
    log = tmp_path / "from-env.db"
    r = CliRunner(env={"CARDBUS_STORE": str(log), "CARDBUS_DB": None}).invoke(
        cli, ["demo", "--json"]
    )
    assert r.exit_code == 0, r.output
    root = json.loads(r.stdout)["root_id"]
    assert log.exists()
    rows = CliRunner(env={"CARDBUS_DB": str(log)}).invoke(cli, ["tasks", "--root", root, "--json"])
    assert rows.exit_code == 0 and len(json.loads(rows.stdout)) >= 3
