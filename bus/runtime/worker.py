"""``AgentWorker``: serves an ``Agent`` class on any ``Bus``.

It announces the agent's card, then for every card runs the agent
(self-check, handler, error capture: ``Agent.run``) and replies with the
``ResultCard``; a handler still running after ``started_after_s`` first gets
a ``Started`` reply (``0``: always, before it runs). A faster answer implies
the start (the orchestrator records no ``TaskStarted``: the result says who ran it), so an
instant agent costs one reply and one write, not two. A redelivered card for
a ``(task_id, attempt)`` it already answered gets the same answer again, not
a second run. A handler still running well past the card's ``timeout_s`` is
cancelled and answered with a failed result, so a hung agent frees its
handler for the next card.

Cancels: a handler whose task was cancelled or halted meanwhile is cancelled
(``CancelledError`` inside it) and answered with a failed result of reason
``cancelled`` (recorded as ``task.result_ignored``, ``handler_cancelled``). The
worker hears it from the orchestrator's cancel notice (``Bus.watch_cancels``), and,
since a notice may be lost, asks ``attempt.live`` every ``cancel_check_s`` for each
handler running that long (``bus.orchestrator.cancel_notices``).

Up to ``concurrency`` cards run at once: by default the agent's
``constraints.max_concurrency``, as that many handlers of its inbox
(``bus.consume_many``). In process they are one consumer with that many slots;
on NATS the handlers of one agent on one bus share one pull loop that asks for
several cards at once, never more than handlers are idle, and each card is
acked when its answer is sent. A blocking
handler belongs in a sync ``def handle`` (``Agent.run`` runs it in a
thread), so it stalls neither the other cards of this worker nor other agents.

Liveness: the worker announces with a lease (``lease_s``, 10 s by default) and
announces again every ``lease_s / 3``, the workers of a process at the same moments,
from one task (``bus.runtime.renewals``); ``stop()`` announces it offline. Every
``Started`` and ``ResultCard`` it sends says who ran the card: its
``replica_id`` (host, pid and a random part), ``host``, ``pid``, and the
card's delivery count (2 or more: a redelivery).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import heapq
import itertools
import math
import os
import socket
import time
import uuid
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

import msgspec

from cardbus.agents.agent import HANDLER_EXECUTOR, Agent
from cardbus.agents.cards import AgentCard, Announce, CancelNotice, ResultCard, Started, TaskCard
from cardbus.agents.llm import LLM
from cardbus.agents.pacing import RUN_CLOCK
from cardbus.agents.requests import LOCAL_TOOLS, REQUESTER, TOOL_SPECS, AgentRequest
from cardbus.agents.schema import capability_schema_problems
from cardbus.agents.streaming import CHUNK_SINK, ChunkSink
from cardbus.agents.tools import ToolRegistry
from cardbus.bus import telemetry
from cardbus.bus.orchestrator.cancel_notices import CANCELLED_REASON
from cardbus.bus.runtime.renewals import RenewalRound, renewal_round
from cardbus.bus.runtime.tools_served import (
    WorkerTools,
    specs_wanted,
    with_specs,
    worker_tools,
)
from cardbus.bus.transport.interface import Bus
from cardbus.eventstore.errors import BusError, ConfigError
from cardbus.eventstore.ids import new_id

__all__ = ["AgentWorker"]


class AgentWorker:
    def __init__(
        self,
        bus: Bus,
        agent: type[Agent],
        llm: LLM | None = None,
        concurrency: int | None = None,
        started_after_s: float = 0.01,
        lease_s: float = 10.0,
        tools: ToolRegistry | None = None,
        cancel_check_s: float = 5.0,
        local_tools: ToolRegistry | None = None,
    ) -> None:
        """``concurrency``: cards at once (None: the agent's ``constraints.max_concurrency``);
        ``lease_s``: the lease announced, renewed every third of it (0: never renewed);
        ``cancel_check_s``: how often a handler running that long asks whether its attempt
        is still wanted (0: never; cancel notices still stop it);
        ``tools``: the registry the agent's tool calls are served from, whose specs of the
        tools on its allow-list a handler reads as ``ctx.tool_specs``.

        The ``Tool`` s the agent declares itself (an ``LLMAgent``'s ``tools``) that
        ``tools`` does not have are run here, by this worker, wherever it runs (journaled:
        ``bus.runtime.tools_served``), and so are ``local_tools`` on its allow-list (MCP
        servers mounted in an agent's own process: ``cardbus agent serve --mcp``); their
        specs are in ``ctx.tool_specs`` too."""
        self.bus = bus
        self.agent = agent
        self.llm = llm
        self.tools = tools
        self.local_tools = local_tools
        self._serving: WorkerTools | None = None  # made at the first card: MCP is mounted
        if concurrency is None:
            concurrency = agent.constraints.max_concurrency
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigError(
                f"{agent.agent_id}: concurrency (max_concurrency) must be an integer >= 1,"
                f" got {concurrency!r}"
            )
        self.concurrency = concurrency
        # a sync handler's threads: as many as cards at once, so none waits for a thread
        # and a blocking agent cannot take the threads another agent's handlers need
        self._threads: ThreadPoolExecutor | None = None
        # the agent's own, where its class says one (``Agent.started_after_s``)
        declared = agent.started_after_s
        if declared is not None:
            started_after_s = declared
        if (
            isinstance(started_after_s, bool)
            or not isinstance(started_after_s, int | float)
            or not started_after_s >= 0
        ):
            raise ConfigError(
                f"{agent.agent_id}: started_after_s must be a number >= 0, got {started_after_s!r}"
            )
        self.started_after_s = float(started_after_s)
        if not lease_s >= 0:
            raise ConfigError(f"{agent.agent_id}: lease_s must be >= 0, got {lease_s!r}")
        self.lease_s = float(lease_s)
        if not cancel_check_s >= 0:
            raise ConfigError(
                f"{agent.agent_id}: cancel_check_s must be >= 0, got {cancel_check_s!r}"
            )
        self.cancel_check_s = float(cancel_check_s)
        self._checking: asyncio.Task[None] | None = None  # an attempt.live round asking
        # the next round's timer: set as a handler begins, cancelled when none runs
        self._check_at: asyncio.TimerHandle | None = None
        self._checks = self.cancel_check_s > 0  # (False once stopped)
        self.stopped = 0  # handlers stopped because their task was cancelled or halted
        # notices for attempts not running here (yet): a card that arrives after its
        # cancel (redelivered, or still queued) is stopped as it begins
        self._cancelled: OrderedDict[tuple[str, int], str] = OrderedDict()
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.replica_id = f"{self.host}-{self.pid}-{uuid.uuid4().hex[:6]}"
        self._renewing: RenewalRound | None = None  # the round it renews in (lease_s > 0)
        self._renewal_out = False  # a renewal being sent (stop waits for it)
        self._announced = 0  # announcements sent (Announce.renewal)
        self._card: AgentCard | None = None
        self.handled = 0
        self._answers: OrderedDict[tuple[str, int], ResultCard] = OrderedDict()
        self._running: dict[tuple[str, int], asyncio.Future[ResultCard]] = {}
        self._watched: dict[tuple[str, int], _Watch] = {}  # cards running: see _sweep_due
        # what the sweep looks at, soonest first: Started dues in the order the cards
        # began (started_after_s is one for the worker), deadlines in a heap; a card
        # that ended leaves its entries, dropped when reached (or when there are many)
        self._dues: collections.deque[_Watch] = collections.deque()
        self._deadlines: list[tuple[float, int, _Watch]] = []
        self._order = itertools.count()
        self._sweep: asyncio.TimerHandle | None = None
        self._sweep_at = 0.0

    def _announce_card(self) -> AgentCard:
        if self._card is None:
            # once: the card is the class's, and its JSON Schemas are dear to build (a
            # renewal every third of a lease rebuilt them: most of an idle runtime's CPU)
            self._card = self.agent.card()
        return self._card

    def _announce(self, online: bool = True) -> Announce:
        self._announced += 1
        return Announce(
            card=self._announce_card(),
            online=online,
            lease_s=self.lease_s,
            replica_id=self.replica_id,
            renewal=self._announced,
        )

    def _chunk_sink(self, card: TaskCard) -> ChunkSink:
        bus = self.bus
        return ChunkSink(
            bus.publish_chunk,
            bus.chunks_watched,
            card.task_id,
            card.attempt,
            card.root_id,
            self.agent.agent_id,
        )

    async def start(self) -> None:
        problems = capability_schema_problems(self._announce_card().capabilities)
        if problems:  # the orchestrator would leave them out: say so to the agent's author
            said = "; ".join(f"capability {n!r}: {why}" for n, why in problems.items())
            raise ConfigError(f"agent {self.agent.agent_id!r}: {said}")
        await self.bus.hear_watchers()  # chunks of a watched run go out from the first
        await self.bus.reply(self._announce())
        # before the first card: a cancel of it must find us listening
        await self.bus.watch_cancels(self.agent.agent_id, self._on_notice)
        # one handler for every unit of concurrency (it keeps no state of its own), and
        # one consumer entry with that many slots where the bus can (in process)
        handler = telemetry.traced_handler(self._on_card, self.bus, self.agent.agent_id)
        await self.bus.consume_many(self.agent.agent_id, handler, self.concurrency)
        if self.lease_s > 0:
            self._renewing = renewal_round(self.lease_s / 3)
            self._renewing.join(self, self._renew)

    def _on_notice(self, notice: CancelNotice) -> None:
        """Cancel the handler of the notice's attempt, if it runs here."""
        key = (notice.task_id, notice.attempt)
        why = (notice.reason or "cancelled") + (f" by {notice.by}" if notice.by else "")
        watch = self._watched.get(key)
        if watch is None:  # not running here: remembered, should its card come (later)
            self._cancelled[key] = why
            if len(self._cancelled) > 10_000:
                self._cancelled.popitem(last=False)
            return
        if watch.ended or watch.expired or watch.stopped:
            return  # done, or being cancelled already
        watch.stopped = why
        if watch.task is not None:
            watch.task.cancel()

    def _notice(self, card: TaskCard, reason: str, by: str = "") -> CancelNotice:
        """A cancel notice for ``card``'s attempt, as the worker tells itself."""
        agent_id = self.agent.agent_id
        return CancelNotice(
            task_id=card.task_id, attempt=card.attempt, agent_id=agent_id, reason=reason, by=by
        )

    def _check_soon(self) -> None:
        """(A handler began) The next ``attempt.live`` round in ``cancel_check_s``, unless
        one is set or asking. A timer, not a task's sleep: the last handler ending cancels
        it, so an idle worker is not woken once more after its work (it was, 5 s on)."""
        if self._check_at is None and self._checking is None and self._checks:
            loop = asyncio.get_running_loop()
            self._check_at = loop.call_later(self.cancel_check_s, self._check_live)

    def _check_live(self) -> None:
        """Ask whether each handler running ``cancel_check_s`` or longer is still wanted,
        and stop those whose task ended (a cancel notice may have been lost)."""
        self._check_at = None
        since = asyncio.get_running_loop().time() - self.cancel_check_s
        old = [w for w in self._watched.values() if w.begun <= since and not w.stopped]
        if not old:
            if self._watched:
                self._check_soon()
            return
        self._checking = asyncio.create_task(
            self._ask_round(old), name=f"cancels-{self.agent.agent_id}"
        )

    async def _ask_round(self, watches: list[_Watch]) -> None:
        carried = await self._ask_live(watches)
        self._checking = None
        if not carried:  # this bus carries no requests: the notices are all there is
            self._checks = False
        elif self._watched:
            self._check_soon()

    async def _ask_live(self, watches: list[_Watch]) -> bool:
        async def ask(watch: _Watch) -> None:
            card = watch.card
            request = AgentRequest(
                request_id=new_id(),
                task_id=card.task_id,
                attempt=card.attempt,
                agent_id=self.agent.agent_id,
                kind="attempt.live",
                root_id=card.root_id,
            )
            answer = await self.bus.request(request, timeout=max(1.0, self.cancel_check_s))
            found = answer.result
            if isinstance(found, dict) and found.get("live") is False:
                self._on_notice(
                    self._notice(card, str(found.get("reason") or ""), str(found.get("by") or ""))
                )

        outcomes = await asyncio.gather(*(ask(w) for w in watches), return_exceptions=True)
        # a bus without the request path says so; any other error: ask again next time
        return not any(
            isinstance(o, BusError) and "does not carry agent requests" in str(o) for o in outcomes
        )

    async def _renew(self) -> bool:
        """Announce again (the renewal round calls it every third of the lease); False
        once the bus is closed."""
        self._renewal_out = True
        try:
            await self.bus.reply(self._announce())
        except BusError as e:
            if "closed" in str(e):
                return False
        except Exception:  # a hiccup: the next renewal may pass (the lease has room)
            pass
        finally:
            self._renewal_out = False
        return True

    async def stop(self, announce: bool = True) -> None:
        """Stop renewing the lease and (``announce``) say the agent is going offline."""
        renewing, self._renewing = self._renewing, None
        if renewing is not None:
            renewing.leave(self)
        checking, self._checking = self._checking, None
        self._checks = False
        if self._check_at is not None:
            self._check_at.cancel()
            self._check_at = None
        if self._sweep is not None and not self._watched:  # nothing left to watch
            self._sweep.cancel()
            self._sweep = None
        if checking is not None:
            checking.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await checking
        if announce:
            # a renewal on its way (the round's task waits in the bus) goes out first,
            # not after the offline announcement (it would make the agent live again)
            while self._renewal_out:
                await asyncio.sleep(0.005)
            with contextlib.suppress(Exception):
                await self.bus.reply(self._announce(online=False))

    def _who(self, card: TaskCard) -> dict[str, object]:
        return {
            "replica_id": self.replica_id,
            "host": self.host,
            "pid": self.pid,
            "delivery": card.delivery,
        }

    async def _on_card(self, card: TaskCard) -> None:
        key = (card.task_id, card.attempt)
        if self._serving is None:  # once, at its first card: MCP servers are mounted by then
            self._serving = await self._worker_tools(card)
        answer = self._answers.get(key)
        if answer is None:
            running = self._running.get(key)
            if running is not None:
                answer = await asyncio.shield(running)
            else:
                answer = await self._run(card, key)
        if answer.delivery != card.delivery:  # answered before: say which delivery this is
            answer = msgspec.structs.replace(answer, delivery=card.delivery)
        await self.bus.reply(answer)

    def _started(self, card: TaskCard) -> Started:
        return Started(
            task_id=card.task_id,
            attempt=card.attempt,
            agent_id=self.agent.agent_id,
            **self._who(card),  # type: ignore[arg-type]
        )

    async def _run(self, card: TaskCard, key: tuple[str, int]) -> ResultCard:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[ResultCard] = loop.create_future()
        self._running[key] = future
        REQUESTER.set(self.bus.request)  # ctx.tool / ctx.long_term / ctx.read_output ask through it
        serving = self._serving or worker_tools(self.agent, self.tools, self.local_tools)
        # set for every card: a consumer's task may have run another agent's card before
        TOOL_SPECS.set(serving.specs)  # ctx.tool_specs
        LOCAL_TOOLS.set(serving.here)  # the tools run here, by this worker (ctx.tool)
        if self._threads is None:
            self._threads = ThreadPoolExecutor(
                self.concurrency, thread_name_prefix=f"cardbus-{self.agent.agent_id}"
            )
        HANDLER_EXECUTOR.set(self._threads)
        # Well past the card's timeout the orchestrator has timed this attempt out
        # (the margin lets it decide first): a handler that hangs must not keep this
        # consumer, and the cards queued behind it, busy forever.
        limit = card.timeout_s + max(0.1, card.timeout_s / 2)
        task = asyncio.current_task()
        assert task is not None  # a consumer's task
        watch: _Watch | None = None
        try:
            if self.started_after_s <= 0:
                await self.bus.reply(self._started(card))
            now = loop.time()
            due = now + self.started_after_s if self.started_after_s > 0 else None
            watch = _Watch(card, due, now + limit, task, now, self, loop)
            # a wait for the provider's limit is not the task's run time (``pacing``): the
            # watch is the clock (no RunClock and two partials per card: ~400 B a card)
            RUN_CLOCK.set(watch)
            # as asyncio.timeout does: a cancel from elsewhere while expiring is not ours
            cancelling = task.cancelling()
            try:
                self._watch(watch)
                self._arm(loop, watch.first())
                if key in self._cancelled:  # its cancel came first: stopped as it begins
                    self._on_notice(self._notice(card, self._cancelled[key]))
                if self.bus.carries_chunks:  # its model calls stream to whoever watches
                    CHUNK_SINK.set(self._chunk_sink(card))
                answer = await telemetry.invoke_agent(self.agent, card, self.llm)
            except BaseException as e:
                # past the deadline the sweep cancelled the handler, or its task ended (a
                # cancel notice): a failed result, unless someone else cancelled this task
                # as well (then it ends, as it must)
                if not (
                    (watch.expired or watch.stopped)
                    and task.uncancel() <= cancelling
                    and isinstance(e, asyncio.CancelledError)
                ):
                    raise
                if watch.stopped and not watch.expired:
                    self.stopped += 1
                    answer = self._stopped_answer(card, watch, loop.time() - now)
                else:
                    answer = self._timeout_answer(card, limit)
            else:
                if watch.expired or watch.stopped:  # the handler swallowed our cancel
                    task.uncancel()
            finally:
                self._watched.pop(key, None)
                if not self._watched and self._check_at is not None:
                    self._check_at.cancel()  # nothing left to ask about
                    self._check_at = None
                watch.ended = True
                # its heap entry stays until its deadline (or a compaction): it must not
                # keep the task, whose context holds RUN_CLOCK -> this watch (a cycle the
                # collector would have to find, a thousand at a time at 1,000 in flight)
                watch.task = None
            answer = msgspec.structs.replace(answer, **self._who(card))
            for sending in watch.reported:  # Started goes out before the answer
                await sending
            self.handled += 1
            self._answers[key] = answer
            if len(self._answers) > 10_000:
                self._answers.popitem(last=False)
            future.set_result(answer)
            return answer
        finally:
            # not awaited (the run was abandoned): no stray warning
            for sending in watch.reported if watch is not None else ():
                sending.add_done_callback(_retrieve)
            self._running.pop(key, None)
            if not future.done():
                # A duplicate delivery waiting on this run gets an ordinary error
                # (its card is redelivered), never a CancelledError that would end
                # its consumer.
                future.set_exception(BusError(f"attempt {key} was abandoned before answering"))
                future.exception()  # retrieved: no "never retrieved" warning if nobody waits

    def _timeout_answer(self, card: TaskCard, limit: float) -> ResultCard:
        return ResultCard(
            task_id=card.task_id,
            attempt=card.attempt,
            agent_id=self.agent.agent_id,
            status="failed",
            # the orchestrator's reason for a deadline: on a busy machine this can
            # arrive before its own time-out, and the log should say the same
            reason="timeout",
            error=f"TimeoutError: still running {limit:g}s after it started; cancelled",
            duration_s=limit,
        )

    def _stopped_answer(self, card: TaskCard, watch: _Watch, ran_s: float) -> ResultCard:
        return ResultCard(
            task_id=card.task_id,
            attempt=card.attempt,
            agent_id=self.agent.agent_id,
            status="failed",
            reason=CANCELLED_REASON,  # recorded as task.result_ignored: handler_cancelled
            error=f"CancelledError: the handler was stopped, its task ended ({watch.stopped})",
            duration_s=round(ran_s, 6),
        )

    async def _worker_tools(self, card: TaskCard) -> WorkerTools:
        """The tools of this worker (at its first card: MCP servers are mounted by then);
        with its orchestrator elsewhere (NATS), the specs of the tools the agent declares
        by name are asked of it (``tool.specs``), for the model to be offered them."""
        serving = worker_tools(self.agent, self.tools, self.local_tools)
        if self.tools is not None or not specs_wanted(self.agent, serving):
            return serving
        ask = AgentRequest(
            request_id=new_id(),
            task_id=card.task_id,
            root_id=card.root_id,
            attempt=card.attempt,
            agent_id=self.agent.agent_id,
            kind="tool.specs",
        )
        try:
            answer = await asyncio.wait_for(self.bus.request(ask), _SPECS_WAIT_S)
        except Exception:  # no answer (an orchestrator of before): offered without schemas
            return serving
        return with_specs(serving, answer.result) if answer.ok else serving

    # One timer for the cards running, not two per card: an instant agent answers long
    # before either would fire, and every timer is a heap push and a cancel on the loop.
    def _arm(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        """Have the sweep run at ``at`` at the latest."""
        if self._sweep is not None:
            if self._sweep_at <= at:
                return
            self._sweep.cancel()
        self._sweep_at = at
        self._sweep = loop.call_at(at, self._sweep_due, loop)

    def _watch(self, watch: _Watch) -> None:
        self._watched[(watch.card.task_id, watch.card.attempt)] = watch
        self._check_soon()
        if watch.due is not None:
            self._dues.append(watch)
        heapq.heappush(self._deadlines, (watch.deadline, next(self._order), watch))
        if len(self._deadlines) > 2 * len(self._watched) + 64:  # mostly ended cards' entries
            self._deadlines = [e for e in self._deadlines if not e[2].ended]
            heapq.heapify(self._deadlines)

    def _pause(self, loop: asyncio.AbstractEventLoop, watch: _Watch, bound_s: float) -> None:
        """A model call of ``watch``'s handler waits for its limit (at most ``bound_s``)."""
        if watch.ended:
            return
        now = loop.time()
        if watch.paused == 0:
            watch.left = max(0.0, watch.deadline - now)
        watch.paused += 1
        self._move(loop, watch, max(watch.deadline, now + watch.left + bound_s))

    def _resume(self, loop: asyncio.AbstractEventLoop, watch: _Watch, waited_s: float) -> None:
        """It stopped waiting: the run time goes on from what was left."""
        watch.paused = max(0, watch.paused - 1)
        if watch.paused == 0 and not watch.ended:
            self._move(loop, watch, loop.time() + watch.left)

    def _move(self, loop: asyncio.AbstractEventLoop, watch: _Watch, deadline: float) -> None:
        # the entry of the old deadline stays in the heap: the sweep skips it (not equal)
        watch.deadline = deadline
        heapq.heappush(self._deadlines, (deadline, next(self._order), watch))
        self._arm(loop, deadline)

    def _sweep_due(self, loop: asyncio.AbstractEventLoop) -> None:
        """Send Started for the cards running past ``started_after_s`` and cancel those
        past their deadline; then sleep until the next such moment, if a card is running.

        Only the cards whose moment has come are looked at (not every card running:
        with a thousand in flight that was a thousand per Started)."""
        self._sweep = None
        now = loop.time() + _CLOCK_SLACK  # the loop runs a timer this early
        dues = self._dues
        while dues and (dues[0].ended or dues[0].due is None or dues[0].due <= now):
            watch = dues.popleft()
            if not watch.ended and watch.due is not None:
                watch.due = None
                started = self._started(watch.card)
                sending = loop.create_task(self.bus.reply(started))
                watch.reported.append(sending)
                # once sent it is nothing to wait for: the list kept each done task for as
                # long as its agent worked (about 500 bytes a waiting card)
                sending.add_done_callback(functools.partial(_forget_sent, watch.reported))
        deadlines = self._deadlines
        while deadlines and (deadlines[0][2].ended or deadlines[0][0] <= now):
            at, _, watch = heapq.heappop(deadlines)
            if not watch.ended and not watch.expired and at == watch.deadline:
                watch.expired = True
                if watch.task is not None:
                    watch.task.cancel()
        soonest = min(
            dues[0].due if dues and dues[0].due is not None else math.inf,
            deadlines[0][0] if deadlines else math.inf,
        )
        if soonest < math.inf:
            self._arm(loop, soonest)


#: how long a worker waits for its orchestrator's tool specs (once) before going on without
_SPECS_WAIT_S = 5.0

#: how early an event loop may run a timer (asyncio: its clock's resolution; uvloop rounds
#: to milliseconds): the sweep counts a moment that near as come, not one to sleep until
_CLOCK_SLACK = max(time.get_clock_info("monotonic").resolution, 1e-3)


class _Watch:
    """A card being run: when its Started is due (None: sent, or not to be sent) and when
    its handler is cancelled; the Started replies sent for it."""

    __slots__ = (
        "begun",
        "card",
        "deadline",
        "due",
        "ended",
        "expired",
        "left",
        "loop",
        "paused",
        "reported",
        "stopped",
        "task",
        "worker",
    )

    def __init__(
        self,
        card: TaskCard,
        due: float | None,
        deadline: float,
        task: asyncio.Task[object],
        begun: float = 0.0,
        worker: AgentWorker | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.card = card
        self.worker = worker  # whose deadlines move while its model calls wait (RunClock)
        self.loop = loop
        self.begun = begun  # when its handler began (the loop's clock)
        self.stopped = ""  # why its handler was cancelled on its task's end (a notice)
        self.due = due
        self.deadline = deadline
        self.task: asyncio.Task[object] | None = task  # None once its handler ended
        self.expired = False
        self.ended = False  # its handler is done: nothing left to send or cancel
        self.reported: list[asyncio.Task[None]] = []
        # model calls waiting for their provider's limit, and the run time left when the
        # first began: the deadline stops meanwhile (``bus.orchestrator.limit_waits``)
        self.paused = 0
        self.left = 0.0

    def first(self) -> float:
        return self.deadline if self.due is None else min(self.due, self.deadline)

    # the card's RunClock (``cardbus.agents.pacing``)
    def pause(self, bound_s: float) -> None:
        if self.worker is not None and self.loop is not None:
            self.worker._pause(self.loop, self, bound_s)

    def resume(self, waited_s: float) -> None:
        if self.worker is not None and self.loop is not None:
            self.worker._resume(self.loop, self, waited_s)


def _forget_sent(reported: list[asyncio.Task[None]], task: asyncio.Task[None]) -> None:
    """A Started reply sent: off its watch's list (one that failed or was cancelled stays,
    so the answer still waits for it and sees how it ended)."""
    if not task.cancelled() and task.exception() is None:
        with contextlib.suppress(ValueError):
            reported.remove(task)


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()
