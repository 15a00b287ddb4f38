"""One table of every bench figure: what ``make bench`` prints at its end.

Each bench appends its figures as JSON lines (``record``) to the file named by
``--json`` or, when not given, by ``$CARDBUS_BENCH_JSON``; ``make bench``
empties that file first, runs every bench, then runs this module, which
prints one Markdown table: bench, figure, value, target, ``met``/``MISSED``,
the peer or baseline it was measured against in the same run (the ratio, and the
peer's own figure where the bench gives it), and the 1-minute load when it was
measured; then the count: ``N met, M MISSED: <the missed figures>``, the targets
of issue 34 that no row measured in this run (``ISSUE_34``), and why each missed
target was missed (``reasons``): what the bench recorded with the row (``why``),
from the figures of the same run, and the command that shows where the time goes.

    .venv/bin/python bench/summary.py [FILE] [--compact] [--write FIGURES.json]

``--compact`` leaves out the peers' own rows (their figures are in the ratios).
``--write`` also saves the rows with the machine and the time they were measured
on as JSON: ``make bench`` writes ``docs/explanation/speed-figures.json``, which is
committed, and the docs build renders it into the speed page (``render``), so
the site's table is what the last ``make bench`` printed and the docs build never
runs a benchmark.
"""

from __future__ import annotations

import json
import os
import platform
import sqlite3
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = [
    "ISSUE_34",
    "closing",
    "figures_document",
    "reasons",
    "record",
    "render",
    "summary_path",
    "table",
]

DEFAULT = "bench/.figures.jsonl"
PEERS = ("LangGraph", "LangGraph durability=sync", "DBOS")

#: issue 34's targets (its section Targets): each is met when a row of ``bench`` whose
#: figure starts with the prefix has a target; one without such a row was not measured
ISSUE_34: list[tuple[str, str, str]] = [
    ("pipeline >= 10x LangGraph, 32 in flight", "pipeline", "3-step pipeline, instant agents, 32"),
    (
        "pipeline >= 10x DBOS, 32 in flight",
        "pipeline",
        "3-step pipeline vs DBOS, instant agents, 32",
    ),
    ("CPU per step <= 0.4 ms, 1,000 in flight", "agent latency", "CPU per step, cardbus, 1,000"),
    (
        "throughput >= 50% of ideal, 1,000 in flight",
        "agent latency",
        "throughput vs ideal, cardbus, 1,000",
    ),
    (
        "added per step <= LangGraph's, 1 in flight",
        "agent latency",
        "added per step p50, cardbus, 1 in flight",
    ),
    ("idle <= 1 ms/s, in memory", "idle", "CPU of an idle embedded runtime, memory"),
    ("idle <= 1 ms/s, SQLite", "idle", "CPU of an idle embedded runtime, SQLite"),
    ("idle <= 1 ms/s, NATS", "idle", "CPU of an idle NATS runtime"),
    ("journal <= 1 ms p50, embedded", "journal", "added per model call, embedded"),
    ("journal <= 1 ms p50, NATS", "journal", "added per model call, nats"),
    ("NATS <= 20 messages per 3-step run", "nats", "server messages per run"),
    ("NATS log >= 30% of raw publish_async", "nats", "events/s in the log"),
]


def summary_path(path: str | None = None) -> str | None:
    return path or os.environ.get("CARDBUS_BENCH_JSON") or None


def record(
    path: str | None,
    bench: str,
    figure: str,
    value: float,
    unit: str,
    *,
    target: str = "",
    met: bool | None = None,
    ratio: float | None = None,
    ratio_of: str = "",
    peer: float | None = None,
    why: str = "",
) -> None:
    """Append one figure (no-op without a file: neither ``path`` nor the variable).

    ``ratio`` is to ``ratio_of`` (a peer or a baseline measured in the same run);
    ``peer``, that one's own figure, in ``unit``. ``why``: what makes the figure what
    it is, said with this run's own figures and the command that shows where the time
    goes; printed when the target is missed (every row with a target gives one)."""
    path = summary_path(path)
    if path is None:
        return
    line = {
        "bench": bench,
        "figure": figure,
        "value": value,
        "unit": unit,
        "target": target,
        "met": met,
        "ratio": ratio,
        "ratio_of": ratio_of,
        "peer": peer,
        "why": why,
        "load": os.getloadavg()[0],
        "at": time.time(),
    }
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


def _value(v: float, unit: str) -> str:
    if abs(v) >= 100:
        return f"{v:,.0f} {unit}"
    return f"{v:.3g} {unit}"


def _peer(r: dict[str, Any]) -> str:
    """The peer column: the ratio and whom to, then the peer's own figure if recorded."""
    if r.get("ratio") is None:
        return ""
    if r.get("peer") is not None:
        return f"{r['ratio']:.2f}x vs {_value(r['peer'], r['unit'])}, {r['ratio_of']}"
    return f"{r['ratio']:.2f}x {r['ratio_of']}".strip()


