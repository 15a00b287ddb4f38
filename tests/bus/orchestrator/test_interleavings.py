"""Every event is folded exactly once whatever other writers do and whenever (invariant 10).

A run waits for a person (a task under approval, and in one scenario a task of a process that
died in flight); its orchestrator process is gone. A new orchestrator starts on the same
SQLite file and resumes it, while another process (a second connection to the file) answers
the approval, denies it, cancels the run or writes an event of its own, injected at every
await point of the start-up, the resume, the follower and the decisions that follow
(``tests/interleave.py``). The run cannot end without that write, so every trial must end as
it ends when the write comes first; every event of the log must be folded once, and no
attempt dispatched twice.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
import pytest
from interleave import TIMED, Points, Trial, explore, folded_log, report
from orchkit import FAST, TextOut, make_agent, plan, task, tid, wait_for
from resumekit import LogTrial, copy_log, trial_folder

from cardbus.agents.cards import AgentConstraints
from cardbus.agents.tools import Tool, ToolRegistry
from cardbus.bus import InProcessBus, Orchestrator, answer_approval
from cardbus.bus.orchestrator.cancel import cancel_run
from cardbus.bus.orchestrator.reviews import answer_review
from cardbus.bus.orchestrator.scheduler import Scheduler, create_schedule
from cardbus.bus.orchestrator.schedules import fold, plan_id_of, stream_of
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.bus.runtime.worker import AgentWorker
from cardbus.eventstore import ConcurrencyError, Envelope, NewEvent, SqliteEventStore
from cardbus.eventstore import events as ev

SLOW = make_agent("slow", "slow")
ECHO = make_agent("echo")

# the foreign writes: (name, write(foreign store, root, gate))
Write = Callable[[SqliteEventStore, str, str], Awaitable[object]]


async def _approve(store: SqliteEventStore, root: str, gate: str) -> object:
    return await answer_approval(store, gate, True, by="alice")


async def _deny(store: SqliteEventStore, root: str, gate: str) -> object:
    return await answer_approval(store, gate, False, by="alice")


async def _cancel(store: SqliteEventStore, root: str, gate: str) -> object:
    return await cancel_run(store, root, by="bob")


async def _another_member_then_approve(store: SqliteEventStore, root: str, gate: str) -> object:
    """Another orchestrator's start (its own stream), then the approval."""
    other = ev.OrchestratorStarted(orchestrator_id="other", resumed=[], host="h", pid=1)
    await store.append("orchestrator-other", [NewEvent(data=other, correlation_id="x")], 0)
    return await answer_approval(store, gate, True, by="alice")


WRITES: dict[str, Write] = {
    "approve": _approve,
    "deny": _deny,
    "cancel": _cancel,
    "member+approve": _another_member_then_approve,
}


async def _waiting_run(
    folder: Path, in_flight: bool, snapshot: bool, waits: dict | None = None
) -> tuple[Path, str, str]:
    """A log whose run waits for approval of ``gate`` (and, ``in_flight``, has a task of
    the dead process in flight); its process died (no give-back, and a final snapshot only
    with ``snapshot``). ``waits``: the plan's wait policies (deadlines)."""
    folder.mkdir()
    db = folder / "cardbus.db"
    store = await SqliteEventStore.open(db, poll_interval=0.01)
    bus = InProcessBus()
    orch = Orchestrator(store, bus, FAST, snapshot=db.with_suffix(".db.snap") if snapshot else None)
    orch.attempts_survive_restart = False
    hold = asyncio.Event()

    async def slow(task_card, inputs, ctx):  # type: ignore[no-untyped-def]
        await hold.wait()

    slow_agent = make_agent("slow", "slow", slow)
    workers = [AgentWorker(bus, a) for a in (ECHO, slow_agent)]
    await orch.start([w.agent.card() for w in workers])
    for w in workers:
        await w.start()
    tasks = [task("gate", requires_approval=True), task("after", deps=["gate"])]
    if in_flight:
        tasks.append(task("slow", "slow", timeout_s=30.0))
    root = await orch.submit(plan(*tasks, waits=waits or {}))
    gate = tid(root, "gate")
    await wait_for(store, lambda e: isinstance(e.data, ev.ApprovalRequested))
    if in_flight:
        await wait_for(store, lambda e: isinstance(e.data, ev.TaskStarted))
    await orch.stop(give_back=False)  # as a process that dies
    await bus.close()
    hold.set()
    await store.close()
    return db, root, gate


