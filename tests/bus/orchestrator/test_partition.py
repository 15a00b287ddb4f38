"""Run ownership by partition leases in a NATS KV bucket (``bus.orchestrator.partition``):
settings checked, one holder per partition at any instant, a dead member's partitions
taken over after the lease, a stopping member's at once."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from natsserver import NatsServer

from cardbus.bus.orchestrator.partition import Partitions, check_settings, partition_of
from cardbus.bus.runtime.nats import NatsRuntime
from cardbus.eventstore.errors import ConfigError
from cardbus.eventstore.nats.connection import NatsOptions


@pytest.mark.parametrize(
    ("partitions", "lease_s", "member"),
    [
        (0, 6.0, None),
        (-3, 6.0, None),
        (True, 6.0, None),
        ("8", 6.0, None),
        (5000, 6.0, None),
        (8, 0.0, None),
        (8, -1.0, None),
        (8, math.nan, None),
        (8, math.inf, None),
        (8, "6", None),
        (8, 6.0, "a.b"),
        (8, 6.0, ""),
        (8, 6.0, "x" * 65),
    ],
)
def test_bad_settings_are_config_errors(
    partitions: object, lease_s: object, member: object
) -> None:
    with pytest.raises(ConfigError):
        check_settings(partitions, lease_s, member)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):  # at construction, before any connection
        NatsRuntime(
            NatsOptions(url="nats://127.0.0.1:1"),
            partitions=partitions,  # type: ignore[arg-type]
            partition_lease_s=lease_s,  # type: ignore[arg-type]
            member=member,  # type: ignore[arg-type]
        )


def test_partition_of_is_stable_and_spread() -> None:
    roots = [f"0190-{i:08d}" for i in range(4000)]
    counts = [0] * 8
    for r in roots:
        counts[partition_of(r, 8)] += 1
    assert partition_of("some-root", 8) == partition_of("some-root", 8)
    assert min(counts) > 350  # about 500 each: no partition left empty or overloaded


@pytest.fixture
async def connections(nats_server: NatsServer) -> AsyncIterator[list[Client]]:
    ncs = [await nats.connect(nats_server.url) for _ in range(5)]
    yield ncs
    for nc in ncs:
        with contextlib.suppress(Exception):
            await nc.close()


async def test_a_bucket_with_other_settings_is_refused(connections: list[Client]) -> None:
    a = Partitions(connections[0].jetstream(), 8, 2.0, member="a")
    await a.start()
    try:
        for count, lease in [(16, 2.0), (8, 3.0)]:
            other = Partitions(connections[1].jetstream(), count, lease, member="b")
            with pytest.raises(ConfigError, match="same partitions"):
                await other.start()
        same = Partitions(connections[1].jetstream(), 8, 2.0, member="c")
        await same.start()  # the same settings join
        await same.stop()
    finally:
        await a.stop()


async def test_a_round_called_during_another_waits_for_it_and_forgets_nothing(
    connections: list[Client],
) -> None:
    """Two rounds of one member at once (its renewal loop's and a caller's): the second
    waits for the first, so each lease is renewed once and none is forgotten (raced, the
    second would update at the revision the first just replaced, fail, and drop it)."""
    a = Partitions(connections[0].jetstream(), 8, 2.0, member="a")
    await a.start()
    try:
        assert len(a.held) == 8  # alone: everything
        kv = await connections[1].jetstream().key_value("cardbus-owners")
        before = {p: (await kv.get(f"p.{p}")).revision for p in range(8)}
        assert a._loop is not None
        a._loop.cancel()  # only the rounds below
        await asyncio.gather(a.round(), a.round(), a.round())
        assert a.holding == frozenset(range(8)) and len(a.held) == 8
        after = {p: (await kv.get(f"p.{p}")).revision for p in range(8)}
        assert all(after[p] > before[p] for p in range(8))  # renewed
        assert a._revision == after  # at the revision the bucket has: one renewal each
    finally:
        await a.stop()


def _check_disjoint(members: list[Partitions]) -> None:
    seen: dict[int, str] = {}
    for m in members:
        for p in m.held:
            assert p not in seen, f"partition {p} held by {seen[p]} and {m.member}"
            seen[p] = m.member


#: renewal periods (a third of the lease each) the members get to settle after the churn:
#: three for any key left by a dead member to expire, three more for the members' own keys
#: (the share they count) to agree, and the rounds that take what is free
SETTLE_PERIODS = 12


async def _holders(kv: Any, members: list[Partitions]) -> dict[int, str]:
    """Each partition whose key names a member that holds its lease, and no other does."""
    found = await asyncio.gather(*(kv.get(f"p.{p}") for p in range(8)), return_exceptions=True)
    holders = {}
    for p, entry in enumerate(found):
        believers = [m.member for m in members if p in m.holding]
        if not isinstance(entry, BaseException) and [entry.value.decode()] == believers:
            holders[p] = believers[0]
    return holders


async def test_a_partition_is_never_held_by_two(connections: list[Client]) -> None:
    """Five members race for eight partitions over many rounds, members dying (no release)
    and stopping (release) and joining again; at every instant sampled no partition is
    held by two, and the holders' belief agrees with the bucket.

    The lease is 2 s, not 1: settling needs every holder to renew within its lease. Beside
    busy loops this test ran into pytest's 120 s limit: the test's own rounds overlapped
    each member's background round, and an overlapped round forgot leases it held (its
    update at the revision the other round had just replaced failed), so partitions kept
    lapsing; and "settled" was read from ``held``, which a lease lapsing for a moment under
    load empties, with a 60 s deadline. A member's round now waits for the one under way
    instead of racing it, and settling is judged on the bucket within a number of renewal
    periods."""
    lease = 2.0
    members = [
        Partitions(nc.jetstream(), 8, lease, member=f"m{i}") for i, nc in enumerate(connections)
    ]
    await asyncio.gather(*(m.start() for m in members))
    problems: list[str] = []
    running = True

    async def sample() -> None:
        while running:
            try:
                _check_disjoint(members)
            except AssertionError as e:
                problems.append(str(e))
            await asyncio.sleep(0.003)

    sampler = asyncio.create_task(sample())
    try:
        for turn in range(6):
            # every member's rounds at once, several times: creates and updates collide
            for _ in range(3):
                await asyncio.gather(*(m.round() for m in members))
            victim = members[turn % len(members)]
            if turn % 2:  # dies: stops renewing, keeps its keys until they expire
                assert victim._loop is not None
                victim._loop.cancel()
                victim._loop = None
                await asyncio.sleep(lease * 1.2)  # its leases lapse, on the server too
                assert not victim.held
                victim._revision.clear()
                victim._until.clear()
            else:  # stops: gives its keys back
                await victim.stop()
            await asyncio.gather(*(m.round() for m in members if m is not victim))
            victim._loop = asyncio.create_task(victim._renew())  # joins again
        # settled: every partition has one holder, and the bucket names it. Judged on the
        # bucket and the members' leases, not on a clock: under load a lease may lapse here
        # between two rounds (``held`` empties for a moment) and the next round renews it.
        # Bounded by renewal periods, not seconds: a dead member's keys expire within one
        # lease (three periods), a member key as well, then a round takes what is free.
        kv = await connections[0].jetstream().key_value("cardbus-owners")
        holders: dict[int, str] = {}
        for _ in range(SETTLE_PERIODS):
            await asyncio.gather(*(m.round() for m in members))
            holders = await _holders(kv, members)
            if len(holders) == 8:
                break
            await asyncio.sleep(lease / 3)  # one renewal period: the members' own pace
        assert len(holders) == 8, (holders, [sorted(m.holding) for m in members])
    finally:
        running = False
        await sampler
        await asyncio.gather(*(m.stop() for m in members), return_exceptions=True)
    assert problems == []


async def test_a_dead_members_partitions_are_taken_over_after_the_lease(
    connections: list[Client],
) -> None:
    lease = 1.0
    acquired = itertools.count()
    a = Partitions(connections[0].jetstream(), 8, lease, member="a")
    b = Partitions(
        connections[1].jetstream(), 8, lease, member="b", on_acquired=lambda: next(acquired)
    )
    await a.start()
    assert len(a.held) == 8  # alone: everything
    await b.start()
    try:
        deadline = time.monotonic() + 20
        while not (len(a.held) == 4 and len(b.held) == 4):  # a gives half away
            assert time.monotonic() < deadline, (sorted(a.held), sorted(b.held))
            await asyncio.sleep(0.05)
        assert a.held.isdisjoint(b.held)
        before = next(acquired)
        root = next(f"r{i}" for i in itertools.count() if a.owns(f"r{i}"))
        assert not b.owns(root)
        await connections[0].close()  # a dies: no release, no renewal
        while not b.owns(root):
            assert time.monotonic() < deadline + 20, sorted(b.held)
            await asyncio.sleep(0.05)
        assert not a.owns(root)  # its own belief lapsed with the lease
        while len(b.held) < 8:
            assert time.monotonic() < deadline + 20, sorted(b.held)
            await asyncio.sleep(0.05)
        assert next(acquired) > before  # the orchestrator was told to look again
    finally:
        await b.stop()


def test_held_replies_are_offered_once_owned_and_only_if_unrecorded() -> None:
    from types import SimpleNamespace

    from cardbus.agents.cards import ResultCard, Started
    from cardbus.bus.orchestrator.partition import sort_held_replies
    from cardbus.eventstore import TaskState

    def task(root: str, state: TaskState, attempt: int = 1, **kw: object) -> SimpleNamespace:
        fields = {"settled": set(), "results": {}, **kw}
        return SimpleNamespace(
            created=SimpleNamespace(root_id=root), state=state, attempt=attempt, **fields
        )

    tasks = {
        "open": task("mine", TaskState.RUNNING),
        "dispatched": task("mine", TaskState.DISPATCHED),
        "recorded": task("mine", TaskState.RUNNING, results={"ag": object()}),
        "settled": task("mine", TaskState.RUNNING, settled={1}),
        "done": task("mine", TaskState.COMPLETED),
        "retried": task("mine", TaskState.DISPATCHED, attempt=2),
        "theirs": task("other", TaskState.RUNNING),
    }

    def result(task_id: str) -> ResultCard:
        return ResultCard(task_id=task_id, agent_id="ag", attempt=1, status="completed")

    started_running = Started(task_id="open", agent_id="ag", attempt=1)
    started_dispatched = Started(task_id="dispatched", agent_id="ag", attempt=1)
    held = [(10.0, result(t)) for t in tasks] + [
        (10.0, started_running),
        (10.0, started_dispatched),
        (1.0, result("open")),  # too old
        (10.0, result("unknown")),
    ]
    keep, offer = sort_held_replies(held, tasks, lambda root: root == "mine", since=5.0)
    # not ours yet, or not folded here yet (a partition being caught up): held on
    assert [r.task_id for _, r in keep] == ["theirs", "unknown"]
    assert offer == [result("open"), result("dispatched"), started_dispatched]


async def test_a_lease_renewed_after_it_lapsed_here_counts_as_acquired(
    connections: list[Client],
) -> None:
    """A late round (the process stalled): the replies held meanwhile must be offered
    again, so the renewal tells the orchestrator as an acquisition does."""
    woken = itertools.count()
    a = Partitions(connections[0].jetstream(), 4, 30.0, member="a", on_acquired=lambda: next(woken))
    await a.start()
    try:
        assert len(a.held) == 4
        before = next(woken)
        await a.round()  # renewed in time: nothing new
        assert next(woken) == before + 1
        a._until = dict.fromkeys(a._until, 0.0)  # as if the renewals came too late here
        assert not a.held and not a.owns("any root")
        await a.round()
        assert len(a.held) == 4
        assert next(woken) == before + 3  # one wake for the lapsed leases renewed
    finally:
        await a.stop()


async def test_a_rounds_renewals_go_as_one_batch_and_one_by_one_when_refused(
    connections: list[Client],
) -> None:
    """The renewals of a round are one atomic batch (one ack, each key still checked at
    its revision): a key taken meanwhile refuses the whole batch, nothing of it is
    stored, and the round renews the others one by one and forgets that one."""
    a = Partitions(connections[0].jetstream(), 4, 30.0, member="a")
    await a.start()
    try:
        assert a._atomic and len(a.held) == 4
        kv = await connections[1].jetstream().key_value("cardbus-owners")
        await a.round()
        after = {p: (await kv.get(f"p.{p}")).revision for p in range(4)}
        assert a._revision == after
        # stored in one piece: the batch's revisions follow one another
        assert sorted(after.values()) == list(range(min(after.values()), min(after.values()) + 4))
        taken = await kv.update("p.2", b"b", last=after[2])  # another member has it now
        await a.round()
        assert a.holding == frozenset({0, 1, 3}) and 2 not in a.held
        assert (await kv.get("p.2")).revision == taken  # the refused batch stored nothing
        now = {p: (await kv.get(f"p.{p}")).revision for p in (0, 1, 3)}
        assert all(now[p] > after[p] for p in now) and a._revision == now
    finally:
        await a.stop()


async def test_a_stopped_member_is_counted_out_by_its_keys_subject(
    connections: list[Client],
) -> None:
    """A stopping member purges its member key: the next round of another counts one
    member fewer and takes the whole share back."""
    a = Partitions(connections[0].jetstream(), 8, 30.0, member="a")
    b = Partitions(connections[1].jetstream(), 8, 30.0, member="b")
    await a.start()
    await b.start()
    try:
        await a.round()  # over its share now: four go
        await b.round()
        assert a.members == b.members == 2 and len(a.held) == len(b.held) == 4
        await b.stop()
        await a.round()
        assert a.members == 1 and len(a.held) == 8
    finally:
        await a.stop()


async def test_a_member_alone_counts_the_members_only_when_the_bucket_changed(
    connections: list[Client],
) -> None:
    """Alone, a round's batch stored right after what the latest count saw means nothing
    else was written: no count (a stream info each round was a third of an idle member's
    round). A member joining writes its key: the next round counts it and gives half away."""
    js = connections[0].jetstream()
    infos = 0
    stream_info = js.stream_info

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal infos
        infos += 1
        return await stream_info(*args, **kwargs)

    js.stream_info = counted  # type: ignore[method-assign]
    a = Partitions(js, 8, 30.0, member="a")
    await a.start()
    try:
        assert a._atomic and len(a.held) == 8
        await a.round()  # (its first round's creates were stored after its count)
        infos = 0
        for _ in range(5):
            await a.round()
        assert infos == 0 and a.members == 1 and len(a.held) == 8
        b = Partitions(connections[1].jetstream(), 8, 30.0, member="b")
        await b.start()
        try:
            await a.round()
            assert infos == 1 and a.members == 2 and len(a.held) == 4
            await b.round()
            assert len(b.held) == 4 and a.held.isdisjoint(b.held)
            await a.round()  # with another member, every round counts
            assert infos == 2 and a.members == 2
        finally:
            await b.stop()
        await a.round()
        assert a.members == 1 and len(a.held) == 8
    finally:
        await a.stop()


async def test_a_joiner_killed_after_a_member_counted_alone_has_its_partitions_taken_back(
    connections: list[Client],
) -> None:
    """The member alone that stopped counting counts again once another joins, so that
    one's death is seen: its keys lapse and everything comes back, as with two all along."""
    lease = 1.0
    a = Partitions(connections[0].jetstream(), 8, lease, member="a")
    await a.start()
    try:
        for _ in range(3):
            await a.round()  # alone: counting only when the bucket changed
        b = Partitions(connections[1].jetstream(), 8, lease, member="b")
        await b.start()
        deadline = time.monotonic() + 20
        while not (len(a.held) == 4 and len(b.held) == 4):
            assert time.monotonic() < deadline, (sorted(a.held), sorted(b.held))
            await asyncio.sleep(0.05)
        assert a.members == 2
        b._loop.cancel()  # type: ignore[union-attr]
        await connections[1].close()  # b dies: no release, no renewal
        while len(a.held) < 8:
            assert time.monotonic() < deadline + 20, sorted(a.held)
            await asyncio.sleep(0.05)
        assert a.members == 1
    finally:
        await a.stop()
