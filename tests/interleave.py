"""A deterministic interleaving harness for the orchestrator's fold (invariant 10).

Another writer's event can come between two steps of an orchestrator only where the
orchestrator waits: on the log (a read, an append, the follower's next event) or on the bus
(a card sent, a reply awaited). Those awaits are this harness's *await points*.
:func:`instrument` wraps the coroutine methods of the store (and the bus) an orchestrator is
given, in place (so ``isinstance`` and the runtimes' own checks see the real objects), and
every awaited call first passes :meth:`Points.point`:

* the point is numbered in the order reached and named by the orchestrator's call site
  (``_started>append``: the method of ours that awaited, then the store's method);
* at the point numbered ``inject_at`` the scenario's *foreign write* runs first (an approval,
  a denial, a cancel, another member's event: written through another connection to the
  same log, as another process would);
* at every point a seeded number of extra yields lets the other tasks (follower, clock,
  commits, workers) run before the call, so a seed is one schedule and another seed another.

:func:`explore` runs a scenario once with nothing injected (the reference: what the run ends
as, and how many points it reaches), then once per point with the write injected there, and
checks after each trial, from what the orchestrator folded and what the log holds:

* every event of the log was folded exactly once (none skipped, none twice), and each stream's
  events in order without crossing a gap (checked at every fold, not only at the end);
* no attempt was dispatched twice (one ``task.dispatched`` per task and attempt);
* the run ended as it ends when the write comes before the orchestrator starts.

Like FoundationDB's simulation and TigerBeetle's VOPR, but at the granularity that matters
here: asyncio already runs one thing at a time, so the only freedom is *where* between the
awaits the other writers land, and every such place is tried.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import random
import sys
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from cardbus.eventstore import Envelope
from cardbus.eventstore import events as ev

__all__ = [
    "TIMED",
    "FoldLedger",
    "Points",
    "Trial",
    "check_dispatched_once",
    "check_folded_once",
    "elusive",
    "folded_log",
    "explore",
    "report",
    "instrument",
]

# the store's and the bus's awaited methods (a method an object lacks is left alone)
STORE_METHODS = (
    "append",
    "append_many",
    "read_stream",
    "read_all",
    "read_correlation",
    "stream_version",
    "last_position",
    "read_last",
)
BUS_METHODS = ("send_task", "reply", "request", "serve_requests", "consume")
_OURS = ("cardbus/", "/bus/", "/eventstore/", "/projections/", "/agents/")


class Points:
    """The await points of one trial: counts them, names them, injects at one of them."""

    def __init__(
        self,
        inject_at: int | None = None,
        inject: Callable[[], Awaitable[object]] | None = None,
        seed: int = 0,
        max_yields: int = 2,
        inject_name: str | None = None,
    ) -> None:
        self.inject_at = inject_at
        self.inject_name = inject_name  # or at the first point with this call site
        self.inject = inject
        self.rng = random.Random(seed)
        self.max_yields = max_yields
        self.count = 0
        self.names: list[str] = []  # the call site of each point, in the order reached
        self.injected_at: str | None = None  # the call site the write was injected at
        self.before: list[str] = []  # the call sites reached before it
        self.injected = asyncio.Event()
        self.inject_error: BaseException | None = None
        self.active = True

    async def point(self, method: str) -> None:
        if not self.active:
            return
        self.count += 1
        name = f"{_call_site()}>{method}"
        self.names.append(name)
        if self.count == self.inject_at or name == self.inject_name:
            await self._inject(name)
        for _ in range(self.rng.randrange(self.max_yields + 1)):
            await asyncio.sleep(0)

    async def before_start(self) -> None:
        """Point 0: the write made before the orchestrator starts (the sequential order)."""
        if self.inject_at == 0:
            await self._inject("before start")

    async def when_idle(self, quiet_s: float = 0.05, not_before_s: float = 0.0) -> None:
        """Inject once no point was reached for ``quiet_s`` (and ``not_before_s`` has
        passed), unless it was injected already: a trial with nothing to inject at
        (``inject_at`` None) or whose schedule reached fewer points than ``inject_at`` gets
        its write once the orchestrator waits for it."""
        if not_before_s:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.injected.wait(), not_before_s)
        while not self.injected.is_set():
            count = self.count
            await asyncio.sleep(quiet_s)
            if not self.injected.is_set() and self.count == count:
                await self._inject("idle")

    async def _inject(self, where: str) -> None:
        if self.injected.is_set() or self.inject is None:
            self.injected.set()
            return
        self.injected_at = where
        self.before = list(self.names)  # the points reached before the write
        self.injected.set()  # before the write: a point it reaches itself does not inject
        try:
            await self.inject()
        except BaseException as e:  # reported by the trial, never swallowed
            self.inject_error = e


def _call_site(depth: int = 2) -> str:
    """The first ``depth`` frames of ours (cardbus) above the harness and the wrapped
    object, outermost first: ``_started/_append``."""
    names: list[str] = []
    frame = sys._getframe(2)
    while frame is not None and len(names) < depth:
        path = frame.f_code.co_filename
        if path != __file__ and any(p in path for p in _OURS) and "/tests/" not in path:
            names.append(frame.f_code.co_name)
        frame = frame.f_back  # type: ignore[assignment]
    return "/".join(reversed(names)) or "?"


def instrument(obj: Any, points: Points, methods: Iterable[str]) -> Any:
    """Make every awaited call of ``obj``'s ``methods`` (and each event of its
    ``subscribe``) an await point of ``points``; ``obj`` itself is returned."""
    for name in methods:
        original = getattr(obj, name, None)
        if original is None or not inspect.iscoroutinefunction(original):
            continue

        def wrap(fn: Callable[..., Awaitable[Any]], method: str) -> Callable[..., Any]:
            @functools.wraps(fn)
            async def at_point(*args: Any, **kw: Any) -> Any:
                await points.point(method)
                return await fn(*args, **kw)

            return at_point

        setattr(obj, name, wrap(original, name))
    subscribe = getattr(obj, "subscribe", None)
    if subscribe is not None and inspect.isasyncgenfunction(subscribe):
        original_subscribe = subscribe

        async def subscribed(*args: Any, **kw: Any) -> AsyncIterator[Any]:
            source = original_subscribe(*args, **kw)
            try:
                while True:
                    await points.point("subscribe.next")
                    try:
                        item = await source.__anext__()
                    except StopAsyncIteration:
                        return
                    yield item
            finally:
                await source.aclose()

        obj.subscribe = subscribed
    return obj


@dataclass
class FoldLedger:
    """What one orchestrator folded: each event's folds, and any fold across a gap."""

    folds: Counter[str] = field(default_factory=Counter)  # event id -> times folded
    gaps: list[str] = field(default_factory=list)  # "stream: v3 folded after v1"

    def watch(self, state: Any) -> None:
        """Count every fold of ``state`` (a ``RunState``): its ``apply`` is wrapped."""
        apply = state.apply
        versions = state.versions

        def counted(env: Envelope) -> bool:
            before = versions.get(env.stream, 0)
            folded = apply(env)
            if folded:
                self.folds[env.event_id] += 1
                if before and env.version != before + 1:
                    self.gaps.append(f"{env.stream}: v{env.version} folded after v{before}")
            return folded

        state.apply = counted


