"""The site builds with --strict (a broken link or a missing reference fails it), offline,
and its generated reference pages cover the code."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from docblocks import REPO

from cardbus.eventstore.events import EVENT_TYPES, tag_of
from cardbus.tools.cli import COMMANDS


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "_docs_hook", REPO / "docs" / "_hooks" / "reference.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` as ``make docs`` runs it, offline (no network is used)."""
    return subprocess.run(
        # no -q: a quiet build drops the warnings before --strict counts them
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin", "HOME": str(site.parent)},
    )


@pytest.mark.timeout(400)
def test_the_site_builds_strict(tmp_path: Path) -> None:
    proc = build(REPO, tmp_path / "s")
    assert proc.returncode == 0, proc.stderr[-6000:]
    site = tmp_path / "s"
    for page in ("index.html", "reference/cli/index.html", "reference/events/index.html"):
        assert (site / page).exists(), page
    html = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    assert 'id="cardbus.EmbeddedRuntime"' in html  # mkdocstrings found the package
    for html_file in site.rglob("*.html"):  # nothing loaded from another host when read
        text = html_file.read_text(encoding="utf-8")
        assert "fonts.googleapis" not in text and "fonts.gstatic" not in text, html_file


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\nSee [nowhere](no-such-page.md).\n")
    (tmp_path / "mkdocs.yml").write_text(
        "site_name: probe\ntheme:\n  name: material\n  font: false\n"
    )
    proc = build(tmp_path, tmp_path / "s")
    assert proc.returncode == 1, proc.stderr
    assert "no-such-page.md" in proc.stderr


def test_the_build_is_strict() -> None:
    config = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    assert "\nstrict: true\n" in config
    assert "mkdocs build --strict" in (REPO / "Makefile").read_text(encoding="utf-8")


def test_the_cli_reference_has_every_command() -> None:
    text = _hook().render_cli()
    for name in COMMANDS:
        assert f"`cardbus {name}`" in text, name


def test_the_catalogue_has_every_event_with_a_meaning() -> None:
    text = _hook().render_events()
    for cls in EVENT_TYPES:
        row = next(line for line in text.splitlines() if line.startswith(f"| [`{tag_of(cls)}`]"))
        assert not row.endswith("|  |"), f"{tag_of(cls)} has no meaning (a docstring)"


def test_an_unknown_generated_section_fails_the_build() -> None:
    with pytest.raises(ValueError, match="unknown generated section 'nope'"):
        _hook().render("# Page\n\n<!-- generated: nope -->\n", "page.md")
