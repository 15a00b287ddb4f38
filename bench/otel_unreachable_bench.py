"""Benchmark: what an unreachable OTLP collector costs a command (issue 33, item 2).

    .venv/bin/python bench/otel_unreachable_bench.py            # 3 runs of each, medians
    .venv/bin/python bench/otel_unreachable_bench.py --runs 5

Times ``cardbus demo`` (a fresh SQLite file each time) as a subprocess, once with no
OTEL_* setting and once with OTEL_EXPORTER_OTLP_ENDPOINT at a closed loopback port (a
port bound and released: nothing listens), and prints both medians and the difference.
Target: the difference is at most 0.5 s (the exporter's deadline,
``cardbus.tools.telemetry_setup.EXPORT_TIMEOUT_S``, bounds the flush at exit).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_CARDBUS = Path(sys.executable).with_name("cardbus")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _demo(env: dict[str, str]) -> tuple[float, str]:
    with tempfile.TemporaryDirectory() as d:
        cmd = [str(_CARDBUS), "demo", "--db", str(Path(d) / "demo.db")]
        began = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        took = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"cardbus demo failed ({done.returncode}):\n{done.stderr}")
    return took, done.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    down = dict(base, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{_closed_port()}")
    _demo(base)  # warm the file cache: the first run pays for imports from disk
    without, with_down, said = [], [], ""
    for _ in range(args.runs):
        without.append(_demo(base)[0])
        took, said = _demo(down)
        with_down.append(took)
    a, b = statistics.median(without), statistics.median(with_down)
    print(f"cardbus demo, no collector set:      {a:.2f} s (median of {args.runs})")
    print(f"cardbus demo, collector unreachable: {b:.2f} s (median of {args.runs})")
    print(f"difference: {b - a:+.2f} s (target <= 0.50 s)")
    lines = [line for line in said.splitlines() if "export" in line.lower()]
    print("stderr lines about the export:", len(lines))
    for line in lines:
        print("  ", line)


if __name__ == "__main__":
    main()
