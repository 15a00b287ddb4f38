"""``cardbus agents``: every agent the log knows, with its status and record."""

from __future__ import annotations

import logging
import time

import click

from cardbus.bus.runtime.leases import ask_leases
from cardbus.eventstore import Envelope
from cardbus.projections.agents import OVERLAP_THRESHOLD, AgentRow, agent_directory
from cardbus.tools.cli import cli
from cardbus.tools.cmd_inspect import (
    echo_json,
    fmt_time,
    json_option,
    new_table,
    open_store,
    print_rich,
    run,
)
from cardbus.tools.store_option import StoreRef, store_option

log = logging.getLogger(__name__)


@cli.command()
@store_option
@json_option
@click.option(
    "--overlap",
    default=OVERLAP_THRESHOLD,
    show_default=True,
    type=click.FloatRange(0.0, 1.0),
    help="Flag an agent when another offers more than this share of its capabilities.",
)
def agents(db: StoreRef, as_json: bool, overlap: float) -> None:
    """Every agent in the log: status (live, lapsed, deregistered), capabilities, last seen,
    success rate, and the agents whose capabilities overlap its own.

    The log holds no lease renewals. On NATS the running orchestrators, which hold them,
    are asked (up to a second for their answers): live means one of them holds a live
    lease for the agent. Otherwise (a
    SQLite log, an agent no orchestrator has a word on yet, or none running), live means
    registered and seen (registered, started or answered a card) within its lease, and
    an idle agent that keeps renewing shows lapsed.
    """

    async def go() -> list[AgentRow]:
        store = await open_store(db)
        try:
            events: list[Envelope] = []
            position = 0
            while True:
                page = await store.read_all(position, 5000)
                events.extend(page)
                if len(page) < 5000:
                    break
                position = page[-1].position + 1
            nc = getattr(store, "nc", None)  # a JetStream log: ask its orchestrators
            leases = await ask_leases(nc) if nc is not None else None
            return agent_directory(events, time.time(), threshold=overlap, leases=leases)
        finally:
            await store.close()

    rows = run(go())
    said: set[frozenset[str]] = set()  # a pair overlaps both ways: said once
    for r in rows:
        fresh = [o for o in r.overlaps if frozenset((r.agent_id, _name(o))) not in said]
        said.update(frozenset((r.agent_id, _name(o))) for o in fresh)
        if fresh:
            log.warning("agent %s overlaps %s", r.agent_id, ", ".join(fresh))
    if as_json:
        echo_json(rows)
        return
    table = new_table(f"{len(rows)} agent{'s' if len(rows) != 1 else ''}")
    for col in ("agent", "status", "capabilities", "last seen", "runs", "success", "overlaps"):
        table.add_column(col)  # too wide for 100 columns: print_rich stacks it
    for r in rows:
        status = {"live": "[green]live[/]", "lapsed": "[yellow]lapsed[/]"}.get(
            r.status, f"[dim]deregistered ({r.reason or '?'})[/]"
        )
        table.add_row(
            r.agent_id,
            status,
            ", ".join(r.capabilities),
            fmt_time(r.last_seen),
            str(r.runs),
            "-" if r.success_rate is None else f"{r.success_rate:.0%}",
            "[red]" + ", ".join(r.overlaps) + "[/]" if r.overlaps else "",
        )
    print_rich(table)


def _name(overlap: str) -> str:
    """The agent id of an ``AgentRow.overlaps`` entry (``"<agent> (85%)"``)."""
    return overlap.rsplit(" (", 1)[0]
