"""One table of every bench figure: what ``make bench`` prints at its end.

Each bench appends its figures as JSON lines (``record``) to the file named by
``--json`` or, when not given, by ``$CARDBUS_BENCH_JSON``; ``make bench``
empties that file first, runs every bench, then runs this module, which
prints one Markdown table: bench, figure, value, target, ``met``/``MISSED``
and the ratio to the peer or baseline it was measured against in the same run.

    .venv/bin/python bench/summary.py [FILE] [--compact]

``--compact`` leaves out the peers' own rows (their figures are in the ratios).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

__all__ = ["record", "summary_path"]

DEFAULT = "bench/.figures.jsonl"
PEERS = ("LangGraph", "DBOS")


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
) -> None:
    """Append one figure (no-op without a file: neither ``path`` nor the variable)."""
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
        "load": os.getloadavg()[0],
    }
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


def _value(v: float, unit: str) -> str:
    if abs(v) >= 100:
        return f"{v:,.0f} {unit}"
    return f"{v:.3g} {unit}"


def table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| bench | figure | value | target | | ratio |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        met = "" if r.get("met") is None else ("met" if r["met"] else "MISSED")
        ratio = f"{r['ratio']:.2f}x {r['ratio_of']}".strip() if r.get("ratio") is not None else ""
        out.append(
            f"| {r['bench']} | {r['figure']} | {_value(r['value'], r['unit'])}"
            f" | {r.get('target', '')} | {met} | {ratio} |"
        )
    return "\n".join(out)


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--compact"]
    compact = "--compact" in sys.argv[1:]
    path = Path(args[0] if args else summary_path() or DEFAULT)
    if not path.exists():
        print(f"no bench figures in {path}")
        return
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if compact:
        rows = [r for r in rows if not any(f", {p}," in f"{r['figure']}," for p in PEERS)]
    loads = [r["load"] for r in rows if "load" in r]
    print()
    print(
        f"Summary: {len(rows)} figures, {platform.machine()} {os.cpu_count()} CPUs,"
        f" Python {platform.python_version()}, load {min(loads, default=0):.1f}"
        f" to {max(loads, default=0):.1f} while measuring"
    )
    print(table(rows))
    missed = sum(1 for r in rows if r.get("met") is False)
    print(f"{missed} target(s) MISSED" if missed else "every target met")


if __name__ == "__main__":
    main()
