"""Start-up and stop: what a process does about the work in flight when it comes and goes.

A part of ``Orchestrator`` (``core``). ``_replay`` folds the log on start (from
the snapshot, when there is one). Then ``_started`` waits for the agents in the
log to renew their leases, counts the attempts of a previous embedded process as
host losses (``hostloss``; not those of a process still running: ``live_hosts``),
writes ``orchestrator.started`` and a ``run.resumed`` on each run it resumes, sends
again the cards dispatched and not taken (``resend``) and has the resumed runs
looked at. On stop, ``_give_back`` records the attempts an embedded process's own
agents held as host losses, so another process on the same log retries them at once.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import time
from collections.abc import Callable

from cardbus.bus.orchestrator import snapshot as _snapshot
from cardbus.bus.orchestrator.commit import Committing
from cardbus.bus.orchestrator.hostloss import HOST_LOST
from cardbus.bus.orchestrator.live_hosts import left_to_live_processes, running_here
from cardbus.bus.orchestrator.loop_items import Changed
from cardbus.bus.orchestrator.resend import untaken_cards
from cardbus.eventstore import TaskState
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import CardbusError

__all__ = ["Resuming"]

log = logging.getLogger(__name__)


class Resuming(Committing):
    """Resuming runs on start, giving back attempts on stop (state: ``Orchestrator``)."""

    orchestrator_id: str
    snapshot_position: int
    owns: Callable[[str], bool] | None
    _loops: list[asyncio.Task[None]]
    _commits: set[asyncio.Task[None]]

    async def _replay(self) -> dict[str, str | None]:
        """Fold the log into the state (what follows the snapshot, when there is one);
        returns each open run's ``run.started`` traceparent, for its trace to rejoin."""
        started: dict[str, str | None] = {}  # root -> its run.started's traceparent
        self.state.folded_floor = math.inf  # folded in log order here: runs retire as they end
        loaded = (
            await _snapshot.load(self.snapshot_path, self.store) if self.snapshot_path else None
        )
        if loaded is not None:  # the open runs as of a position: fold only what follows
            snap, data = loaded
            _snapshot.restore(data, self.state)
            self.state.position = self.snapshot_position = snap.position
            started.update(snap.traceparents)
        while True:
            page = await self.log.read_all(self.state.position + 1, 5000)
            for env in page:
                self.state.apply(env)
                if isinstance(env.data, ev.RunStarted):
                    started[env.stream] = env.traceparent
                elif isinstance(env.data, (ev.RunCompleted, ev.RunFailed, ev.RunHalted)):
                    started.pop(env.stream, None)
            if len(page) < 5000:
                break
        # from here on the follower hands the log on (and our appends are folded ahead of it)
        self._followed = self.state.folded_floor = self.state.position
        if self.results is not None:  # the memory stream whole: a snapshot skips it
            await self.results.build(self.store)
        return started

    async def _started(self) -> None:
        """After the replay: agents in the log wait for a renewal; the attempts of a previous
        embedded process are lost; ``orchestrator.started`` names the runs resumed."""
        now = time.time()
        for agent_id in self.state.agents:
            self.leases.unconfirm(agent_id, self.state.agent_leases.get(agent_id, 0.0), now)
        lost = []
        if not self.attempts_survive_restart:
            for run in self.state.open.values():
                for task_id in run.tasks:
                    task = self.state.tasks[task_id]
                    if task.state in (TaskState.DISPATCHED, TaskState.RUNNING) and (
                        task.attempt not in task.settled
                    ):
                        lost.append((task_id, task.attempt))
            # another process's attempts while it lives: its own, not lost (``live_hosts``)
            left = await left_to_live_processes(self.store, lost)
            lost = [key for key in lost if key not in left]
        self._lost_attempts = dict.fromkeys(lost, HOST_LOST)
        untaken = (
            untaken_cards(self._decider(time.time()), self.owns)
            if self.attempts_survive_restart
            else []
        )
        stream = f"orchestrator-{self.orchestrator_id}"
        data = ev.OrchestratorStarted(
            orchestrator_id=self.orchestrator_id,
            resumed=list(self.state.open),
            host=socket.gethostname(),
            pid=os.getpid(),
            lost_attempts=[f"{t}#{a}" for t, a in lost],
        )
        running_here(self)  # before its first dispatch: another start here asks
        try:
            await self._append(stream, [data], 0, stream)
            for root in [r for r in self.state.open if self.owns is None or self.owns(r)]:
                resumed = ev.RunResumed(
                    orchestrator_id=self.orchestrator_id,
                    host=data.host,
                    pid=data.pid,
                    lost_attempts=[
                        f"{t}#{a}" for t, a in lost if self.state.tasks[t].created.root_id == root
                    ],
                )
                await self._append_folded(root, [resumed])
        except CardbusError as e:  # a log that refuses writes: the first decision will say
            log.warning("orchestrator.started not written: %s", e)
        if untaken:  # dispatched, maybe never sent: sent (again)
            log.info("sending again %d card(s) dispatched and not taken", len(untaken))
            await self._send_cards(untaken)
        if self.state.open:  # resumed runs are looked at now (lost attempts time out)
            self._queue.put_nowait(Changed(frozenset(self.state.open)))

    async def _give_back(self) -> None:
        """An embedded process stopping: the cards it sent to its own agents die with it, as
        host losses recorded now (retried by another process on the same log, or this one
        resumed), not left to wait for the queue limit: no start will come for them."""
        if self.attempts_survive_restart or not self._loops or self.store_failure:
            return
        # Until every attempt sent to our agents is settled and no write is in flight (or
        # the loop or the log is gone), with no time limit: another process on the same
        # log waits on these attempts, and an attempt left in flight there waits out the
        # queue limit (an hour by default). A fixed limit here expired on a busy machine
        # and wedged the other process's run. Looked at again each time, not once: a
        # dispatch decided before the stop and still being written is ours too once
        # stored (it was written after a single look, and the other process of a
        # two-process test waited on it until its run's limit).
        given: set[tuple[str, int]] = set()
        while self.store_failure is None and not all(t.done() for t in self._loops):
            mine = {key for key in self._sent if self._in_flight(*key)}
            new = mine - given
            given |= new
            if new:
                self._lost_attempts = self._lost_attempts | dict.fromkeys(new, HOST_LOST)
                self._queue.put_nowait(Changed(frozenset(self._root_of(t) for t, _ in new)))
            if not mine and not self._commits:
                return
            await asyncio.sleep(0.01)
