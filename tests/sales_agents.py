"""Agents over sales figures, as a user writes them: inputs ``region`` and ``period``.

Used by the planning tests (the rule planner never fills ``region`` or
``period`` with the goal's words; ``YOY_AGENTS``: a year-over-year analysis whose
``current`` and ``previous`` inputs are one query's output type, so the query is
needed twice, and a report of it) and the retry tests (``FlakySales`` always
fails, ``SteadySales`` offers the same capability and succeeds).
"""

from __future__ import annotations

import msgspec

from cardbus.agents.agent import Agent, Capability, TaskContext
from cardbus.agents.cards import TaskCard


class SalesQueryIn(msgspec.Struct, frozen=True):
    region: str
    period: str


class Sales(msgspec.Struct, frozen=True):
    region: str
    period: str
    total: float


class ReportIn(msgspec.Struct, frozen=True):
    sales: Sales


class Report(msgspec.Struct, frozen=True):
    text: str


class CompareIn(msgspec.Struct, frozen=True):
    current: Sales
    previous: Sales


class Comparison(msgspec.Struct, frozen=True):
    change: float
    text: str


def _total(region: str, period: str) -> float:
    return float(sum(map(ord, region + period)) % 1000)


class SalesQuery(Agent):
    agent_id = "sales-query"
    description = "Queries the sales database."
    capabilities = [
        Capability(
            "sales_query", SalesQueryIn, Sales, "query the sales figures of a region for a period"
        )
    ]

    async def handle(self, task: TaskCard, inputs: SalesQueryIn, ctx: TaskContext) -> Sales:
        return Sales(inputs.region, inputs.period, _total(inputs.region, inputs.period))


class SalesReport(Agent):
    agent_id = "sales-report"
    description = "Writes reports."
    capabilities = [
        Capability("sales_report", ReportIn, Report, "generate a report of sales figures")
    ]

    async def handle(self, task: TaskCard, inputs: ReportIn, ctx: TaskContext) -> Report:
        s = inputs.sales
        return Report(f"Sales in {s.region} for {s.period}: {s.total:.0f}")


class CompareSales(Agent):
    agent_id = "compare-sales"
    description = "Compares two periods."
    capabilities = [
        Capability("compare_sales", CompareIn, Comparison, "compare sales of two periods")
    ]

    async def handle(self, task: TaskCard, inputs: CompareIn, ctx: TaskContext) -> Comparison:
        change = inputs.current.total - inputs.previous.total
        text = f"{inputs.current.period} vs {inputs.previous.period}: {change:+.0f}"
        return Comparison(change, text)


class FlakySales(SalesQuery):
    """Offers ``sales_query`` and always fails."""

    agent_id = "flaky-sales"

    async def handle(self, task: TaskCard, inputs: SalesQueryIn, ctx: TaskContext) -> Sales:
        raise RuntimeError("the sales database is down")


class SteadySales(SalesQuery):
    """Offers ``sales_query`` and succeeds."""

    agent_id = "steady-sales"


SALES_AGENTS = [SalesQuery, SalesReport, CompareSales]
SALES_PATHS = [f"sales_agents:{a.__name__}" for a in SALES_AGENTS]


# -- a year-over-year analysis: one capability (the query) needed twice -------------------


class SalesRows(msgspec.Struct, frozen=True):
    region: str
    period: str
    rows: list[float]


class YoYIn(msgspec.Struct, frozen=True):
    current: SalesRows
    previous: SalesRows


class YoY(msgspec.Struct, frozen=True):
    current_total: float
    previous_total: float
    change_pct: float


class YoYReportIn(msgspec.Struct, frozen=True):
    analysis: YoY


class SalesRowsQuery(Agent):
    agent_id = "sales-rows"
    description = "Queries the sales database, row by row."
    capabilities = [
        Capability(
            "sales_rows", SalesQueryIn, SalesRows, "query the sales rows of a region for a period"
        )
    ]

    async def handle(self, task: TaskCard, inputs: SalesQueryIn, ctx: TaskContext) -> SalesRows:
        total = _total(inputs.region, inputs.period)
        return SalesRows(inputs.region, inputs.period, [total / 2, total / 2])


class YearOverYear(Agent):
    agent_id = "yoy"
    description = "Analyses sales year over year."
    capabilities = [
        Capability("yoy", YoYIn, YoY, "do a year-over-year analysis of two periods' sales")
    ]

    async def handle(self, task: TaskCard, inputs: YoYIn, ctx: TaskContext) -> YoY:
        now, before = sum(inputs.current.rows), sum(inputs.previous.rows)
        change = round(100 * (now - before) / before, 1) if before else 0.0
        return YoY(now, before, change)


class YoYReport(Agent):
    agent_id = "yoy-report"
    description = "Writes reports."
    capabilities = [
        Capability("yoy_report", YoYReportIn, Report, "generate a report of an analysis")
    ]

    async def handle(self, task: TaskCard, inputs: YoYReportIn, ctx: TaskContext) -> Report:
        a = inputs.analysis
        return Report(f"{a.current_total:.0f} against {a.previous_total:.0f}: {a.change_pct:+}%")


YOY_AGENTS = [SalesRowsQuery, YearOverYear, YoYReport]
YOY_PATHS = [f"sales_agents:{a.__name__}" for a in YOY_AGENTS]