async def folded_log(reader: Any, orchestrator: Any, timeout: float = 10) -> list[Envelope]:
    """The log as a trial ends, read through ``reader`` (another connection) *before* the
    ``orchestrator`` is asked to be caught up, so that it has folded everything returned.

    ``caught_up`` folds through the log as it is when asked. A late event (a task's answer
    after its run ended: the orchestrator's own ``task.result_ignored``, its append's
    acknowledgement still on the way) can be stored after that; a log read afterwards
    holds it unfolded, and a busy machine called it "folded 0 times" (1 run in 24 of the
    NATS reconnection trial beside two busy loops). Read first, every event returned is at
    or before ``caught_up``'s target. An orchestrator that has not folded that far after
    ``timeout`` fails here, saying so (the check that follows would count 0 folds).
    """
    log: list[Envelope] = await reader.read_all(0, 100_000)
    if await orchestrator.caught_up(timeout) is False:
        last = log[-1].position if log else 0
        raise AssertionError(f"the orchestrator had not folded the log up to {last} in {timeout} s")
    return log


def check_folded_once(ledger: FoldLedger, log: list[Envelope], after: int = 0) -> list[str]:
    """The events of ``log`` past position ``after`` each folded exactly once; no gap."""
    problems = list(ledger.gaps)
    for env in log:
        if env.position <= after:
            continue
        n = ledger.folds.get(env.event_id, 0)
        if n != 1:
            problems.append(f"{env.position}:{env.type} on {env.stream} folded {n} times")
    return problems


