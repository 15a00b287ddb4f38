"""Pacing model calls under a provider's limits, before they are sent.

A provider limits calls per (provider, model, key): requests and tokens per minute,
sometimes concurrent calls. Meeting the limit by retrying 429s makes every run learn
it by hitting it; a ``Pacer`` holds a token bucket per limit instead and lets a call
go only when both buckets hold enough. One pacer serves a whole process
(``process_pacer``), so every run in it shares the pace; the members of a NATS cluster
each pace their share of it (``cardbus.bus.runtime.pace_share``).

Limits are configured (a ``LimitTable``: the file ``CARDBUS_LIMITS`` or ``--limits``
names, or ``Pacer.configure``) or learned from the answers' rate-limit headers
(``x-ratelimit-limit-*``, ``x-ratelimit-remaining-*``), as OpenAI-compatible providers
send them; until a key's first answer is read, one call goes and the others wait for
it. A 429 that still comes halves the pace and holds every call for its
``retry-after``.

Waiters are served by priority first (a higher ``priority`` goes first; a waiter's
priority grows by one per ``aging_s`` waited, so a low one is never starved for
ever), then round-robin between runs (one run's fan-out does not starve the others).
A call that waits says so (``QueueWatch``: the task journal records ``model.queued``
and ``model.slot_granted``) and stops the worker's clock of the task's run time
(``RunClock``): queued for the model's limit is not running.

The bucket arithmetic (``Bucket``, ``PaceState``) is pure: time is an argument, so a
test drives it with a fake clock; ``Pacer`` is the thin asyncio shell around it.
"""

from __future__ import annotations

import asyncio
import contextvars
import fnmatch
import itertools
import json
import os
import re
import time
import tomllib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cardbus.eventstore.errors import ConfigError, LLMRateLimited

__all__ = [
    "CALL_PACING",
    "CALL_QUEUED_S",
    "CALL_QUEUE_WATCH",
    "QueueWatch",
    "RUN_CLOCK",
    "RunClock",
    "ENV_LIMITS",
    "Bucket",
    "Limit",
    "LimitKey",
    "LimitTable",
    "MIN_SLOWDOWN",
    "PaceState",
    "Pacer",
    "current_pacing",
    "parse_reset",
    "process_pacer",
]

#: (provider, model, key fingerprint)
LimitKey = tuple[str, str, str]

#: The run (root id) and priority of the model call being made: the journal sets it
#: around the live call, so the pacer can serve runs round-robin and by priority.
CALL_PACING: contextvars.ContextVar[tuple[str, int]] = contextvars.ContextVar(
    "cardbus_call_pacing", default=("", 0)
)


#: seconds the model call just made waited for its limit (``OpenAIChatLLM`` sets it; the
#: task journal records it on the call's ``model.answered`` as ``queued_s``)
CALL_QUEUED_S: contextvars.ContextVar[float] = contextvars.ContextVar(
    "cardbus_call_queued_s", default=0.0
)


#: the environment variable naming the user's limits file (JSON or TOML)
ENV_LIMITS = "CARDBUS_LIMITS"

_LIMIT_FIELDS = {"requests_per_minute", "tokens_per_minute", "concurrent", "endpoint"}