async def _resume(
    points: Points,
    db: Path,
    root: str,
    gate: str,
    write: Write,
    check: Callable[[list[Envelope]], list[str]] | None = None,
) -> Trial:
    """One trial: a new orchestrator resumes the run on a copy of ``db``; ``write`` comes
    from another connection at the point ``points`` says. ``check``: more problems, found
    in the log the trial ends with."""
    db = copy_log(db)
    snapshot = db.with_suffix(".db.snap")
    async with LogTrial(points, db, lambda f: write(f, root, gate), snapshot=snapshot) as t:
        await t.resume([ECHO, SLOW])
        try:
            result = await t.orch.wait(root, 5)
            end: tuple[str, ...] = (result.status, result.reason)
        except TimeoutError:
            end = ("still waiting",)
        log = await t.check()
        if check is not None:
            t.problems += check(log)
    return Trial(end, points, t.problems)


@pytest.mark.parametrize(
    ("write", "in_flight", "snapshot"),
    [
        ("approve", False, False),
        ("deny", False, False),
        ("cancel", False, False),
        ("approve", True, False),
        ("cancel", True, True),
        ("member+approve", False, True),
    ],
)
async def test_a_write_at_any_await_point_of_a_resume_is_folded_once(
    tmp_path: Path, write: str, in_flight: bool, snapshot: bool
) -> None:
    db, root, gate = await _waiting_run(tmp_path / "template", in_flight, snapshot)

    async def scenario(points: Points) -> Trial:
        return await _resume(points, db, root, gate, WRITES[write])

    reference, trials = await explore(scenario, seed=len(write))
    problems, injected, reached = report(reference, trials)
    print(f"{len(trials)} trials, written at {len(injected)} call sites: {sorted(injected)}")
    print(f"  timed sites reached, not written at: {sorted(reached - injected)}")
    assert not problems, "\n".join(problems)
    assert reference.end[0] in ("completed", "failed", "cancelled"), reference.end
    # the write landed at every call site a trial reached, the start-up window among them
    assert not reached - injected - TIMED, sorted(reached - injected)
    assert any(name.startswith("_started/") for name in injected), sorted(injected)
    assert len(trials) >= 10


async def _follow(points: Points, folder: Path, write: Write, retire: bool = False) -> Trial:
    """One trial of the follow path: an orchestrator is running a three-task run while
    another process answers (or cancels) a second run that waits for approval.
    ``retire``: no finished run is kept in memory (``retain_finished_runs=0``), so each
    run leaves it as it ends, wherever the follower then is."""
    points.active = False  # until the waiting run is set up
    async with LogTrial(points, trial_folder(folder) / "cardbus.db", snapshot=None) as t:
        if retire:
            t.orch.state.retain_finished = 0
        await t.start([ECHO])
        waiting = await t.orch.submit(plan(task("gate", requires_approval=True)))
        gate = tid(waiting, "gate")
        await wait_for(t.foreign, lambda e: isinstance(e.data, ev.ApprovalRequested))
        points.inject = lambda: write(t.foreign, waiting, gate)
        points.active = True
        await points.before_start()
        chain = await t.orch.submit(
            plan(task("a"), task("b", deps=["a"]), task("c", deps=["b"]), goal="chain")
        )
        await points.when_idle()
        ends: list[str] = []
        for root in (chain, waiting):
            try:
                ends.append((await t.orch.wait(root, 5)).status)
            except TimeoutError:
                ends.append("still waiting")
        await t.check()
    return Trial(tuple(ends), points, t.problems)


