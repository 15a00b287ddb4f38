"""cardbus lives beside packages with generic names (openai-agents installs ``agents``).

Stand-in packages named ``agents``, ``tools`` and ``bus`` come first on
``sys.path`` of a fresh interpreter (offline, in a clean directory); the demo
runs in that interpreter, and ``import agents`` still gives the stand-in,
before and after.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

STANDINS = {
    # like openai-agents: `from agents import Agent, Runner`
    "agents": "Runner = object()\nAgent = object()\nSTANDIN = 'agents'\n",
    "tools": "STANDIN = 'tools'\n",
    "bus": "STANDIN = 'bus'\n",
}

SCRIPT = """
import json, sys
import agents, bus, tools
runner = agents.Runner
from click.testing import CliRunner
from cardbus.tools.cli import cli
result = CliRunner().invoke(cli, ["demo", "--db", sys.argv[1]])
import agents as again
print(json.dumps({
    "exit_code": result.exit_code,
    "output": result.output,
    "exception": repr(result.exception),
    "standins": [m.STANDIN for m in (agents, bus, tools)],
    "same_runner": again.Runner is runner,
    "agents_file": again.__file__,
    "cardbus_agents": sys.modules["cardbus.agents"].__file__,
}))
"""


def _standins(where: Path) -> Path:
    for name, source in STANDINS.items():
        (where / name).mkdir(parents=True)
        (where / name / "__init__.py").write_text(source)
    return where


def _run(tmp_path: Path, standins: Path) -> dict:  # type: ignore[type-arg]
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "OTEL_"))}
    env |= {"PYTHONPATH": str(standins), "NO_COLOR": "1"}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(work / "x.db")],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def test_demo_runs_beside_standins_named_agents_tools_and_bus(tmp_path: Path) -> None:
    standins = _standins(tmp_path / "standins")
    got = _run(tmp_path, standins)
    assert got["exit_code"] == 0, got["output"] + got["exception"]
    assert got["standins"] == ["agents", "bus", "tools"]
    assert got["same_runner"] is True
    assert Path(got["agents_file"]) == standins / "agents" / "__init__.py"
    assert Path(got["cardbus_agents"]).parent != standins / "agents"
    # the demo's report and the completed run
    assert "# Report: ocean tides" in got["output"]
    assert re.search(r"^run \S+: completed in ", got["output"], re.M)
    assert (tmp_path / "work" / "x.db").is_file()


def test_cardbus_itself_provides_no_top_level_agents_tools_or_bus(tmp_path: Path) -> None:
    """Without the stand-ins, those names are not importable from cardbus's files at all."""
    probe = (
        "import importlib.util, json\n"
        "specs = {n: importlib.util.find_spec(n) for n in ('agents', 'tools', 'bus')}\n"
        "print(json.dumps({n: s and (s.origin or list(s.submodule_search_locations))"
        " for n, s in specs.items()}))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    found = json.loads(out.stdout)
    # an installed package of that name may be found (openai-agents' `agents`, in a
    # .venv inside the checkout), never one of the repository's folders
    root = Path(__file__).resolve().parents[1]
    ours = {n: str(root / n) for n in found}
    assert {n: where for n, where in found.items() if where and ours[n] in str(where)} == {}