def table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| bench | figure | value | target | | peer, same run | load |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        met = "" if r.get("met") is None else ("met" if r["met"] else "MISSED")
        load = f"{r['load']:.1f}" if r.get("load") is not None else ""
        out.append(
            f"| {r['bench']} | {r['figure']} | {_value(r['value'], r['unit'])}"
            f" | {r.get('target', '')} | {met} | {_peer(r)} | {load} |"
        )
    return "\n".join(out)


def closing(rows: list[dict[str, Any]]) -> str:
    """``N met, M MISSED: <bench: figure>, ...``, and issue 34's targets no row measured."""
    met = sum(1 for r in rows if r.get("met") is True)
    missed = [f"{r['bench']}: {r['figure']}" for r in rows if r.get("met") is False]
    line = f"{met} met, {len(missed)} MISSED" + (": " + "; ".join(missed) if missed else "")
    absent = [
        name
        for name, bench, prefix in ISSUE_34
        if not any(
            r["bench"] == bench and r["figure"].startswith(prefix) and r.get("met") is not None
            for r in rows
        )
    ]
    if absent:
        line += "\nissue 34 targets not measured in this run: " + "; ".join(absent)
    return line


def reasons(rows: list[dict[str, Any]]) -> list[str]:
    """One line per missed target: the figure, then why, as the bench measured it."""
    return [
        f"- {r['bench']}: {r['figure']}: {r.get('why') or 'the bench recorded no reason'}"
        for r in rows
        if r.get("met") is False
    ]


def _compact(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if not any(f", {p}," in f"{r['figure']}," for p in PEERS)]


def _machine() -> dict[str, Any]:
    model = ""
    try:  # Linux: the CPU's name, so a reader can tell one machine from another
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "arch": platform.machine(),
        "cpus": os.cpu_count(),
        "cpu": model,
        "system": platform.system(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
    }


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M UTC")


def figures_document(rows: list[dict[str, Any]], *, compact: bool) -> dict[str, Any]:
    """What ``--write`` saves: the rows, when (from the rows' own times) and on what machine
    (this one: ``--write`` runs on the machine that just measured, as ``make bench`` does)."""
    times = [r["at"] for r in rows if "at" in r]
    loads = [r["load"] for r in rows if "load" in r]
    return {
        "measured_from": _utc(min(times)) if times else "",
        "measured_to": _utc(max(times)) if times else "",
        "machine": _machine(),
        "load": [min(loads, default=0.0), max(loads, default=0.0)],
        "compact": compact,
        "source": "make bench",
        "rows": _compact(rows) if compact else rows,
    }


def render(doc: dict[str, Any]) -> str:
    """The Markdown the docs show for a saved figures document: where and when, the table,
    and how many targets were missed."""
    m = doc["machine"]
    cpu = f" ({m['cpu']})" if m.get("cpu") else ""
    rows = doc["rows"]
    missed = sum(1 for r in rows if r.get("met") is False)
    lo, hi = doc["load"]
    lines = [
        f"Measured by `{doc['source']}` from {doc['measured_from']} to {doc['measured_to']},"
        f" on {m['system']} {m['arch']} with {m['cpus']} CPUs{cpu}, Python {m['python']},"
        f" SQLite {m['sqlite']}; 1-minute load {lo:.1f} to {hi:.1f} while measuring"
        f" ({len(rows)} figures{', peers in the ratios only' if doc['compact'] else ''}).",
    ]
    if doc.get("note"):
        lines += ["", str(doc["note"])]
    lines += [
        "",
        table(rows),
        "",
        f"{missed} target(s) MISSED, each with why, from the same run:"
        if missed
        else "Every target met.",
    ]
    if missed:
        lines += ["", *reasons(rows)]
    return "\n".join(lines) + "\n"


def main() -> None:
    argv = sys.argv[1:]
    write = None
    if "--write" in argv:
        i = argv.index("--write")
        write = Path(argv[i + 1])
        del argv[i : i + 2]
    args = [a for a in argv if a != "--compact"]
    compact = "--compact" in argv
    path = Path(args[0] if args else summary_path() or DEFAULT)
    if not path.exists():
        print(f"no bench figures in {path}")
        return
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    shown = _compact(rows) if compact else rows
    loads = [r["load"] for r in shown if "load" in r]
    print()
    print(
        f"Summary: {len(shown)} figures, {platform.machine()} {os.cpu_count()} CPUs,"
        f" Python {platform.python_version()}, load {min(loads, default=0):.1f}"
        f" to {max(loads, default=0):.1f} while measuring"
    )
    print(table(shown))
    print(closing(shown))
    why = reasons(shown)
    if why:
        print("\nWhy each missed target is missed (this run's figures; where the time goes):")
        print("\n".join(why))
    if write is not None:
        write.write_text(json.dumps(figures_document(rows, compact=True), indent=1) + "\n")
        print(f"wrote {write} (the docs' speed table)")


if __name__ == "__main__":
    main()
