"""Benchmark: what an unreachable OTLP collector costs a command (issue 33, item 2).

    .venv/bin/python bench/otel_unreachable_bench.py            # 5 rounds
    .venv/bin/python bench/otel_unreachable_bench.py --rounds 9

Times ``cardbus demo`` (a fresh SQLite file each time) as a subprocess in rounds; each
round runs it three ways, in a rotating order:

* ``none``: no OTEL_* setting (nothing exported, no SDK loaded);
* ``refused``: OTEL_EXPORTER_OTLP_ENDPOINT at a closed loopback port (a port bound and
  released: nothing listens, each connection is refused at once);
* ``silent``: OTEL_EXPORTER_OTLP_ENDPOINT at a loopback listener that accepts connections
  and never answers (a collector that hangs, or a firewall that drops: the exporter waits
  for its deadline).

It prints every round's wall times, the per-round differences against ``none`` (paired:
the same moment of a shared machine), and their medians; the CPU time (user + system)
of each way, which a busy machine stretches far less than the wall time (its difference
is what loading the SDK and its exporter costs, with any collector); and the flush at
exit, the time from the command's end to the end of its exit handlers, which is the part
spent waiting for the collector. Target: each median wall difference is at most 0.5 s:
the exporters' deadline (``cardbus.tools.telemetry_setup.EXPORT_TIMEOUT_S``, 0.4 s)
bounds the wait once for traces and metrics together, and the background probe usually
spends it before the command ends.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# ``cardbus demo`` as its console script runs it, plus one figure it cannot print itself:
# the time from the command's end to the end of the exit handlers (the flush of the
# spans and metrics: the part of the cost that is waiting for the collector, which a
# busy machine does not stretch as it stretches CPU)
_WRAPPER = """
import atexit, sys, time
ended = []
atexit.register(lambda: print(f"bench-exit-flush {time.perf_counter() - ended[0]:.4f}",
                              file=sys.stderr) if ended else None)
from cardbus.tools.cli import cli
try:
    cli.main(sys.argv[1:], prog_name="cardbus")
finally:
    ended.append(time.perf_counter())
"""


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Silent:
    """A loopback listener that accepts every connection and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = int(self.sock.getsockname()[1])
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)  # kept open, never read nor answered

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def _cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _demo(env: dict[str, str]) -> tuple[float, float, float, str]:
    """(wall seconds, CPU seconds, flush at exit seconds, stderr) of one ``cardbus demo``."""
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-c", _WRAPPER, "demo", "--db", str(Path(d) / "demo.db")]
        cpu = _cpu()
        began = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        took = time.perf_counter() - began
        cpu = _cpu() - cpu
    if done.returncode not in (0, None):
        raise SystemExit(f"cardbus demo failed ({done.returncode}):\n{done.stderr}")
    flush = [line for line in done.stderr.splitlines() if line.startswith("bench-exit-flush ")]
    return took, cpu, float(flush[-1].split()[1]), done.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    silent = _Silent()
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    envs = {
        "none": base,
        "refused": dict(base, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{_closed_port()}"),
        "silent": dict(base, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{silent.port}"),
    }
    names = list(envs)
    _demo(base)  # warm the file cache: the first run pays for imports from disk
    times: dict[str, list[float]] = {n: [] for n in names}
    cpus: dict[str, list[float]] = {n: [] for n in names}
    flushes: dict[str, list[float]] = {n: [] for n in names}
    said: dict[str, str] = {}
    print(
        "wall    "
        + "".join(f"{n:>10}" for n in names)
        + "   cpu "
        + "".join(f"{n:>10}" for n in names)
    )
    for r in range(args.rounds):
        order = names[r % 3 :] + names[: r % 3]  # each way first in turn
        for name in order:
            took, cpu, flush, err = _demo(envs[name])
            times[name].append(took)
            cpus[name].append(cpu)
            flushes[name].append(flush)
            said[name] = err
        print(
            f"{r + 1:5}   "
            + "".join(f"{times[n][-1]:9.2f}s" for n in names)
            + "      "
            + "".join(f"{cpus[n][-1]:9.2f}s" for n in names)
            + "                 "
            + "".join(f"{flushes[n][-1]:9.2f}s" for n in names)
        )
    silent.close()
    print()
    for name in names[1:]:
        diffs = [b - a for a, b in zip(times["none"], times[name], strict=True)]
        print(
            f"collector {name:8}: median {statistics.median(times[name]):.2f} s vs"
            f" {statistics.median(times['none']):.2f} s; paired difference median"
            f" {statistics.median(diffs):+.2f} s, max {max(diffs):+.2f} s (target <= 0.50 s)"
        )
        cpu_diffs = [b - a for a, b in zip(cpus["none"], cpus[name], strict=True)]
        print(f"  CPU: paired difference median {statistics.median(cpu_diffs):+.2f} s")
        print(
            f"  flush at exit: median {statistics.median(flushes[name]):.2f} s,"
            f" max {max(flushes[name]):.2f} s"
        )
        lines = [line for line in said[name].splitlines() if "export" in line.lower()]
        print(f"  stderr lines about the export: {len(lines)}")
        for line in lines:
            print("    " + line)
    waits = [b - a for a, b in zip(times["refused"], times["silent"], strict=True)]
    print(
        f"silent vs refused (the wait for a collector that never answers, the SDK's load"
        f" the same in both): paired difference median {statistics.median(waits):+.2f} s"
    )
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