class LimitTable:
    """Configured limits: a model name or glob (``fnmatch``, case-insensitive), and
    optionally the endpoint (``host:port``) it applies to, -> ``Limit``. The first
    matching entry wins; a key no entry matches is learned from the headers.

    A JSON or TOML file::

        # limits.toml                          // limits.json
        [models."gpt-4o-mini"]                 {"models": {
        requests_per_minute = 500                "gpt-4o-mini": {"requests_per_minute": 500,
        tokens_per_minute = 200000                               "tokens_per_minute": 200000},
        [models."llama*"]                        "llama*": {"concurrent": 4,
        concurrent = 4                                      "endpoint": "localhost:8000"}}}
        endpoint = "localhost:8000"
    """

    def __init__(
        self, entries: list[tuple[str, str | None, Limit]] | None = None, source: str = ""
    ) -> None:
        self.entries = list(entries or [])
        self.source = source

    @classmethod
    def load(cls, path: str | Path) -> LimitTable:
        """Read a limits file; a ``ConfigError`` names what is wrong in it."""
        path = Path(path)
        try:
            text = path.read_text()
            data: Any = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
        except (OSError, ValueError) as e:  # TOMLDecodeError and JSONDecodeError are both
            raise ConfigError(f"limits file {str(path)!r}: {e}") from e
        models = data.get("models") if isinstance(data, dict) else None
        if not isinstance(models, dict):
            raise ConfigError(f"limits file {str(path)!r}: no 'models' table")
        entries: list[tuple[str, str | None, Limit]] = []
        for name, entry in models.items():
            where = f"limits file {str(path)!r}, model {name!r}"
            if not isinstance(entry, dict) or set(entry) - _LIMIT_FIELDS:
                raise ConfigError(f"{where}: fields are {sorted(_LIMIT_FIELDS)}")
            numbers = {k: v for k, v in entry.items() if k != "endpoint"}
            for k, v in numbers.items():
                if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                    raise ConfigError(f"{where}: {k} must be a positive number, not {v!r}")
            endpoint = entry.get("endpoint")
            if endpoint is not None and not isinstance(endpoint, str):
                raise ConfigError(f"{where}: endpoint must be a string (host:port)")
            concurrent = numbers.get("concurrent")
            limit = Limit(
                requests_per_minute=numbers.get("requests_per_minute"),
                tokens_per_minute=numbers.get("tokens_per_minute"),
                concurrent=int(concurrent) if concurrent is not None else None,
            )
            entries.append((str(name), endpoint, limit))
        return cls(entries, source=str(path))

    @classmethod
    def from_env(cls) -> LimitTable:
        """The file ``CARDBUS_LIMITS`` names, else an empty table (everything learned)."""
        path = os.environ.get(ENV_LIMITS)
        return cls.load(path) if path else cls()

    def limit_for(self, key: LimitKey) -> Limit | None:
        endpoint, model, _ = key
        for pattern, where, limit in self.entries:
            if where is not None and where.lower() != endpoint.lower():
                continue
            if fnmatch.fnmatchcase(model.lower(), pattern.lower()):
                return limit
        return None


@dataclass(frozen=True)
class QueueWatch:
    """Told when a call starts waiting for its limit (``queued(limit, max_wait_s)``) and
    when it gets its slot (``granted(waited_s)``), before it is sent: the task journal
    records both, so the wait is shown as queued and not counted as the task's run time."""

    queued: Callable[[str, float], Awaitable[object]]
    granted: Callable[[float], Awaitable[object]]


#: the journal's watch on the call being made (None: nobody records the wait)
CALL_QUEUE_WATCH: contextvars.ContextVar[QueueWatch | None] = contextvars.ContextVar(
    "cardbus_call_queue_watch", default=None
)


class RunClock(Protocol):
    """The worker's clock of a task's run time: ``pause(bound_s)`` when a call starts
    waiting for its limit (the wait is at most ``bound_s``), ``resume(waited_s)`` when it
    stops waiting (its slot came, or it gave up). Calls waiting at once pause it once.
    A protocol: the worker's watch over the card is the clock, no object of its own per
    card (a thousand cards waiting at once)."""

    def pause(self, bound_s: float) -> None: ...

    def resume(self, waited_s: float) -> None: ...


#: set by the agent worker around a handler (None: no run time is counted here)
RUN_CLOCK: contextvars.ContextVar[RunClock | None] = contextvars.ContextVar(
    "cardbus_run_clock", default=None
)


def current_pacing() -> dict[str, Any]:
    """``run``, ``priority`` and ``watch`` of the call being made, as ``Pacer.acquire``
    takes them."""
    run, priority = CALL_PACING.get()
    return {"run": run, "priority": priority, "watch": CALL_QUEUE_WATCH.get()}


@dataclass(frozen=True)
class Limit:
    """A provider's limit for one key: None means unlimited."""

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    concurrent: int | None = None


@dataclass
class Bucket:
    """A token bucket: ``capacity`` at most, refilled at ``rate`` per second."""

    capacity: float
    rate: float
    level: float
    updated: float

    def refill(self, now: float) -> None:
        if now > self.updated:
            self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
            self.updated = now

    def wait_for(self, amount: float, now: float) -> float:
        """Seconds until ``amount`` can be taken (0: now)."""
        self.refill(now)
        need = min(amount, self.capacity) - self.level
        if need <= 1e-9:  # a rounding error is not a wait
            return 0.0
        return need / self.rate if self.rate > 0 else float("inf")

    def take(self, amount: float, now: float) -> None:
        self.refill(now)
        self.level -= min(amount, self.capacity)


