"""Whether the process that dispatched an attempt still runs (issue 30: nothing untrue).

An embedded start counts the attempts in flight as lost with their host (``hostloss``):
the process whose agents ran them is gone. Only when it is: another ``cardbus run``
on the same file may be running them now. Each ``task.dispatched`` names the
orchestrator that sent the card (``orchestrator_id``; in an embedded process its own
agents run it), and that orchestrator's ``orchestrator.started`` names its host and
pid. An attempt is left to its process when that process is

* this one, and its orchestrator has not begun to stop (two runtimes in one process,
  as tests run them: a registry of the orchestrators running here), or
* another process on this host that is alive and started before it wrote its
  ``orchestrator.started`` (a later process with the same pid is not it: pids are
  reused; a zombie is dead).

Everything else is lost as before: a killed process, one on another host (which this
host cannot look at), a log from before ``task.dispatched`` named its orchestrator.
An attempt left to a live process is its own again when it stops: its ``_give_back``.
"""

from __future__ import annotations

import os
import socket
import time
import weakref
from pathlib import Path
from typing import Protocol

from cardbus.eventstore import EventStore
from cardbus.eventstore import events as ev

__all__ = ["left_to_live_processes", "process_alive", "running_here"]

#: what the start time read from /proc may be off by (clock ticks, the boot time)
_SLACK_S = 1.0


class _Running(Protocol):
    orchestrator_id: str
    _stopping: bool


#: orchestrators started in this process, by id (gone once collected)
_HERE: weakref.WeakValueDictionary[str, _Running] = weakref.WeakValueDictionary()


def running_here(orchestrator: _Running) -> None:
    """``orchestrator`` runs in this process from now until it begins to stop."""
    _HERE[orchestrator.orchestrator_id] = orchestrator


def _started_at(pid: int) -> float | None:
    """When process ``pid`` started (unix seconds), or None if unknown or a zombie's
    (-1.0: a zombie, dead though its pid is taken)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError):
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)", which may hold spaces
    if fields[0] in ("Z", "X"):
        return -1.0
    ticks = int(fields[19])  # field 22 of proc(5): start time, in clock ticks after boot
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


def process_alive(pid: int, since: float) -> bool:
    """Whether process ``pid`` of this host is alive and the one that ran at ``since``."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:
        pass  # alive, another user's
    except OSError:
        return False
    started = _started_at(pid)
    if started is None:  # no /proc: its existence is all this host says
        return True
    return 0.0 <= started <= since + _SLACK_S


async def _dispatcher(store: EventStore, task_id: str, attempt: int) -> str:
    for env in await store.read_stream(task_id):
        if isinstance(env.data, ev.TaskDispatched) and env.data.attempt == attempt:
            return env.data.orchestrator_id
    return ""


async def _alive(store: EventStore, orchestrator_id: str) -> bool:
    if not orchestrator_id:
        return False  # a log from before dispatches named their orchestrator
    here = _HERE.get(orchestrator_id)
    if here is not None:
        return not here._stopping
    for env in await store.read_stream(f"orchestrator-{orchestrator_id}"):
        if isinstance(env.data, ev.OrchestratorStarted):
            started = env.data
            if started.host != socket.gethostname() or started.pid == os.getpid():
                return False  # another host's (not to be looked at), or this process's past
            return process_alive(started.pid, env.recorded_at)
    return False


async def left_to_live_processes(
    store: EventStore, attempts: list[tuple[str, int]]
) -> set[tuple[str, int]]:
    """Those of ``attempts`` (task, attempt) whose dispatching process still runs."""
    alive: dict[str, bool] = {}
    left = set()
    for task_id, attempt in attempts:
        by = await _dispatcher(store, task_id, attempt)
        if by not in alive:
            alive[by] = await _alive(store, by)
        if alive[by]:
            left.add((task_id, attempt))
    return left
