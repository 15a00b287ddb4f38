"""Pacing model calls under a provider's limits, before they are sent.

A provider limits calls per (provider, model, key): requests and tokens per minute,
sometimes concurrent calls. Meeting the limit by retrying 429s makes every run learn
it by hitting it; a ``Pacer`` holds a token bucket per limit instead and lets a call
go only when both buckets hold enough. One pacer serves a whole process
(``process_pacer``), so every run in it shares the pace.

Limits are configured (``Pacer.configure``) or learned from the answers' rate-limit
headers (``x-ratelimit-limit-*``, ``x-ratelimit-remaining-*``, ``x-ratelimit-reset-*``,
as OpenAI-compatible providers send them). A 429 that still comes halves the pace and
holds every call for its ``retry-after``.

Waiters are served by priority first (a higher ``priority`` goes first; a waiter's
priority grows by one per ``aging_s`` waited, so a low one is never starved for
ever), then round-robin between runs (one run's fan-out does not starve the others).

The bucket arithmetic (``Bucket``, ``PaceState``) is pure: time is an argument, so a
test drives it with a fake clock; ``Pacer`` is the thin asyncio shell around it.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "CALL_PACING",
    "CALL_QUEUED_S",
    "Bucket",
    "Limit",
    "LimitKey",
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


def current_pacing() -> dict[str, str | int]:
    """``run`` and ``priority`` of the call being made, as ``Pacer.acquire`` takes them."""
    run, priority = CALL_PACING.get()
    return {"run": run, "priority": priority}


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


@dataclass
class PaceState:
    """The buckets of one limit key, and what a 429 taught."""

    requests: Bucket | None = None
    tokens: Bucket | None = None
    concurrent: int | None = None
    in_flight: int = 0
    hold_until: float = 0.0  # a 429's retry-after: nothing goes before
    configured: bool = False  # configured limits are not overridden by headers
    minute_s: float = 60.0  # a provider's minute (a bench scales time down)
    rate_limited: int = 0

    def wait_for(self, tokens: float, now: float) -> float:
        """Seconds until a call of ``tokens`` may go (inf: wait for a release)."""
        if self.concurrent is not None and self.in_flight >= self.concurrent:
            return float("inf")
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

    def configure(self, limit: Limit, now: float) -> None:
        self.configured = True
        rpm, tpm = limit.requests_per_minute, limit.tokens_per_minute
        self.requests = _per_minute(rpm, now, self.minute_s) if rpm else None
        self.tokens = _per_minute(tpm, now, self.minute_s) if tpm else None
        self.concurrent = limit.concurrent

    def learn(self, headers: Mapping[str, str], now: float) -> None:
        """Fold an answer's rate-limit headers: the limit sets the pace (unless one is
        configured), and the remaining count caps what the bucket believes it holds."""
        h = {k.lower(): v for k, v in headers.items()}
        for kind in ("requests", "tokens"):
            limit = _number(h, f"x-ratelimit-limit-{kind}")
            remaining = _number(h, f"x-ratelimit-remaining-{kind}")
            bucket = getattr(self, kind)
            said = limit is not None and limit > 0 and not self.configured
            # a pace a 429 halved is restored once its retry-after has passed
            if said and limit is not None and now >= self.hold_until:
                fresh = _per_minute(limit, now, self.minute_s)
                if bucket is not None and bucket.rate == fresh.rate:
                    fresh = bucket
                elif bucket is not None:
                    bucket.refill(now)
                    fresh.level = min(bucket.level, fresh.capacity)
                bucket = fresh
                setattr(self, kind, bucket)
            if bucket is not None and remaining is not None:
                bucket.refill(now)
                bucket.level = min(bucket.level, remaining)

    def rate_limited_answer(self, retry_after: float | None, now: float) -> None:
        """A 429 came anyway: hold every call for ``retry_after`` (1 s if unsaid) and
        halve the pace; learning from the next answers' headers restores it."""
        self.rate_limited += 1
        self.hold_until = max(self.hold_until, now + (retry_after or 1.0))
        for bucket in (self.requests, self.tokens):
            if bucket is not None:
                bucket.refill(now)
                bucket.rate /= 2.0
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
    ) -> None:
        """``aging_s``: a waiter gains one priority per ``aging_s`` waited; ``minute_s``:
        the length of the limits' minute (60; a bench scales it down)."""
        self.clock = clock
        self.minute_s = minute_s
        self.aging_s = aging_s
        self.states: dict[LimitKey, PaceState] = {}
        self._waiters: dict[LimitKey, list[_Waiter]] = {}
        self._served: dict[LimitKey, dict[str, int]] = {}
        self._timers: dict[LimitKey, asyncio.TimerHandle] = {}
        self._seq = itertools.count()

    def state(self, key: LimitKey) -> PaceState:
        return self.states.setdefault(key, PaceState(minute_s=self.minute_s))

    def configure(self, key: LimitKey, limit: Limit) -> None:
        self.state(key).configure(limit, self.clock())

    def learn(self, key: LimitKey, headers: Mapping[str, str]) -> None:
        self.state(key).learn(headers, self.clock())
        self._pump(key)

    def rate_limited(self, key: LimitKey, retry_after: float | None) -> None:
        self.state(key).rate_limited_answer(retry_after, self.clock())
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
            aged = w.priority + (now - w.since) / self.aging_s
            return (-aged, served.get(w.run, 0), w.seq)

        return min(waiters, key=rank)

    async def acquire(
        self, key: LimitKey, tokens: float = 1.0, *, run: str | int = "", priority: str | int = 0
    ) -> float:
        """Wait for a slot of ``key`` for a call of ``tokens``; the seconds waited.
        Pair with ``release`` when the call has its answer."""
        now = self.clock()
        loop = asyncio.get_running_loop()
        waiter = _Waiter(
            str(run), int(priority), tokens, now, next(self._seq), loop.create_future()
        )
        self._waiters.setdefault(key, []).append(waiter)
        self._pump(key)
        if waiter.future.done():
            return 0.0  # a slot was free: no wait at all
        try:
            return await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():
                self.release(key)  # granted as we were cancelled: give it back
            elif waiter in self._waiters.get(key, []):
                self._waiters[key].remove(waiter)
            raise

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
        _process_pacer = Pacer()
    return _process_pacer
