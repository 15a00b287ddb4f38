"""``MemberLog.observe``: which runs created here a partitioned member drops from its
state once folded, and which it keeps.

The race these pin (seen under load in ``test_an_agents_request_is_answered_by_its_runs_
member``: a run stayed at its creation, its waiter unanswered): a member that has just
been given a partition (leased, ``want``) is still catching it up (not ``following``
yet) when a submit places a run there (``local_runs``). The run's events are folded at
once; the follower's catch-up then drops its copy of them (folded already); if the
decision loop dropped the run only after that (its step busy meanwhile, the drop queued
before the partition's marker), the run was known to nobody and never decided. The
orchestrator here is a stand-in: what matters is what ``observe`` and ``hold`` queue,
and what that does when the decision loop runs it, before the catch-up's marker.

And ``route``: a request for a run another member decides is answered by that member,
on a real nats-server.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import nats
import pytest
from memberkit import root_in
from natsserver import NatsServer

from cardbus.agents.requests import AgentRequest, AgentResponse
from cardbus.bus.runtime import members
from cardbus.bus.runtime.members import MemberLog
from cardbus.eventstore import Envelope, new_id
from cardbus.eventstore import events as ev

PARTITIONS = 8


class _Store:
    partitions = PARTITIONS


class _State:
    def __init__(self) -> None:
        self.forgotten: list[str] = []
        self.runs: dict[str, Any] = {}

    def forget(self, root_id: str) -> None:
        self.forgotten.append(root_id)


class _Orchestrator:
    """What ``MemberLog`` uses of it: ``later`` (queued for the decision loop) and the state."""

    def __init__(self) -> None:
        self.state = _State()
        self._waiters: dict[str, Any] = {}
        self.queued: list[Callable[[], None]] = []

    def later(self, fn: Callable[[], None]) -> None:
        self.queued.append(fn)

    def step(self) -> None:
        """The decision loop's next step: what was queued, in order."""
        queued, self.queued = self.queued, []
        for fn in queued:
            fn()


def _member() -> tuple[MemberLog, _Orchestrator]:
    m = MemberLog(_Store())  # type: ignore[arg-type]
    o = _Orchestrator()
    m.orchestrator = o  # type: ignore[assignment]
    return m, o


def _started(root: str) -> Envelope:
    return Envelope(
        event_id=new_id(),
        stream=root,
        version=1,
        recorded_at=0.0,
        correlation_id=root,
        data=ev.RunStarted(goal="g", plan_id="p"),
        position=5,
    )


def test_a_run_created_in_a_partition_still_being_caught_up_is_kept() -> None:
    m, o = _member()
    m.hold([3])  # leased here; its catch-up not done (not followed, not folded)
    root = root_in(3)
    m.observe(_started(root))
    o.step()  # the decision loop gets to it before the partition's marker
    assert o.state.forgotten == []
    # the marker then makes the partition folded, and the run is decided here
    m.following = m.want
    m._acquired(frozenset([3]))
    assert m.folds(root)


def test_a_run_created_in_another_members_partition_is_dropped() -> None:
    m, o = _member()
    m.hold([3])
    m.following = m.folded = m.want
    root = root_in(4)
    m.observe(_started(root))
    o.step()
    assert o.state.forgotten == [root]


def test_a_run_kept_for_a_partition_let_go_before_it_was_followed_is_dropped() -> None:
    m, o = _member()
    m.hold([3])
    root = root_in(3)
    m.observe(_started(root))
    o.state.runs[root] = object()
    o.step()
    assert o.state.forgotten == []
    m.hold([])  # the lease lost before the follower caught the partition up
    o.step()
    assert o.state.forgotten == [root]


def test_a_partition_let_go_and_taken_again_before_the_step_keeps_its_runs() -> None:
    m, o = _member()
    m.hold([3])
    root = root_in(3)
    m.observe(_started(root))
    o.state.runs[root] = object()
    m.hold([])
    m.hold([3])  # taken again before the decision loop got to it
    o.step()
    assert o.state.forgotten == []


# -- an agent's request for a run another member decides (``MemberLog.route``) ------------


def _request(root: str) -> AgentRequest:
    return AgentRequest(
        request_id=new_id(), task_id="t", root_id=root, attempt=1, agent_id="x", kind="tool"
    )


async def test_a_handed_request_gets_its_members_answer_however_long_its_work_takes(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The member deciding the run takes longer than a partition may be without an owner
    (a slow tool call): its answer is the one returned. The member that received the
    request does not answer it itself: it does not know the run, so it would refuse it as
    ``unknown_task`` and record that on a task the other member writes."""
    monkeypatch.setattr(members, "_HAND_S", 0.2)
    p = 3
    here: list[AgentRequest] = []

    async def owner_answers(req: AgentRequest) -> AgentResponse:
        await asyncio.sleep(0.8)  # longer than _HAND_S
        return AgentResponse(request_id=req.request_id, ok=True, result="from the owner")

    async def answered_here(req: AgentRequest) -> AgentResponse:
        here.append(req)
        return AgentResponse(request_id=req.request_id, ok=False, error_type="access_denied")

    nc_owner, nc_other = await nats.connect(nats_server.url), await nats.connect(nats_server.url)
    owner, _ = _member()
    other, _ = _member()
    try:
        owner.folded = frozenset({p})
        owner.route(owner_answers, nc_owner)
        assert owner._syncing is not None
        await owner._syncing  # it serves p's handed-over requests
        await nc_owner.flush()
        handle = other.route(answered_here, nc_other)
        response = await handle(_request(root_in(p)))
        assert (response.ok, response.result) == (True, "from the owner")
        assert here == [] and other.handed_over == 1
        # nobody serves partition 5: "unavailable" once _HAND_S is up, nothing done here
        response = await handle(_request(root_in(5)))
        assert (response.ok, response.error_type) == (False, "unavailable")
        assert response.error is not None and "partition 5" in response.error
        assert here == []
    finally:
        await owner.close()
        await other.close()
        await nc_owner.close()
        await nc_other.close()


async def test_a_member_that_let_the_partition_go_passes_requests_on_and_none_is_done_twice(
    nats_server: NatsServer,
) -> None:
    """A partition passing from one member to the next: for a moment both serve its
    handed-over requests. Each is taken by one of them (a queue group); the one that let
    the partition go does nothing and says so, and the request is asked again."""
    p = 3
    done: Counter[str] = Counter()

    def answering(who: str, pause: float = 0.0) -> Callable[[AgentRequest], Any]:
        async def answer(req: AgentRequest) -> AgentResponse:
            done[who] += 1
            await asyncio.sleep(pause)
            return AgentResponse(request_id=req.request_id, ok=True, result=who)

        return answer

    conns = [await nats.connect(nats_server.url) for _ in range(3)]
    (owner, _), (gone, _), (other, _) = _member(), _member(), _member()
    try:
        for m, nc, who in ((owner, conns[0], "owner"), (gone, conns[1], "gone")):
            m.folded = frozenset({p})
            m.route(answering(who, 0.05), nc)
            assert m._syncing is not None
            await m._syncing
            await nc.flush()
        gone.folded = frozenset()  # let go: its subscription not dropped yet
        handle = other.route(answering("here"), conns[2])
        responses = [await handle(_request(root_in(p))) for _ in range(12)]
        assert [r.result for r in responses] == ["owner"] * 12
        assert done == Counter(owner=12)
    finally:
        for m in (owner, gone, other):
            await m.close()
        for nc in conns:
            await nc.close()
