"""The last line of a command that ran a run (``run``, ``demo``, ``fork``, ``rerun``,
``orchestrator --plan``), and what a command does when it gives up waiting for one.

A run that completed: ``run R: completed``. One cancelled: ``run R cancelled:
cancelled by ops; b: cancelled_by_user: wrong`` (who, and each plan task left
undone). One whose tasks did not complete:
the task that failed it first and why, before anything generic
(``projections.outcome``); any other end (planning failed, a loop, a budget):
the run's own reason and detail::

    run R failed: task draft-3f2a (write) failed: agent_error: RuntimeError: boom (attempt 3 of 3)

A command that started a run and reaches its ``--timeout`` cancels the run
(:func:`give_up`: each live task gets ``task.cancelled`` with the reason
``client_timed_out: ...``; the orchestrator, still in this process, ends the
run as cancelled), so the log never keeps a run ``running`` that
nothing works on: the agents and the orchestrator of these commands live in
the command's process and stop with it. Then one line, exit code 124
(:class:`~cardbus.tools.errors.TimedOut`). Interrupted (Ctrl-C), it cancels
the run as well, with the reason ``client_interrupted`` (:func:`see_through`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

from cardbus.bus.orchestrator.cancel import cancel_run
from cardbus.eventstore import EventStore
from cardbus.eventstore.errors import CardbusError
from cardbus.projections.ids import resolve_id
from cardbus.projections.outcome import Failure, first_failure
from cardbus.tools.errors import TimedOut

__all__ = [
    "CLIENT_INTERRUPTED",
    "CLIENT_TIMED_OUT",
    "failure_json",
    "give_up",
    "root_of_plan",
    "run_events",
    "run_line",
    "see_through",
]

#: the reason a timed-out command's cancellations carry (then ": <command> gave up ...")
CLIENT_TIMED_OUT = "client_timed_out"
#: the reason of an interrupted command's (Ctrl-C)
CLIENT_INTERRUPTED = "client_interrupted"

T = TypeVar("T")

_ERROR_CHARS = 500  # of an error or detail in the line (a hint may end it): one line still


def _attempts(f: Failure) -> str:
    if not f.attempts:
        return ""
    return f" (attempt {f.attempts} of {max(f.max_attempts, f.attempts)})"


def _error(text: str) -> str:
    one = " ".join(text.split())  # one line however the error was laid out
    return one if len(one) <= _ERROR_CHARS else one[: _ERROR_CHARS - 1] + "…"


def run_line(result: Any, events: list[Any]) -> str:
    """The last line about ``result`` (a ``RunResult``); ``events``: the run's, to name the
    task that failed it (a completed run does not need them)."""
    head = f"run {result.root_id}"
    if result.status == "completed":
        line = f"{head}: completed {result.reason}".rstrip()
        return line + (f" ({result.detail})" if result.detail else "")
    if result.status == "cancelled":  # who cancelled it, and what it left undone
        return f"{head} cancelled: {_error(result.detail) or 'no reason recorded'}"
    # only a run that ended because tasks did not complete is told by its first failed
    # task; any other end (planning found no plan, a loop, a budget) by the run's reason,
    # whose detail says more than its tasks' (a planner's rejection and its hint)
    failure = first_failure(events) if result.reason in ("tasks_not_completed", "") else None
    if failure is None:
        why = ": ".join(x for x in (result.reason, _error(result.detail)) if x)
        return f"{head} {result.status}: {why or 'no reason recorded'}"
    why = ": ".join(x for x in (failure.reason, _error(failure.error)) if x)
    line = (
        f"{head} {result.status}: task {failure.task_id} ({failure.capability})"
        f" {failure.ended}: {why}{_attempts(failure)}"
    )
    if failure.others:
        line += f"; {failure.others} other task(s) did not complete either"
    return line


def failure_json(events: list[Any]) -> dict[str, Any] | None:
    """The task that failed the run first, for ``--json`` (None: none did)."""
    f = first_failure(events)
    if f is None:
        return None
    return {
        "task_id": f.task_id,
        "task": f.name,
        "capability": f.capability,
        "ended": f.ended,
        "reason": f.reason,
        "error": f.error,
        "attempts": f.attempts,
        "max_attempts": f.max_attempts,
    }


async def run_events(store: EventStore, result: Any) -> list[Any]:
    """The events of ``result``'s run (for :func:`run_line` of a run that did not complete)."""
    return await store.read_correlation(result.root_id)


async def root_of_plan(store: EventStore, plan_id: str | None) -> str | None:
    """The root id of the run of ``plan_id`` (None: it has not started)."""
    if plan_id is None:
        return None
    try:
        return await resolve_id(store, plan_id)
    except CardbusError:
        return None


async def give_up(
    store: EventStore,
    root_id: str | None,
    timeout: float,
    command: str,
    orchestrator: Any = None,
    store_flag: str = "",
) -> TimedOut:
    """Cancel run ``root_id`` after ``command`` waited ``timeout`` s; the ``TimedOut`` to raise.

    ``orchestrator`` (the command's, still running): waited for, briefly, to end the
    run on the cancellations, so ``run.failed`` is in the log before the process exits.
    ``root_id`` None: the run never started (nothing to cancel).
    """
    waited = f"timed out after {timeout:g} s"
    if root_id is None:
        return TimedOut(f"{waited} before the run started; nothing was written")
    reason = f"{CLIENT_TIMED_OUT}: {command} gave up after {timeout:g} s (--timeout)"
    cancelled = await cancel_run(store, root_id, by="cli", reason=reason)
    if not cancelled:  # it ended as the wait ran out
        return TimedOut(
            f"{waited} waiting for run {root_id}, which has just ended: see"
            f" cardbus replay {root_id}{store_flag}"
        )
    if orchestrator is not None:
        # the run ends on the next step of the orchestrator, which follows the log
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await orchestrator.wait(root_id, 10.0)
    return TimedOut(
        f"{waited} waiting for run {root_id}: cancelled it ({len(cancelled)} task(s),"
        f" reason {CLIENT_TIMED_OUT}); see cardbus replay {root_id}{store_flag}"
    )


async def see_through(
    wait: Awaitable[T],
    store: EventStore,
    timeout: float,
    command: str,
    *,
    root_id: str | None = None,
    plan_id: str | None = None,
    orchestrator: Any = None,
    store_flag: str = "",
) -> T:
    """``await wait`` (the command's wait for its run: ``root_id``, or found by ``plan_id``).

    Past ``timeout`` (a ``TimeoutError``) the run is cancelled and :class:`TimedOut`
    raised (:func:`give_up`). Interrupted (Ctrl-C: ``asyncio.run`` cancels the command's
    task) the run is cancelled too, with the reason ``client_interrupted``, and the
    interruption goes on: either way no run stays ``running`` that nothing works on.
    """
    try:
        return await wait
    except TimeoutError:
        root = root_id or await root_of_plan(store, plan_id)
        raise await give_up(store, root, timeout, command, orchestrator, store_flag) from None
    except asyncio.CancelledError:
        root = root_id or await root_of_plan(store, plan_id)
        if root is not None:
            reason = f"{CLIENT_INTERRUPTED}: {command} was interrupted"
            # best effort on the way out: a store that fails here has its own line
            with contextlib.suppress(Exception):
                await cancel_run(store, root, by="cli", reason=reason)
                if orchestrator is not None:
                    await orchestrator.wait(root, 5.0)
        raise
