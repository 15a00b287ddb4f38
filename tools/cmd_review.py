"""``cardbus review``: a person's word on a tool call held for review (``reviews``)."""

from __future__ import annotations

import json
from typing import Any

import click

from cardbus.bus.orchestrator.reviews import DECISIONS, Review, answer_review, open_reviews
from cardbus.bus.runtime.loop import run as run_loop
from cardbus.projections import resolve_id
from cardbus.tools.cli import cli
from cardbus.tools.store_option import StoreRef, open_store_option, store_option


def _shown(review: Review) -> dict[str, Any]:
    return {
        "call": review.call,
        "tool": review.tool,
        "arguments": review.arguments,
        "text": review.text,
        "attempt": review.attempt,
    }


@cli.command()
@click.argument("task_id")
@click.argument("decision", required=False, type=click.Choice(DECISIONS))
@store_option
@click.option("--call", default="", help="Which call (its digest or a prefix, or 'all').")
@click.option("--args", "args_json", default=None, metavar="JSON", help="With edit: the arguments.")
@click.option("--reason", default="", help="With refuse: why (the model gets it as the answer).")
@click.option("--by", default="cli", show_default=True, help="Who answers.")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def review(
    task_id: str,
    decision: str | None,
    db: StoreRef,
    call: str,
    args_json: str | None,
    reason: str,
    by: str,
    as_json: bool,
) -> None:
    """Show the tool calls of TASK_ID held for review, or answer them: approve, edit
    (--args JSON: the arguments the tool runs with, checked against its schema) or
    refuse (--reason: the model gets it as the tool's answer and goes on)."""
    arguments: dict[str, Any] | None = None
    if args_json is not None:
        if decision != "edit":
            raise click.UsageError("--args goes with edit")
        try:
            arguments = json.loads(args_json)
        except ValueError as e:
            raise click.BadParameter(f"not JSON: {e}", param_hint="--args") from e

    async def go() -> tuple[str, list[Review]]:
        store = await open_store_option(db)
        try:
            task = await resolve_id(store, task_id)  # a full id or a unique prefix
            if decision is None:
                return task, await open_reviews(store, task)
            answered = await answer_review(
                store, task, decision, by=by, call=call, arguments=arguments, reason=reason
            )
            return task, answered
        finally:
            await store.close()

    task, reviews = run_loop(go())
    if as_json:
        out = {"task_id": task, "decision": decision, "by": by if decision else None}
        click.echo(json.dumps(out | {"calls": [_shown(r) for r in reviews]}, default=str))
        return
    if decision is None and not reviews:
        click.echo(f"{task}: no tool call under review")
    for r in reviews:
        args = json.dumps(r.arguments, default=str)
        if decision is None:
            said = f" - the model said: {r.text}" if r.text else ""
            click.echo(f"{task}: {r.tool}({args}) call {r.call[:12]} under review{said}")
        else:
            edited = f" as {json.dumps(arguments)}" if decision == "edit" else ""
            why = f": {reason}" if decision == "refuse" else ""
            click.echo(f"{task}: {r.tool}({args}) {decision}{edited}{why} by {by}")