@pytest.mark.parametrize(
    ("write", "retire"),
    [("approve", False), ("cancel", False), ("member+approve", False), ("approve", True)],
)
async def test_a_write_at_any_await_point_while_following_is_folded_once(
    tmp_path: Path, write: str, retire: bool
) -> None:
    async def scenario(points: Points) -> Trial:
        return await _follow(points, tmp_path, WRITES[write], retire)

    reference, trials = await explore(scenario, seed=7)
    problems, injected, reached = report(reference, trials)
    print(f"{len(trials)} trials, written at {len(injected)} call sites: {sorted(injected)}")
    print(f"  timed sites reached, not written at: {sorted(reached - injected)}")
    assert not problems, "\n".join(problems)
    assert reference.end[0] == "completed", reference.end
    assert not reached - injected - TIMED, sorted(reached - injected)
    # the run's own decisions and the follower were written at, not only the submission
    assert any(n.startswith("_commit/") for n in injected), sorted(injected)
    assert any("subscribe" in n for n in injected), sorted(injected)


@pytest.mark.parametrize("write", ["approve", "cancel"])
async def test_the_start_up_window_race_ends_right_in_100_of_100_tries(
    tmp_path: Path, write: str
) -> None:
    """The issue's race: the write lands between the start's fold and its first append
    (``orchestrator.started``); 100 schedules (seeds) of it."""
    db, root, gate = await _waiting_run(tmp_path / "template", False, False)
    reference = await _resume(Points(0), db, root, gate, WRITES[write])
    ends = []
    for seed in range(100):
        points = Points(-1, seed=seed, inject_name="_started/_append>append")
        trial = await _resume(points, db, root, gate, WRITES[write])
        assert trial.points.injected_at == "_started/_append>append"
        assert not trial.problems, trial.problems
        ends.append(trial.end[0])
    assert reference.end[0] == ("completed" if write == "approve" else reference.end[0])
    assert ends == [reference.end[0]] * 100, ends


# -- a schedule's firing written by another member ----------------------------------------


async def _another_member_fires(store: SqliteEventStore, sid: str, due: float) -> object:
    """Another member's scheduler: it folds the schedule's stream and, finding ``due``
    not handled, writes its firing with the version it folded; a ``ConcurrencyError``
    (ours was written meanwhile) sends it back to the fold, which finds it handled."""
    while True:
        state = fold(await store.read_stream(stream_of(sid)))
        assert state is not None
        if state.handled >= due:
            return None
        fired = ev.ScheduleFired(due=due, plan_id=plan_id_of(sid, due), member="other")
        new = NewEvent(data=fired, correlation_id=stream_of(sid))
        try:
            return await store.append(stream_of(sid), [new], state.version)
        except ConcurrencyError:
            continue


async def _schedule_trial(points: Points, folder: Path) -> Trial:
    """One trial: an orchestrator starts and follows the log while its scheduler finds a
    due time, and another member writes the firing of that due time at one await point."""
    points.active = False  # until the schedule is written
    due = time.time() + 10_000  # the first due time; the scheduler's clock is just past it
    async with LogTrial(points, trial_folder(folder) / "cardbus.db", snapshot=None) as t:
        scheduler = Scheduler(t.store, t.orch.submit, "local", grace=0.5, clock=lambda: due + 1)
        body = msgspec.to_builtins(plan(task("a"), goal="scheduled"))
        sid = await create_schedule(
            t.foreign, body, interval_seconds=3600, start=due, overlap="allow_all", catchup="all"
        )
        written = asyncio.Event()  # the write done (the harness marks only its start)

        async def write() -> object:
            try:
                return await _another_member_fires(t.foreign, sid, due)
            finally:
                written.set()

        points.inject = write
        points.active = True
        await points.before_start()
        await t.start([ECHO])
        await scheduler.run_once()  # fires the due time, or finds it fired
        await scheduler.run_once()  # starts the other member's firing's run
        await points.when_idle()
        await written.wait()
        await scheduler.run_once()  # a firing the other wrote late: its run starts now
        claim = await wait_for(t.foreign, lambda e: isinstance(e.data, ev.PlanSubmitted))
        assert isinstance(claim.data, ev.PlanSubmitted)
        end = (await t.orch.wait(claim.data.root_id, 5)).status
        log = await t.check()
        fired = [e for e in log if isinstance(e.data, ev.ScheduleFired)]
        runs = [e for e in log if isinstance(e.data, ev.RunStarted) and e.data.schedule == sid]
        if len(fired) != 1 or len(runs) != 1:
            t.problems.append(f"{len(fired)} firings and {len(runs)} runs of one due time")
    return Trial((end, len(fired), len(runs)), points, t.problems)


