"""Dispatching a task: its card, its agent, and the guards before it goes out.

A part of ``Decider`` (``decisions``). ``card_for`` builds exactly what the agent
sees (its inputs, its declared dependencies' outputs). ``_dispatch`` fits the
card to the agents' input size (``context``), ranks the live agents
(``selection``), counts the loop hash (too many: the run halts, or pauses for a
person: ``loop_pause``), checks the budgets (``budget``) and decides
``task.dispatched``, with the card to send once it is stored. A pending task
may instead be answered from a kept result (``reuse``). ``_halt`` stops a run
(a loop, a spent budget, a person's stop).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable
from typing import Any

import msgspec

from cardbus.agents.cards import AgentCard, TaskCard
from cardbus.agents.embedding import Embedder
from cardbus.bus.orchestrator import child_runs, loop_pause, optional
from cardbus.bus.orchestrator.attempts import Attempts
from cardbus.bus.orchestrator.budget import Budgets, refused_event
from cardbus.bus.orchestrator.context import fit_card
from cardbus.bus.orchestrator.liveness import Leases
from cardbus.bus.orchestrator.plan import resolve_inputs
from cardbus.bus.orchestrator.refusals import why_no_agent
from cardbus.bus.orchestrator.reuse import ResultIndex
from cardbus.bus.orchestrator.runstate import RunView, TaskView
from cardbus.bus.orchestrator.selection import rank
from cardbus.eventstore import TaskState
from cardbus.eventstore import events as ev
from cardbus.eventstore.taskspec import restate

__all__ = ["Dispatching", "loop_hash"]

S = TaskState


class Dispatching(Attempts):
    """Cards decided and addressed (state: ``Decider``)."""

    embedder: Embedder
    leases: Leases | None
    results: ResultIndex | None
    budgets: Budgets | None
    dispatching: bool
    _loop_here: Counter[tuple[str, str]]
    place: Callable[[str], int] | None  # a root's partition (``child_runs``)
    # who sends the cards decided (``task.dispatched.orchestrator_id``: ``live_hosts``)
    orchestrator_id: str = ""

    def _dispatch(self, run: RunView, task: TaskView) -> None:
        if not self.dispatching:
            return  # left pending for whoever carries on
        if loop_pause.holds(self, run):
            return  # paused for a person: nothing more goes out until they answer
        if task.created.child is not None:  # no agent: a run of its own (child_runs)
            child_runs.start(self, run, task)
            return
        attempt = task.attempt + 1
        card = self.card_for(task, attempt)
        c = task.created
        # context budget: fit upstream outputs into the capable agents' max input size
        agents = self._selectable(run)
        card, trimmed = fit_card(card, c.inputs, agents, self.policy.context_policy)
        candidates = rank(
            agents,
            c.capability,
            c.goal,
            card.inputs,
            c.constraints,
            c.timeout_s,
            stats=self.state,
            embedder=self.embedder,
            weights=self.policy.weights,
            exclude=frozenset(task.excluded),
            penalty=lambda agent: (
                1.0  # this task failed on it in this run: a retry prefers another agent
                if agent in task.failed_on
                else self.state.failure_penalty(
                    agent, c.capability, self.now, self.policy.failure_half_life_s
                )
            ),
        )
        if not candidates:
            if self._awaited(run, c.capability):
                return  # an agent from the log may renew its lease: the task waits for it
            why = why_no_agent(self, task, card, run)
            self._fail(task, *optional.no_agent_failure(card.absent, self.state.tasks, why))
            return
        h = loop_hash(
            c.capability, [card.inputs, card.supplement, msgspec.to_builtins(card.review)]
        )
        if (h, task.task_id) not in run.loop_seen and task.task_id not in run.loop_pass:
            # tasks with this hash in the log, and those dispatched earlier in this step
            count = run.loop_counts.get(h, 0) + self._loop_here[(run.root_id, h)] + 1
            if count > self.policy.loop_threshold:
                detail = f"{c.capability} with the same inputs on {count} tasks"
                if self.policy.on_loop == "pause":  # a person decides (loop_pause)
                    loop_pause.pause(self, run, task, h, count, card.inputs, detail)
                else:
                    self._halt(run, "loop_detected", detail)
                return
            self._loop_here[(run.root_id, h)] += 1
        if self.budgets is not None and self.budgets.applies(run):
            # before the dispatch: a scope that has spent its cap dispatches nothing more
            agent = candidates[0].agent_id
            refusal = self.budgets.at_cap(run, task, agent)
            if refusal is not None:
                decision = run.started.on_budget
                if decision == "fail" and refusal.scope == "run":
                    self._halt(run, "budget_exceeded", refusal.reason)
                    return
                refused = refused_event(
                    refusal,
                    task_id=task.task_id,
                    agent_id=agent,
                    attempt=attempt,
                    action="dispatch",
                    decision=decision,
                )
                self.d.add(task.task_id, refused)
                self._over_budget(task, refusal.reason)
                return
        sent = msgspec.json.encode(card.inputs, order="sorted")
        digest = hashlib.sha256(sent).hexdigest()
        # what the agent receives, on the dispatch: inline when small, else its digest alone
        inline = card.inputs if len(sent) <= ev.DISPATCH_INPUTS_INLINE else None
        # schedule-to-start; the task's timeout_s runs from its start (``deadlines``)
        deadline = self.now + self.policy.queue_timeout_s
        if trimmed is not None:
            self.d.add(task.task_id, trimmed)  # recorded with the dispatch it shaped
        for i, chosen in enumerate(candidates[: max(1, c.fanout)]):
            self.d.add(
                task.task_id,
                ev.TaskDispatched(
                    attempt=attempt,
                    agent_id=chosen.agent_id,
                    score=chosen.score,
                    candidates=candidates[:5],
                    deadline=deadline,
                    timeout_s=c.timeout_s,
                    inputs_digest=digest,
                    loop_hash=h if i == 0 else "",
                    inputs=inline,
                    inputs_bytes=len(sent),
                    absent=list(card.absent),
                    orchestrator_id=self.orchestrator_id,
                ),
            )
            self.d.sends.setdefault(task.task_id, []).append((chosen.agent_id, card))

    def card_for(self, task: TaskView, attempt: int) -> TaskCard:
        """Exactly what the agent sees: its inputs, with only its declared deps resolved."""
        done = self.d.completed
        deps = self._deps(task)
        outputs = {d.task_id: done.get(d.task_id, d.output) for d in deps}
        absent = optional.absent_deps(deps)
        inputs = resolve_inputs(task.created.inputs, outputs, {}, frozenset(absent))
        return restate(
            task.created,
            TaskCard,
            task_id=task.task_id,
            inputs=inputs,
            deps=list(task.created.deps),
            attempt=attempt,
            # the latest review rides on every attempt of the revision, retries included
            review=list(task.review),
            previous_output=task.previous_output if task.review else None,
            supplement=task.supplement,
            absent=absent,
            priority=run.started.priority
            if (run := self.state.runs.get(task.created.root_id))
            else 0,
        )

    def _reused(self, run: RunView, task: TaskView) -> bool:
        """Answered from a result kept in long-term memory (``reuse``): no dispatch."""
        assert self.results is not None
        inputs = self.card_for(task, 1).inputs
        done = self.results.answer(run.started, task.created, task.task_id, inputs, self.now)
        if done is None:
            return False
        self.d.add(task.task_id, done)
        if run.started.budget_tokens is None:  # dependents may go on in this step
            self.d.completed[task.task_id] = done.output
        return True

    def _selectable(self, run: RunView) -> list[AgentCard]:
        """The agents a dispatch of ``run`` may choose from: live ones, of the run's named
        agents when it names some."""
        named = set(run.started.agents)
        return [
            a
            for a in self.state.agents.values()
            if (not named or a.agent_id in named)
            and (self.leases is None or self.leases.live(a.agent_id, self.now))
        ]

    def _awaited(self, run: RunView, capability: str) -> bool:
        """An unconfirmed agent (in the log, not yet renewed) that could do it: wait for it.

        So is one whose lease or grace has run out but whose ``agent.deregistered`` is
        not written yet (the loop's next sweep writes it): failing the task first would
        tell, in the log, of a task that found no agent while a capable one was still
        registered (seen on a busy machine, where a grace ran out before a decision)."""
        if self.leases is None:
            return False
        leases, now = self.leases, self.now
        named = set(run.started.agents)
        return any(
            (leases.waiting(a.agent_id, now) or leases.lapsed([a.agent_id], now))
            and a.capability(capability) is not None
            for a in self.state.agents.values()
            if not named or a.agent_id in named
        )

    def _deps(self, task: TaskView) -> list[TaskView]:
        return [self.state.tasks[d] for d in task.created.deps if d in self.state.tasks]

    def _dep_check(self, task: TaskView) -> tuple[str | None, bool]:
        """(the first dependency whose end cancels ``task``, or None; whether every
        dependency completed, or, an optional one, ended with its output absent).

        One pass over the deps for both answers, with no list or generator made: a pending
        task is looked at on every step its run is (1,000 runs in flight: about 4 looks
        per step, 2.5 us each in place before)."""
        tasks, done = self.state.tasks, self.d.completed
        ready = True  # so far: every dependency known and completed (or absent)
        for dep_id in task.created.deps:
            d = tasks.get(dep_id)
            if d is None:  # not folded here (yet): not done
                ready = False
            elif optional.blocks(d):  # an optional one that ended leaves its output absent
                return d.task_id, False
            elif ready and not (
                d.state is S.COMPLETED or d.task_id in done or optional.is_absent(d)
            ):
                ready = False
        return None, ready

    def _halt(self, run: RunView, reason: str, detail: str) -> None:
        # a completion decided in this step stands; the halt is written after it
        done_here = [t for t in run.tasks if t in self.d.completed]
        live = [
            t for t in run.tasks if not self.state.tasks[t].terminal and t not in self.d.completed
        ]
        if run.root_id in self.d.busy or any(t in self.d.busy for t in live):
            # a write to one of its streams is in flight: halting now would race
            # it (and lose the TaskHalted to a ConcurrencyError); the condition
            # holds on the next step, so halt then
            return
        child_runs.drop_decided(self.d, run.root_id)  # a child decided here: never started
        for stream, events in list(self.d.events.items()):
            first = events[0]
            if isinstance(first, ev.TaskCreated) and first.root_id == run.root_id:
                del self.d.events[stream]  # a subtask decided in this step: never start it
        for task_id in live:
            # keep the facts already decided (a result that arrived), drop the rest
            kept = [e for e in self.d.events.pop(task_id, []) if isinstance(e, _FACTS)]
            self.d.sends.pop(task_id, None)
            self.d.after.pop(task_id, None)
            self.d.add(task_id, *kept, ev.TaskHalted(reason=reason, detail=detail))
            self._follow_completed(task_id, done_here)
        self.d.add(run.root_id, ev.RunHalted(reason=reason, detail=detail))
        self._follow_completed(run.root_id, done_here)


_FACTS = (ev.TaskStarted, ev.TaskResultSubmitted, ev.TaskResultIgnored, ev.TaskRedelivered)


def loop_hash(capability: str, inputs: Any) -> str:
    """Hash of (capability, normalized inputs): keys sorted, whitespace and case folded."""
    canon = msgspec.json.encode(_normalize(inputs), order="sorted")
    return hashlib.sha256(capability.encode() + b"\0" + canon).hexdigest()[:32]


def _normalize(value: Any) -> Any:
    if isinstance(value, str):
        # runs of whitespace to one space: str.split() splits on exactly what the
        # pattern \s+ matches (str.isspace), at a third of re.sub's cost
        return " ".join(value.lower().split())
    if isinstance(value, dict):
        return {str(k): _normalize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalize(v) for v in value]
    return value
