"""``cardbus answer``: a person's answer to a question an agent asked (``questions``)."""

from __future__ import annotations

import json
from typing import Any

import click

from cardbus.bus.orchestrator.questions import Question, answer_question, open_questions
from cardbus.bus.runtime.loop import run as run_loop
from cardbus.projections import resolve_id
from cardbus.tools.cli import cli
from cardbus.tools.store_option import StoreRef, open_store_option, store_option


def _fields(q: Question) -> str:
    """The answer's fields as the schema names them: ``amount: number, currency: EUR|USD``."""
    props = q.schema.get("properties")
    if not isinstance(props, dict):
        return json.dumps(q.schema) if q.schema else "any JSON value or text"
    out = []
    for name, spec in props.items():
        kind = spec.get("type", "") if isinstance(spec, dict) else ""
        enum = spec.get("enum") if isinstance(spec, dict) else None
        out.append(f"{name}: {'|'.join(map(str, enum)) if enum else kind or 'any'}")
    return ", ".join(out)


@cli.command()
@click.argument("task_id")
@click.argument("answer", required=False)
@store_option
@click.option("--default", "use_default", is_flag=True, help="Answer with the question's default.")
@click.option("--by", default="cli", show_default=True, help="Who answers.")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def answer(
    task_id: str, answer: str | None, db: StoreRef, use_default: bool, by: str, as_json: bool
) -> None:
    """Show the open question of TASK_ID (the question's task, the task that asked, or
    the run), or answer it: ANSWER is JSON checked against the question's schema (text
    that is not JSON is a string). An answer that does not fit is refused naming the
    field, and the question stays open."""
    if answer is not None and use_default:
        raise click.UsageError("give an ANSWER or --default, not both")
    given: Any = None
    if answer is not None:
        try:
            given = json.loads(answer)
        except ValueError:
            given = answer  # plain text: a string answer

    async def go() -> tuple[list[Question], Any]:
        store = await open_store_option(db)
        try:
            ident = await resolve_id(store, task_id)  # a full id or a unique prefix
            if answer is None and not use_default:
                return await open_questions(store, ident), None
            q, recorded = await answer_question(
                store, ident, given, by=by, door="cli", use_default=use_default
            )
            return [q], recorded
        finally:
            await store.close()

    questions, recorded = run_loop(go())
    answered = answer is not None or use_default
    if as_json:
        out: dict[str, Any] = {"questions": [q.as_dict() for q in questions]}
        if answered:
            out |= {"task_id": questions[0].task_id, "answer": recorded, "by": by}
        click.echo(json.dumps(out, default=str))
        return
    if not questions:
        click.echo(f"{task_id}: no open question")
    for q in questions:
        if answered:
            click.echo(f"{q.task_id}: answered {json.dumps(recorded)} by {by}")
            continue
        click.echo(f"{q.task_id}: {q.question}")
        click.echo(f"  answer with: {_fields(q)}")
        if q.choices is not None:
            click.echo(f"  choices: {', '.join(json.dumps(c) for c in q.choices)}")
        if q.has_default:
            click.echo(f"  default: {json.dumps(q.default)} (cardbus answer {q.task_id} --default)")
