"""The rounds of a goal run's planning, as ``Decider`` decides them.

A part of ``Decider`` (``decisions``). A run with a goal and no tasks gets a
planning task each round; the planner's proposal is judged (``planning``) and
refused (the next round's card carries the errors; past the rounds allowed the
run fails) or accepted; once the acceptance is in the log the accepted plan's
tasks are created. A run that fails may be planned again (``replan_on_failure``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from cardbus.bus.orchestrator import planning
from cardbus.bus.orchestrator.attempts import Attempts
from cardbus.bus.orchestrator.runstate import RunView, TaskView
from cardbus.eventstore import TaskState
from cardbus.eventstore import events as ev

__all__ = ["PlanningRounds"]

S = TaskState


class PlanningRounds(Attempts):
    """A goal planned round by round (state: ``Decider``)."""

    def _plan(self, run: RunView) -> None:
        """The next planning decision of a goal run: a round, its verdict, or the plan's tasks."""
        if run.finished is not None or self.d.touched(run.root_id):
            return
        latest = len(run.planners)
        if run.accepted and run.accepted[-1].round == latest:
            if any(t not in self.state.tasks for t in run.accepted[-1].task_ids.values()):
                self._create_accepted(run, run.accepted[-1])
            return
        if not run.planners:
            if not run.started.task_ids:
                self._planning_round(run, errors=[], previous=None)
            return
        if latest in run.refusals:
            previous = run.proposals.get(latest)
            self._planning_round(
                run,
                errors=list(run.refusals[latest].errors),
                previous=previous.proposal if previous else None,
            )
            return
        if latest in run.proposals:
            return  # its verdict is written with it: never here
        planner = self.state.tasks.get(run.planners[-1])
        if planner is None:
            return
        if planner.task_id in self.d.completed:
            output = self.d.completed[planner.task_id]
            self._follow_completed(run.root_id, [planner.task_id])
        elif planner.state is S.COMPLETED:
            output = planner.output
        elif planner.terminal:
            self.d.add(
                run.root_id,
                ev.RunFailed(
                    reason="planning_failed",
                    failed_tasks=[planner.task_id],
                    detail=planning.planning_failure(planner)[:2000],
                ),
            )
            return
        else:
            return
        self._judge(run, latest, planner, output)

    def _judge(self, run: RunView, round: int, planner: TaskView, output: Any) -> None:
        spec = run.started.planning or ev.PlanningSpec()
        agent = next(
            (a for a, r in planner.results.items() if r.output == output),
            next(iter(planner.dispatched_to), ""),
        )
        proposed, plan, errors = planning.judge_proposal(
            output,
            run,
            self.state,
            self.policy,
            round=round,
            planner_task_id=planner.task_id,
            agent_id=agent,
            event_limit=self.event_limit,
        )
        if plan is None:
            events: list[ev.Event] = [proposed, ev.PlanRefused(round=round, errors=errors)]
            used = round - planning.episode_start(run, round) + 1
            if used >= spec.max_plan_rounds:
                events.append(
                    ev.RunFailed(
                        reason="plan_invalid",
                        failed_tasks=[],
                        detail=f"{used} proposals refused; the last: " + "; ".join(errors),
                    )
                )
            self.d.add(run.root_id, *events)
            return
        superseded = []
        if run.accepted or planning.planned_before(run):
            done = planning.completed_names(run, self.state)
            superseded = [t for n, t in run.names.items() if n not in done]
        ids = planning.accepted_task_ids(plan, run, round)
        self.d.add(
            run.root_id,
            proposed,
            ev.PlanAccepted(round=round, task_ids=ids, superseded=superseded),
        )

    def _accepted_proposal(self, run: RunView) -> Any:
        if not run.accepted:
            return None
        proposed = run.proposals.get(run.accepted[-1].round)
        return proposed.proposal if proposed else None

    def _planning_round(self, run: RunView, errors: list[str], previous: Any) -> None:
        """A planning task for the next round (the decision that starts it)."""
        round = len(run.planners) + 1
        task_id = planning.planner_task_id(run.root_id, round)
        if self.d.touched(task_id) or task_id in self.state.tasks:
            return
        inputs = planning.planning_inputs(
            run, self.state, errors=errors, previous=previous, limit_bytes=self.event_limit // 2
        )
        created = planning.planning_task(run, inputs, self.policy)
        if len(msgspec.json.encode(created)) > self.event_limit:
            self.d.add(
                run.root_id,
                ev.RunFailed(
                    reason="planning_failed",
                    detail="the planning card (the agents' cards and schemas) is over the"
                    f" event size limit ({self.event_limit} bytes)",
                ),
            )
            return
        self.d.add(task_id, created)

    def _create_accepted(self, run: RunView, accepted: ev.PlanAccepted) -> None:
        """The accepted plan's tasks, once the acceptance is in the log."""
        try:
            created = planning.created_tasks(run, self.state, accepted, self.policy)
        except Exception as e:  # a log written by another version: fail, never wedge
            self.d.add(
                run.root_id,
                ev.RunFailed(reason="plan_invalid", detail=f"accepted plan unusable: {e}"[:2000]),
            )
            return
        for task_id, data in created.items():
            if task_id not in self.state.tasks and not self.d.touched(task_id):
                self.d.add(task_id, data)
