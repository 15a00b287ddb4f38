"""The orchestrator's fold: the log's events into its state, and what follows from them.

A part of ``Orchestrator`` (``core``). ``_apply`` folds one stored event into
``RunState`` (leases, the reuse index, traces and observers told), and answers
whoever waits for a run that just ended; ``_follow_log`` follows the log and hands
news to the decision loop (holding what arrives for a stream our own append is
still writing); the snapshot is saved at a moment when exactly the events up to
``state.position`` are folded (``snapshot`` writes and reads it); ``_store_failed``
ends every wait once the log refuses writes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cardbus.bus import telemetry
from cardbus.bus.orchestrator import snapshot as _snapshot
from cardbus.bus.orchestrator.liveness import Leases
from cardbus.bus.orchestrator.policy import Policy
from cardbus.bus.orchestrator.reuse import ResultIndex
from cardbus.bus.orchestrator.run_result import RunResult, result_of
from cardbus.bus.orchestrator.runstate import RunState
from cardbus.eventstore import Envelope, EventStore
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import StoreUnavailable
from cardbus.projections.memory import MEMORY_STREAM

__all__ = ["Folding"]

log = logging.getLogger(__name__)


class Folding:
    """Folding the log into the state (state: ``Orchestrator``)."""

    state: RunState
    store: EventStore
    log: Any  # the store, or a partitioned member's view of it (``Orchestrator.log``)
    policy: Policy
    leases: Leases
    results: ResultIndex | None
    tracing: telemetry.RunTracing
    observers: list[Callable[[Envelope], None]]
    store_failure: StoreUnavailable | None
    snapshot_path: Path | None
    _queue: asyncio.Queue[object]
    _busy: set[str]
    _held: dict[str, list[Envelope]]
    _waiters: dict[str, list[asyncio.Future[RunResult]]]
    _answering: set[asyncio.Task[None]]
    _unfolded: set[int]
    _followed: int
    _since_snapshot: int
    _saving: asyncio.Task[None] | None

    def _apply(self, env: Envelope) -> bool:
        """Fold ``env`` into the state; False if it was already there."""
        if not self.state.apply(env):
            return False
        if isinstance(env.data, ev.AgentRegistered):  # by another writer: await its renewal
            self.leases.unconfirm(env.data.agent_id, env.data.lease_s, time.time())
        elif isinstance(env.data, ev.AgentDeregistered):
            self.leases.forget(env.data.agent_id)
        if self.results is not None and env.stream == MEMORY_STREAM:
            self.results.apply(env)
        self._since_snapshot += 1
        self._unfolded.discard(env.position)
        self._maybe_snapshot()
        self.tracing.on_event(env)
        for observe in self.observers:
            try:
                observe(env)
            except Exception:  # an observer's bug must not stop the orchestrator
                log.exception("observer %r failed on %s", observe, env.event_id)
        if isinstance(env.data, (ev.RunCompleted, ev.RunFailed, ev.RunHalted)):
            waiters = self._waiters.pop(env.stream, None)
            if waiters:  # the result (a pass over the run's tasks) only for someone waiting
                result = self._result(env.stream)
                if result is None:  # retired as it finished (retain_finished_runs=0)
                    self._answering.add(
                        asyncio.create_task(self._answer_from_log(env.stream, waiters))
                    )
                for future in waiters:
                    if result is not None and not future.done():
                        future.set_result(result)
        return True

    def _result(self, root_id: str) -> RunResult | None:
        return result_of(self.state, root_id)

    async def _answer_from_log(
        self, root_id: str, waiters: list[asyncio.Future[RunResult]]
    ) -> None:
        try:
            result = await self._retired_result(root_id)
        except Exception as exc:  # the log cannot be read: the waiters learn why
            for future in waiters:
                if not future.done():
                    future.set_exception(exc)
        else:
            for future in waiters:
                if result is not None and not future.done():
                    future.set_result(result)
        finally:
            task = asyncio.current_task()
            if task is not None:
                self._answering.discard(task)

    async def _retired_result(self, root_id: str) -> RunResult | None:
        """The result of a finished run no longer kept in memory, from the log."""
        if root_id in self.state.runs:
            return None  # kept, and not finished yet
        state = RunState()
        for env in await self.store.read_correlation(root_id):
            state.apply(env)
        return result_of(state, root_id)

    def _store_failed(self, error: StoreUnavailable) -> None:
        """The log refuses writes: say so once, end every wait with the error, decide no more."""
        if self.store_failure is not None:
            return
        self.store_failure = error
        log.error("the log cannot be written, the orchestrator stops deciding: %s", error)
        for waiters in self._waiters.values():
            for future in waiters:
                if not future.done():
                    future.set_exception(error)

    async def _follow_log(self) -> None:
        state = self.state
        versions = state.versions
        busy = self._busy
        # From where the start's fold ended, not from ``state.position``: the start's own
        # appends (orchestrator.started, run.resumed) moved that past whatever another
        # writer appended meanwhile, which was then never folded (an approval lost for good)
        async for env in self.log.subscribe(self._followed + 1):
            if not isinstance(env, Envelope):  # a change of what is followed: see ``log``
                self._queue.put_nowait(env)
                continue
            # Only news wakes the loop. Our own appends come back already applied, or
            # (the log can be quicker than the append's caller) onto a stream still
            # busy with our append: held until it is settled, then folded if still new.
            # Never dropped: an append that ends in neither success nor a conflict
            # (PrerequisiteNotStored, a store error) reads nothing back, and a dropped
            # event of another writer left a gap the next one was folded across (a
            # member then saw a dispatched task as pending and dispatched attempt 1 again).
            self._followed = position = env.position
            if env.version > versions.get(env.stream, 0):
                self._unfolded.add(position)
                if env.stream not in busy:
                    self._queue.put_nowait(env)
                else:
                    self._held.setdefault(env.stream, []).append(env)
            else:
                self._maybe_snapshot()
            if position >= state.retire_at:  # (after the look: this event may be its end)
                self._retire_folded()

    def _retire_folded(self) -> None:
        """Let the finished runs past ``retain_finished_runs`` go whose end is folded with
        everything before it: the follower has handed it on, and nothing it handed on up
        to there waits in the queue or on a busy stream (``RunState.folded_floor``)."""
        self.state.retire_through(min(self._unfolded, default=self._followed + 1) - 1)

    def _folded_through(self, target: int) -> bool:
        """Every event up to ``target`` is folded: the follower has seen it and none it saw
        waits in the queue or on a busy stream (our own appends come back through the
        follower too). ``state.position`` alone is not enough: our own append moves it
        past another writer's event the follower has not reached, or holds
        (a reply for a task the other orchestrator had just created was called unknown)."""
        return self._followed >= target and not any(p <= target for p in self._unfolded)

    def _maybe_snapshot(self) -> None:
        """Save a snapshot once ``snapshot_every`` events were folded since the last, at a
        moment when exactly the events up to ``state.position`` are folded: the follower
        has seen them all, and none it saw still waits to be folded.

        Called by the follower (when it is behind our appends) and by ``_apply`` (when
        it is ahead of them): checked on the follower's side alone, a follower always
        quicker than the appender never found that moment and no periodic snapshot was
        written (30 runs one after the other, 450 events, ``snapshot_every=20``: none).
        """
        every = self.policy.snapshot_every
        if (
            every
            and self._since_snapshot >= every
            and self.snapshot_path is not None
            and not self._unfolded
            and self._followed >= self.state.position
            and self._saving is None
        ):
            self._save_snapshot(self.snapshot_path, self.state.position)

    def _save_snapshot(self, path: Path, position: int) -> None:
        """Capture the state now (it covers the log up to ``position`` exactly), write it
        in the background."""
        self._since_snapshot = 0
        data = _snapshot.encode_state(self.state)
        runs = self.tracing._runs
        traceparents = {
            r: self.tracing.traceparent(r) if r in runs else None for r in self.state.open
        }

        async def save() -> None:
            try:
                await _snapshot.save(path, self.store, data, position, traceparents)
            except Exception as e:  # a snapshot is only a shortcut: the log has it all
                log.warning("snapshot %s not written: %s", path, e)
            finally:
                self._saving = None

        self._saving = asyncio.create_task(save(), name="orchestrator-snapshot")

    async def _final_snapshot(self, path: Path) -> None:
        """On stop: fold what the log has that the state lacks, then snapshot it all."""
        try:
            start = min(self._unfolded, default=self._followed + 1)
            end = max(self.state.position, self._followed)
            while page := await self.store.read_all(start, 5000):
                for env in page:
                    self.state.apply(env)
                start = page[-1].position + 1
                end = max(end, page[-1].position)
            self._unfolded.clear()
            self.state.position = end
            self._save_snapshot(path, end)
            if self._saving is not None:
                await self._saving
        except Exception as e:
            log.warning("snapshot %s not written: %s", path, e)
