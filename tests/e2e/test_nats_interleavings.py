"""Every event folded exactly once on NATS too, whatever the interleaving (invariant 10).

The harness of ``tests/interleave.py`` on a real nats-server: a run waits for approval;
its orchestrator goes; another orchestrator resumes it (``resume``), or, sharing the runs by
partition, takes its partition over when the first lets go (``takeover``: the partition's
events caught up through ``MemberLog``, then followed). Another connection answers the
approval, or cancels the run, injected at every await point of the second orchestrator's
log and bus calls (each point reached by index, and each call site at its first
occurrence). Each trial starts from an empty server (its streams and buckets deleted).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import msgspec
import nats
import pytest
from interleave import (
    BUS_METHODS,
    STORE_METHODS,
    TIMED,
    FoldLedger,
    Points,
    Trial,
    check_dispatched_once,
    check_folded_once,
    explore,
    folded_log,
    instrument,
    report,
)
from natsprocs import FAST_BUS, until
from natsserver import NatsServer

from cardbus.agents import Agent, Capability, TaskCard, TaskContext
from cardbus.bus import Plan, PlanTask, answer_approval
from cardbus.bus.orchestrator.cancel import cancel_run
from cardbus.bus.orchestrator.core import Orchestrator
from cardbus.bus.runtime.members import MemberLog
from cardbus.bus.runtime.nats import NatsRuntime
from cardbus.eventstore import EventStore
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import StoreUnavailable
from cardbus.eventstore.nats import NatsEventStore
from cardbus.eventstore.nats.connection import TRANSPORT_ERRORS, NatsOptions
from cardbus.eventstore.nats.follow import EphemeralConsumer


class Text(msgspec.Struct, frozen=True):
    text: str


class Echo(Agent):
    agent_id = "echo"
    description = "echoes"
    capabilities = [Capability("echo", Text, Text, "echo")]

    async def handle(self, task: TaskCard, inputs: Text, ctx: TaskContext) -> Text:
        return inputs


PARTITIONS = 2
# what a partitioned member reads the log through (``Orchestrator.log``)
MEMBER_LOG_METHODS = ("_read", "read_all", "last_position", "read_last", "read_correlation")
Write = Callable[[EventStore, str, str], Awaitable[object]]


async def _approve(store: EventStore, root: str, gate: str) -> object:
    return await answer_approval(store, gate, True, by="alice")


async def _cancel(store: EventStore, root: str, gate: str) -> object:
    return await cancel_run(store, root, by="bob")


WRITES: dict[str, Write] = {"approve": _approve, "cancel": _cancel}


async def _empty(url: str) -> None:
    """Delete every stream (the log, the bus's, the lease bucket): a trial of its own."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        for info in await js.streams_info():
            await js.delete_stream(info.config.name)
    finally:
        await nc.close()


def _runtime(url: str, member: str | None) -> NatsRuntime:
    shared = {"partitions": PARTITIONS, "partition_lease_s": 2.0} if member else {}
    return NatsRuntime(
        NatsOptions(url=url),
        [Echo],
        bus_options=FAST_BUS,
        name=member or "orchestrator",
        member=member,
        **shared,  # type: ignore[arg-type]
    )


async def _trial(points: Points, url: str, write: Write, takeover: bool) -> Trial:
    await _empty(url)
    first = _runtime(url, "a" if takeover else None)
    await first.__aenter__()
    try:
        if takeover:  # "a" holds every partition: the run is placed in one of them
            partitions = first.partitions
            assert partitions is not None
            await until(lambda: len(partitions.held) == PARTITIONS, what="a holds all")
        gated = PlanTask(id="gate", capability="echo", inputs={"text": "x"}, requires_approval=True)
        root = await first.submit(Plan(tasks=[gated], goal="wait for a person"))
        gate = f"gate-{root[-12:]}"

        async def asked() -> bool:
            events = await first.store.read_stream(gate)
            return any(isinstance(e.data, ev.ApprovalRequested) for e in events)

        await until(asked, what="approval requested")
    finally:
        if takeover:  # "a" stops deciding (its process hangs) but holds its leases
            await first.orchestrator.stop()
        else:
            await first.__aexit__(None, None, None)
    foreign = await NatsEventStore.connect(url)
    points.inject = lambda: write(foreign, root, gate)
    second = _runtime(url, "b" if takeover else None)
    problems: list[str] = []
    ledger = FoldLedger()
    try:
        await points.before_start()
        # the second's orchestrator is made in its __aenter__: its fold counted from there
        with _watching_orchestrators(ledger, points):
            await second.__aenter__()
        if takeover:  # "a" lets go of its partitions: "b" catches them up and decides
            await first.__aexit__(None, None, None)
            member_log = second.member_log
            assert member_log is not None
            await until(lambda: len(member_log.folded) == PARTITIONS, what="b folds all")
        await points.when_idle()
        try:
            result = await second.orchestrator.wait(root, 15)
            end: tuple[str, ...] = (result.status, result.reason)
        except TimeoutError:
            end = ("still waiting",)
        log = await folded_log(foreign, second.orchestrator)
        problems += check_folded_once(ledger, log)
        problems += check_dispatched_once(log)
    finally:
        points.active = False
        with contextlib.suppress(Exception):
            await second.__aexit__(None, None, None)
        if takeover:
            with contextlib.suppress(Exception):
                await first.__aexit__(None, None, None)
        await foreign.close()
    return Trial(end, points, problems)


@contextlib.contextmanager
def _watching_orchestrators(ledger: FoldLedger, points: Points):  # type: ignore[no-untyped-def]
    """The orchestrator a runtime makes while this is open has its folds counted and its
    store's and bus's awaits made points, and so has the member log it reads the log
    through (the runtime makes them in its ``__aenter__``)."""
    made, member_made = Orchestrator.__init__, MemberLog.__init__

    def init(self: Orchestrator, *args, **kw) -> None:  # type: ignore[no-untyped-def]
        made(self, *args, **kw)
        ledger.watch(self.state)
        instrument(self.store, points, STORE_METHODS)  # the runtime's own, as it made it
        instrument(self.bus, points, BUS_METHODS)

    def member_init(self: MemberLog, *args, **kw) -> None:  # type: ignore[no-untyped-def]
        member_made(self, *args, **kw)  # a partition's catch-up and follow: points too
        instrument(self, points, MEMBER_LOG_METHODS)

    Orchestrator.__init__ = init  # type: ignore[method-assign]
    MemberLog.__init__ = member_init  # type: ignore[method-assign]
    try:
        yield
    finally:
        Orchestrator.__init__ = made  # type: ignore[method-assign]
        MemberLog.__init__ = member_made  # type: ignore[method-assign]


@pytest.mark.parametrize(
    ("write", "takeover"), [("approve", False), ("cancel", False), ("approve", True)]
)
async def test_a_write_at_any_await_point_on_nats_is_folded_once(
    nats_server: NatsServer, write: str, takeover: bool
) -> None:
    async def scenario(points: Points) -> Trial:
        return await _trial(points, nats_server.url, WRITES[write], takeover)

    reference, trials = await explore(scenario, seed=3)
    problems, injected, reached = report(reference, trials)
    print(f"{len(trials)} trials, written at {len(injected)} call sites: {sorted(injected)}")
    print(f"  timed sites reached, not written at: {sorted(reached - injected)}")
    assert not problems, "\n".join(problems)
    assert reference.end[0] in ("completed", "failed", "cancelled"), reference.end
    assert not reached - injected - TIMED, sorted(reached - injected)
    assert any(n.startswith("_started/") for n in injected), sorted(injected)


async def _patient(write: Write) -> Write:
    """``write`` as a person retries it while the server is away (``cardbus approve``
    says the log is unavailable, and is run again)."""

    async def again(store: EventStore, root: str, gate: str) -> object:
        for _ in range(200):
            try:
                return await write(store, root, gate)
            except (StoreUnavailable, *TRANSPORT_ERRORS):
                await asyncio.sleep(0.05)
        return await write(store, root, gate)

    return again


async def _reconnect_trial(points: Points, server: NatsServer, write: Write) -> Trial:
    """The follow path across a reconnection: the server restarts while the run waits;
    the write comes at any point of the orchestrator's reconnection and re-reading."""
    url = server.url
    await _empty(url)
    foreign = await NatsEventStore.connect(url)
    runtime = _runtime(url, None)
    ledger = FoldLedger()
    problems: list[str] = []
    points.active = False
    with _watching_orchestrators(ledger, points):
        await runtime.__aenter__()
    # the follower's reader: its consumer made again and its pulls after the reconnection
    follower = contextlib.ExitStack()
    follower.enter_context(_class_points(EphemeralConsumer, points, ("open", "_next_request")))
    instrument(runtime.store, points, ("_read", "_read_direct"))
    try:
        gated = PlanTask(id="gate", capability="echo", inputs={"text": "x"}, requires_approval=True)
        root = await runtime.submit(Plan(tasks=[gated], goal="wait for a person"))
        gate = f"gate-{root[-12:]}"

        async def asked() -> bool:
            events = await foreign.read_stream(gate)
            return any(isinstance(e.data, ev.ApprovalRequested) for e in events)

        await until(asked, what="approval requested")
        points.inject = lambda: write(foreign, root, gate)
        points.active = True
        await points.before_start()
        await asyncio.to_thread(server.restart)
        # idle only once the follower had time to look again after the reconnection (it
        # reads what it missed within its heartbeat, 1 s): that read is a point to write at
        await points.when_idle(quiet_s=0.2, not_before_s=2.5 * runtime.store.heartbeat)
        try:
            result = await runtime.orchestrator.wait(root, 20)
            end: tuple[str, ...] = (result.status, result.reason)
        except TimeoutError:
            end = ("still waiting",)
        log = await folded_log(foreign, runtime.orchestrator)
        problems += check_folded_once(ledger, log)
        problems += check_dispatched_once(log)
    finally:
        points.active = False
        follower.close()
        with contextlib.suppress(Exception):
            await runtime.__aexit__(None, None, None)
        await foreign.close()
    return Trial(end, points, problems)


@contextlib.contextmanager
def _class_points(cls: type, points: Points, methods: tuple[str, ...]):  # type: ignore[no-untyped-def]
    """Every instance's ``methods`` of ``cls`` are await points while this is open."""
    originals = {m: cls.__dict__[m] for m in methods}
    for name, fn in originals.items():

        def wrap(fn=fn, name=name):  # type: ignore[no-untyped-def]
            async def at_point(self, *args, **kw):  # type: ignore[no-untyped-def]
                await points.point(name)
                return await fn(self, *args, **kw)

            return at_point

        setattr(cls, name, wrap())
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(cls, name, fn)


@pytest.mark.parametrize("write", ["approve", "cancel"])
async def test_a_write_at_any_await_point_of_a_reconnection_is_folded_once(
    nats_server: NatsServer, write: str
) -> None:
    patient = await _patient(WRITES[write])

    async def scenario(points: Points) -> Trial:
        return await _reconnect_trial(points, nats_server, patient)

    reference, trials = await explore(scenario, seed=5, by_site_only=True)
    problems, injected, reached = report(reference, trials)
    print(f"{len(trials)} trials, written at {len(injected)} call sites: {sorted(injected)}")
    print(f"  timed sites reached, not written at: {sorted(reached - injected)}")
    assert not problems, "\n".join(problems)
    assert reference.end[0] in ("completed", "failed", "cancelled"), reference.end
    assert not reached - injected - TIMED, sorted(reached - injected)
