"""A realistic run written through the EventStore interface, following the state machine.

Shared by the projection and CLI tests. Times are explicit (``recorded_at``)
so latencies and durations are known exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cardbus.eventstore import EventStore, NewEvent
from cardbus.eventstore import events as ev
from cardbus.eventstore.states import fold_state

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z


@dataclass
class RunIds:
    root: str
    research: str
    write: str
    review: str
    code: str
    loop: str
    positions: list[int] = field(default_factory=list)


class Writer:
    def __init__(self, store: EventStore, root: str, t0: float = T0) -> None:
        self.store = store
        self.root = root
        self.t = t0
        self.versions: dict[str, int] = {}
        self.history: dict[str, list[object]] = {}
        self.positions: list[int] = []

    async def emit(self, stream: str, data: ev.Event, dt: float = 1.0) -> None:
        self.t += dt
        v = self.versions.get(stream, 0)
        if type(data) in ev.TASK_EVENT_TYPES:
            # every task event must be legal for the state machine
            fold_state([*self.history.get(stream, []), data])
            self.history.setdefault(stream, []).append(data)
        out = await self.store.append(
            stream,
            [
                NewEvent(
                    data=data, correlation_id=self.root, actor="orchestrator", recorded_at=self.t
                )
            ],
            v,
        )
        self.versions[stream] = v + 1
        self.positions.append(out[0].position)


async def write_run(store: EventStore, prefix: str = "", t0: float = T0) -> RunIds:
    """One run with a success, a rejection+retry+revision, a subtask, a failure and a halt."""
    p = prefix
    ids = RunIds(
        root=f"{p}run-1",
        research=f"{p}task-research",
        write=f"{p}task-write",
        review=f"{p}task-review",
        code=f"{p}task-code",
        loop=f"{p}task-loop",
    )
    w = Writer(store, ids.root, t0)
    R = ids.root
    use = ev.Usage
    await w.emit(
        R,
        ev.RunStarted(
            goal="write a report",
            plan_id="plan-1",
            task_ids=[ids.research, ids.write, ids.code, ids.loop],
        ),
    )
    # research: first pass success, latency 3s
    t = ids.research
    await w.emit(t, ev.TaskCreated(root_id=R, capability="research", inputs={"q": "cats"}))
    await w.emit(t, ev.TaskDispatched(attempt=1, agent_id="researcher", loop_hash="h-research"))
    await w.emit(t, ev.TaskStarted(attempt=1, agent_id="researcher"))
    await w.emit(
        t,
        ev.TaskResultSubmitted(
            attempt=1,
            agent_id="researcher",
            status="completed",
            output={"facts": ["purr"]},
            usage=use(input_tokens=100, output_tokens=50),
        ),
        dt=2.0,
    )
    await w.emit(t, ev.TaskCompleted(attempt=1, agent_id="researcher", output={"facts": ["purr"]}))
    # write: rejected by writer-1, retried on writer-2, revision round, then completed
    t = ids.write
    await w.emit(t, ev.TaskCreated(root_id=R, capability="write", deps=[ids.research]))
    await w.emit(t, ev.TaskDispatched(attempt=1, agent_id="writer-1", loop_hash="h-write"))
    await w.emit(
        t,
        ev.TaskRejected(
            attempt=1, agent_id="writer-1", reason="out_of_capability", detail="no prose"
        ),
    )
    await w.emit(t, ev.TaskRetryScheduled(attempt=2, delay_s=0.5, reason="rejected"))
    await w.emit(t, ev.TaskDispatched(attempt=2, agent_id="writer-2", loop_hash="h-write"))
    await w.emit(t, ev.TaskStarted(attempt=2, agent_id="writer-2"))
    await w.emit(
        t,
        ev.TaskResultSubmitted(
            attempt=2,
            agent_id="writer-2",
            status="completed",
            output="draft",
            usage=use(input_tokens=200, output_tokens=300),
        ),
        dt=4.0,
    )
    # the review is a subtask of write
    r = ids.review
    await w.emit(r, ev.TaskCreated(root_id=R, parent_id=t, capability="review"))
    await w.emit(r, ev.TaskDispatched(attempt=1, agent_id="reviewer"))
    await w.emit(r, ev.TaskStarted(attempt=1, agent_id="reviewer"))
    await w.emit(
        r,
        ev.TaskResultSubmitted(
            attempt=1,
            agent_id="reviewer",
            status="completed",
            output={"ok": False},
            usage=use(input_tokens=30, output_tokens=10),
        ),
    )
    await w.emit(r, ev.TaskCompleted(attempt=1, agent_id="reviewer", output={"ok": False}))
    await w.emit(
        t,
        ev.RevisionRequested(
            round=1,
            reviewer_task_id=r,
            issues=[
                ev.ReviewIssue(
                    issue_type="clarity", section="intro", severity="high", suggestion="shorter"
                )
            ],
        ),
    )
    await w.emit(t, ev.TaskDispatched(attempt=3, agent_id="writer-2", loop_hash="h-write-2"))
    await w.emit(t, ev.TaskStarted(attempt=3, agent_id="writer-2"))
    await w.emit(
        t,
        ev.TaskResultSubmitted(
            attempt=3,
            agent_id="writer-2",
            status="completed",
            output="final",
            usage=use(input_tokens=250, output_tokens=280),
        ),
        dt=2.0,
    )
    await w.emit(t, ev.TaskCompleted(attempt=3, agent_id="writer-2", output="final"))
    # code: failed result, schema mismatch retry, timeout, failed
    t = ids.code
    await w.emit(t, ev.TaskCreated(root_id=R, capability="code", max_attempts=2))
    await w.emit(t, ev.TaskDispatched(attempt=1, agent_id="coder", loop_hash="h-code"))
    await w.emit(t, ev.TaskStarted(attempt=1, agent_id="coder"))
    await w.emit(
        t,
        ev.TaskResultSubmitted(
            attempt=1,
            agent_id="coder",
            status="completed",
            output={"wrong": 1},
            usage=use(input_tokens=10, output_tokens=5),
        ),
    )
    await w.emit(t, ev.TaskRetryScheduled(attempt=2, delay_s=1, reason="output_schema_mismatch"))
    await w.emit(t, ev.TaskDispatched(attempt=2, agent_id="coder", loop_hash="h-code"))
    await w.emit(t, ev.TaskStarted(attempt=2, agent_id="coder"))
    await w.emit(t, ev.TaskTimedOut(attempt=2, agent_id="coder", deadline=0.0), dt=30.0)
    await w.emit(t, ev.TaskFailed(reason="attempts_exhausted", error="timed out", attempts=2))
    # loop: the same hash dispatched again and again, then halted
    t = ids.loop
    await w.emit(t, ev.TaskCreated(root_id=R, capability="plan"))
    for attempt in (1, 2, 3):
        await w.emit(t, ev.TaskDispatched(attempt=attempt, agent_id="planner", loop_hash="h-loop"))
        if attempt < 3:
            await w.emit(t, ev.TaskTimedOut(attempt=attempt, agent_id="planner", deadline=0.0))
            await w.emit(t, ev.TaskRetryScheduled(attempt=attempt + 1, delay_s=0, reason="timeout"))
    await w.emit(t, ev.TaskHalted(reason="loop_detected", detail="h-loop seen 3 times"))
    await w.emit(R, ev.RunFailed(reason="tasks failed", failed_tasks=[ids.code, ids.loop]))
    ids.positions = w.positions
    return ids
