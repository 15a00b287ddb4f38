"""From a decision to the log and the bus: the orchestrator's write path.

A part of ``Orchestrator`` (``core``). ``_decider`` makes the ``Decider`` a step
decides with; ``_commit`` appends every stream's decided events in one
``append_many`` (``commit_order`` puts the streams it creates before the parents
naming them), turns a result the log refused into a failed one, sends the cards
of the streams that were stored only once they are (invariant 2: logged, then
sent), folds what was stored and tells the agent requests whose events rode along
how it went (``sending``: the fold after the cards, so their agents begin first).
The appends outside a step (``_append`` and its retrying forms) are here too.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Iterable, Sequence

import msgspec

from cardbus.agents.embedding import Embedder
from cardbus.bus.orchestrator import commit_order
from cardbus.bus.orchestrator.budget import Budgets
from cardbus.bus.orchestrator.decisions import Decider, Decisions
from cardbus.bus.orchestrator.loop_items import Changed, Record
from cardbus.bus.orchestrator.reply_intake import HeldForStream
from cardbus.bus.orchestrator.second_look import NotedBusy, looked_again, started_only
from cardbus.bus.orchestrator.sending import Sending
from cardbus.bus.orchestrator.store_trouble import StoreTrouble
from cardbus.bus.transport.interface import Bus
from cardbus.eventstore import (
    Append,
    ConcurrencyError,
    Envelope,
    NewEvent,
)
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import (
    BusError,
    DecodeError,
    PrerequisiteNotStored,
    StoreUnavailable,
    ValidationError,
)

__all__ = ["Committing"]

log = logging.getLogger(__name__)


class Committing(Sending):
    """Writing decisions to the log, then sending their cards (state: ``Orchestrator``)."""

    bus: Bus
    embedder: Embedder | None
    rng: random.Random
    budgets: Budgets
    store_trouble: StoreTrouble
    attempts_survive_restart: bool
    orchestrator_id: str
    partition_of: Callable[[str], int] | None
    _event_limit: int
    _stopping: bool
    _expected: dict[str, int]
    _parked: list[object]
    _held_for: HeldForStream
    _records: dict[str, list[Record]]
    _refused_runs: set[str]
    _sent: set[tuple[str, int]]
    _lost_attempts: dict[tuple[str, int], str]
    # busy streams a decider passed over, for the look after their commit (second_look);
    # the instance's own set is made by its first decider
    _passed: set[str] | None = None

    def _decider(self, now: float, awaits: bool = True) -> Decider:
        """``awaits``: the caller may await before it is done deciding (appends settle
        meanwhile), so the decider reads a copy of the streams busy now; a caller that
        decides without awaiting (a new run's first step) lets it read the set itself:
        the copy was O(appends in flight) per submitted run (370 at 1,000 in flight).
        Either way each busy stream it finds is noted (``second_look``)."""
        if self._passed is None:
            self._passed = set()
        busy = NotedBusy(
            frozenset(self._busy) if awaits else self._busy, self._busy, self._passed, self._late
        )
        decider = Decider(
            self.state,
            self.policy,
            now,
            self.embedder,
            self.rng,
            busy,
            event_limit=self._event_limit,
            leases=self.leases,
            lost_attempts=self._lost_attempts,
            dispatching=not self._stopping,
            budgets=self.budgets,
            results=self.results,
            place=self.partition_of,
        )
        decider.orchestrator_id = self.orchestrator_id  # its dispatches name their sender
        return decider

    async def _commit(self, d: Decisions) -> None:
        """Append every stream's new events in one write, then send the logged cards.

        One ``append_many`` for the whole decision (``commit_order``): the streams it
        creates first and the parents naming them after them, so a parent never points
        at a child that does not exist. If a child cannot be created, its parent's
        events are not written either: the reply is dropped (or, for a child the log
        refused, decided again as that refusal says) and the attempt times out and is
        retried, rather than waiting forever.
        """
        streams = list(d.events)
        quiet: set[str] = set()  # stored streams with nothing to look at again (second_look)
        try:
            write = commit_order.plan_write(d, streams)
            folds: list[tuple[str, list[Envelope]]] = []  # stored: folded as the cards leave
            outcomes = dict(await self._append_streams(d, write, folds))
            second = commit_order.again(write, outcomes)
            if second is not None:  # a child that already existed held its parent back
                self._fold_stored(d, folds)  # (decided again on the state with the first)
                outcomes.update(await self._append_streams(d, second))
            held = commit_order.blocked(write, outcomes)
            for stream, error in outcomes.items():
                if stream in held:
                    self._unstorable(d, stream, held[stream])
                elif not write.is_child(stream):  # a refused child speaks through its parent
                    self._unstorable(d, stream, error)
            stored = [s for s, error in outcomes.items() if error is None]
            await self._send_then_fold(d, stored, lambda: self._fold_stored(d, folds))
            quiet = started_only(d, stored)  # folded: else (it raised) every run is looked at
        finally:
            self._busy.difference_update(streams)
            versions = self.state.versions
            for stream in streams:  # the log's events for them meanwhile (see _follow_log)
                for env in self._held.pop(stream, ()):
                    if env.version > versions.get(stream, 0):  # news: to fold and decide on
                        self._queue.put_nowait(env)
                    else:  # our own append's, folded with it: what the step would conclude
                        self._unfolded.discard(env.position)
            if self.state.retire_at <= self._followed:  # (what held it back may be settled)
                self._retire_folded()
            for stream in streams:
                self._expected.pop(stream, None)
                for rec in self._records.pop(stream, []):  # never appended (e.g. blocked)
                    if not rec.done.done():
                        rec.done.set_exception(BusError(f"not recorded on {stream}"))
            # held for these streams (reply_intake), then what waited for any commit
            parked, self._parked = self._held_for.release(streams) + self._parked, []
            for reply in parked:
                self._queue.put_nowait(reply)
            # Not a tick: a tick looks at every open run, and this happens after
            # every commit; the clock's own ticks still catch deadlines everywhere.
            # Not for a stream that only recorded a start, unless a step passed it over.
            again = looked_again(streams, quiet, self._passed or set())
            if again:
                self._queue.put_nowait(Changed(frozenset(self._root_of(s) for s in again)))

    def _late(self, stream: str) -> None:
        """A decider passed over ``stream`` on a copy of the busy streams taken before its
        commit settled: that commit's look went before the pass; look at its run now."""
        self._queue.put_nowait(Changed(frozenset([self._root_of(stream)])))

    async def _append_streams(
        self,
        d: Decisions,
        write: commit_order.Write,
        folds: list[tuple[str, list[Envelope]]] | None = None,
    ) -> list[tuple[str, BaseException | None]]:
        """Append each stream's decided events in one ``append_many``; the error of each,
        or None. A stream not attempted (``PrerequisiteNotStored``) keeps its records
        waiting: ``_commit`` may write it again, and settles what it does not. What was
        stored is folded (and its records settled) here, or with ``folds`` later
        (``_fold_stored``: ``sending``)."""
        streams = write.streams
        if not streams:
            return []
        appends = [
            Append(
                s,
                self._new_events(d.events[s], self._decided_root(s, d.events[s])),
                self._expected.get(s, self.state.versions.get(s, 0)),
                after=after,
            )
            for s, after in zip(streams, write.after, strict=True)
        ]
        outcomes = await self.store.append_many(appends)
        out: list[tuple[str, BaseException | None]] = []
        for stream, outcome in zip(streams, outcomes, strict=True):
            if isinstance(outcome, PrerequisiteNotStored):
                log.info("%s not written: what it follows was not", stream)
                out.append((stream, outcome))
            elif isinstance(outcome, Exception):
                self._settle_records(stream, d.events[stream], outcome)
                if isinstance(outcome, ConcurrencyError):
                    for env in await self.store.read_stream(
                        stream, self.state.versions.get(stream, 0) + 1
                    ):
                        self._apply(env)
                elif isinstance(outcome, StoreUnavailable):
                    self.store_trouble.refused(outcome)
                else:
                    log.error("append to %s failed: %r", stream, outcome)
                out.append((stream, outcome))
            else:
                self.store_trouble.worked()
                if folds is None:
                    self._fold_stored(d, [(stream, outcome)])
                else:
                    folds.append((stream, outcome))
                out.append((stream, None))
        return out

    def _fold_stored(self, d: Decisions, folds: list[tuple[str, list[Envelope]]]) -> None:
        """Fold what each append stored, then tell the requests that rode along."""
        for stream, stored in folds:
            for env in stored:
                self._apply(env)
            self._settle_records(stream, d.events[stream], None, stored)
        folds.clear()

    def _settle_records(
        self,
        stream: str,
        data: list[ev.Event],
        error: BaseException | None,
        stored: Sequence[Envelope] = (),
    ) -> None:
        """Tell the requests whose events were in this append how it went; after a race,
        decide them again."""
        for rec in self._records.pop(stream, []):
            if rec.done.done():
                continue
            if isinstance(error, ConcurrencyError) and rec.tries < 5:
                rec.tries += 1
                self._parked.append(rec)  # decided again on the stream's new version
            elif error is not None:
                rec.done.set_exception(error)
            elif not all(any(e is x for x in data) for e in rec.events):
                rec.done.set_exception(BusError(f"not recorded: {stream} was halted"))
            else:
                # stored in the order decided (a backend may return decoded copies of the
                # events, so they are matched by place, not identity)
                places = [i for i, x in enumerate(data) if any(x is e for e in rec.events)]
                rec.done.set_result([stored[i] for i in places if i < len(stored)])

    def _unstorable(self, d: Decisions, stream: str, error: BaseException | None) -> None:
        """A result the log refused (too large, not encodable) becomes a failed result.

        Without this the agent's answer would vanish and the attempt would only
        time out; this way the failure is recorded with its reason and retried.
        """
        reply = d.origins.get(stream)
        if isinstance(error, (ConcurrencyError, StoreUnavailable)) and reply is not None:
            # decided again (on the stream as it now is): the agent took the card, and an
            # attempt that never started waits for the queue deadline only (deadlines)
            self._parked.append(reply)
            return
        if not isinstance(error, (DecodeError, ValidationError)):
            return
        if reply is None:  # a decision of the orchestrator's own: deciding it again would loop
            self._fail_refused(stream, error)
            return
        if reply.status == "failed" and reply.output is None:
            return  # already the replacement: do not loop
        reason = f"unstorable result: {type(error).__name__}: {error}"
        self._parked.append(
            msgspec.structs.replace(
                reply,
                status="failed",
                output=None,
                error=reason[:500],
                notes="",
                supplement_inputs={},
            )
        )

    def _fail_refused(self, stream: str, error: BaseException) -> None:
        """The log refused a decision (too large, not storable): the run fails with the
        reason ``decision_unstorable`` (once) instead of the step being decided forever."""
        root = self._root_of(stream)
        if root in self._refused_runs or root not in self.state.open:
            return
        self._refused_runs.add(root)
        failed = [stream] if stream != root else []
        detail = f"the log refused the events decided for {stream}: {type(error).__name__}: {error}"
        data = ev.RunFailed(reason="decision_unstorable", failed_tasks=failed, detail=detail[:2000])
        done: asyncio.Future[list[Envelope]] = asyncio.get_running_loop().create_future()
        done.add_done_callback(lambda f: f.cancelled() or f.exception())  # nobody awaits it
        self._parked.append(Record(root, [data], done))

    def _decided_root(self, stream: str, data: list[ev.Event]) -> str:
        if isinstance(data[0], ev.TaskCreated):
            return data[0].root_id
        task = self.state.tasks.get(stream)
        return task.created.root_id if task else stream

    def _root_of(self, stream: str) -> str:
        task = self.state.tasks.get(stream)
        return task.created.root_id if task is not None else stream

    def _new_events(
        self, data: Iterable[ev.Event], root: str, actor: str | None = None
    ) -> list[NewEvent]:
        """``data`` as events of run ``root``, by ``actor`` (default: the policy's)."""
        tp = self.tracing.traceparent(root)
        actor = actor or self.policy.actor
        return [NewEvent(data=x, correlation_id=root, actor=actor, traceparent=tp) for x in data]

    async def _append(
        self,
        stream: str,
        data: Iterable[ev.Event],
        expected: int,
        root: str,
        actor: str | None = None,
    ) -> list[Envelope]:
        stored = await self.store.append(stream, self._new_events(data, root, actor), expected)
        for env in stored:
            self._apply(env)
        return stored

    async def _append_folded(self, root: str, data: list[ev.Event]) -> None:
        """Append to an open run's stream at the version this orchestrator has folded; after a
        race, fold what the other writer wrote first and go on only if the run is still open.

        Never at a version read fresh from the store: that would put our event after
        events we have not folded, and the follower then skips them as already seen (a
        run another process completed meanwhile would look open here for ever).
        """
        for _ in range(5):
            if root not in self.state.open:
                return
            version = self.state.versions.get(root, 0)
            try:
                await self._append(root, data, version, root)
                return
            except ConcurrencyError:
                for env in await self.store.read_stream(root, version + 1):
                    self._apply(env)

    async def _append_at_current_version(
        self, stream: str, data: list[ev.Event], correlation_id: str
    ) -> None:
        """Append at the stream's current version, reading it again after a race (5 tries)."""
        for _ in range(5):
            try:
                await self._append(
                    stream, data, await self.store.stream_version(stream), correlation_id
                )
                return
            except ConcurrencyError:
                continue
