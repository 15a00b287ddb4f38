"""What one of several partitioned orchestrator processes reads of the log: the shared
partition and the partitions it holds (``NatsRuntime(partitions=...)``).

The log's subjects name each event's partition (``eventstore.nats.subjects``): the
shared partition ``<prefix>.*.s.>`` (agents, orchestrator starts, memory) and
``<prefix>.*.<p>.>`` for each partition ``p`` the member holds are what it follows.
A member is nearly the only writer of its partitions, so it follows them *echo-free*
(on its ``no_echo`` log connection with direct get): its own appends are handed over by
the append, never sent back by the server; others' publishes on those subjects are
heard (a core subscription per partition) and read from the log from where that
partition's last read ended. Without direct get or ``no_echo``, one consumer filtered
to those subjects (``filter_subjects``) delivers them all. When the leases change
(``Partitions.on_change``) the follower goes on with the new partitions:

* a partition *acquired* is caught up first: its events read from the log (no snapshot
  per partition on NATS: from its first event), handed to the orchestrator's decision
  loop, then a marker that makes the partition count as folded (``folds``: only then
  may the member decide its runs) and offers the replies held for it;
* a partition *released* stops counting as folded at once, and a marker drops its
  runs' state in the decision loop (``RunState.forget``); whoever waits for one of
  them waits through the log from then on.

A run submitted here is placed in a partition this member holds (``local_runs``), so
``wait`` is mostly answered from the fold. One for a run this member does not fold is
answered from the log: the run's finish is heard on the log's subjects (a core
subscription, one message per finished run), looked at with one lookup of the root's last
event (``read_last``: the server's subject index; a read with a wildcard filter walks the
log's blocks message by message on the server), and its result read with
``read_correlation`` once it has finished; a slow poll of that lookup covers what is not
heard. A submit for such a run writes its creation to the log, where its owner folds it;
an approval is written to the log too (``answer_approval``). An agent's request for such
a run is handed to the member that folds it (``route``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

import nats.errors

from cardbus.agents import requests as rq
from cardbus.bus.orchestrator.core import Orchestrator, RunResult
from cardbus.bus.orchestrator.run_result import result_of
from cardbus.bus.orchestrator.runstate import RunState
from cardbus.bus.runtime.member_bell import MemberBell
from cardbus.bus.runtime.member_busy import BusyLook
from cardbus.eventstore import Envelope
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import StoreUnavailable
from cardbus.eventstore.nats import NatsEventStore
from cardbus.eventstore.nats.connection import TRANSPORT_ERRORS, is_transient, on_reconnected
from cardbus.eventstore.nats.follow import (
    IDLE_READ_MAX_HEARTBEATS,
    EphemeralConsumer,
    OwnAppends,
    echoes,
)
from cardbus.eventstore.nats.subjects import (
    SHARED,
    decode_token,
    kind_token,
    partition_filter,
    partition_of,
    partition_token,
)
from cardbus.eventstore.nats.wire import MSG_ID, envelope_of

__all__ = ["OWNER_REQUESTS", "MemberLog"]

log = logging.getLogger(__name__)

_FINISHES = tuple(kind_token(t) for t in ("run.completed.v1", "run.failed.v1", "run.halted.v1"))
_FINISH_TYPES = (ev.RunCompleted, ev.RunFailed, ev.RunHalted)
_POLL_S = 2.0  # a run waited for elsewhere is looked at this often when nothing is heard
# + ``.<partition>``: an agent's request for a run another member decides, handed to it
OWNER_REQUESTS = "cardbus.orch.req"
# its queue group: while a partition passes from one member to the next both may serve it
# for a moment, and a request must be taken by one of them only (else done twice)
_OWNER_QUEUE = "cardbus-orch-req"
# the header of a served member's answer "not mine (any more): ask again"
_NOT_HERE = "Cardbus-Not-Here"
_READ_ERRORS: tuple[type[BaseException], ...] = (StoreUnavailable, *TRANSPORT_ERRORS)
_HINT_TRIES = 8  # reads for another writer's event heard, not stored yet: 1 ms doubling
_HAND_S = 10.0  # how long a request waits for its run's partition to have an owner
# how long a request handed to its run's member waits for the answer: longer than an agent
# waits for any (``NatsBus.request``: 30 s), so the agent's own bound speaks first
_ANSWER_S = 35.0


class MemberLog:
    """The log as one member sees it; ``Orchestrator.log`` and ``Orchestrator.elsewhere``."""

    def __init__(self, store: NatsEventStore) -> None:
        self.store = store
        self.partitions = store.partitions
        self.want: frozenset[int] = frozenset()  # what the leases say (Partitions.holding)
        self.following: frozenset[int] = frozenset()  # in the follower's filters
        self.folded: frozenset[int] = frozenset()  # caught up and folded: decided here
        self.orchestrator: Orchestrator | None = None
        self.on_folded: Callable[[frozenset[int]], None] | None = None  # (acquired ones)
        self.folded_events = 0  # events handed to the orchestrator (bench: the fold share)
        self._reader: EphemeralConsumer | None = None
        self._finish_sub: Any = None
        self._finishing: dict[str, asyncio.Event] = {}  # root waited for -> its finish heard
        self._waiting: dict[str, int] = {}  # root -> how many wait for it here
        self._handovers: set[asyncio.Task[None]] = set()
        self.nc: Any = None  # the connection requests are handed over on (the bus's)
        self._handler: Callable[[rq.AgentRequest], Any] | None = None  # this member's answer
        self._serving: dict[int, Any] = {}  # partition -> subscription to its requests
        self._syncing: asyncio.Task[None] | None = None
        self.handed_over = 0  # requests answered by another member (tests, bench)
        self.last_yielded = 0  # the highest position the follower handed over
        self._wake: asyncio.Event | None = None  # the echo-free follower's
        self._quiet: Callable[[], bool] | None = None  # it has nothing waiting
        self._yielded: dict[int, str] = {}  # its handed positions kept (``remembered``)
        self._busy: BusyLook | None = None  # its looks by count while busy

    @property
    def remembered(self) -> int:
        """How many handed positions the echo-free follower keeps so as to hand none twice
        (what a read could still return again, and what the doorbell counts)."""
        return len(self._yielded)

    # -- what is folded ----------------------------------------------------------

    def folds(self, root_id: str) -> bool:
        return partition_of(root_id, self.partitions) in self.folded

    def hold(self, partitions: Iterable[int]) -> None:
        """The partitions the leases give this member now (``Partitions.on_change``)."""
        want = frozenset(partitions)
        if want == self.want:
            return
        unfollowed = self.want - want - self.following
        self.want = want
        o = self.orchestrator
        if unfollowed and o is not None:  # (the followed ones: the follower's marker)
            o.later(lambda: self._forget_unfollowed(unfollowed))
        if self._wake is not None:
            self._wake.set()
        reader = self._reader
        if reader is not None:  # the follower goes on with the new filters
            task = asyncio.ensure_future(reader.close())
            self._handovers.add(task)
            task.add_done_callback(self._handovers.discard)

    def _filters(self, parts: Iterable[int | str]) -> list[str]:
        prefix = self.store.subject_prefix
        return [partition_filter(prefix, p) for p in parts]

    async def _read(
        self, parts: Iterable[int | str], start: int, end: int | None
    ) -> list[Envelope]:
        """The events of ``parts`` from ``start`` (to ``end``), in log order."""
        msgs = []
        for filt in self._filters(parts):
            msgs.extend(await self.store._retry(lambda f=filt: self.store._read(f, start)))  # type: ignore[misc]
        msgs.sort(key=lambda m: m.seq)
        return [envelope_of(m) for m in msgs if end is None or m.seq <= end]

    # -- the orchestrator's reads (Orchestrator.log) -----------------------------

    async def read_all(self, from_position: int = 0, limit: int = 1000) -> list[Envelope]:
        """The start's replay: every event of the shared and the held partitions."""
        parts = self.want
        envs = await self._read([SHARED, *sorted(parts)], max(from_position, 1), None)
        self.following = self.folded = parts
        self._sync_serving()
        self.folded_events += len(envs)
        return envs

    async def subscribe(self, from_position: int) -> AsyncIterator[Envelope | Callable[[], None]]:
        if self.store._direct_reads and not echoes(self.store.nc):
            source = self._subscribe_echo_free(from_position)
        else:
            source = self._subscribe_consumer(from_position)
        async with contextlib.aclosing(source):  # type: ignore[type-var]
            async for item in source:
                yield item

    def _changes(self) -> Iterator[Callable[[], None]]:
        """The markers of the partitions lost since the follower last looked (its state
        updated here; gained ones are the caller's to catch up)."""
        lost = self.following - self.want
        if lost:
            self.following -= lost
            self.folded -= lost  # decided here no more, from now
            self._sync_serving()
            yield lambda: self._forget(lost)

    async def _subscribe_echo_free(
        self, from_position: int
    ) -> AsyncIterator[Envelope | Callable[[], None]]:
        """The shared and held partitions without the server sending this member's own
        events back: its appends are handed over by the append (``OwnAppends``), and
        others' publishes on the followed partitions' subjects are heard (a core
        subscription per partition, ``no_echo``: others' only) and then read from the
        log, from where that partition's last read ended. Nothing heard for
        ``heartbeat`` seconds (doubling while those reads find nothing, up to
        ``IDLE_READ_MAX_HEARTBEATS``) and the log grown since such a look, or a reconnect
        (which wakes it): every followed partition is read.

        Events of different writers may come out of log order (another writer's event
        after an own later one): each task's stream stays in order, which is what the
        fold needs (a version it did not get is read: ``gaps.fill_gap``)."""
        store = self.store
        prefix = store.subject_prefix
        loop = asyncio.get_running_loop()
        own = OwnAppends(store, from_position)
        wake = self._wake = own.wake
        self._quiet = lambda: not hints and not own.own
        hints: dict[str, set[str]] = {}  # partition token -> ids of others' events heard
        due: dict[str, float] = {}  # partition token -> when to read it (again)
        tries: dict[str, int] = {}
        subs: dict[str, Any] = {}
        read_from: dict[str, int] = {}  # partition token -> where its next read starts
        # position -> partition token of what was handed over, from the oldest read_from
        # on: what a read could return again, and what the doorbell's look counts
        yielded: dict[int, str] = {}
        self._yielded = yielded
        reconnects = store.nc.stats.get("reconnects", 0)
        idle_since = loop.time()
        # the wait before reading every partition with nothing heard: it doubles while
        # those reads find nothing, up to IDLE_READ_MAX_HEARTBEATS (for hints lost with
        # no reconnect: one wakes the follower at once); a read each heartbeat of every
        # held partition was most of an idle member's messages
        quiet_s = store.heartbeat
        idle_read = False
        # every followed partition is read through this position (the log's last position
        # at the latest idle look that read them all, or where their doorbell was armed)
        read_to = 0
        # idle: wait on the server (member_bell.py) rather than look at the log's end
        bell = MemberBell(store, wake)
        # busy: past so many kept, a look by count lets go of them (member_busy.py)
        busy = self._busy = BusyLook(store, read_from)
        active = False  # appends handed over or partitions changed: disarm, look later
        unhook = on_reconnected(store.nc, wake.set)

        async def on_hint(msg: Any) -> None:
            tokens = msg.subject[len(prefix) + 1 :].split(".", 2)
            if len(tokens) >= 2:
                hints.setdefault(tokens[1], set()).add((msg.headers or {}).get(MSG_ID, ""))
                wake.set()

        async def listen(tokens: Iterable[str]) -> None:  # before the read: nothing missed
            for tok in tokens:
                subs[tok] = await store.nc.subscribe(
                    partition_filter(prefix, tok),
                    cb=on_hint,
                    pending_msgs_limit=1_000_000,
                    pending_bytes_limit=1 << 30,
                )
            await store.nc.flush()

        def followed(env: Envelope) -> bool:
            tok = partition_token(env.correlation_id, self.partitions)
            return tok == SHARED or int(tok) in self.following

        def read_all_again() -> None:
            for tok in read_from:
                hints.setdefault(tok, set())
                due[tok] = 0.0

        def read_through(pos: int) -> None:
            """Every followed partition's events up to ``pos`` are handed over (a look
            found nothing missed, and the reads it scheduled are done): none is read below
            it again, and what was kept for those reads is let go. A partition that gets
            no event (often the shared one) or only this member's own otherwise kept its
            read position, and every position handed since was kept for the member's life."""
            for tok in read_from:
                read_from[tok] = max(read_from[tok], pos + 1)
            floor = min(read_from.values(), default=0)
            for p in [p for p, tok in yielded.items() if p < floor or tok not in read_from]:
                del yielded[p]

        def let_go() -> None:
            """The kept positions below every partition's read position, oldest first (as
            they were handed: one handed out of order waits for a later call)."""
            oldest = min(read_from.values(), default=0)
            while yielded:
                pos = next(iter(yielded))
                if pos >= oldest:
                    break
                del yielded[pos]

        def handed(start: int) -> tuple[int, int]:
            """How many events of the followed partitions at ``start`` or after were
            handed over, and the last one's position (the doorbell's count)."""
            mine = [p for p, tok in yielded.items() if p >= start and tok in read_from]
            return len(mine), max(mine, default=start - 1)

        try:
            await bell.listen()
            first = [SHARED, *(str(p) for p in sorted(self.following))]
            await listen(first)
            for tok in first:
                read_from[tok] = max(from_position, 1)
            read_all_again()
            while True:
                for marker in self._changes():
                    yield marker
                for tok in [t for t in read_from if t != SHARED and int(t) not in self.following]:
                    active = True
                    busy.forget()
                    del read_from[tok]
                    hints.pop(tok, None)
                    sub = subs.pop(tok, None)
                    if sub is not None:
                        with contextlib.suppress(Exception):
                            await sub.unsubscribe()
                gained = self.want - self.following
                if gained:
                    busy.forget()
                    await listen(str(p) for p in gained)
                    end = await store.last_position()
                    envs = await self._read(sorted(gained), 1, None)
                    self.following |= gained
                    self.folded_events += len(envs)
                    n = self.partitions
                    for env in envs:
                        yielded[env.position] = partition_token(env.correlation_id, n)
                        yield env
                    active = True
                    for p in gained:  # what is stored after its read, or was heard, next
                        tok = str(p)
                        read = [
                            e.position for e in envs if partition_token(e.correlation_id, n) == tok
                        ]
                        read_from[tok] = max([end, *read]) + 1
                    yield lambda gained=gained: self._acquired(gained)  # type: ignore[misc]
                    continue
                if busy.due(len(yielded)) and await busy.look(yielded, self.last_yielded):
                    let_go()
                if own.own:  # this member's appends, in order
                    for pos in sorted(own.own):
                        env = own.own.pop(pos)
                        tok = partition_token(env.correlation_id, self.partitions)
                        # (below its partition's read position: a read handed it over,
                        # its append's answer came after the read's)
                        if pos in yielded or not followed(env) or pos < read_from.get(tok, 0):
                            continue
                        yielded[pos] = tok
                        self.last_yielded = max(self.last_yielded, pos)
                        self.folded_events += 1
                        if busy.handed(pos, tok):
                            let_go()
                        yield env
                    idle_since = loop.time()
                    quiet_s = store.heartbeat
                    active = True
                    continue
                now = loop.time()
                reconnected = store.nc.stats.get("reconnects", 0) != reconnects
                quiet = not (active or hints or reconnected)
                if bell.armed and quiet and bell.expired(now):
                    # its request expired with nothing stored: asked again as it is
                    if await bell.again():
                        continue
                    idle_since = now - quiet_s  # (not asked, disarmed: a look at once)
                elif bell.armed and (not quiet or bell.answered(now)):
                    # awake anyway, or the server answered: a message stored where nothing
                    # was heard is read (after own work, the next look counts instead);
                    # the request over without one: armed again at once
                    rung, again = await bell.stop(now)
                    tokens = (rung or "")[len(prefix) + 1 :].split(".", 2)
                    if rung and not active and len(tokens) >= 2:
                        hints.setdefault(tokens[1], set())
                    elif again:
                        idle_since = now - quiet_s
                active = False
                if reconnected:
                    reconnects = store.nc.stats.get("reconnects", 0)
                    read_all_again()  # others' publishes while away were not heard
                elif now - idle_since >= quiet_s and not hints and not bell.armed:
                    # nothing for a while: anything not heard? The doorbell counts what is
                    # stored after what was read (nothing: it waits for the server to ring)
                    idle_since = now
                    busy.forget()  # (this look reads them all through)
                    # (nothing waits to be read: the reads a look scheduled are done)
                    read_through(read_to)
                    start = min(read_from.values())
                    looked = await bell.look(self._filters(read_from), start, handed)
                    if looked is not None:
                        armed, through = looked
                        read_to = max(read_to, through)
                        read_through(read_to)
                        if armed:
                            continue
                    # Without one, or it counted more than was handed over: the log's end,
                    # and every partition read if it grew since the last such look
                    try:
                        last = await store._last_position()
                    except _READ_ERRORS:
                        last = -1
                    if last < 0 or last > read_to:
                        read_all_again()
                        read_to = max(last, read_to)
                        idle_read = True
                    else:  # nothing anywhere: the next look waits twice as long
                        quiet_s = min(quiet_s * 2, IDLE_READ_MAX_HEARTBEATS * store.heartbeat)
                        continue
                ready = [t for t in hints if due.get(t, 0.0) <= now and t in read_from]
                for tok in [t for t in hints if t not in read_from]:
                    del hints[tok]
                if not ready:
                    waits = [bell.deadline - now if bell.armed else idle_since + quiet_s - now]
                    waits += [due.get(t, 0.0) - now for t in hints]
                    wake.clear()
                    # (asyncio.timeout: wait_for runs the wait as a task of its own, two
                    # more loop iterations at each wake-up)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(max(min(waits), 0.0005)):
                            await wake.wait()
                    continue
                found = False
                for tok in ready:
                    heard = hints.pop(tok)
                    start = read_from[tok]
                    try:
                        page = await store._read_direct(
                            partition_filter(prefix, tok), start, None, 0
                        )
                    except _READ_ERRORS as e:
                        store._check_open()
                        if isinstance(e, StoreUnavailable) and not is_transient(e):
                            raise
                        hints.setdefault(tok, set()).update(heard)
                        due[tok] = loop.time() + 0.1
                        continue
                    found = found or bool(page)
                    for m in page:
                        heard.discard(m.msg_id)
                        read_from[tok] = max(read_from[tok], m.seq + 1)
                        if m.seq in yielded:
                            continue
                        env = envelope_of(m)
                        yielded[m.seq] = tok
                        self.last_yielded = max(self.last_yielded, m.seq)
                        self.folded_events += 1
                        busy.handed(m.seq, tok)  # (let go below, after this read)
                        yield env
                    if heard:  # heard, not stored yet (or refused): looked at again
                        tries[tok] = tries.get(tok, 0) + 1
                        if tries[tok] <= _HINT_TRIES:
                            hints.setdefault(tok, set()).update(heard)
                            due[tok] = loop.time() + 0.001 * 2 ** (tries[tok] - 1)
                        else:
                            tries.pop(tok, None)
                    else:
                        tries.pop(tok, None)
                        due.pop(tok, None)
                    idle_since = loop.time()
                quiet_s = (
                    min(quiet_s * 2, IDLE_READ_MAX_HEARTBEATS * store.heartbeat)
                    if idle_read and not found
                    else store.heartbeat
                )
                idle_read = False
                let_go()
        finally:
            with contextlib.suppress(Exception):
                await bell.close()
            if unhook is not None:
                unhook()
            self._wake = self._quiet = None
            own.close()
            for sub in subs.values():
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

    async def _subscribe_consumer(
        self, from_position: int
    ) -> AsyncIterator[Envelope | Callable[[], None]]:
        last = from_position - 1
        while True:
            want = self.want
            lost, gained = self.following - want, want - self.following
            if lost:
                self.following -= lost
                self.folded -= lost  # decided here no more, from now
                self._sync_serving()
                yield lambda lost=lost: self._forget(lost)  # type: ignore[misc]
            if gained:
                envs = await self._read(sorted(gained), 1, last)
                self.following |= gained
                self.folded_events += len(envs)
                for env in envs:
                    yield env
                yield lambda gained=gained: self._acquired(gained)  # type: ignore[misc]
            parts: list[int | str] = [SHARED, *sorted(self.following)]
            follow = self.store.follow_filtered(self._filters(parts), last + 1, self._opened)
            async with contextlib.aclosing(follow):  # type: ignore[type-var]
                async for env in follow:
                    last = self.last_yielded = env.position
                    self.folded_events += 1
                    yield env
                    if self.want != self.following:
                        break

    async def last_position(self) -> int:
        """The position of the last event this member follows (``Orchestrator.caught_up``):
        its consumer's last delivery once nothing is pending for it; while the consumer
        is behind (a few tries), or without one, the log's last position."""
        quiet = self._quiet
        if quiet is not None:  # echo-free: once nothing heard or appended waits to be handed
            for _ in range(50):
                if quiet():
                    return self.last_yielded
                await asyncio.sleep(0.01)
        for _ in range(5):
            reader = self._reader
            if reader is None or reader.consumer is None or reader.closed:
                break
            try:
                info = await self.store._js.consumer_info(self.store.stream_name, reader.consumer)
            except Exception:  # recreated meanwhile, or the server away: the whole log
                break
            if not info.num_pending and info.delivered is not None:
                return int(info.delivered.stream_seq or 0)
            await asyncio.sleep(0.01)
        return await self.store.last_position()

    def _opened(self, reader: EphemeralConsumer) -> None:
        self._reader = reader
        if self.want != self.following:  # changed meanwhile: go round again at once
            task = asyncio.ensure_future(reader.close())
            self._handovers.add(task)
            task.add_done_callback(self._handovers.discard)

    def observe(self, env: Envelope) -> None:
        """(An orchestrator observer.) A run created here in a partition this member does
        not follow (a submit for another member's run) is dropped once folded: its owner
        goes on with it, and ``wait`` reads it from the log.

        Not one in a partition this member holds a lease on but is still catching up
        (``local_runs`` places new runs there): the catch-up skips the run's events,
        already folded here, so a run dropped now would be known to no member and never
        decided (seen under load: a run left at its creation, its waiter never answered)."""
        o = self.orchestrator
        root = env.stream
        p = partition_of(root, self.partitions)
        if o is not None and isinstance(env.data, ev.RunStarted) and p not in self.following:
            o.later(lambda: None if self.folds(root) or p in self.want else o.state.forget(root))

    def _forget_unfollowed(self, dropped: frozenset[int]) -> None:
        """(In the decision loop.) The runs of partitions let go before they were ever
        followed (their catch-up not begun): created here meanwhile and kept for it,
        dropped now, as the follower's marker drops those of a partition it followed."""
        gone = frozenset(p for p in dropped if p not in self.want and p not in self.following)
        if gone:
            self._forget(gone)

    # -- markers, run in the decision loop -----------------------------------------

    def _acquired(self, gained: frozenset[int]) -> None:
        self.folded |= gained & self.following
        self._sync_serving()
        if self.on_folded is not None:
            self.on_folded(gained)

    def _forget(self, lost: frozenset[int]) -> None:
        o = self.orchestrator
        if o is None:
            return
        n = self.partitions
        for root in [r for r in o.state.runs if partition_of(r, n) in lost]:
            o.state.forget(root)
        # every waiter of those partitions, its run folded here yet or not (one registered
        # while its run's creation was still on its way, or read from the log): they wait
        # through the log now, or here again once this member folds the partition again
        for root in [r for r in o._waiters if partition_of(r, n) in lost]:
            for future in o._waiters.pop(root):
                self._hand_over(root, future)

    def _hand_over(self, root: str, future: asyncio.Future[RunResult]) -> None:
        async def answer() -> None:
            try:
                result = await self.wait(root, None)
            except asyncio.CancelledError:
                return
            except Exception as e:  # the log cannot be read: the waiter learns why
                if not future.done():
                    future.set_exception(e)
            else:
                if not future.done():
                    future.set_result(result)

        task = asyncio.ensure_future(answer())
        self._handovers.add(task)
        task.add_done_callback(self._handovers.discard)
        future.add_done_callback(lambda _: task.cancel())

    # -- agents' requests: answered by the member that decides the run -------------------

    def route(
        self, handler: Callable[[rq.AgentRequest], Any], nc: Any
    ) -> Callable[[rq.AgentRequest], Any]:
        """``handler`` (``Orchestrator.handle_request``) for the requests of the runs this
        member folds; one for a run another member folds is handed to it on
        ``cardbus.orch.req.<partition>`` (each member serves those of the partitions it
        folds), and its answer returned. A request without its run (an older agent) is
        answered here."""
        self._handler, self.nc = handler, nc
        self._sync_serving()

        async def handle(req: rq.AgentRequest) -> rq.AgentResponse:
            root = req.root_id
            if not root or self.folds(root):
                response: rq.AgentResponse = await handler(req)
                return response
            return await self._hand_request(req, handler)

        return handle

    async def _hand_request(
        self, req: rq.AgentRequest, handler: Callable[[rq.AgentRequest], Any]
    ) -> rq.AgentResponse:
        """Ask the member that folds ``req``'s run, and return its answer, however long its
        work takes (a tool call, a wait for a provider's limit: up to ``_ANSWER_S``).

        While nobody serves the run's partition (it is between two members), or the member
        asked has let it go since (it answers ``_NOT_HERE``, doing nothing), ask again for
        up to ``_HAND_S``; then the answer is ``unavailable``, and nothing is recorded,
        unless the partition came here meanwhile. Never answered here otherwise: this
        member does not know the run, so it would refuse the request as ``unknown_task``
        and record that on a task another member writes (untrue), or do it twice."""
        p = partition_of(req.root_id, self.partitions)
        subject, data = f"{OWNER_REQUESTS}.{p}", rq.encode(req)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _HAND_S
        pause = 0.02
        while not self.folds(req.root_id):  # (taken over meanwhile: answered here)
            try:
                msg = await self.nc.request(subject, data, timeout=_ANSWER_S)
            except nats.errors.NoRespondersError:  # its partition between two members
                msg = None
            except (nats.errors.TimeoutError, TimeoutError):  # it has it, or died with it
                why = f"the member deciding run {req.root_id!r} did not answer in {_ANSWER_S:g}s"
                return _unanswered(req, why, "timeout")
            if msg is not None and not (msg.headers and _NOT_HERE in msg.headers):
                self.handed_over += 1
                return rq.decode_response(msg.data)
            # nobody has it, or the one asked let it go just now: ask again, for a while
            if loop.time() + pause >= deadline:
                why = f"no member decides run {req.root_id!r} (partition {p}) now"
                return _unanswered(req, why, "unavailable")
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.5)
        response: rq.AgentResponse = await handler(req)
        return response

    def _sync_serving(self) -> None:
        """Serve the handed-over requests of the partitions folded now (in a task)."""
        if self._handler is None or self.nc is None:
            return
        if self._syncing is None or self._syncing.done():
            self._syncing = asyncio.ensure_future(self._serve_folded())
        else:
            self._syncing.add_done_callback(lambda _: self._sync_serving())

    async def _serve_folded(self) -> None:
        want = self.folded
        for p in [p for p in self._serving if p not in want]:
            with contextlib.suppress(Exception):
                await self._serving.pop(p).unsubscribe()
        for p in sorted(want - set(self._serving)):
            try:
                self._serving[p] = await self.nc.subscribe(
                    f"{OWNER_REQUESTS}.{p}", queue=_OWNER_QUEUE, cb=self._on_handed
                )
            except Exception as e:  # not allowed, or the connection closing: answered where
                log.warning("requests of partition %s not served here: %r", p, e)  # they land
                return

    async def _on_handed(self, msg: Any) -> None:
        handler = self._handler
        if handler is None or not msg.reply:
            return

        async def answer() -> None:
            try:
                req = rq.decode_request(msg.data)
                if not self.folds(req.root_id):  # let go since it was sent: not ours to do
                    with contextlib.suppress(Exception):
                        await self.nc.publish(msg.reply, b"", headers={_NOT_HERE: "1"})
                    return
                response = await handler(req)
                data = rq.encode(response)
            except Exception as e:  # answered as the bus answers a server bug
                log.exception("a handed-over request failed")
                data = rq.encode(
                    rq.AgentResponse(
                        request_id="", ok=False, error=repr(e)[:1000], error_type="unavailable"
                    )
                )
            with contextlib.suppress(Exception):
                await self.nc.publish(msg.reply, data)

        task = asyncio.ensure_future(answer())
        self._handovers.add(task)
        task.add_done_callback(self._handovers.discard)

    # -- waiting for a run another member folds (Orchestrator.elsewhere) ------------

    async def wait(self, root_id: str, timeout: float | None) -> RunResult:
        heard = self._finishing.setdefault(root_id, asyncio.Event())
        self._waiting[root_id] = self._waiting.get(root_id, 0) + 1
        try:
            async with asyncio.timeout(timeout):
                await self._listen()
                while True:
                    if self.folds(root_id) and self.orchestrator is not None:
                        # taken over meanwhile: this member folds it now
                        return await self.orchestrator.wait(root_id, None)
                    result = await self._result(root_id)
                    if result is not None:
                        return result
                    heard.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(_POLL_S):
                            await heard.wait()
        finally:
            self._waiting[root_id] -= 1
            if not self._waiting[root_id]:
                del self._waiting[root_id]
                self._finishing.pop(root_id, None)

    async def _result(self, root_id: str) -> RunResult | None:
        # the root's last event first (the server's subject index, no scan of the log); the
        # run's events are read once it has finished
        last = await self.store.read_last(root_id)
        if last is None or not isinstance(last.data, _FINISH_TYPES):
            return None
        state = RunState()
        for env in await self.store.read_correlation(root_id):
            state.apply(env)
        return result_of(state, root_id)

    async def _listen(self) -> None:
        """Hear runs finish: a core subscription to the finish events' subjects (others'
        publishes; the store's connection does not echo its own)."""
        if self._finish_sub is not None:
            return
        prefix = self.store.subject_prefix

        async def on_msg(msg: Any) -> None:
            tokens = msg.subject[len(prefix) + 1 :].split(".")
            if len(tokens) == 4:
                heard = self._finishing.get(decode_token(tokens[2]))
                if heard is not None:
                    heard.set()

        subs = []
        try:
            for kind in _FINISHES:
                subs.append(await self.store.nc.subscribe(f"{prefix}.*.*.*.{kind}", cb=on_msg))
        except Exception as e:  # not allowed to: the poll alone
            log.info("runs waited for elsewhere are polled: %r", e)
        self._finish_sub = subs

    async def close(self) -> None:
        self._handler = None
        if self._syncing is not None:
            self._syncing.cancel()
        for sub in list(self._serving.values()):
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._serving.clear()
        for task in list(self._handovers):
            task.cancel()
        for sub in self._finish_sub or ():
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._finish_sub = None


def _unanswered(req: rq.AgentRequest, why: str, error_type: str) -> rq.AgentResponse:
    """The answer to a request no member could take: nothing done, nothing recorded."""
    return rq.AgentResponse(request_id=req.request_id, ok=False, error=why, error_type=error_type)
