"""The speed page's table is what `make bench` saved: bench/summary.py --write keeps the
figures with their machine and time, the docs hook renders the committed file, and the
docs build runs no benchmark."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from docblocks import REPO

FIGURES = REPO / "docs" / "explanation" / "speed-figures.json"


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_make_bench_writes_the_figures_the_page_renders(tmp_path: Path) -> None:
    summary = _load("_bench_summary", REPO / "bench" / "summary.py")
    jsonl = tmp_path / "figures.jsonl"
    summary.record(
        str(jsonl),
        "replay",
        "task table rebuild",
        214406.0,
        "events/s",
        target=">= 30% raw scan",
        met=True,
        ratio=0.37,
        ratio_of="raw scan",
    )
    summary.record(
        str(jsonl),
        "nats",
        "events/s in the log",
        2949.0,
        "events/s",
        target=">= 30% raw",
        met=False,
    )
    summary.record(
        str(jsonl), "pipeline", "3-step pipeline, LangGraph, 1 in flight", 106.0, "runs/s"
    )  # a peer's own row: in the ratios only
    out = tmp_path / "speed-figures.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "summary.py"), str(jsonl), "--write", str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "LangGraph" in proc.stdout  # the terminal's table is whole
    doc = json.loads(out.read_text())
    assert [r["figure"] for r in doc["rows"]] == ["task table rebuild", "events/s in the log"]
    assert doc["machine"]["cpus"] == os.cpu_count() and doc["source"] == "make bench"
    page = _load("_docs_hook_speed", REPO / "docs" / "_hooks" / "reference.py").render_speed_table(
        out
    )
    assert f"with {os.cpu_count()} CPUs" in page and doc["measured_from"] in page
    assert (
        "| replay | task table rebuild | 214,406 events/s | >= 30% raw scan | met"
        " | 0.37x raw scan |" in page
    )
    assert "| nats | events/s in the log | 2,949 events/s | >= 30% raw | MISSED |  |" in page
    assert "1 target(s) MISSED." in page and "LangGraph" not in page


def test_the_committed_figures_render_into_the_speed_page() -> None:
    page = (REPO / "docs" / "explanation" / "speed.md").read_text(encoding="utf-8")
    assert "\n<!-- generated: speed-table -->\n" in page
    doc = json.loads(FIGURES.read_text(encoding="utf-8"))
    assert doc["rows"] and doc["measured_from"] and doc["machine"]["cpus"]
    text = _load(
        "_docs_hook_speed2", REPO / "docs" / "_hooks" / "reference.py"
    ).render_speed_table()
    assert text.count("\n| ") == len(doc["rows"]) + 1  # the header, then one per row


def test_make_bench_ends_by_saving_the_docs_figures() -> None:
    proc = subprocess.run(
        ["make", "-n", "-s", "-C", str(REPO), "bench"], capture_output=True, text=True, check=True
    )
    last = [line for line in proc.stdout.splitlines() if "summary.py" in line]
    assert last and last[-1].endswith(f"--write {FIGURES.relative_to(REPO)}"), last
