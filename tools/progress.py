"""What ``cardbus run`` and ``cardbus demo`` say while a run works, from the store's subscribe.

:class:`RunProgress` follows the log (``EventStore.subscribe``, so it sees the
same events on SQLite and on NATS, written by this process or any other), picks
out the run of one plan id, and folds each task's events into its state with
the transition table (``eventstore.states.transition``). It tells:

* the root id as soon as the run exists (the first line);
* each task's state changes: on a terminal, a rich Live display (tasks done of
  total, what runs, what waits for approval and the command that answers it);
  without one (pipes, tests), one plain line per change, and a task waiting
  for approval prints the exact ``cardbus approve <task id> --store ...``.

With ``--json`` the commands do not use it: stdout carries only the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cardbus.eventstore import Envelope, EventStore, TaskState
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import IllegalTransition
from cardbus.eventstore.states import TERMINAL, transition
from cardbus.projections.replay import worded_inputs
from cardbus.tools.follow import Follow

__all__ = ["RunProgress"]

_TASK_TYPES = frozenset(ev.TASK_EVENT_TYPES)
_FINISHED = (ev.RunCompleted, ev.RunFailed, ev.RunHalted)


@dataclass
class _Task:
    task_id: str
    capability: str
    state: TaskState | None = None
    agent_id: str = ""
    unknown_effect: bool = False  # it waits on a tool call whose effect is unknown


class RunProgress:
    """Follow the run of ``plan_id`` in ``store`` and report it (see the module doc).

    ``store_flag`` is the `` --store URL`` the suggested commands repeat; ``live``
    None: a rich Live display when stdout is a terminal, plain lines otherwise.
    Use as ``async with RunProgress(...) as p:`` around the run; leaving waits (up
    to ``drain_s``) until the run's end has been seen, so every line is out.
    ``changes`` False: off a terminal, only the first line and the lines that ask
    for an approval.
    """

    def __init__(
        self,
        store: EventStore,
        plan_id: str,
        store_flag: str = "",
        live: bool | None = None,
        echo: Callable[[str], None] | None = None,
        drain_s: float = 5.0,
        changes: bool = True,
        follow: Follow | None = None,
    ) -> None:
        self.store = store
        self.plan_id = plan_id
        self.flag = store_flag
        self.live = sys.stdout.isatty() if live is None else live
        self.echo = echo or (lambda line: print(line, flush=True))
        self.drain_s = drain_s
        # False: without a live display, only the lines that ask something of the user
        # (a task waiting for approval), not every change (the demo sums the run up after)
        self.changes = changes
        # --follow: every model and tool call too, and the text as it is written (plain
        # lines: a live display would redraw over the text)
        self.follow = follow
        if follow is not None:
            self.live = False
        self.root_id: str | None = None
        self.tasks: dict[str, _Task] = {}
        self.finished = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._display: Any = None  # rich.live.Live on a terminal

    async def __aenter__(self) -> RunProgress:
        start = await self.store.last_position()
        known = await self.store.read_stream(f"plan-{self.plan_id}")  # resuming a run
        self._task = asyncio.create_task(self._follow(start, known), name="cardbus-progress")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if exc[0] is None and self.root_id is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.finished.wait(), self.drain_s)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._display is not None:
            self._display.stop()
            self._display = None

    # -- following the log -----------------------------------------------------

    async def _follow(self, start: int, known: list[Envelope]) -> None:
        root = next((e.data.root_id for e in known if isinstance(e.data, ev.PlanSubmitted)), None)
        if root is not None:  # a run resumed: its tasks as they are, then what follows
            self._found(root)
            for env in await self.store.read_correlation(root):
                start = max(start, env.position)
                self._apply(env, quiet=True)
            self._show()
        async for env in self.store.subscribe(start + 1):
            if self.root_id is None:
                data = env.data
                if isinstance(data, ev.PlanSubmitted) and data.plan_id == self.plan_id:
                    self._found(data.root_id)
                elif isinstance(data, ev.RunStarted) and data.plan_id == self.plan_id:
                    self._found(env.stream)
            if env.correlation_id == self.root_id:
                self._apply(env)
            if self.finished.is_set():
                return

    def _found(self, root_id: str) -> None:
        self.root_id = root_id
        if self.follow is not None:
            self.follow.root_id = root_id
        follow = f" (follow it: cardbus replay {root_id}{self.flag})" if self.changes else ""
        self._say(f"run {root_id}: started{follow}")
        if self.live:
            from rich.console import Console
            from rich.live import Live

            self._display = Live(
                self._render(), console=Console(), transient=True, refresh_per_second=8
            )
            self._display.start()

    def _apply(self, env: Envelope, quiet: bool = False) -> None:
        data = env.data
        if isinstance(data, _FINISHED):
            self.finished.set()
            return
        if self.follow is not None and not quiet:
            self.follow.step(env)
        if isinstance(data, ev.PlanProposed) and data.from_goal and self.changes and not quiet:
            # a value nobody gave is never passed off as one: the planner took the goal's words
            self._say(f"  plan round {data.round}{worded_inputs(data.from_goal)}")
        if type(data) not in _TASK_TYPES:
            return
        task = self.tasks.get(env.stream)
        if isinstance(data, ev.TaskCreated):
            task = self.tasks.setdefault(env.stream, _Task(env.stream, data.capability))
        if task is None:
            return
        try:
            state = transition(task.state, data)
        except IllegalTransition:
            return
        if isinstance(data, ev.TaskDispatched):
            task.agent_id = data.agent_id
        if isinstance(data, ev.ApprovalRequested):
            task.unknown_effect = data.reason == "tool_effect_unknown"
        if state is task.state:
            return
        task.state = state
        if not quiet:
            self._changed(task)

    # -- telling -----------------------------------------------------------------

    def _counts(self) -> str:
        done = sum(1 for t in self.tasks.values() if t.state in TERMINAL)
        return f"{done}/{len(self.tasks)}"

    def _approve(self, task: _Task) -> str:
        return f"cardbus approve {task.task_id}{self.flag}"

    def _changed(self, task: _Task) -> None:
        state = task.state.value if task.state else "?"
        where = f" on {task.agent_id}" if task.agent_id and task.state in _ACTIVE else ""
        line = f"  [{self._counts()}] {task.task_id} ({task.capability}) {state}{where}"
        if task.state is TaskState.AWAITING_APPROVAL and task.unknown_effect:
            line += (
                f"; a tool call's effect is unknown: {self._approve(task)} calls it again,"
                " with --done --result JSON records it as done, or cardbus deny"
            )
        elif task.state is TaskState.AWAITING_APPROVAL:
            line += f"; answer with: {self._approve(task)} (or cardbus deny)"
        if self._display is None:
            if self.changes or task.state is TaskState.AWAITING_APPROVAL:
                self._say(line)
        elif task.state is TaskState.AWAITING_APPROVAL:
            self._say(line)  # kept above the live display
        self._show()

    def _say(self, line: str) -> None:
        if self._display is not None:
            self._display.console.print(line, highlight=False, soft_wrap=True)
        elif self.follow is not None:
            self.follow.line(line)  # after the streamed text it interrupts
        else:
            self.echo(line)

    def _show(self) -> None:
        if self._display is not None:
            self._display.update(self._render())

    def _render(self) -> Any:
        from rich.console import Group
        from rich.text import Text

        lines = [Text(f"run {self.root_id}: {self._counts()} tasks done", style="bold")]
        for t in self.tasks.values():
            if t.state in _ACTIVE:
                lines.append(Text(f"  running  {t.task_id} ({t.capability}) on {t.agent_id}"))
            elif t.state is TaskState.AWAITING_APPROVAL:
                lines.append(Text(f"  waiting  {t.task_id}: {self._approve(t)}", style="yellow"))
        return Group(*lines)


_ACTIVE = frozenset({TaskState.DISPATCHED, TaskState.RUNNING})
