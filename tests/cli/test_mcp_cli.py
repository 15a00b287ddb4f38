"""``cardbus run`` mounts MCP servers named by --mcp-config, --mcp and the plan file's
``mcp_servers``: a plan's agent (tests/mcpservers.py ``Asker``) calls their tools."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from mcpservers import SCRIPT

from cardbus.tools.cli import cli

PLAN: dict[str, Any] = {
    "goal": "ask the MCP tools",
    "agents": ["mcpservers:Asker"],
    "tasks": [{"id": "ask", "capability": "ask", "inputs": {"text": "tide"}}],
}
SERVER = {"command": sys.executable, "args": [SCRIPT]}


def _run(args: list[str]) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["run", *args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output.strip().splitlines()[-1])


def test_run_mounts_the_servers_of_a_config_file_and_a_flag(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"t": SERVER}}))
    flag = f"u={sys.executable} {SCRIPT}"
    args = [str(plan), "--db", str(tmp_path / "c.db"), "--mcp-config", str(config), "--mcp", flag]
    out = _run(args)
    assert out["status"] == "completed"
    ask = out["outputs"]["ask"]
    assert ask["echo"] == {"result": "tide"} and ask["add"] == {"sum": 5}
    assert ask["other"] == {"error": "AccessDenied"}  # u is mounted, but not on its allow-list


def test_run_mounts_the_servers_of_the_plan_file_and_keeps_them_out_of_the_log(
    tmp_path: Path,
) -> None:
    plan = tmp_path / "plan.json"
    secret = {**SERVER, "env": {"API_TOKEN": "s3cret"}}
    plan.write_text(json.dumps({**PLAN, "mcp_servers": {"t": secret}}))
    db = tmp_path / "c.db"
    out = _run([str(plan), "--db", str(db)])
    assert out["status"] == "completed" and out["outputs"]["ask"]["add"] == {"sum": 5}
    assert b"s3cret" not in db.read_bytes()


def test_a_bad_server_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    args = ["run", str(plan), "--db", str(tmp_path / "c.db"), "--mcp", "t=/nonexistent/server"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1
    assert "MCP server 't'" in result.output and "did not start" in result.output
    bad = CliRunner().invoke(cli, ["run", str(plan), "--mcp", "a__b=x"])
    assert bad.exit_code == 1 and "a server's name" in bad.output
