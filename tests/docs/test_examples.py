"""Every example of examples/ runs: each folder's README.md blocks (its `python main.py`
among them) run in a copy of the folder, against the mock LLM and loopback only."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from docblocks import REPO, missing_programs, run_page

EXAMPLES = sorted(p for p in (REPO / "examples").iterdir() if p.is_dir() and p.name[0] != "_")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_the_example_runs(example: Path, tmp_path: Path) -> None:
    missing = missing_programs((example / "README.md").read_text(encoding="utf-8"))
    if missing:  # said, never silent: make test runs pytest -rs
        pytest.skip(f"examples/{example.name} needs {' and '.join(missing)}, not found on PATH")
    work = tmp_path / example.name
    shutil.copytree(example, work, ignore=shutil.ignore_patterns("__pycache__", "*.db*"))
    ran = run_page(work / "README.md", work)
    assert any("python main.py" in b.code for b in ran), "the README runs main.py"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_file_of_the_example_is_in_its_readme(example: Path) -> None:
    readme = (example / "README.md").read_text(encoding="utf-8")
    for f in example.glob("*.py"):
        assert f"`{f.name}`" in readme, f"{f.name} is not described in {example.name}/README.md"


def test_there_are_examples() -> None:
    assert {p.name for p in EXAMPLES} >= {"research_team", "nats_deployment", "a2a_bridge"}
