"""README.md is a landing page: at most 200 lines, every block runs from a fresh clone
(the harness of docs/, tests/docs/docblocks.py), every link it has leads somewhere, and
its agent is about twenty lines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from docblocks import REPO, parse, run_page

README = REPO / "README.md"
MAX_LINES = 200


def test_the_readme_is_at_most_200_lines() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines; the docs site has room"


@pytest.mark.timeout(300)
def test_every_block_of_the_readme_runs_from_a_clone(tmp_path: Path) -> None:
    ran = run_page(README, tmp_path)
    # the two set-up commands (checked with make -n), the agent, its plan and the commands
    assert {b.lang for b in ran} >= {"sh", "python", "json", "console"}
    setup = next(b for b in ran if b.lang == "sh")
    assert [line.split("#")[0].strip() for line in setup.code.splitlines()] == [
        "make demo",
        "make test",
    ]
    assert (tmp_path / "cardbus.db").exists()  # the log of the run it shows


def test_the_readme_agent_is_about_twenty_lines() -> None:
    blocks = parse(README.read_text(encoding="utf-8"), README)
    (agent,) = [b for b in blocks if b.title == "my_agents.py"]
    assert "class Summarizer(Agent):" in agent.code
    lines = agent.code.strip().splitlines()
    assert len(lines) <= 25 and len([x for x in lines if x.strip()]) <= 20, len(lines)


def _links(text: str) -> list[str]:
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.findall(r"\]\(([^)\s]+)\)", prose)


def test_the_readme_links_lead_somewhere() -> None:
    text = README.read_text(encoding="utf-8")
    local = [t for t in _links(text) if not t.startswith(("http://", "https://", "#"))]
    assert "docs/assets/console.png" in local  # the picture of the console
    assert any(t.startswith("docs/tutorials/") for t in local)  # links into the site
    missing = [t for t in local if not (REPO / t.split("#")[0]).exists()]
    assert missing == []


def test_the_console_picture_is_a_png_the_site_shows_too() -> None:
    png = REPO / "docs" / "assets" / "console.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "(assets/console.png)" in (REPO / "docs" / "index.md").read_text(encoding="utf-8")


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    text = "See [the page](docs/no-such-page.md) and [a site](https://example.org).\n"
    local = [t for t in _links(text) if not t.startswith(("http://", "https://", "#"))]
    assert [t for t in local if not (REPO / t).exists()] == ["docs/no-such-page.md"]