async def test_a_schedule_firing_by_another_member_at_any_await_point_fires_once(
    tmp_path: Path,
) -> None:
    async def scenario(points: Points) -> Trial:
        return await _schedule_trial(points, tmp_path)

    reference, trials = await explore(scenario, seed=11)
    problems, injected, reached = report(reference, trials)
    print(f"{len(trials)} trials, written at {len(injected)} call sites: {sorted(injected)}")
    assert not problems, "\n".join(problems)
    assert reference.end == ("completed", 1, 1), reference.end
    assert not reached - injected - TIMED, sorted(reached - injected)
    # written during the orchestrator's start, and in the scheduler's own look
    assert any(n.startswith("_started/") for n in injected), sorted(injected)
    assert any(n.startswith("_advance/") for n in injected), sorted(injected)


# -- a tool call held for review, answered by another process ---------------------------

PAID: list[float] = []  # the amounts the reviewed tool ran with, in this trial


async def _pay(task_card, inputs, ctx):  # type: ignore[no-untyped-def]
    await ctx.tool("transfer", amount=900)
    return TextOut(text="paid")


PAYER = make_agent("payer", "pay", _pay, constraints=AgentConstraints(tools=["transfer"]))


def _transfer_tools() -> ToolRegistry:
    def transfer(args: dict[str, object]) -> dict[str, object]:
        PAID.append(float(args["amount"]))  # type: ignore[arg-type]
        return {"sent": args["amount"]}

    return ToolRegistry([Tool.define("transfer", transfer, review="always")])


async def _held_run(folder: Path) -> tuple[Path, str, str]:
    """A log whose run waits for a person's review of a transfer; its process died."""
    folder.mkdir()
    db = folder / "cardbus.db"
    store = await SqliteEventStore.open(db, poll_interval=0.01)
    bus = InProcessBus()
    orch = Orchestrator(store, bus, FAST, tools=_transfer_tools())
    orch.attempts_survive_restart = False
    worker = AgentWorker(bus, PAYER)
    await orch.start([worker.agent.card()])
    await worker.start()
    root = await orch.submit(plan(task("pay", "pay")))
    await wait_for(store, lambda e: isinstance(e.data, ev.ApprovalRequested))
    await orch.stop(give_back=False)  # as a process that dies
    await bus.close()
    await store.close()
    return db, root, tid(root, "pay")


async def _resume_held(points: Points, db: Path, root: str, pay: str) -> Trial:
    """A new orchestrator resumes the held run on a copy of ``db``; a person's approval
    of the transfer comes from another connection at the point ``points`` says."""
    PAID.clear()

    def approve(foreign: SqliteEventStore) -> Awaitable[object]:
        return answer_review(foreign, pay, "approve", by="alice")

    async with LogTrial(points, copy_log(db), approve, tools=_transfer_tools()) as t:
        await t.resume([PAYER])
        try:
            result = await t.orch.wait(root, 5)
            end: tuple[str, ...] = (result.status, result.reason)
        except TimeoutError:
            end = ("still waiting",)
        await t.check()
        if end[0] == "completed" and PAID != [900.0]:  # the tool runs once, approved
            t.problems.append(f"the reviewed tool ran with {PAID}, not once with 900")
    return Trial(end, points, t.problems)


async def test_a_review_answered_at_any_await_point_of_a_resume_runs_the_tool_once(
    tmp_path: Path,
) -> None:
    db, root, pay = await _held_run(tmp_path / "template")

    async def scenario(points: Points) -> Trial:
        return await _resume_held(points, db, root, pay)

    reference, trials = await explore(scenario, seed=7)
    problems, injected, reached = report(reference, trials)
    assert not problems, "\n".join(problems)
    assert reference.end[0] == "completed", reference.end
    assert not reached - injected - TIMED, sorted(reached - injected)
    assert len(trials) >= 10


# -- child runs: the parent waits for its child, which may end by another writer's hand ----


async def _cancel_child(store: SqliteEventStore, root: str, gate: str) -> object:
    """Cancel the child run itself (its root is its gate task's): the parent's task fails."""
    child_root = (await store.read_stream(gate))[0].correlation_id
    return await cancel_run(store, child_root, by="bob")


