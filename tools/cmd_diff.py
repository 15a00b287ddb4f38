"""``cardbus diff ROOT_A ROOT_B``: two runs side by side, and where they first diverged.

The comparison is ``projections.diff.diff_runs`` over the two runs' events; this
module reads them and prints it (``--json``: the whole of it).
"""

from __future__ import annotations

import asyncio
from typing import Any

import click
import msgspec

from cardbus.projections.diff import CallView, RunDiff, TaskView, diff_runs
from cardbus.projections.ids import read_run
from cardbus.tools.cli import cli
from cardbus.tools.cmd_inspect import echo_json, json_option, open_store
from cardbus.tools.store_option import StoreRef, store_option

__all__ = ["diff_text", "read_run"]


def _short(value: Any, limit: int = 70) -> str:
    from cardbus.projections.replay import one_line

    return one_line(value, limit)


def _task_line(t: TaskView | None) -> str:
    if t is None:
        return "-"
    models = sum(c.kind == "model" for c in t.calls)
    tools = len(t.calls) - models
    who = ",".join(t.agents) or "-"
    used = ",".join(t.models) or "-"
    how = "reused" if t.reused_from else f"{models} model/{tools} tool call(s)"
    return f"{t.status} {t.reason}".rstrip() + f"  {who}  {used}  {how}"


def _call_line(c: CallView | None) -> str:
    if c is None:
        return "-"
    got = c.error if c.error else _short(c.answer, 50)
    replayed = "  (replayed)" if c.replayed_from else ""
    return f"{c.kind} #{c.seq} {c.name}: {_short(c.request, 40)} -> {got}{replayed}"


def diff_text(d: RunDiff) -> list[str]:
    """The diff as lines of text: the runs, the first divergence, each task side by side."""

    def run_line(name: str, r: Any) -> str:
        how = ""
        if r.rerun_of:
            how = f"  (re-run of {r.rerun_of}{', offline' if r.offline else ''})"
        elif r.forked_from:
            how = f"  (fork of {r.forked_from})"
        return f"run {name} {r.root_id}: {r.status}  goal {_short(r.goal, 50)}{how}"

    lines = [run_line("A", d.a), run_line("B", d.b)]
    if d.a.plan != d.b.plan:
        lines.append(f"plan: A {d.a.plan}  B {d.b.plan}")
    else:
        lines.append(f"plan: {', '.join(d.a.plan)} (the same tasks)")
    first = d.first_divergence
    if first is None:
        lines.append("first divergence: none (the same requests, answers and outputs)")
    else:
        lines.append(f"first divergence: {first.summary}")
        lines.append(f"  event in A: {first.event_a or '-'}  event in B: {first.event_b or '-'}")
        lines += [f"  {line}" for line in first.diff]
    for pair in d.tasks:
        same = "same" if not pair.differs else "differs: " + ", ".join(pair.differs)
        if pair.reused_in:  # a fork or re-run took the other's plan or parent result
            same = f"not run in {pair.reused_in}, which reused the other run's result"
        lines.append(f"task {pair.key}: {same}")
        lines.append(f"  A  {_task_line(pair.a)}")
        lines.append(f"  B  {_task_line(pair.b)}")
        if not pair.differs:
            continue
        if "output" in pair.differs:
            lines.append(f"  output A  {_short(pair.a.output if pair.a else None)}")
            lines.append(f"  output B  {_short(pair.b.output if pair.b else None)}")
        calls_a = pair.a.calls if pair.a else []
        calls_b = pair.b.calls if pair.b else []
        for i in range(max(len(calls_a), len(calls_b))):
            ca = calls_a[i] if i < len(calls_a) else None
            cb = calls_b[i] if i < len(calls_b) else None
            same_call = (
                ca is not None
                and cb is not None
                and (ca.request_digest, ca.answer_digest) == (cb.request_digest, cb.answer_digest)
            )
            mark = "=" if same_call else "≠"
            lines.append(f"  {mark} A {_call_line(ca)}")
            lines.append(f"  {mark} B {_call_line(cb)}")
    return lines


@cli.command()
@click.argument("run_a")
@click.argument("run_b")
@store_option
@json_option
def diff(run_a: str, run_b: str, db: StoreRef, as_json: bool) -> None:
    """Compare two runs (root or task ids, or prefixes): the plan, each task's inputs,
    outputs, agents, models, model calls and tool calls side by side (tasks matched by
    plan task id), and the first event where they diverge.

    Exit code 0 when they did the same, 1 when they diverge.
    """

    async def go() -> RunDiff:
        store = await open_store(db)
        try:
            return diff_runs(await read_run(store, run_a), await read_run(store, run_b))
        finally:
            await store.close()

    d = asyncio.run(go())
    if as_json:
        echo_json(msgspec.to_builtins(d))
    else:
        for line in diff_text(d):
            click.echo(line)
    if d.first_divergence is not None:
        raise SystemExit(1)