def _per_minute(limit: float, now: float, minute_s: float = 60.0) -> Bucket:
    # a burst of a twentieth of the limit, and a rate such that burst + a minute's refill
    # is the limit: no sliding window of a minute ever sees more than the provider allows
    capacity = max(1.0, limit / 20.0)
    rate = max(limit - capacity, limit / 20.0) / minute_s
    return Bucket(capacity=capacity, rate=rate, level=capacity, updated=now)


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")


def parse_reset(text: str) -> float | None:
    """An ``x-ratelimit-reset-*`` value in seconds: ``"1s"``, ``"6m0s"``, ``"20ms"``,
    ``"1h2m3.5s"`` or a bare number of seconds; None if unreadable."""
    text = text.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(n) * scale[u] for n, u in parts)


def _number(headers: Mapping[str, str], name: str) -> float | None:
    value = headers.get(name)
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None


#: 429s in a row halve the pace down to this part of the limit, no further: a pace of
#: nearly nothing would wait minutes for the one answer that restores it
MIN_SLOWDOWN = 1 / 16


@dataclass
class PaceState:
    """The buckets of one limit key, and what a 429 taught.

    The buckets pace ``share`` (this process's part of a cluster's limit: 1.0 alone,
    set by ``cardbus.bus.runtime.pace_share``) of the limit, times ``slowdown`` (halved
    by each 429, restored by the next headers once the 429's hold has passed)."""

    requests: Bucket | None = None
    tokens: Bucket | None = None
    concurrent: int | None = None
    in_flight: int = 0
    hold_until: float = 0.0  # a 429's retry-after: nothing goes before
    configured: bool = False  # configured limits are not overridden by headers
    minute_s: float = 60.0  # a provider's minute (a bench scales time down)
    rate_limited: int = 0
    requests_per_minute: float | None = None  # the limit, configured or learned
    tokens_per_minute: float | None = None
    share: float = 1.0
    slowdown: float = 1.0
    # an answer was read (``learn``): until then one call goes, and the others wait for
    # what its headers say (a batch of runs does not spend a minute's budget unpaced)
    learned: bool = False
    # a bucket made for a limit just learned starts empty, not with its burst: in a
    # cluster, the other members may be bursting at the same moment (``pace_share``)
    start_empty: bool = False

    def wait_for(self, tokens: float, now: float) -> float:
        """Seconds until a call of ``tokens`` may go (inf: wait for a release)."""
        if self.concurrent is not None and self.in_flight >= self.concurrent:
            return float("inf")
        if not self.configured and not self.learned and self.in_flight > 0:
            return float("inf")  # the first call's answer tells the limits
        wait = max(0.0, self.hold_until - now)
        if self.requests is not None:
            wait = max(wait, self.requests.wait_for(1, now))
        if self.tokens is not None:
            wait = max(wait, self.tokens.wait_for(tokens, now))
        return wait

    def take(self, tokens: float, now: float) -> None:
        if self.requests is not None:
            self.requests.take(1, now)
        if self.tokens is not None:
            self.tokens.take(tokens, now)
        self.in_flight += 1

    def _rebuild(self, now: float) -> None:
        """Buckets for the limits at ``share * slowdown``, keeping what they hold."""
        for kind in ("requests", "tokens"):
            limit = getattr(self, f"{kind}_per_minute")
            old: Bucket | None = getattr(self, kind)
            if not limit:
                setattr(self, kind, None)
                continue
            fresh = _per_minute(limit * self.share, now, self.minute_s)
            fresh.rate *= self.slowdown
            if old is not None:
                if (old.capacity, old.rate) == (fresh.capacity, fresh.rate):
                    continue
                old.refill(now)
                fresh.level = min(old.level, fresh.capacity)
            elif self.start_empty:
                fresh.level = 0.0
            setattr(self, kind, fresh)

    def configure(self, limit: Limit, now: float) -> None:
        self.configured = True
        self.requests_per_minute = limit.requests_per_minute or None
        self.tokens_per_minute = limit.tokens_per_minute or None
        self.concurrent = limit.concurrent
        self._rebuild(now)

    def set_share(self, share: float, now: float) -> None:
        """Pace ``share`` (0 < share <= 1) of the limit: this process's part of a cluster's."""
        self.share = min(1.0, max(1e-3, share))
        self._rebuild(now)

    def learn(self, headers: Mapping[str, str], now: float) -> None:
        """Fold an answer's rate-limit headers: the limit sets the pace (unless one is
        configured), and the remaining count caps what the bucket believes it holds."""
        h = {k.lower(): v for k, v in headers.items()}
        self.learned = True
        changed = False
        # a pace a 429 halved is restored once its retry-after has passed
        if not self.configured and now >= self.hold_until:
            for kind in ("requests", "tokens"):
                limit = _number(h, f"x-ratelimit-limit-{kind}")
                if limit is not None and limit > 0:
                    changed |= getattr(self, f"{kind}_per_minute") != limit
                    setattr(self, f"{kind}_per_minute", limit)
                    changed |= self.slowdown != 1.0
            if changed:
                self.slowdown = 1.0
                self._rebuild(now)
        for kind in ("requests", "tokens"):
            remaining = _number(h, f"x-ratelimit-remaining-{kind}")
            bucket = getattr(self, kind)
            if bucket is not None and remaining is not None:
                bucket.refill(now)
                bucket.level = min(bucket.level, remaining)

    def rate_limited_answer(self, retry_after: float | None, now: float) -> None:
        """A 429 came anyway: hold every call for ``retry_after`` (1 s if unsaid) and
        halve the pace; learning from the next answers' headers restores it."""
        self.rate_limited += 1
        self.hold(now + (retry_after or 1.0), now)

    def hold(self, until: float, now: float) -> None:
        """Nothing goes before ``until``, and the pace is halved (a 429, here or in
        another member of the cluster)."""
        self.hold_until = max(self.hold_until, until)
        self.slowdown = max(MIN_SLOWDOWN, self.slowdown / 2.0)
        self._rebuild(now)
        for bucket in (self.requests, self.tokens):
            if bucket is not None:
                bucket.level = min(bucket.level, 0.0)


