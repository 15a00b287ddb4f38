"""Writing a new run: its creation, and (when it is ours alone) its first step with it.

A part of ``Orchestrator`` (``core``): ``Orchestrator.submit`` checks the plan and
builds the creation events (``submission``); these write them. A run nobody
else knows of gets its first dispatches decided on the run folded tentatively
and written in the same append as its creation, its cards sent once stored: one
commit fewer before an agent starts. A new root id is drawn in a partition this
member holds, so the run is decided where it was submitted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from cardbus.bus.orchestrator.admission import Admission
from cardbus.bus.orchestrator.commit import Committing
from cardbus.bus.orchestrator.decisions import Decisions
from cardbus.eventstore import Append, ConcurrencyError, Envelope, new_id
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import PlanConflict

__all__ = ["Creating"]

log = logging.getLogger(__name__)
_PLACE_TRIES = 256  # new root ids drawn for one in a partition this member holds (p ~ share)


class Creating(Committing):
    """Writing a submitted run's creation (state: ``Orchestrator``)."""

    owns: Callable[[str], bool] | None
    places: Callable[[str], bool] | None
    local_runs: bool
    admission: Admission

    def _new_root(self) -> str:
        """A new run's root id. With ``owns`` (several members share the runs), one this
        member decides when it decides any: drawn again until its partition is one held
        here, so the run's creation goes with its first dispatches and its ``wait`` is
        answered here, not through another member. Runs go where they are submitted."""
        root_id = new_id()
        if self.places is not None and self.local_runs:
            for _ in range(_PLACE_TRIES):
                if self.places(root_id):
                    break
                root_id = new_id()
        return root_id

    def _same_plan(self, plan_id: str, digest: str) -> None:
        """``PlanConflict`` if ``plan_id`` was submitted before with another plan body."""
        known = self.state.plan_digests.get(plan_id)
        root_id = self.state.plans.get(plan_id)
        if known and root_id is not None and known != digest:
            raise PlanConflict(plan_id, root_id)

    async def _create(
        self,
        creates: list[tuple[str, ev.Event]],
        root_id: str,
        first_step: bool = False,
        actor: str | None = None,
    ) -> None:
        """Create streams (one commit on SQLite); one created earlier is read instead.

        ``first_step`` (a new run nobody else knows of): the run's first decisions,
        its first dispatches, are written in the same append as its creation and
        their cards sent once it is stored: one commit fewer before an agent starts.
        A caller cancelled meanwhile does not stop it half-way: what is stored is
        folded and its cards are sent.
        """
        first = self._first_step(creates, root_id) if first_step else None
        write = asyncio.ensure_future(self._write_creation(creates, root_id, first, actor))
        write.add_done_callback(lambda f: f.cancelled() or f.exception())  # the caller's to see
        await asyncio.shield(write)

    def _first_step(self, creates: list[tuple[str, ev.Event]], root_id: str) -> Decisions | None:
        """What the decide loop would decide first for this run, decided on the run
        folded tentatively (``RunState.tentatively``); None when that is more than
        events on the run's own new streams (the decide loop then decides it)."""
        if self.store_failure is not None or (self.owns is not None and not self.owns(root_id)):
            return None
        if not self.admission.room_for_one_more(self.state):
            return None  # it may be queued: the decide loop admits it or not
        now = time.time()
        drafts = [
            Envelope(
                event_id="", stream=s, version=1, recorded_at=now, correlation_id=root_id, data=x
            )
            for s, x in creates
        ]
        decider = self._decider(now, awaits=False)  # no await until it has decided
        try:
            with self.state.tentatively(drafts):
                decider.advance(self.state.open[root_id])
        except Exception:  # a bug here must not fail the submit: the decide loop decides it
            log.exception("deciding the first step of %s with its creation failed", root_id)
            return None
        d = decider.d
        new = {s for s, _ in creates}
        if not d or d.completed or d.after or not new.issuperset(d.events):
            return None
        return d

    async def _write_creation(
        self,
        creates: list[tuple[str, ev.Event]],
        root_id: str,
        first: Decisions | None,
        actor: str | None = None,
    ) -> None:
        extra = first.events if first is not None else {}
        appends = [  # the creation is the submitter's (actor), the first dispatches ours
            Append(
                s,
                self._new_events([data], root_id, actor)
                + self._new_events(extra.get(s, ()), root_id),
                0,
            )
            for s, data in creates
        ]
        error: Exception | None = None
        stored: list[str] = []
        # Not marked busy meanwhile: the log follower folds what it sees of these streams,
        # and on NATS another orchestrator (the run's owner, ``owns``) may write to one
        # while this append still waits for another stream's answer. Busy, that event
        # was skipped by the follower and never folded here (a partitioned member then
        # saw task.started on a task it had as pending: nats_scale_bench.py).
        streams = [s for s, _ in creates]
        outcomes = await self.store.append_many(appends)
        for stream, outcome in zip(streams, outcomes, strict=True):
            if isinstance(outcome, ConcurrencyError):  # created by an earlier, interrupted submit
                outcome = await self.store.read_stream(stream)
            elif isinstance(outcome, Exception):
                error = error or outcome
                continue
            else:
                stored.append(stream)
            for env in outcome:
                self._apply(env)
        if first is not None:
            await self._send(first, stored)  # what was stored is sent, whatever else failed
        if error is not None:
            raise error
