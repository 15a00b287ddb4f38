"""Spend: tokens per run, task, agent and model, from the model calls in the log; priced on read.

One row per ``(task_id, agent_id, model)`` in ``proj_spend``, with the run
(``root_id``) and the task's capability and role, so any breakdown (per run,
task, agent, capability, model) is a ``GROUP BY``:

* every live ``model.answered`` (``replayed_from`` unset) adds its tokens under
  the model that answered, one ``call``; its ``cost_usd`` as the orchestrator
  priced it when it was recorded is kept too (``recorded_usd``; ``unrecorded``
  counts calls without one);
* a ``task.result_submitted`` whose attempt made no journaled model call (an
  agent that reports only ``ctx.usage``) adds the result's usage under
  ``usage.model`` (``from_results``). An attempt that did journal its calls is
  counted from them alone, so nothing is counted twice.

The fold holds no prices: a read model outlives the price table it was read
with. :func:`priced` prices rows with a :class:`~projections.pricing.PriceTable`
(the table's price of the model; where it has none, the price recorded with
the calls, if every call had one; else unknown).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from cardbus.eventstore import events as ev
from cardbus.eventstore.batch import tokens_in_range
from cardbus.eventstore.envelope import Envelope
from cardbus.projections.base import Projection
from cardbus.projections.model import Model, Row, TableSpec
from cardbus.projections.pricing import Money, PriceTable

__all__ = ["GROUPS", "Spend", "priced", "row_cost"]

#: what ``priced`` can group by: columns of ``proj_spend``
GROUPS = ("root_id", "task_id", "agent_id", "model", "capability", "role")

SPEND = TableSpec(
    "proj_spend",
    (
        ("task_id", "TEXT"),
        ("agent_id", "TEXT"),
        ("model", "TEXT"),
        ("root_id", "TEXT"),
        ("capability", "TEXT"),
        ("role", "TEXT"),
        ("input_tokens", "INTEGER"),
        ("output_tokens", "INTEGER"),
        ("calls", "INTEGER"),
        ("recorded_usd", "REAL"),
        ("unrecorded", "INTEGER"),  # calls (or results) without a recorded cost
        ("from_results", "INTEGER"),  # results counted from their usage (no journaled call)
    ),
    key=("task_id", "agent_id", "model"),
    indexes=(("root_id",),),
)
CONTEXT = TableSpec(
    "proj_spend_ctx",
    (
        ("task_id", "TEXT"),
        ("root_id", "TEXT"),
        ("capability", "TEXT"),
        ("role", "TEXT"),
        ("journaled", "JSON"),  # "<attempt>|<agent>" of the attempts with journaled calls
    ),
    key=("task_id",),
)


class Spend(Projection):
    """``proj_spend``: tokens (and recorded costs) per task, agent and model."""

    name = "spend"
    version = 1
    tables = (SPEND, CONTEXT)
    handles = frozenset({ev.TaskCreated, ev.ModelAnswered, ev.TaskResultSubmitted})

    def apply(self, model: Model, env: Envelope) -> None:
        data: Any = env.data
        ctxs = model["proj_spend_ctx"]
        t = type(data)
        if t is ev.TaskCreated:
            ctxs.put(
                (env.stream,),
                {
                    "task_id": env.stream,
                    "root_id": data.root_id or env.correlation_id,
                    "capability": data.capability,
                    "role": data.role or data.capability,
                    "journaled": [],
                },
            )
            return
        ctx = ctxs.get((env.stream,))
        if ctx is None:  # a task whose creation this log lacks: counted under its root
            ctx = {
                "task_id": env.stream,
                "root_id": env.correlation_id,
                "capability": "?",
                "role": "?",
                "journaled": [],
            }
            ctxs.put((env.stream,), ctx)
        if t is ev.ModelAnswered:
            mark = f"{data.attempt}|{data.agent_id}"
            if mark not in ctx["journaled"]:
                ctx["journaled"] = [*ctx["journaled"], mark]
                ctxs.put((env.stream,), ctx)
            if data.replayed_from is not None or data.error is not None:
                return  # nothing spent again / no answer
            row = self._row(model, ctx, data.agent_id, data.model)
            row["input_tokens"] += tokens_in_range(data.input_tokens)
            row["output_tokens"] += tokens_in_range(data.output_tokens)
            row["calls"] += 1
            if data.cost_usd is None:
                row["unrecorded"] += 1
            else:
                row["recorded_usd"] += max(0.0, float(data.cost_usd))
        elif t is ev.TaskResultSubmitted:
            if f"{data.attempt}|{data.agent_id}" in ctx["journaled"]:
                return  # counted from its calls
            usage = data.usage
            tokens_in = tokens_in_range(usage.input_tokens)
            tokens_out = tokens_in_range(usage.output_tokens)
            if tokens_in == tokens_out == 0:
                return
            row = self._row(model, ctx, data.agent_id, usage.model)
            row["input_tokens"] += tokens_in
            row["output_tokens"] += tokens_out
            row["from_results"] += 1
            row["unrecorded"] += 1

    @staticmethod
    def _row(model: Model, ctx: Row, agent_id: str, model_name: str) -> Row:
        table = model["proj_spend"]
        key = (ctx["task_id"], agent_id, model_name or "")
        row = table.get(key)
        if row is None:
            row = {
                "task_id": ctx["task_id"],
                "agent_id": agent_id,
                "model": model_name or "",
                "root_id": ctx["root_id"],
                "capability": ctx["capability"],
                "role": ctx["role"],
                "input_tokens": 0,
                "output_tokens": 0,
                "calls": 0,
                "recorded_usd": 0.0,
                "unrecorded": 0,
                "from_results": 0,
            }
        table.put(key, row)
        return row

    # -- queries -------------------------------------------------------------

    def rows(
        self,
        conn: sqlite3.Connection,
        root_id: str | None = None,
        roots: Sequence[str] | None = None,
    ) -> list[Row]:
        """Every row (of one run, or of some runs)."""
        if root_id is not None:
            roots = [root_id]
        if roots is None:
            return self.query(conn, "SELECT * FROM proj_spend ORDER BY root_id, task_id")
        out: list[Row] = []
        for i in range(0, len(roots), 500):
            chunk = list(roots[i : i + 500])
            marks = ",".join("?" * len(chunk))
            out += self.query(
                conn, f"SELECT * FROM proj_spend WHERE root_id IN ({marks})", tuple(chunk)
            )
        return out


def row_cost(row: Row, table: PriceTable) -> float | None:
    """One row's USD: the table's price of its model; else what was recorded with its calls
    (all of them); else None."""
    cost = table.cost(row["model"], row["input_tokens"], row["output_tokens"])
    if cost is not None:
        return cost
    if row["unrecorded"] == 0 and row["calls"] > 0:
        return float(row["recorded_usd"])
    return None


def priced(rows: Iterable[Row], table: PriceTable, by: str | Sequence[str]) -> list[Row]:
    """Rows summed per ``by`` (one or more of :data:`GROUPS`), each with its ``money``
    (a :class:`Money`), tokens, calls and models; in order of first appearance."""
    keys = (by,) if isinstance(by, str) else tuple(by)
    out: dict[tuple[Any, ...], Row] = {}
    for row in rows:
        k = tuple(row[c] for c in keys)
        acc = out.get(k)
        if acc is None:
            acc = out[k] = {
                **{c: row[c] for c in keys},
                "input_tokens": 0,
                "output_tokens": 0,
                "calls": 0,
                "models": [],
                "money": Money(),
            }
        acc["input_tokens"] += row["input_tokens"]
        acc["output_tokens"] += row["output_tokens"]
        acc["calls"] += row["calls"]
        if row["model"] and row["model"] not in acc["models"]:
            acc["models"].append(row["model"])
        acc["money"].add(row_cost(row, table))
    return list(out.values())