@dataclass(eq=False)
class _Waiter:
    run: str
    priority: int
    tokens: float
    since: float
    seq: int
    future: asyncio.Future[float] = field(repr=False)


class Pacer:
    """Model calls wait here for their limit's slot; one per process (``process_pacer``)."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        aging_s: float = 10.0,
        minute_s: float = 60.0,
        limits: LimitTable | None = None,
        max_wait_s: float = 600.0,
    ) -> None:
        """``aging_s``: a waiter gains one priority per ``aging_s`` waited; ``minute_s``:
        the length of the limits' minute (60; a bench scales it down); ``limits``: the
        configured ones (the rest are learned from the headers); ``max_wait_s``: the longest
        a call waits for its slot (then it fails with ``LLMRateLimited``)."""
        self.clock = clock
        self.max_wait_s = max_wait_s
        self.limits = limits or LimitTable()
        #: called with (key, retry_after) when a call was answered 429 (a cluster's share
        #: tells the other members: ``cardbus.bus.runtime.pace_share``)
        self.on_rate_limited: list[Callable[[LimitKey, float | None], None]] = []
        #: buckets of limits met from now on start empty (set by a cluster's share)
        self.start_empty = False
        #: called with a key the first time it is met (a cluster's share sets its part)
        self.on_new_key: list[Callable[[LimitKey], None]] = []
        self.minute_s = minute_s
        self.aging_s = aging_s
        self.states: dict[LimitKey, PaceState] = {}
        self._waiters: dict[LimitKey, list[_Waiter]] = {}
        self._served: dict[LimitKey, dict[str, int]] = {}
        self._timers: dict[LimitKey, asyncio.TimerHandle] = {}
        self._seq = itertools.count()

    def state(self, key: LimitKey) -> PaceState:
        state = self.states.get(key)
        if state is None:
            state = self.states[key] = PaceState(
                minute_s=self.minute_s, start_empty=self.start_empty
            )
            limit = self.limits.limit_for(key)
            if limit is not None:
                state.configure(limit, self.clock())
            for listener in self.on_new_key:
                listener(key)
        return state

    def use_limits(self, limits: LimitTable) -> None:
        """Configure from ``limits`` (the keys known now, and those met later)."""
        self.limits = limits
        for key, state in self.states.items():
            limit = limits.limit_for(key)
            if limit is not None:
                state.configure(limit, self.clock())

    def demand(self, key: LimitKey) -> int:
        """Calls of ``key`` waiting or under way here (what a cluster's shares follow)."""
        return len(self._waiters.get(key, ())) + self.state(key).in_flight

    def set_share(self, key: LimitKey, share: float) -> None:
        self.state(key).set_share(share, self.clock())
        self._pump(key)

    def hold(self, key: LimitKey, seconds: float) -> None:
        """Another member was answered 429: hold for ``seconds`` and halve the pace."""
        now = self.clock()
        self.state(key).hold(now + seconds, now)
        self._pump(key)

    def configure(self, key: LimitKey, limit: Limit) -> None:
        self.state(key).configure(limit, self.clock())

    def learn(self, key: LimitKey, headers: Mapping[str, str]) -> None:
        self.state(key).learn(headers, self.clock())
        self._pump(key)

    def rate_limited(self, key: LimitKey, retry_after: float | None) -> None:
        self.state(key).rate_limited_answer(retry_after, self.clock())
        for listener in self.on_rate_limited:
            listener(key, retry_after)
        self._pump(key)

    def release(self, key: LimitKey) -> None:
        state = self.state(key)
        state.in_flight = max(0, state.in_flight - 1)
        self._pump(key)

    def choose(self, key: LimitKey, now: float) -> _Waiter | None:
        """The waiter served next: highest aged priority, then the run served least."""
        waiters = self._waiters.get(key)
        if not waiters:
            return None
        served = self._served.setdefault(key, {})

        def rank(w: _Waiter) -> tuple[float, int, int]:
            # whole steps of aging: a waiter a microsecond older is not a priority higher
            # (the round-robin between runs decides among equals)
            aged = w.priority + (now - w.since) // self.aging_s
            return (-aged, served.get(w.run, 0), w.seq)

        return min(waiters, key=rank)

    async def acquire(
        self,
        key: LimitKey,
        tokens: float = 1.0,
        *,
        run: str | int = "",
        priority: str | int = 0,
        watch: QueueWatch | None = None,
    ) -> float:
        """Wait for a slot of ``key`` for a call of ``tokens``; the seconds waited.
        Pair with ``release`` when the call has its answer. ``watch`` is told when the
        call starts waiting and when it gets its slot (not when a slot was free at once).
        Past ``max_wait_s`` the call gives up: ``LLMRateLimited``."""
        now = self.clock()
        loop = asyncio.get_running_loop()
        waiter = _Waiter(
            str(run), int(priority), tokens, now, next(self._seq), loop.create_future()
        )
        self._waiters.setdefault(key, []).append(waiter)
        self._pump(key)
        if waiter.future.done():
            return 0.0  # a slot was free: no wait at all
        granted = False
        clock = RUN_CLOCK.get()
        if clock is not None:
            clock.pause(self.max_wait_s)
        try:
            if watch is not None:
                await watch.queued(f"{key[0]}/{key[1]}", self.max_wait_s)
            waited = await asyncio.wait_for(asyncio.shield(waiter.future), self.max_wait_s)
            granted = True
            if watch is not None:
                await watch.granted(waited)
            return waited
        except BaseException as e:
            if granted or (waiter.future.done() and not waiter.future.cancelled()):
                self.release(key)  # granted as we were stopped: give it back
            else:
                waiter.future.cancel()
                if waiter in self._waiters.get(key, []):
                    self._waiters[key].remove(waiter)
            if isinstance(e, TimeoutError):
                raise LLMRateLimited(
                    f"waited {self.max_wait_s:g} s for a slot of {key[0]}/{key[1]}'s limit"
                ) from e
            raise
        finally:
            if clock is not None:
                clock.resume(max(0.0, self.clock() - now))

    def _pump(self, key: LimitKey) -> None:
        """Grant every waiter that may go now, in order; else wake when the next may."""
        state = self.state(key)
        while True:
            now = self.clock()
            waiter = self.choose(key, now)
            if waiter is None:
                return
            if waiter.future.done() or waiter.future.get_loop().is_closed():
                self._waiters[key].remove(waiter)  # cancelled meanwhile, or its loop is gone
                continue
            wait = state.wait_for(waiter.tokens, now)
            if wait > 0:
                if wait != float("inf"):
                    self._wake_in(key, wait)
                return
            state.take(waiter.tokens, now)
            self._waiters[key].remove(waiter)
            served = self._served.setdefault(key, {})
            served[waiter.run] = served.get(waiter.run, 0) + 1
            waiter.future.set_result(max(0.0, now - waiter.since))

    def _wake_in(self, key: LimitKey, delay: float) -> None:
        timer = self._timers.get(key)
        if timer is not None:
            timer.cancel()
        loop = asyncio.get_running_loop()
        self._timers[key] = loop.call_later(delay, self._pump, key)


_process_pacer: Pacer | None = None


def process_pacer() -> Pacer:
    """The pacer every model call in this process shares."""
    global _process_pacer
    if _process_pacer is None:
        _process_pacer = Pacer(limits=LimitTable.from_env())
    return _process_pacer
