"""One trial of an interleaving scenario on the embedded store (``tests/interleave.py``):
the set-up every SQLite scenario shares (``test_interleavings``,
``test_question_interleavings``), so each scenario says only what is its own.

A trial opens the log twice (the orchestrator's connection, instrumented with the bus,
and a *foreign* one: another process, which writes the scenario's event and reads the
log for the checks), starts an orchestrator with its workers, lets the scenario run,
then checks what every trial must hold: every event of the log folded exactly once and
no attempt dispatched twice (the log read as ``folded_log`` says: before the
orchestrator is asked to be caught up).
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from interleave import (
    BUS_METHODS,
    STORE_METHODS,
    FoldLedger,
    Points,
    check_dispatched_once,
    check_folded_once,
    folded_log,
    instrument,
)
from orchkit import FAST

from cardbus.agents import Agent
from cardbus.bus import InProcessBus, Orchestrator
from cardbus.bus.runtime.worker import AgentWorker
from cardbus.eventstore import Envelope, SqliteEventStore

__all__ = ["LogTrial", "copy_log", "trial_folder"]

_n = itertools.count()


def trial_folder(parent: Path) -> Path:
    """A new empty folder for one trial's log under ``parent``."""
    folder = parent / f"trial-{next(_n)}"
    folder.mkdir()
    return folder


def copy_log(db: Path) -> Path:
    """A copy of the log ``db`` (with its WAL and snapshot files) for one trial, beside
    the template's folder; the copy's path."""
    to = trial_folder(db.parent.parent)
    for f in db.parent.iterdir():
        shutil.copy(f, to / f.name)
    return to / db.name


class LogTrial:
    """``async with LogTrial(points, db) as t``: ``t.store`` (the orchestrator's, its
    awaits ``points``' await points), ``t.foreign`` (another process's), ``t.bus``,
    ``t.orch`` (its folds counted in ``t.ledger``); everything stopped on exit, the
    workers too (a worker left running keeps its tasks past the trial).

    ``write``: the scenario's foreign write, given the foreign store (``points.inject``;
    set later by the scenario when it needs the log first). ``orchestrator``: keyword
    arguments of the ``Orchestrator`` (``snapshot``, ``tools``)."""

    def __init__(
        self,
        points: Points,
        db: Path,
        write: Callable[[SqliteEventStore], Awaitable[object]] | None = None,
        **orchestrator: Any,
    ) -> None:
        self.points = points
        self.db = db
        self.write = write
        self.orchestrator = orchestrator
        self.workers: list[AgentWorker] = []
        self.problems: list[str] = []

    async def __aenter__(self) -> LogTrial:
        self.store = await SqliteEventStore.open(self.db, poll_interval=0.01)
        self.foreign = await SqliteEventStore.open(self.db, poll_interval=0.01)
        self.bus = InProcessBus()
        instrument(self.store, self.points, STORE_METHODS)
        instrument(self.bus, self.points, BUS_METHODS)
        if self.write is not None:
            write, foreign = self.write, self.foreign
            self.points.inject = lambda: write(foreign)
        self.orch = Orchestrator(self.store, self.bus, FAST, **self.orchestrator)
        self.orch.attempts_survive_restart = False  # the embedded runtime's: agents die too
        self.ledger = FoldLedger()
        self.ledger.watch(self.orch.state)
        return self

    async def start(self, agents: Sequence[type[Agent]]) -> None:
        """The orchestrator started, then ``agents``' workers."""
        self.workers = [AgentWorker(self.bus, a) for a in agents]
        await self.orch.start([w.agent.card() for w in self.workers])
        for w in self.workers:
            await w.start()

    async def resume(self, agents: Sequence[type[Agent]]) -> None:
        """A resume: point 0 (the write before the start), the start, then the write
        once the orchestrator waits for it (if no await point had it)."""
        await self.points.before_start()
        await self.start(agents)
        await self.points.when_idle()

    async def check(self) -> list[Envelope]:
        """The log as it ends, after the checks every trial makes (``self.problems``):
        each event folded once (past the start's snapshot), each attempt dispatched once."""
        log = await folded_log(self.foreign, self.orch)
        self.problems += check_folded_once(self.ledger, log, self.orch.snapshot_position)
        self.problems += check_dispatched_once(log)
        return log

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.points.active = False
        for w in self.workers:
            await w.stop(announce=False)
        await self.orch.stop()
        await self.bus.close()
        await self.foreign.close()
        await self.store.close()