CHILD_WRITES: dict[str, Write] = {
    "approve child": _approve,  # the child's gate: the child completes, then the parent
    "cancel parent": _cancel,  # the parent's cancel reaches the child (parent_close)
    "cancel child": _cancel_child,
}


async def _waiting_parent(folder: Path) -> tuple[Path, str, str]:
    """A log whose parent run waits for its child run, which waits for approval of its
    ``gate``; the process died (no give-back, no snapshot)."""
    from cardbus.bus.orchestrator import PlanTask
    from cardbus.bus.orchestrator.children import ChildSpec

    folder.mkdir()
    db = folder / "cardbus.db"
    store = await SqliteEventStore.open(db, poll_interval=0.01)
    bus = InProcessBus()
    orch = Orchestrator(store, bus, FAST, snapshot=None)
    orch.attempts_survive_restart = False
    workers = [AgentWorker(bus, ECHO)]
    await orch.start([w.agent.card() for w in workers])
    for w in workers:
        await w.start()
    sub = {
        "goal": "department",
        "tasks": [
            {
                "id": "gate",
                "capability": "echo",
                "inputs": {"text": "g"},
                "requires_approval": True,
            },
            {"id": "find", "capability": "echo", "deps": ["gate"], "inputs": {"text": "f"}},
        ],
    }
    dept = PlanTask(id="dept", capability="department", child=ChildSpec(plan=sub), timeout_s=60)
    root = await orch.submit(plan(task("brief"), dept, task("after", deps=["dept"])))
    asked = await wait_for(store, lambda e: isinstance(e.data, ev.ApprovalRequested))
    await orch.stop(give_back=False)  # as a process that dies
    await bus.close()
    await store.close()
    return db, root, asked.stream


async def _resume_parent(points: Points, db: Path, root: str, gate: str, write: Write) -> Trial:
    """One trial: a new orchestrator resumes the parent and its child on a copy of ``db``;
    ``write`` comes from another connection at the point ``points`` says. The end is the
    parent's and the child's."""
    async with LogTrial(points, copy_log(db), lambda f: write(f, root, gate), snapshot=None) as t:
        child_root = (await t.foreign.read_stream(gate))[0].correlation_id
        await t.resume([ECHO])
        end: tuple[str, ...] = ()
        for run in (root, child_root):
            try:
                end += ((await t.orch.wait(run, 5)).status,)
            except TimeoutError:
                end += ("still waiting",)
        log = await t.check()
        started = [e for e in log if isinstance(e.data, ev.ChildRunStarted)]
        if len(started) != 1:  # one child, whoever decided when
            t.problems.append(f"{len(started)} child runs started")
    return Trial(end, points, t.problems)


@pytest.mark.parametrize("write", sorted(CHILD_WRITES))
async def test_a_write_at_any_await_point_of_a_parent_waiting_for_its_child_is_folded_once(
    tmp_path: Path, write: str
) -> None:
    """The parent's task waits for its child run's end, a wait child runs add: the child's
    approval, the parent's cancel or the child's, written by another process at every await
    point of a resume, ends both runs as when it comes first."""
    db, root, gate = await _waiting_parent(tmp_path / "template")

    async def scenario(points: Points) -> Trial:
        return await _resume_parent(points, db, root, gate, CHILD_WRITES[write])

    reference, trials = await explore(scenario, seed=len(write))
    problems, injected, reached = report(reference, trials)
    print(f"{len(trials)} trials, written at {len(injected)} call sites: {sorted(injected)}")
    print(f"  timed sites reached, not written at: {sorted(reached - injected)}")
    assert not problems, "\n".join(problems)
    assert (
        reference.end
        == {
            "approve child": ("completed", "completed"),
            "cancel parent": ("cancelled", "cancelled"),
            "cancel child": ("failed", "cancelled"),
        }[write]
    )
    assert not reached - injected - TIMED, sorted(reached - injected)
    assert any(name.startswith("_started/") for name in injected), sorted(injected)
    assert len(trials) >= 10


# --- a wait's deadline racing a person's answer -----------------------------------------


async def _approve_as_b(store: SqliteEventStore, root: str, gate: str) -> object:
    return await answer_approval(store, gate, True, by="bea")


