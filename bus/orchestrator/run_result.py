"""A finished run's result, as ``Orchestrator.wait`` returns it: ``RunResult``.

Its ``status`` is the run's end: ``completed``, ``failed``, ``halted``, or
``cancelled`` (a ``run.failed`` with ``cancelled``: someone cancelled the run, the
reason ``cancelled`` and ``detail`` naming who).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cardbus.bus.orchestrator.runstate import RunState
from cardbus.eventstore import events as ev

__all__ = ["RunResult", "result_of"]


@dataclass(frozen=True)
class RunResult:
    root_id: str
    status: str  # completed | failed | halted | cancelled
    outputs: dict[str, Any]
    reason: str = ""  # "degraded" for a completion without some optional tasks' outputs
    detail: str = ""  # e.g. the errors of a plan refused for good (reason plan_invalid)
    # False if a reviewed task completed with its review not passed (max_review_rounds spent)
    quality_met: bool = True
    open_issues: dict[str, list[ev.ReviewIssue]] = field(default_factory=dict)  # by plan task id
    # completed degraded: the optional plan tasks that did not complete (``optional``)
    degraded: list[str] = field(default_factory=list)


def result_of(state: RunState, root_id: str) -> RunResult | None:
    """A finished run's result (its outputs by plan task id), or None."""
    run = state.runs.get(root_id)
    if run is None or run.finished is None:
        return None
    data = run.finish_event
    outputs = (
        data.outputs
        if isinstance(data, ev.RunCompleted)
        else {name: state.tasks[tid].output for name, tid in run.names.items()}
    )
    unmet = {  # plan tasks that completed without passing their review, and what is open
        name: list(state.tasks[tid].open_issues)
        for name, tid in run.names.items()
        if tid in state.tasks and not state.tasks[tid].quality_met
    }
    degraded = list(data.degraded) if isinstance(data, ev.RunCompleted) else []
    return RunResult(
        root_id,
        run.finished,
        outputs,
        "degraded" if degraded else getattr(data, "reason", ""),
        getattr(data, "detail", ""),
        quality_met=not unmet,
        open_issues=unmet,
        degraded=degraded,
    )
