"""The orchestrator: the only component that decides.

One decision loop owns the state. It takes, in order of arrival, events from
the log (its own and anyone else's, e.g. ``cardbus approve`` in another
process), replies from agents and clock ticks; folds them into ``RunState``;
asks ``Decider`` what follows; appends those events (streams in parallel, so
the store's group commit batches them) and only then sends the cards.

On start it replays the log, so a restarted orchestrator resumes in-flight
runs: pending tasks are dispatched, attempts whose deadline passed while it
was down time out and are retried, finished work is not redone.

This module holds the public API and the step (``_step``: what one turn of the
loop does with the items it took). The class is carved by role into parts it
inherits, each a sibling module, lowest first:

* ``fold`` (``Folding``): the log's events into the state, waiters answered
  when a run ends, the log followed, snapshots kept;
* ``intake`` (``Intake``): whose a reply is, replicas proved alive, what the
  bus refused or could not read;
* ``reply_intake`` (``ReplyTaking``): a reply or record decided in the step, or held
  until its stream's append in flight is settled;
* ``commit`` (``Committing``): a step's decisions appended in one write and
  folded, then their cards sent;
* ``creation`` (``Creating``): a submitted run's creation written, with its
  first step when it is ours alone;
* ``resume`` (``Resuming``): the replay on start, the runs resumed, the
  attempts given back on stop.

``loop_items`` names what the loop's queue carries besides events and replies.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from cardbus.agents.cards import AgentCard, Announce
from cardbus.agents.embedding import Embedder
from cardbus.agents.requests import AgentRequest, AgentResponse
from cardbus.agents.tools import ToolRegistry
from cardbus.bus import telemetry
from cardbus.bus.orchestrator import snapshot as _snapshot
from cardbus.bus.orchestrator.access import AccessPolicy, RequestBroker
from cardbus.bus.orchestrator.admission import Admission
from cardbus.bus.orchestrator.approvals import answer_approval
from cardbus.bus.orchestrator.budget import Budgets
from cardbus.bus.orchestrator.cancel_notices import CancelNotices
from cardbus.bus.orchestrator.child_runs import related_roots
from cardbus.bus.orchestrator.clock import Clock
from cardbus.bus.orchestrator.creation import Creating
from cardbus.bus.orchestrator.digest import plan_digest
from cardbus.bus.orchestrator.gaps import fill_gap
from cardbus.bus.orchestrator.liveness import Leases
from cardbus.bus.orchestrator.loop_guard import reader_task
from cardbus.bus.orchestrator.loop_items import DUE, LAPSED, RESEND, TICK, Changed, Record
from cardbus.bus.orchestrator.memory import LongTermMemory
from cardbus.bus.orchestrator.notify import Notifier
from cardbus.bus.orchestrator.plan import (
    Plan,
    as_plan,
    validate_goal_plan,
    validate_plan,
)
from cardbus.bus.orchestrator.policy import Policy
from cardbus.bus.orchestrator.registry import AgentGrants, check_registrable
from cardbus.bus.orchestrator.repeats import UnknownReplies
from cardbus.bus.orchestrator.reply_intake import HeldForStream, ReplyCounts, ReplyTaking
from cardbus.bus.orchestrator.resend import untaken_cards
from cardbus.bus.orchestrator.resume import Resuming
from cardbus.bus.orchestrator.reuse import ResultIndex, ReusePolicy
from cardbus.bus.orchestrator.run_result import RunResult
from cardbus.bus.orchestrator.runstate import RunState
from cardbus.bus.orchestrator.settle import settle_after
from cardbus.bus.orchestrator.store_trouble import StoreTrouble
from cardbus.bus.orchestrator.submission import run_creation
from cardbus.bus.run_metrics import RunMetrics
from cardbus.bus.transport.interface import Bus
from cardbus.eventstore import (
    DEFAULT_MAX_EVENT_BYTES,
    ConcurrencyError,
    Envelope,
    EventStore,
    new_id,
)
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import (
    BusError,
    CardbusError,
    StoreUnavailable,
)
from cardbus.projections.agents import capability_overlaps
from cardbus.projections.pricing import PriceTable

__all__ = ["Orchestrator", "RunResult", "answer_approval"]

log = logging.getLogger(__name__)


class Orchestrator(Creating, Resuming, ReplyTaking):
    def __init__(
        self,
        store: EventStore,
        bus: Bus,
        policy: Policy | None = None,
        embedder: Embedder | None = None,
        rng: random.Random | None = None,
        tools: ToolRegistry | None = None,
        memory: LongTermMemory | None = None,
        access: AccessPolicy | None = None,
        serve_requests: bool | None = None,
        snapshot: str | Path | None = "auto",
        lease_s: float = 10.0,
        attempts_survive_restart: bool = True,
        agents: AgentGrants | Iterable[AgentCard] | None = None,
        owns: Callable[[str], bool] | None = None,
        prices: PriceTable | None = None,
        local_runs: bool = True,
        reuse: ReusePolicy | None = None,
    ) -> None:
        """``snapshot``: the file a start reads the state from and a stop (and every
        ``Policy.snapshot_every`` events) writes it to (see ``snapshot``); ``"auto"``:
        ``<db>.snap`` beside a SQLite log, none for other stores; None: never.

        ``lease_s``: the lease of an agent found in the log on start that gave none (it
        is selected again once it renews: ``liveness``). ``attempts_survive_restart=False``
        (embedded: agents die with the process): attempts in flight on start or stop are
        host losses, retried at once without spending an attempt (``hostloss``).

        ``agents``: the operator's grants (``AgentGrants``, or the cards themselves):
        which agents may register through their announcements, with at most what
        (``bus.orchestrator.registry``); None: open, each agent's first card is its
        ceiling.

        ``owns``: several orchestrator processes share the runs (``partition``): this one
        decides only the runs (roots) it owns; None: every run. ``local_runs`` (with
        ``owns``): a new run's root id is drawn in a partition this process owns when it
        owns any, so the run is decided where it was submitted (its creation written with
        its first dispatches, its ``wait`` answered here); False: wherever its root id
        falls (another process then decides it).

        ``prices``: what model calls cost (``projections.pricing``; None: the table
        ``CARDBUS_PRICES`` names, over genai-prices' bundled data), for the runs' money
        budgets and the cost recorded with each answer (``bus.orchestrator.budget``)."""
        self.owns = owns
        self.local_runs = local_runs
        # where ``local_runs`` draws a new root: a partition whose lease this member holds
        # (the runtime's; default ``owns``), folded or still being caught up (``owns`` is
        # false meanwhile): its run is decided here once it is
        self.places: Callable[[str], bool] | None = owns
        # a root's partition, when members share the runs by partitions (the runtime's):
        # a child run's root is drawn in its parent's, decided and folded where it is
        self.partition_of: Callable[[str], int] | None = None
        # stored results pending tasks may be answered from (a fold of the memory stream)
        self.results = ResultIndex(reuse) if reuse is not None and reuse.reuse else None
        # what the log is read through for the start and the follower: the store, or (a
        # partitioned member, ``bus.runtime.members``) only the partitions it holds; then
        # ``elsewhere`` answers ``wait`` for the runs it does not fold
        self.log: Any = store
        self.elsewhere: Any = None
        # replies for runs another process decides (time, reply): its partition's next owner
        # offers them again (``wake``), in case that process died before recording them
        self.foreign_replies: collections.deque[tuple[float, object]] = collections.deque(
            maxlen=8192
        )
        self.store = store
        self.grants = agents if isinstance(agents, AgentGrants) else AgentGrants(agents)
        self.leases = Leases(lease_s)
        self.attempts_survive_restart = attempts_survive_restart
        self.orchestrator_id = new_id()
        self._lost_attempts: dict[tuple[str, int], str] = {}  # -> why: ``hostloss``
        self._announce_refused: dict[str, str] = {}  # agent -> the refusal recorded last
        self.snapshot_path = (
            _snapshot.snapshot_path_for(store)
            if snapshot == "auto"
            else Path(snapshot)
            if snapshot
            else None
        )
        self.snapshot_position = 0  # where the latest start's snapshot ended (0: none)
        self._unfolded: set[int] = set()  # positions the log follower saw before the fold did
        self._followed = 0  # the latest position the log follower saw
        self._since_snapshot = 0  # events folded since the latest snapshot
        self._saving: asyncio.Task[None] | None = None
        self.bus = bus
        self.policy = policy or Policy()
        self.embedder = embedder
        self.rng = rng or random.Random()
        self.state = RunState(retain_finished=self.policy.retain_finished_runs)
        self.state.folded_floor = 0  # no follower yet (``_replay``, ``_follow_log`` move it)
        self.admission = Admission(self.policy.max_runs_in_flight)  # runs in flight, queued
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        # the clock sleeps until the next moment something may be due; a new wakeup
        # earlier than that, a lease, a run opened or the last one ended wakes it
        self.clock = Clock(
            self.policy, self.state, self.leases, self._queue.put_nowait, (TICK, DUE, LAPSED)
        )
        self._loops: list[asyncio.Task[None]] = []
        self._waiters: dict[str, list[asyncio.Future[RunResult]]] = {}
        # reads of a retired run's result for its waiters (kept referenced while they run)
        self._answering: set[asyncio.Task[None]] = set()
        self._busy: set[str] = set()  # streams with an append in flight
        self._expected: dict[str, int] = {}  # busy stream -> its version when decided
        self._parked: list[object] = []  # items to decide again after the next commit
        self._held_for = HeldForStream()  # items waiting for their busy stream's commit
        self.reply_counts = ReplyCounts()
        # the log's events for a stream busy with our append: folded once it is settled
        self._held: dict[str, list[Envelope]] = {}
        self._commits: set[asyncio.Task[None]] = set()
        self.bad_messages: list[tuple[str, str]] = []  # the latest 1000: see _bad
        # (caught up with no 2 s cut-off: on a busy machine the fold took longer, and a
        # reply for a task the other orchestrator had just created was called unknown)
        self.unknown = UnknownReplies(
            lambda: self.caught_up(60.0), self._queue.put_nowait, self._bad
        )
        # spans per run, the tree cardbus export draws (agents by name); no-ops without an SDK
        self.tracing = telemetry.RunTracing(lambda a: getattr(self.state.agents.get(a), "name", a))
        # agent requests (task and long-term memory, tools): checked, recorded, answered;
        # served when asked to, or (None) when given tools, memory or an access policy
        self.serve_requests = (
            serve_requests
            if serve_requests is not None
            else any(x is not None for x in (tools, memory, access))
        )
        memory = memory if memory is not None else LongTermMemory(store, embedder)
        self.broker = RequestBroker(
            self.state, self.record, tools, memory, access, store=store, catch_up=self.caught_up
        )
        # budgets checked before each live model call (the journal) and each dispatch
        self.budgets = Budgets(self.state, prices)
        self.broker.journal.budgets = self.budgets
        # what agents' requests are answered with (a partitioned member hands those of runs
        # another member decides to it: ``bus.runtime.members``)
        self.handle_request: Callable[[AgentRequest], Awaitable[AgentResponse]] = self.broker.handle
        self._records: dict[str, list[Record]] = {}  # stream -> requests' events in flight
        # called with every event newly folded in while running (not the replay on start);
        # the first stops the handlers of attempts whose task was cancelled or halted
        # (and the metrics of the runs this one owns: no-ops without an SDK meter provider)
        self.observers: list[Callable[[Envelope], None]] = [
            CancelNotices(bus, self.state).observe,
            RunMetrics(owns, self.state).observe,
            self.clock.observe,
        ]
        # a webhook told when a person's word is awaited: best effort (``notify``)
        self.notifier = (
            Notifier(self.policy.notify_url, self.policy.notify_timeout_s, state=self.state)
            if self.policy.notify_url
            else None
        )
        if self.notifier is not None:
            self.observers.append(self.notifier.observe)
        # the largest event decided (the store's limit, with room for the envelope)
        self._event_limit = int(getattr(store, "max_event_bytes", DEFAULT_MAX_EVENT_BYTES)) - 8192
        # set when the log has refused writes for Policy.store_grace_s (disk full, read-only,
        # gone): nothing can be decided any more, so every waiter gets this error and no
        # step decides again; a refusal shorter than that (a hiccup) is retried
        self.store_failure: StoreUnavailable | None = None
        self.store_trouble = StoreTrouble(self.policy.store_grace_s, self._store_failed)
        self._refused_runs: set[str] = set()  # runs failed because the log refused a decision
        self._sent: set[tuple[str, int]] = set()  # attempts sent to this process's agents
        self._stopping = False  # no new dispatch once stopping (its agents go with it)

    # -- lifecycle -----------------------------------------------------------

    async def start(self, agents: Iterable[AgentCard] = ()) -> None:
        """Rebuild state from the log, then follow the log, the bus and the clock.

        ``agents``: cards registered (as :meth:`register`, live while this runs)
        before any open run is resumed, so a resumed run finds them.
        """
        started = await self._replay()
        for card in agents:  # before the open runs are looked at
            await self.register(card)
        for root in self.state.open:  # runs resumed from the log rejoin their traces
            self.tracing.resume_run(root, started.get(root))
        await self._started()
        self.bus.on_bad_message = self._on_bad_message
        self.bus.on_refused = self._on_refused
        if self.serve_requests:
            try:
                await self.bus.serve_requests(self.handle_request)
            except BusError:
                log.info("%s carries no agent requests", type(self.bus).__name__)
        self._loops = [
            reader_task("orchestrator-log", self._follow_log),
            reader_task("orchestrator-replies", self._pump_replies),
            asyncio.create_task(self.clock.run(), name="orchestrator-clock"),
            asyncio.create_task(self._decide_loop(), name="orchestrator-decide"),
        ]

    async def stop(self, give_back: bool = True) -> None:
        """Stop deciding; an embedded process first gives back its agents' attempts
        (``give_back=False``: stop as a process that dies would, leaving them)."""
        ran = bool(self._loops)
        self._stopping = True
        self.unknown.close()
        if give_back:
            await self._give_back()
        if self._commits:  # let decisions already made finish their writes
            await asyncio.gather(*self._commits, return_exceptions=True)
        with contextlib.suppress(asyncio.CancelledError, Exception):
            if self._saving is not None:
                await self._saving
        for t in self._loops:
            t.cancel()
        for t in self._loops:
            # A cancellation can be lost inside a library's asyncio.wait_for (Python 3.11,
            # e.g. a NATS client read that completes at the same moment): cancel again
            # until the loop is really gone, so stop() cannot hang.
            while not t.done():
                await asyncio.wait({t}, timeout=0.5)
                if not t.done():
                    t.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._loops = []
        # a step decided between the first wait for commits and the loops' end wrote in
        # the background too: its write ends before the caller closes the store (else it
        # failed on a closed store, an exception nobody retrieved)
        while self._commits:
            await asyncio.gather(*self._commits, return_exceptions=True)
        if self.snapshot_path is not None and ran:
            await self._final_snapshot(self.snapshot_path)
        self.tracing.close()  # runs still open end their spans here (a restart rejoins them)

    async def __aenter__(self) -> Orchestrator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- public API ----------------------------------------------------------

    async def register(self, card: AgentCard, lease_s: float = 0.0, replica_id: str = "") -> None:
        """Record an agent's card in the log (a no-op if the same card is there).

        ``lease_s`` 0 (the operator's path): the agent is live while this orchestrator
        runs; else (an announcement) while ``replica_id`` renews within ``lease_s``.
        Not checked against the grants: an agent's own announcement goes through
        :meth:`announced`. A card whose capability schemas are not JSON Schema is a
        ``ValidationError``."""
        check_registrable(card)  # an id that fits the log, schemas that are JSON Schema
        now = time.time()
        was_live = self.leases.live(card.agent_id, now)
        if lease_s > 0:
            self.leases.renew(card.agent_id, replica_id, lease_s, now)
        else:
            self.leases.pin(card.agent_id, now)
        if not was_live and self.state.open:
            self._queue.put_nowait(TICK)  # tasks waiting for an agent look again
        if self.state.agents.get(card.agent_id) == card:
            return
        stream = f"agent-{card.agent_id}"
        data = ev.AgentRegistered(
            agent_id=card.agent_id, card=msgspec.to_builtins(card), lease_s=lease_s
        )
        await self._append_at_current_version(stream, [data], correlation_id=stream)
        caps = {a: [c.name for c in x.capabilities] for a, x in self.state.agents.items()}
        for other, share in capability_overlaps(caps).get(card.agent_id, []):
            log.warning(  # seed 003: a near duplicate (or the same agent under a new id)
                "agent %s: %.0f%% of its capabilities are offered by %s too",
                card.agent_id,
                share * 100,
                other,
            )

    async def deregister(self, agent_id: str, reason: str = "stopped") -> None:
        """Record that an agent left (a no-op if it is not registered); it is selected no
        more, and an attempt it has in flight times out at once (``agent_lost``)."""
        self.leases.forget(agent_id)
        if agent_id not in self.state.agents:
            return
        stream = f"agent-{agent_id}"
        data = ev.AgentDeregistered(agent_id=agent_id, reason=reason)
        await self._append_at_current_version(stream, [data], correlation_id=stream)
        if self.state.open:
            self._queue.put_nowait(TICK)  # its attempts in flight are lost

    async def announced(self, announce: Announce) -> None:
        """An announcement: registered as far as the grants (and its wire version) allow, the
        rest refused (``reply.refused`` on ``agent-<id>``); its sender checked by the bus."""
        card, known = announce.card, self.state.agents.get(announce.card.agent_id)
        admission = self.grants.admit(card, known, announce.wire_version)
        stream = f"agent-{card.agent_id}"
        reason = "not granted: " + "; ".join(admission.refused)
        # a lease renewal repeats the announcement every lease/3: its refusal is logged once
        if admission.refused and self._announce_refused.get(card.agent_id) != reason:
            self._announce_refused[card.agent_id] = reason
            refused = ev.ReplyRefused(
                kind="announce",
                claimed_agent_id=card.agent_id,
                sender=card.agent_id,
                reason=reason,
            )
            log.warning("announcement of %s: %s", card.agent_id, refused.reason)
            await self._append_at_current_version(stream, [refused], correlation_id=stream)
        if admission.card is not None:
            await self.register(admission.card, announce.lease_s, announce.replica_id)

    async def submit(
        self,
        plan: Plan | Mapping[str, Any],
        agents: Iterable[str] = (),
        agent_paths: Iterable[str] = (),
        actor: str | None = None,
        lineage: Mapping[str, Any] | None = None,
    ) -> str:
        """Start a run of ``plan`` (a Plan or its JSON form); returns its root id.

        ``agents``: the run's agents (ids); selection considers only them (none: all).
        ``agent_paths``: their classes ("module:Class", default ``plan.agents``), kept in
        ``run.started`` for ``cardbus fork`` and ``cardbus rerun``. ``actor``: who asked
        for the run (an operator of the console), the actor of its creation events
        (``plan.submitted``, ``run.started``, ``task.created``); default the policy's.
        ``lineage``: the task of another log whose child this run is (``run.started``'s
        ``parent_*`` fields: a remote department's run, ``bus.a2a.server``).

        The same plan id runs once.
        """
        plan = as_plan(plan)
        goal_only = not plan.tasks
        if goal_only:  # a planner proposes the tasks (bus.orchestrator.planning)
            validate_goal_plan(plan, self.state.agents.values())
        else:
            validate_plan(plan, self.state.agents.values(), self.policy.retry)
        plan_id = plan.plan_id or new_id()
        digest = plan_digest(plan)
        root_id = self.state.plans.get(plan_id)
        self._same_plan(plan_id, digest)
        if root_id is not None and root_id in self.state.runs:
            return root_id
        fresh = root_id is None
        root_id = root_id or self._new_root()
        self.tracing.start_run(root_id, plan_id, plan.goal)
        # bus.orchestrator.submission: refused before anything is written, not half-way
        creates = run_creation(
            plan, plan_id, root_id, self.policy, agents, agent_paths, self._event_limit, lineage
        )
        if fresh:
            claim = (
                f"plan-{plan_id}",
                ev.PlanSubmitted(plan_id=plan_id, root_id=root_id, plan_digest=digest),
            )
            if plan.plan_id is None:  # an id nobody else knows: nothing to race for
                creates.insert(0, claim)
            else:
                try:
                    await self._append(claim[0], [claim[1]], 0, root_id, actor)
                except ConcurrencyError:
                    for env in await self.store.read_stream(claim[0]):
                        self.state.apply(env)
                    self._same_plan(plan_id, digest)
                    return self.state.plans[plan_id]
        # PlanSubmitted claims the id; a submitter that died after it is completed by
        # the next submit of the same plan id (each append below is create-only)
        await self._create(creates, root_id, fresh and plan.plan_id is None, actor)
        self._queue.put_nowait(Changed(frozenset([root_id])))
        return root_id

    async def wait(self, root_id: str, timeout: float | None = None) -> RunResult:
        """Wait until the run finishes; its outputs by plan task id.

        Raises ``StoreUnavailable`` once the log cannot be written (see store_failure).
        """
        if self.elsewhere is not None and not self.elsewhere.folds(root_id):
            return await self.elsewhere.wait(root_id, timeout)  # a run another member folds
        # registered before the log read: a partition lost meanwhile hands it over (members)
        future: asyncio.Future[RunResult] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(root_id, []).append(future)
        try:
            done = self._result(root_id) or await self._retired_result(root_id)
            if done is not None:
                return done
            if self.store_failure is not None:
                raise self.store_failure
            # asyncio.timeout, not wait_for: no wrapping future and callbacks per run
            async with asyncio.timeout(timeout):
                return await future
        finally:  # a waiter that gave up must not stay registered (nor its handover run)
            future.cancel()
            waiters = self._waiters.get(root_id, [])
            if future in waiters:
                waiters.remove(future)
                if not waiters:
                    self._waiters.pop(root_id, None)

    async def run(
        self,
        plan: Plan | Mapping[str, Any],
        timeout: float | None = None,
        agents: Iterable[str] = (),
        agent_paths: Iterable[str] = (),
    ) -> RunResult:
        return await self.wait(await self.submit(plan, agents, agent_paths), timeout)

    async def approve(self, task_id: str, by: str = "api", note: str = "") -> None:
        await answer_approval(self.store, task_id, True, by, note)

    async def deny(self, task_id: str, by: str = "api", note: str = "") -> None:
        await answer_approval(self.store, task_id, False, by, note)

    def wake(self, replies: Iterable[object] = (), resend: bool = False) -> None:
        """Look at every open run again (e.g. the runs of a partition just acquired), after
        ``replies`` (those of ``foreign_replies`` its previous owner left unrecorded);
        ``resend``: then send again the cards dispatched and not taken (``resend``: the
        previous owner may have died between logging a dispatch and sending its card)."""
        for reply in replies:
            self._queue.put_nowait(reply)
        if resend and self.attempts_survive_restart:
            self._queue.put_nowait(RESEND)
        self._queue.put_nowait(TICK)

    def later(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` in the decision loop (``bus.runtime.members``): in the next step,
        after every log event that step takes (events first, see ``_step``), even one
        queued after ``fn``; so ``fn`` decides on what the state holds then."""
        self._queue.put_nowait(fn)

    async def caught_up(self, timeout: float = 2.0) -> bool:
        """Return once the state holds every event the log held when asked: True; or
        False after ``timeout`` (the caller then decides on what it has). The log as this
        process reads it (``log``): a partitioned member's ends at its partitions' last
        event."""
        target = await self.log.last_position()
        deadline = time.monotonic() + timeout
        while not self._folded_through(target):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.005)  # the follower folds meanwhile; a rare wait
        return True

    async def record(self, stream: str, events: list[ev.Event]) -> list[Envelope]:
        """Append an agent request's events to ``stream`` through the decision loop (so
        they never race the stream's own decisions); returns them stored, once durable."""
        done: asyncio.Future[list[Envelope]] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(Record(stream, list(events), done))
        return await done

    # -- the loops -----------------------------------------------------------

    async def _pump_replies(self) -> None:
        async for reply in self.bus.replies():
            self._queue.put_nowait(reply)

    async def _decide_loop(self) -> None:
        while True:
            items = [await self._queue.get()]
            while not self._queue.empty():
                items.append(self._queue.get_nowait())
            try:
                await self._step(items)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug in one step must not stop every run
                log.exception("orchestrator step failed")

    async def _step(self, items: list[object]) -> None:
        if self.store_failure is not None:
            return  # the log cannot be written: deciding again would only fail again
        decider = self._decider(time.time())
        dirty: set[str] = set()  # roots something happened to; a tick looks at every run
        handled: list[object] = []  # replies decided on here: settled once committed
        # The log's events first: every decision of this step is then made on the
        # versions the step ends with, which its appends expect (another
        # orchestrator's events must not slip in between a decision and its append).
        for item in items:
            # our own appends come back from the log already applied: only news
            # (another writer's event) can change what to decide
            if isinstance(item, Envelope):
                await fill_gap(self.store, self.state, item, self._apply)
                if self._apply(item):
                    dirty.add(item.correlation_id)
                self._unfolded.discard(item.position)  # folded now or before
        for item in items:
            if item is TICK:
                dirty.update(self.state.open)
            elif item is RESEND:  # after the replies queued before it: still untaken
                cards = untaken_cards(decider, self.owns)
                if cards:
                    log.info("sending again %d card(s) dispatched and not taken", len(cards))
                    sending = asyncio.create_task(self._send_cards(cards))
                    self._commits.add(sending)
                    sending.add_done_callback(self._commits.discard)
            elif item is DUE:
                dirty.update(self.state.due(decider.now))
            elif isinstance(item, Changed):
                dirty.update(item.roots)
            elif isinstance(item, Envelope):
                continue
            elif callable(item):  # from ``log``: partitions acquired or released
                item()
            elif item is LAPSED:
                for agent_id in self.leases.lapsed(list(self.state.agents), decider.now):
                    await self.deregister(agent_id, "lease_expired")
            elif isinstance(item, Announce) and not item.online:
                # a worker stopping: the agent leaves when its last live replica has
                if self.leases.leave(item.card.agent_id, item.replica_id, decider.now):
                    await self.deregister(item.card.agent_id, "stopped")
            elif isinstance(item, Announce):
                try:
                    await self.announced(item)
                except CardbusError as e:  # a bad announcement: dead-lettered, the step goes on
                    self._bad(f"cardbus.announce.{str(item.card.agent_id)[:64]}", str(e)[:500])
            elif isinstance(item, Record):
                self._take_record(decider, item)
            else:  # a reply: decided, or held while its stream is written (reply_intake)
                self._take_reply(decider, item, handled)
        # a completion decided just now lets its run go on in this same step
        dirty.update(self._root_of(t) for t in decider.d.completed)
        dirty |= related_roots(self.state, dirty)  # a child's parent, a parent's children
        # runs that moved up from the queue (one ended, or a partition came)
        dirty |= self.admission.update(self.state, self.owns, force=TICK in items)
        for root in dirty:
            run = self.state.open.get(root)
            owned = self.owns is None or self.owns(root)
            if run is not None and owned and self.admission.admits(root):
                decider.advance(run)
        d = decider.d
        self.unknown.look_again(d.unroutable)  # bad if still unknown once caught up
        if d:
            # Commits run in the background so the next step can decide on other
            # streams meanwhile (their appends then share a group commit); a stream
            # stays busy, and decided on no further, until its append is settled.
            self._busy.update(d.events)
            # the version each decision was made on: the log may bring other writers'
            # events for the stream before the append runs (several orchestrators)
            self._expected.update({s: self.state.versions.get(s, 0) for s in d.events})
            commit = asyncio.create_task(self._commit(d))
            self._commits.add(commit)
            commit.add_done_callback(self._commits.discard)
        self._hold_deferred(d.deferred)  # once the commit made their streams busy
        settle_after(self.bus, handled, d.deferred, commit if d else None)

    # -- snapshots (see bus.orchestrator.snapshot) ---------------------------