async def test_an_expiry_racing_an_approval_at_any_await_point_applies_once(
    tmp_path: Path,
) -> None:
    """The run's approval deadline has passed when a new orchestrator resumes it: its first
    step escalates the approval to group B, while bea (of group B) approves, injected at
    every await point. Whichever comes first, the other is decided on it: the escalation is
    applied at most once and only before the approval, the approval is never refused, and
    the run completes, each event folded once."""
    policy = ev.WaitPolicy(
        deadline_s=0.05, then=[ev.WaitStep(action="escalate", group="B")], groups={"B": ["bea"]}
    )
    db, root, gate = await _waiting_run(
        tmp_path / "template", False, False, waits={"approval": policy}
    )
    await asyncio.sleep(0.1)  # past the deadline before any trial starts

    def applied_once(log: list[Envelope]) -> list[str]:
        stream = [e.data for e in log if e.stream == gate]
        expiries = [i for i, d in enumerate(stream) if isinstance(d, ev.WaitExpired)]
        granted = [i for i, d in enumerate(stream) if isinstance(d, ev.ApprovalGranted)]
        seen["escalated" if expiries else "answered first"] += 1
        if len(expiries) > 1:
            return [f"the deadline applied {len(expiries)} times"]
        if expiries and granted and expiries[0] > granted[0]:
            return ["the deadline applied after the approval"]
        return []

    seen: Counter[str] = Counter()

    async def scenario(points: Points) -> Trial:
        return await _resume(points, db, root, gate, _approve_as_b, applied_once)

    reference, trials = await explore(scenario, seed=5)
    problems, injected, reached = report(reference, trials)
    print(f"{len(trials)} trials, written at {len(injected)} call sites; the race: {seen}")
    assert not problems, "\n".join(problems)
    assert reference.end[0] == "completed", reference.end
    assert not reached - injected - TIMED, sorted(reached - injected)
    assert len(trials) >= 10
    # both orders happened: the write before the expiry (the reference) and after it
    assert seen["escalated"] and seen["answered first"], seen


async def test_the_log_a_trial_checks_is_read_before_the_orchestrator_catches_up(
    tmp_path: Path,
) -> None:
    """``folded_log``: an event stored once ``caught_up`` has taken its target (a late
    answer's ``task.result_ignored``, its acknowledgement still on the way) is not in the
    log checked, so it is never called "folded 0 times" (the order was the other way round
    in the NATS trials: 1 failure in 24 runs beside two busy loops)."""
    store = await SqliteEventStore.open(tmp_path / "log.db")
    started = ev.OrchestratorStarted(orchestrator_id="o", resumed=[], host="h", pid=1)
    late = ev.TaskResultIgnored(attempt=1, agent_id="echo", reason="run already ended")
    try:
        await store.append("o", [NewEvent(data=started, correlation_id="o")], 0)

        class LateAnswer:  # its target taken, a late event is stored, then it is caught up
            asked: list[float] = []

            async def caught_up(self, timeout: float) -> bool:
                self.asked.append(timeout)
                await store.append("o", [NewEvent(data=late, correlation_id="o")], 1)
                return True

        orch = LateAnswer()
        log = await folded_log(store, orch, timeout=3)
        assert orch.asked == [3]
        assert [e.type for e in log] == ["orchestrator.started.v1"]
        assert [e.type for e in await store.read_all(0, 10)][-1] == "task.result_ignored.v1"

        class NeverCaughtUp:  # its fold never reaches the log's end
            async def caught_up(self, timeout: float) -> bool:
                return False

        with pytest.raises(AssertionError, match="had not folded the log up to 2 in 3 s"):
            await folded_log(store, NeverCaughtUp(), timeout=3)
    finally:
        await store.close()


async def test_caught_up_says_whether_the_fold_reached_the_log_s_end(tmp_path: Path) -> None:
    """True once every event the log held when asked is folded; False after the timeout
    while one is not (here: held back, as an event on a stream busy with an append)."""
    store = await SqliteEventStore.open(tmp_path / "log.db")
    try:
        async with EmbeddedRuntime(store, []) as rt:
            orch = rt.orchestrator
            assert await orch.caught_up(5) is True
            orch._unfolded.add(orch._followed)  # as if the follower's last were still held
            assert await orch.caught_up(0.05) is False
            orch._unfolded.clear()
            assert await orch.caught_up(5) is True
    finally:
        await store.close()
