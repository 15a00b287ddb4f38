"""Commands are loaded on demand: the map names every command, and one runs without the rest."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from cardbus.tools.cli import COMMANDS, cli


def test_the_command_map_names_every_command_and_its_module() -> None:
    for module in sorted(set(COMMANDS.values())):
        importlib.import_module(module)
    registered = {name: cmd.callback.__module__ for name, cmd in cli.commands.items()}  # type: ignore[union-attr]
    assert registered == COMMANDS


# what a command that only reads the log or writes one person's answer does not load:
# the NATS client, the decision loop, the LLM agents, jsonschema (each a share of the start-up
# every `cardbus` command pays; `cardbus.bus` and `cardbus.agents` load names on use)
HEAVY = ("nats", "cardbus.bus.orchestrator.core", "cardbus.agents.llm_agent", "jsonschema")


@pytest.mark.parametrize("command", ["tasks", "review", "answer"])
def test_a_command_imports_only_what_it_needs(tmp_path, command: str) -> None:  # type: ignore[no-untyped-def]
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from cardbus.tools.cli import cli\n"
        f"r = CliRunner().invoke(cli, [*{command.split()!r}, '--db', {str(tmp_path / 'x.db')!r}])\n"
        f"print(*[m in sys.modules for m in {HEAVY!r}])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="."
    ).stdout.split()
    assert out == ["False"] * len(HEAVY), dict(zip(HEAVY, out, strict=False))


def test_help_lists_every_command() -> None:
    from click.testing import CliRunner

    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    assert all(name in result.output for name in COMMANDS)