def check_dispatched_once(log: list[Envelope]) -> list[str]:
    seen = Counter(
        (env.stream, env.data.attempt) for env in log if isinstance(env.data, ev.TaskDispatched)
    )
    return [f"{s} attempt {a} dispatched {n} times" for (s, a), n in seen.items() if n > 1]


@dataclass
class Trial:
    """What one run of a scenario came to."""

    end: tuple[str, ...]  # how the run ended (the scenario says what counts)
    points: Points
    problems: list[str]


Scenario = Callable[[Points], Awaitable[Trial]]


async def explore(
    scenario: Scenario, seed: int = 0, by_site_only: bool = False
) -> tuple[Trial, list[Trial]]:
    """The reference (the write made before the orchestrator starts), then the write made
    once the orchestrator waits for it (which counts the points reached before it), then
    one trial per point a write can land at, with the write injected there. The scenario sets
    ``points.inject`` (its foreign write, through its own connection to the log) and calls
    ``before_start`` and ``when_idle``. Each trial's problems include an end other than
    the reference's and a write that failed. ``by_site_only``: no trial per point, one per
    call site (at its first occurrence), where a trial is dear (a real server)."""
    reference = await scenario(Points(0, seed=seed))
    idle = await scenario(Points(None, seed=seed))
    trials = [idle]
    # A write lands at a point reached before the orchestrator waits for it: one trial per
    # such point, and on while a trial still gets that far (another seed may go further).
    # A point reached only after the write (the run cannot get there without it) would
    # have its trial write once idle, as ``idle`` did: the same schedule again (once a
    # trial per point of the whole idle trial: 26 of the child approval's 40 were that).
    k, last = 1, 0 if by_site_only else len(idle.points.before)
    while k <= last:
        trial = await scenario(Points(k, seed=seed * 1000 + k))
        trials.append(trial)
        if trial.points.injected_at != "idle":  # it got as far as point k: try the next
            last = max(last, k + 1)
        k += 1
    # a call site some schedule reached before its write but none wrote at (the followers'
    # polls come when the clock says, a conflict's re-read when another write raced): a
    # trial that writes at its first occurrence, under up to three seeds, until every site
    # reached was written at or was not reached again when asked for (``elusive``)
    asked: dict[str, int] = {}
    while True:
        _, injected, reached = report(reference, trials)
        missing = sorted(n for n in reached - injected if asked.get(n, 0) < 3)
        if not missing:
            break
        for name in missing:
            asked[name] = asked.get(name, 0) + 1
            trials.append(await scenario(Points(-1, seed=seed + asked[name], inject_name=name)))
    for t in [reference, *trials]:
        if t.points.inject_error is not None:
            t.problems.append(f"the foreign write failed: {t.points.inject_error!r}")
        if t.end != reference.end:
            t.problems.append(f"ended {t.end}, not {reference.end} as without the interleaving")
    return reference, trials


# call sites whose occurrence the clock or a race decides (a follower's poll, the re-read
# after a conflict): a trial asking for one may not reach it; the tests print those missed
TIMED = frozenset(
    {
        "_follow_log/subscribe>read_all",
        "_commit/_append_streams>read_stream",
        "subscribe/_subscribe_echo_free>_read_direct",
        "subscribe/_subscribe_echo_free>_read",
        "subscribe/_subscribe_echo_free>last_position",
        # a worker's lease renewal: on its process's grid, so the first may fall within
        # a trial or not (bus.runtime.renewals.renewal_wait)
        "_run/_renew>reply",
    }
)


def elusive(trials: list[Trial]) -> set[str]:
    """Call sites reached before a write that three trials asking for them did not reach
    again (a poll the clock times): reported by the tests, never silently dropped."""
    _, injected, reached = report(trials[0], trials[1:])
    return reached - injected


def report(reference: Trial, trials: list[Trial]) -> tuple[list[str], set[str], set[str]]:
    """(every problem, each with the trial's injection point; the call sites written at;
    the call sites a trial reached before its write: what could have been written at)."""
    problems = [f"{t.points.injected_at}: {p}" for t in [reference, *trials] for p in t.problems]
    injected = {t.points.injected_at for t in trials if t.points.injected_at}
    reached = {name for t in trials for name in t.points.before}
    return problems, injected, reached
