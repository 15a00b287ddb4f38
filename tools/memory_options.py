"""``cardbus run``'s memory options: whose memory the run uses, and result reuse.

``--user`` / ``--tenant`` set the plan's ``user`` / ``tenant`` (the run's scope
chain in long-term memory: ``projections.scope``); ``--reuse`` keeps completed
tasks' results and answers identical tasks from them, no older than
``--reuse-max-age`` seconds (``bus.orchestrator.reuse``). Apart from
``cmd_run`` so the command reads as it did.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click
import msgspec

from cardbus.bus.orchestrator.plan import Plan
from cardbus.bus.orchestrator.reuse import ReusePolicy
from cardbus.eventstore.errors import InvalidScope
from cardbus.projections.scope import check_id

__all__ = ["memory_options", "with_context"]


def memory_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(
        [
            click.option("--user", default=None, help="The run's user (its memory scope)."),
            click.option("--tenant", default=None, help="The run's tenant (its memory scope)."),
            click.option(
                "--reuse",
                is_flag=True,
                help="Keep completed tasks' results in memory; answer identical tasks from them.",
            ),
            click.option(
                "--reuse-max-age",
                type=float,
                default=24 * 3600.0,
                show_default=True,
                help="Seconds a kept result may be reused for.",
            ),
        ]
    ):
        fn = option(fn)
    return fn


def with_context(
    plan: Plan, user: str | None, tenant: str | None, reuse: bool, max_age_s: float
) -> tuple[Plan, ReusePolicy | None]:
    """The plan with ``--user``/``--tenant`` applied, and the reuse policy (None: off)."""
    try:
        if user is not None:
            plan = msgspec.structs.replace(plan, user=check_id("user", user))
        if tenant is not None:
            plan = msgspec.structs.replace(plan, tenant=check_id("tenant", tenant))
    except InvalidScope as e:
        raise click.BadParameter(str(e)) from None
    if not reuse:
        return plan, None
    if not max_age_s > 0:
        raise click.BadParameter(f"--reuse-max-age must be above 0; got {max_age_s}")
    return plan, ReusePolicy(keep=True, reuse=True, max_age_s=max_age_s)
