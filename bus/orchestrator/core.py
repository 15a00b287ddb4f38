"""The orchestrator: the only component that decides.

One decision loop owns the state. It takes, in order of arrival, events from
the log (its own and anyone else's, e.g. ``cardbus approve`` in another
process), replies from agents and clock ticks; folds them into ``RunState``;
asks ``Decider`` what follows; appends those events (streams in parallel, so
the store's group commit batches them) and only then sends the cards.

On start it replays the log, so a restarted orchestrator resumes in-flight
runs: pending tasks are dispatched, attempts whose deadline passed while it
was down time out and are retried, finished work is not redone.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import random
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from cardbus.agents.cards import AgentCard, Announce, TaskCard
from cardbus.agents.embedding import Embedder
from cardbus.agents.requests import AgentRequest, AgentResponse
from cardbus.agents.tools import ToolRegistry
from cardbus.bus import telemetry
from cardbus.bus.orchestrator import commit_order
from cardbus.bus.orchestrator import snapshot as _snapshot
from cardbus.bus.orchestrator.access import AccessPolicy, RequestBroker
from cardbus.bus.orchestrator.admission import Admission
from cardbus.bus.orchestrator.approvals import answer_approval
from cardbus.bus.orchestrator.budget import Budgets
from cardbus.bus.orchestrator.cancel_notices import CancelNotices
from cardbus.bus.orchestrator.child_runs import related_roots
from cardbus.bus.orchestrator.clock import Clock
from cardbus.bus.orchestrator.decisions import Decider, Decisions
from cardbus.bus.orchestrator.digest import plan_digest
from cardbus.bus.orchestrator.gaps import fill_gap
from cardbus.bus.orchestrator.hostloss import HOST_LOST
from cardbus.bus.orchestrator.liveness import Leases
from cardbus.bus.orchestrator.memory import LongTermMemory
from cardbus.bus.orchestrator.notify import Notifier
from cardbus.bus.orchestrator.plan import (
    Plan,
    as_plan,
    validate_goal_plan,
    validate_plan,
)
from cardbus.bus.orchestrator.policy import Policy
from cardbus.bus.orchestrator.registry import AgentGrants
from cardbus.bus.orchestrator.repeats import UnknownReplies
from cardbus.bus.orchestrator.resend import untaken_cards
from cardbus.bus.orchestrator.reuse import ResultIndex, ReusePolicy
from cardbus.bus.orchestrator.run_result import RunResult, result_of
from cardbus.bus.orchestrator.runstate import RunState
from cardbus.bus.orchestrator.settle import settle_after
from cardbus.bus.orchestrator.store_trouble import StoreTrouble
from cardbus.bus.orchestrator.submission import run_creation
from cardbus.bus.run_metrics import RunMetrics
from cardbus.bus.transport.interface import Bus, Refusal
from cardbus.eventstore import (
    DEFAULT_MAX_EVENT_BYTES,
    Append,
    ConcurrencyError,
    Envelope,
    EventStore,
    NewEvent,
    TaskState,
    new_id,
)
from cardbus.eventstore import events as ev
from cardbus.eventstore.batch import MAX_ID_CHARS
from cardbus.eventstore.errors import (
    BusError,
    CardbusError,
    DecodeError,
    PlanConflict,
    PrerequisiteNotStored,
    StoreUnavailable,
    ValidationError,
)
from cardbus.projections.agents import capability_overlaps
from cardbus.projections.memory import MEMORY_STREAM
from cardbus.projections.pricing import PriceTable

__all__ = ["Orchestrator", "RunResult", "answer_approval"]

log = logging.getLogger(__name__)
_TICK = object()  # look at every open run
_RESEND = object()  # send again the cards of our runs dispatched and not taken (resend)
_DUE = object()  # look at the runs whose deadline or backoff has come
_LAPSED = object()  # an agent's lease ran out: deregister it
_PLACE_TRIES = 256  # new root ids drawn for one in a partition this member holds (p ~ share)


@dataclass(frozen=True)
class _Changed:
    """Runs whose streams were just written: only they need looking at again."""

    roots: frozenset[str]


@dataclass
class _Record:
    """Events an agent request produced, for the decision loop to append to ``stream``."""

    stream: str
    events: list[ev.Event]
    done: asyncio.Future[list[Envelope]]
    tries: int = 0


class Orchestrator:
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
        self.admission = Admission(self.policy.max_runs_in_flight)  # runs in flight, queued
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        # the clock sleeps until the next moment something may be due; a new wakeup
        # earlier than that, or a run opened, wakes it
        self.clock = Clock(
            self.policy, self.state, self.leases, self._queue.put_nowait, (_TICK, _DUE, _LAPSED)
        )
        self.state.on_wake = self.clock.wake_at
        self.state.on_open = self.clock.run_opened
        self.leases.on_lease = self.clock.wake_at
        self._loops: list[asyncio.Task[None]] = []
        self._waiters: dict[str, list[asyncio.Future[RunResult]]] = {}
        # reads of a retired run's result for its waiters (kept referenced while they run)
        self._answering: set[asyncio.Task[None]] = set()
        self._busy: set[str] = set()  # streams with an append in flight
        self._expected: dict[str, int] = {}  # busy stream -> its version when decided
        self._parked: list[object] = []  # replies waiting for a busy stream
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
        self._records: dict[str, list[_Record]] = {}  # stream -> requests' events in flight
        # called with every event newly folded in while running (not the replay on start);
        # the first stops the handlers of attempts whose task was cancelled or halted
        # (and the metrics of the runs this one owns: no-ops without an SDK meter provider)
        self.observers: list[Callable[[Envelope], None]] = [
            CancelNotices(bus, self.state).observe,
            RunMetrics(owns, self.state).observe,
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
        started: dict[str, str | None] = {}  # root -> its run.started's traceparent
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
        self._followed = self.state.position
        if self.results is not None:  # the memory stream whole: a snapshot skips it
            await self.results.build(self.store)
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
            asyncio.create_task(self._follow_log(), name="orchestrator-log"),
            asyncio.create_task(self._pump_replies(), name="orchestrator-replies"),
            asyncio.create_task(self.clock.run(), name="orchestrator-clock"),
            asyncio.create_task(self._decide_loop(), name="orchestrator-decide"),
        ]

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
            self._queue.put_nowait(_Changed(frozenset(self.state.open)))

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
        if self.snapshot_path is not None and ran:
            await self._final_snapshot(self.snapshot_path)
        self.tracing.close()  # runs still open end their spans here (a restart rejoins them)

    async def _give_back(self) -> None:
        """An embedded process stopping: the cards it sent to its own agents die with it, as
        host losses recorded now (retried by another process on the same log, or this one
        resumed), not left to wait for the queue limit: no start will come for them."""
        if self.attempts_survive_restart or not self._loops or self.store_failure:
            return
        mine = {key for key in self._sent if self._in_flight(*key)}
        if not mine:
            return
        self._lost_attempts = self._lost_attempts | dict.fromkeys(mine, HOST_LOST)
        self._queue.put_nowait(_Changed(frozenset(self._root_of(t) for t, _ in mine)))
        # Until the loss is recorded (or the loop or the log is gone), with no time limit:
        # another process on the same log waits on these attempts, and an attempt left
        # in flight there waits out the queue limit (an hour by default). A fixed limit
        # here expired on a busy machine and wedged the other process's run.
        while (
            any(self._in_flight(*key) for key in mine)
            and self.store_failure is None
            and not all(t.done() for t in self._loops)
        ):
            await asyncio.sleep(0.01)

    def _in_flight(self, task_id: str, attempt: int) -> bool:
        task = self.state.tasks.get(task_id)
        return (
            task is not None
            and task.attempt == attempt
            and task.state in (TaskState.DISPATCHED, TaskState.RUNNING)
            and attempt not in task.settled
        )

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
        :meth:`announced`."""
        if not isinstance(card.agent_id, str) or not 0 < len(card.agent_id) <= MAX_ID_CHARS:
            shown = card.agent_id[:40] if isinstance(card.agent_id, str) else card.agent_id
            raise ValidationError(
                f"agent id {shown!r} must be 1 to {MAX_ID_CHARS} chars (MAX_ID_CHARS)"
            )
        now = time.time()
        was_live = self.leases.live(card.agent_id, now)
        if lease_s > 0:
            self.leases.renew(card.agent_id, replica_id, lease_s, now)
        else:
            self.leases.pin(card.agent_id, now)
        if not was_live and self.state.open:
            self._queue.put_nowait(_TICK)  # tasks waiting for an agent look again
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

    def _alive(self, reply: object) -> None:
        """A Started or result from a replica proves it alive: as good as a renewal."""
        agent_id, replica_id = getattr(reply, "agent_id", None), getattr(reply, "replica_id", "")
        if not replica_id or agent_id not in self.state.agents:
            return
        lease = self.state.agent_leases.get(agent_id) or self.leases.default_lease_s
        if self.leases.renew(agent_id, replica_id, lease, time.time()) and self.state.open:
            self._queue.put_nowait(_TICK)  # tasks waiting for it look again

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
            self._queue.put_nowait(_TICK)  # its attempts in flight are lost

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
        self._queue.put_nowait(_Changed(frozenset([root_id])))
        return root_id

    def _new_root(self) -> str:
        """A new run's root id. With ``owns`` (several members share the runs), one this
        member decides when it decides any: drawn again until its partition is one held
        here, so the run's creation goes with its first dispatches and its ``wait`` is
        answered here, not through another member. Runs go where they are submitted."""
        root_id = new_id()
        if self.places is not None and self.local_runs:
            for _ in range(_PLACE_TRIES):
                if self.places(root_id):
                    break
                root_id = new_id()
        return root_id

    def _same_plan(self, plan_id: str, digest: str) -> None:
        """``PlanConflict`` if ``plan_id`` was submitted before with another plan body."""
        known = self.state.plan_digests.get(plan_id)
        root_id = self.state.plans.get(plan_id)
        if known and root_id is not None and known != digest:
            raise PlanConflict(plan_id, root_id)

    async def _create(
        self,
        creates: list[tuple[str, ev.Event]],
        root_id: str,
        first_step: bool = False,
        actor: str | None = None,
    ) -> None:
        """Create streams (one commit on SQLite); one created earlier is read instead.

        ``first_step`` (a new run nobody else knows of): the run's first decisions,
        its first dispatches, are written in the same append as its creation and
        their cards sent once it is stored: one commit fewer before an agent starts.
        A caller cancelled meanwhile does not stop it half-way: what is stored is
        folded and its cards are sent.
        """
        first = self._first_step(creates, root_id) if first_step else None
        write = asyncio.ensure_future(self._write_creation(creates, root_id, first, actor))
        write.add_done_callback(lambda f: f.cancelled() or f.exception())  # the caller's to see
        await asyncio.shield(write)

    async def _write_creation(
        self,
        creates: list[tuple[str, ev.Event]],
        root_id: str,
        first: Decisions | None,
        actor: str | None = None,
    ) -> None:
        extra = first.events if first is not None else {}
        appends = [  # the creation is the submitter's (actor), the first dispatches ours
            Append(
                s,
                self._new_events([data], root_id, actor)
                + self._new_events(extra.get(s, ()), root_id),
                0,
            )
            for s, data in creates
        ]
        error: Exception | None = None
        stored: list[str] = []
        # Not marked busy meanwhile: the log follower folds what it sees of these streams,
        # and on NATS another orchestrator (the run's owner, ``owns``) may write to one
        # while this append still waits for another stream's answer. Busy, that event
        # was skipped by the follower and never folded here (a partitioned member then
        # saw task.started on a task it had as pending: nats_scale_bench.py).
        streams = [s for s, _ in creates]
        outcomes = await self.store.append_many(appends)
        for stream, outcome in zip(streams, outcomes, strict=True):
            if isinstance(outcome, ConcurrencyError):  # created by an earlier, interrupted submit
                outcome = await self.store.read_stream(stream)
            elif isinstance(outcome, Exception):
                error = error or outcome
                continue
            else:
                stored.append(stream)
            for env in outcome:
                self._apply(env)
        if first is not None:
            await self._send(first, stored)  # what was stored is sent, whatever else failed
        if error is not None:
            raise error

    def _first_step(self, creates: list[tuple[str, ev.Event]], root_id: str) -> Decisions | None:
        """What the decide loop would decide first for this run, decided on the run
        folded tentatively (``RunState.tentatively``); None when that is more than
        events on the run's own new streams (the decide loop then decides it)."""
        if self.store_failure is not None or (self.owns is not None and not self.owns(root_id)):
            return None
        if not self.admission.room_for_one_more(self.state):
            return None  # it may be queued: the decide loop admits it or not
        now = time.time()
        drafts = [
            Envelope(
                event_id="", stream=s, version=1, recorded_at=now, correlation_id=root_id, data=x
            )
            for s, x in creates
        ]
        decider = self._decider(now)
        try:
            with self.state.tentatively(drafts):
                decider.advance(self.state.open[root_id])
        except Exception:  # a bug here must not fail the submit: the decide loop decides it
            log.exception("deciding the first step of %s with its creation failed", root_id)
            return None
        d = decider.d
        new = {s for s, _ in creates}
        if not d or d.completed or d.after or not new.issuperset(d.events):
            return None
        return d

    def _decider(self, now: float) -> Decider:
        return Decider(
            self.state,
            self.policy,
            now,
            self.embedder,
            self.rng,
            frozenset(self._busy),
            event_limit=self._event_limit,
            leases=self.leases,
            lost_attempts=self._lost_attempts,
            dispatching=not self._stopping,
            budgets=self.budgets,
            results=self.results,
            place=self.partition_of,
        )

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
            self._queue.put_nowait(_RESEND)
        self._queue.put_nowait(_TICK)

    def later(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` in the decision loop, between two steps (``bus.runtime.members``)."""
        self._queue.put_nowait(fn)

    def _reply_owned(self, reply: object) -> bool:
        """A reply is decided by its run's owner; a task not folded yet is not ours: the
        owner folded the dispatch before it sent the card."""
        task = self.state.tasks.get(getattr(reply, "task_id", ""))
        return task is not None and self.owns is not None and self.owns(task.created.root_id)

    async def caught_up(self, timeout: float = 2.0) -> None:
        """Return once the state holds every event the log held when asked (or after
        ``timeout``: the caller then decides on what it has). The log as this process
        reads it (``log``): a partitioned member's ends at its partitions' last event."""
        target = await self.log.last_position()
        deadline = time.monotonic() + timeout
        while not self._folded_through(target) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)  # the follower folds meanwhile; a rare wait

    def _folded_through(self, target: int) -> bool:
        """Every event up to ``target`` is folded: the follower has seen it and none it saw
        waits in the queue or on a busy stream (our own appends come back through the
        follower too). ``state.position`` alone is not enough: our own append moves it
        past another writer's event the follower has not reached, or holds
        (a reply for a task the other orchestrator had just created was called unknown)."""
        return self._followed >= target and not any(p <= target for p in self._unfolded)

    async def record(self, stream: str, events: list[ev.Event]) -> list[Envelope]:
        """Append an agent request's events to ``stream`` through the decision loop (so
        they never race the stream's own decisions); returns them stored, once durable."""
        done: asyncio.Future[list[Envelope]] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Record(stream, list(events), done))
        return await done

    # -- the loops -----------------------------------------------------------

    async def _follow_log(self) -> None:
        versions = self.state.versions
        busy = self._busy
        # From where the start's fold ended, not from ``state.position``: the start's own
        # appends (orchestrator.started, run.resumed) moved that past whatever another
        # writer appended meanwhile, which was then never folded (an approval lost for good)
        async for env in self.log.subscribe(self._followed + 1):
            if not isinstance(env, Envelope):  # a change of what is followed: see ``log``
                self._queue.put_nowait(env)
                continue
            # Only news wakes the loop. Our own appends come back already applied, or
            # (the log can be quicker than the append's caller) onto a stream still
            # busy with our append: held until it is settled, then folded if still new.
            # Never dropped: an append that ends in neither success nor a conflict
            # (PrerequisiteNotStored, a store error) reads nothing back, and a dropped
            # event of another writer left a gap the next one was folded across (a
            # member then saw a dispatched task as pending and dispatched attempt 1 again).
            self._followed = env.position
            if env.version > versions.get(env.stream, 0):
                self._unfolded.add(env.position)
                if env.stream not in busy:
                    self._queue.put_nowait(env)
                else:
                    self._held.setdefault(env.stream, []).append(env)
            else:
                self._maybe_snapshot()

    def _maybe_snapshot(self) -> None:
        """Save a snapshot once ``snapshot_every`` events were folded since the last, at a
        moment when exactly the events up to ``state.position`` are folded: the follower
        has seen them all, and none it saw still waits to be folded.

        Called by the follower (when it is behind our appends) and by ``_apply`` (when
        it is ahead of them): checked on the follower's side alone, a follower always
        quicker than the appender never found that moment and no periodic snapshot was
        written (30 runs one after the other, 450 events, ``snapshot_every=20``: none).
        """
        every = self.policy.snapshot_every
        if (
            every
            and self._since_snapshot >= every
            and self.snapshot_path is not None
            and not self._unfolded
            and self._followed >= self.state.position
            and self._saving is None
        ):
            self._save_snapshot(self.snapshot_path, self.state.position)

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
            if item is _TICK:
                dirty.update(self.state.open)
            elif item is _RESEND:  # after the replies queued before it: still untaken
                cards = untaken_cards(decider, self.owns)
                if cards:
                    log.info("sending again %d card(s) dispatched and not taken", len(cards))
                    sending = asyncio.create_task(self._send_cards(cards))
                    self._commits.add(sending)
                    sending.add_done_callback(self._commits.discard)
            elif item is _DUE:
                dirty.update(self.state.due(decider.now))
            elif isinstance(item, _Changed):
                dirty.update(item.roots)
            elif isinstance(item, Envelope):
                continue
            elif callable(item):  # from ``log``: partitions acquired or released
                item()
            elif item is _LAPSED:
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
            elif isinstance(item, _Record):
                if decider.d.touched(item.stream):
                    self._parked.append(item)  # after the stream's append in flight
                else:
                    decider.d.add(item.stream, *item.events)
                    self._records.setdefault(item.stream, []).append(item)
            elif self.owns is not None and not self._reply_owned(item):
                self.foreign_replies.append((time.monotonic(), item))  # another decides it
            else:
                self._alive(item)
                # no advance for it (but for a completion, below): the reply's events
                # change the state only once appended, and their commit marks the run
                decider.on_reply(item)  # type: ignore[arg-type]
                handled.append(item)
        # a completion decided just now lets its run go on in this same step
        dirty.update(self._root_of(t) for t in decider.d.completed)
        dirty |= related_roots(self.state, dirty)  # a child's parent, a parent's children
        # runs that moved up from the queue (one ended, or a partition came)
        dirty |= self.admission.update(self.state, self.owns, force=_TICK in items)
        for root in dirty:
            run = self.state.open.get(root)
            owned = self.owns is None or self.owns(root)
            if run is not None and owned and self.admission.admits(root):
                decider.advance(run)
        d = decider.d
        self._parked.extend(d.deferred)
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
        settle_after(self.bus, handled, d.deferred, commit if d else None)

    async def _commit(self, d: Decisions) -> None:
        """Append every stream's new events in one write, then send the logged cards.

        One ``append_many`` for the whole decision (``commit_order``): the streams it
        creates first and the parents naming them after them, so a parent never points
        at a child that does not exist. If a child cannot be created, its parent's
        events are not written either: the reply is dropped (or, for a child the log
        refused, decided again as that refusal says) and the attempt times out and is
        retried, rather than waiting forever.
        """
        streams = list(d.events)
        try:
            write = commit_order.plan_write(d, streams)
            outcomes = dict(await self._append_streams(d, write))
            second = commit_order.again(write, outcomes)
            if second is not None:  # a child that already existed held its parent back
                outcomes.update(await self._append_streams(d, second))
            held = commit_order.blocked(write, outcomes)
            for stream, error in outcomes.items():
                if stream in held:
                    self._unstorable(d, stream, held[stream])
                elif not write.is_child(stream):  # a refused child speaks through its parent
                    self._unstorable(d, stream, error)
            await self._send(d, [s for s, error in outcomes.items() if error is None])
        finally:
            self._busy.difference_update(streams)
            for stream in streams:  # the log's events for them meanwhile (see _follow_log)
                for env in self._held.pop(stream, ()):
                    self._queue.put_nowait(env)
            for stream in streams:
                self._expected.pop(stream, None)
                for rec in self._records.pop(stream, []):  # never appended (e.g. blocked)
                    if not rec.done.done():
                        rec.done.set_exception(BusError(f"not recorded on {stream}"))
            parked, self._parked = self._parked, []
            for reply in parked:
                self._queue.put_nowait(reply)
            # Not a tick: a tick looks at every open run, and this happens after
            # every commit; the clock's own ticks still catch deadlines everywhere.
            self._queue.put_nowait(_Changed(frozenset(self._root_of(s) for s in streams)))

    async def _send(self, d: Decisions, stored: list[str]) -> None:
        """Send the cards decided for the streams whose events are stored."""
        await self._send_cards([pair for s in stored for pair in d.sends.get(s, [])])

    async def _send_cards(self, cards: list[tuple[str, TaskCard]]) -> None:
        """Send ``(agent_id, card)``s; an attempt whose card could not be sent is lost (it
        times out at once and is retried: its deadline would count from a start)."""
        sends = [self.tracing.send_task(self.bus, a, card) for a, card in cards]
        if len(sends) == 1:  # the common case: no task for a gather of one
            outcomes: list[Any] = [None]
            try:
                await sends[0]
            except Exception as e:
                outcomes = [e]
        else:
            outcomes = await asyncio.gather(*sends, return_exceptions=True)
        lost = set()
        for (_, card), outcome in zip(cards, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                log.warning("send failed, the attempt is retried: %r", outcome)
                lost.add((card.task_id, card.attempt))
            elif not self.attempts_survive_restart:  # held by this process's agents
                self._sent.add((card.task_id, card.attempt))
        if len(self._sent) > 4096:
            self._sent = {key for key in self._sent if self._in_flight(*key)}
        if lost:
            self._lost_attempts = self._lost_attempts | dict.fromkeys(lost, "agent_lost")
            self._queue.put_nowait(_TICK)

    def _root_of(self, stream: str) -> str:
        task = self.state.tasks.get(stream)
        return task.created.root_id if task is not None else stream

    def _unstorable(self, d: Decisions, stream: str, error: BaseException | None) -> None:
        """A result the log refused (too large, not encodable) becomes a failed result.

        Without this the agent's answer would vanish and the attempt would only
        time out; this way the failure is recorded with its reason and retried.
        """
        reply = d.origins.get(stream)
        if isinstance(error, (ConcurrencyError, StoreUnavailable)) and reply is not None:
            # decided again (on the stream as it now is): the agent took the card, and an
            # attempt that never started waits for the queue deadline only (deadlines)
            self._parked.append(reply)
            return
        if not isinstance(error, (DecodeError, ValidationError)):
            return
        if reply is None:  # a decision of the orchestrator's own: deciding it again would loop
            self._fail_refused(stream, error)
            return
        if reply.status == "failed" and reply.output is None:
            return  # already the replacement: do not loop
        reason = f"unstorable result: {type(error).__name__}: {error}"
        self._parked.append(
            msgspec.structs.replace(
                reply,
                status="failed",
                output=None,
                error=reason[:500],
                notes="",
                supplement_inputs={},
            )
        )

    def _fail_refused(self, stream: str, error: BaseException) -> None:
        """The log refused a decision (too large, not storable): the run fails with the
        reason ``decision_unstorable`` (once) instead of the step being decided forever."""
        root = self._root_of(stream)
        if root in self._refused_runs or root not in self.state.open:
            return
        self._refused_runs.add(root)
        failed = [stream] if stream != root else []
        detail = f"the log refused the events decided for {stream}: {type(error).__name__}: {error}"
        data = ev.RunFailed(reason="decision_unstorable", failed_tasks=failed, detail=detail[:2000])
        done: asyncio.Future[list[Envelope]] = asyncio.get_running_loop().create_future()
        done.add_done_callback(lambda f: f.cancelled() or f.exception())  # nobody awaits it
        self._parked.append(_Record(root, [data], done))

    async def _append_streams(
        self, d: Decisions, write: commit_order.Write
    ) -> list[tuple[str, BaseException | None]]:
        """Append each stream's decided events in one ``append_many``; the error of each,
        or None. A stream not attempted (``PrerequisiteNotStored``) keeps its records
        waiting: ``_commit`` may write it again, and settles what it does not."""
        streams = write.streams
        if not streams:
            return []
        appends = [
            Append(
                s,
                self._new_events(d.events[s], self._decided_root(s, d.events[s])),
                self._expected.get(s, self.state.versions.get(s, 0)),
                after=after,
            )
            for s, after in zip(streams, write.after, strict=True)
        ]
        outcomes = await self.store.append_many(appends)
        out: list[tuple[str, BaseException | None]] = []
        for stream, outcome in zip(streams, outcomes, strict=True):
            if isinstance(outcome, PrerequisiteNotStored):
                log.info("%s not written: what it follows was not", stream)
                out.append((stream, outcome))
            elif isinstance(outcome, Exception):
                self._settle_records(stream, d.events[stream], outcome)
                if isinstance(outcome, ConcurrencyError):
                    for env in await self.store.read_stream(
                        stream, self.state.versions.get(stream, 0) + 1
                    ):
                        self._apply(env)
                elif isinstance(outcome, StoreUnavailable):
                    self.store_trouble.refused(outcome)
                else:
                    log.error("append to %s failed: %r", stream, outcome)
                out.append((stream, outcome))
            else:
                self.store_trouble.worked()
                for env in outcome:
                    self._apply(env)
                self._settle_records(stream, d.events[stream], None, outcome)
                out.append((stream, None))
        return out

    def _store_failed(self, error: StoreUnavailable) -> None:
        """The log refuses writes: say so once, end every wait with the error, decide no more."""
        if self.store_failure is not None:
            return
        self.store_failure = error
        log.error("the log cannot be written, the orchestrator stops deciding: %s", error)
        for waiters in self._waiters.values():
            for future in waiters:
                if not future.done():
                    future.set_exception(error)

    def _decided_root(self, stream: str, data: list[ev.Event]) -> str:
        if isinstance(data[0], ev.TaskCreated):
            return data[0].root_id
        task = self.state.tasks.get(stream)
        return task.created.root_id if task else stream

    def _settle_records(
        self,
        stream: str,
        data: list[ev.Event],
        error: BaseException | None,
        stored: Sequence[Envelope] = (),
    ) -> None:
        """Tell the requests whose events were in this append how it went; after a race,
        decide them again."""
        for rec in self._records.pop(stream, []):
            if rec.done.done():
                continue
            if isinstance(error, ConcurrencyError) and rec.tries < 5:
                rec.tries += 1
                self._parked.append(rec)  # decided again on the stream's new version
            elif error is not None:
                rec.done.set_exception(error)
            elif not all(any(e is x for x in data) for e in rec.events):
                rec.done.set_exception(BusError(f"not recorded: {stream} was halted"))
            else:
                # stored in the order decided (a backend may return decoded copies of the
                # events, so they are matched by place, not identity)
                places = [i for i, x in enumerate(data) if any(x is e for e in rec.events)]
                rec.done.set_result([stored[i] for i in places if i < len(stored)])

    async def _append(
        self,
        stream: str,
        data: Iterable[ev.Event],
        expected: int,
        root: str,
        actor: str | None = None,
    ) -> list[Envelope]:
        stored = await self.store.append(stream, self._new_events(data, root, actor), expected)
        for env in stored:
            self._apply(env)
        return stored

    def _new_events(
        self, data: Iterable[ev.Event], root: str, actor: str | None = None
    ) -> list[NewEvent]:
        """``data`` as events of run ``root``, by ``actor`` (default: the policy's)."""
        tp = self.tracing.traceparent(root)
        actor = actor or self.policy.actor
        return [NewEvent(data=x, correlation_id=root, actor=actor, traceparent=tp) for x in data]

    async def _append_folded(self, root: str, data: list[ev.Event]) -> None:
        """Append to an open run's stream at the version this orchestrator has folded; after a
        race, fold what the other writer wrote first and go on only if the run is still open.

        Never at a version read fresh from the store: that would put our event after
        events we have not folded, and the follower then skips them as already seen (a
        run another process completed meanwhile would look open here for ever).
        """
        for _ in range(5):
            if root not in self.state.open:
                return
            version = self.state.versions.get(root, 0)
            try:
                await self._append(root, data, version, root)
                return
            except ConcurrencyError:
                for env in await self.store.read_stream(root, version + 1):
                    self._apply(env)

    async def _append_at_current_version(
        self, stream: str, data: list[ev.Event], correlation_id: str
    ) -> None:
        """Append at the stream's current version, reading it again after a race (5 tries)."""
        for _ in range(5):
            try:
                await self._append(
                    stream, data, await self.store.stream_version(stream), correlation_id
                )
                return
            except ConcurrencyError:
                continue

    def _apply(self, env: Envelope) -> bool:
        """Fold ``env`` into the state; False if it was already there."""
        if not self.state.apply(env):
            return False
        if isinstance(env.data, ev.AgentRegistered):  # by another writer: await its renewal
            self.leases.unconfirm(env.data.agent_id, env.data.lease_s, time.time())
        elif isinstance(env.data, ev.AgentDeregistered):
            self.leases.forget(env.data.agent_id)
        if self.results is not None and env.stream == MEMORY_STREAM:
            self.results.apply(env)
        self._since_snapshot += 1
        self._unfolded.discard(env.position)
        self._maybe_snapshot()
        self.tracing.on_event(env)
        for observe in self.observers:
            try:
                observe(env)
            except Exception:  # an observer's bug must not stop the orchestrator
                log.exception("observer %r failed on %s", observe, env.event_id)
        if isinstance(env.data, (ev.RunCompleted, ev.RunFailed, ev.RunHalted)):
            waiters = self._waiters.pop(env.stream, None)
            if waiters:  # the result (a pass over the run's tasks) only for someone waiting
                result = self._result(env.stream)
                if result is None:  # retired as it finished (retain_finished_runs=0)
                    self._answering.add(
                        asyncio.create_task(self._answer_from_log(env.stream, waiters))
                    )
                for future in waiters:
                    if result is not None and not future.done():
                        future.set_result(result)
        return True

    async def _answer_from_log(
        self, root_id: str, waiters: list[asyncio.Future[RunResult]]
    ) -> None:
        try:
            result = await self._retired_result(root_id)
        except Exception as exc:  # the log cannot be read: the waiters learn why
            for future in waiters:
                if not future.done():
                    future.set_exception(exc)
        else:
            for future in waiters:
                if result is not None and not future.done():
                    future.set_result(result)
        finally:
            task = asyncio.current_task()
            if task is not None:
                self._answering.discard(task)

    def _result(self, root_id: str) -> RunResult | None:
        return result_of(self.state, root_id)

    # -- snapshots (see bus.orchestrator.snapshot) ---------------------------

    def _save_snapshot(self, path: Path, position: int) -> None:
        """Capture the state now (it covers the log up to ``position`` exactly), write it
        in the background."""
        self._since_snapshot = 0
        data = _snapshot.encode_state(self.state)
        runs = self.tracing._runs
        traceparents = {
            r: self.tracing.traceparent(r) if r in runs else None for r in self.state.open
        }

        async def save() -> None:
            try:
                await _snapshot.save(path, self.store, data, position, traceparents)
            except Exception as e:  # a snapshot is only a shortcut: the log has it all
                log.warning("snapshot %s not written: %s", path, e)
            finally:
                self._saving = None

        self._saving = asyncio.create_task(save(), name="orchestrator-snapshot")

    async def _final_snapshot(self, path: Path) -> None:
        """On stop: fold what the log has that the state lacks, then snapshot it all."""
        try:
            start = min(self._unfolded, default=self._followed + 1)
            end = max(self.state.position, self._followed)
            while page := await self.store.read_all(start, 5000):
                for env in page:
                    self.state.apply(env)
                start = page[-1].position + 1
                end = max(end, page[-1].position)
            self._unfolded.clear()
            self.state.position = end
            self._save_snapshot(path, end)
            if self._saving is not None:
                await self._saving
        except Exception as e:
            log.warning("snapshot %s not written: %s", path, e)

    async def _retired_result(self, root_id: str) -> RunResult | None:
        """The result of a finished run no longer kept in memory, from the log."""
        if root_id in self.state.runs:
            return None  # kept, and not finished yet
        state = RunState()
        for env in await self.store.read_correlation(root_id):
            state.apply(env)
        return result_of(state, root_id)

    def _on_refused(self, refusal: Refusal) -> None:
        """A reply or request the bus refused for its sender: recorded through the decision
        loop, on the task's stream if the task is known, else on ``agent-<sender>``."""
        known = refusal.task_id in self.state.tasks
        who = refusal.sender or refusal.claimed
        stream = refusal.task_id if known else f"agent-{who}"
        event = ev.ReplyRefused(
            kind=refusal.kind,
            claimed_agent_id=refusal.claimed,
            sender=refusal.sender,
            reason=refusal.reason[:1000],
            task_id=refusal.task_id,
            attempt=refusal.attempt,
            subject=refusal.subject[:1000],
        )
        done: asyncio.Future[list[Envelope]] = asyncio.get_running_loop().create_future()
        done.add_done_callback(_log_unrecorded)
        self._queue.put_nowait(_Record(stream, [event], done))

    def _on_bad_message(self, subject: str, data: bytes, reason: str) -> None:
        self._bad(subject, reason, logged=True)  # the bus logged and dead-lettered it

    def _bad(self, subject: str, reason: str, logged: bool = False) -> None:
        if not logged:
            log.warning("bad message on %s: %s", subject, reason)  # one line, no traceback
        self.bad_messages.append((subject, reason))
        if len(self.bad_messages) > 1000:  # a long-lived orchestrator keeps the latest
            del self.bad_messages[:500]


def _log_unrecorded(done: asyncio.Future[list[Envelope]]) -> None:
    if not done.cancelled() and done.exception() is not None:
        log.error("a refusal could not be recorded: %r", done.exception())
