"""After a commit its runs are decided on again (``Changed``), but not for a start alone.

An agent's ``Started`` reply is a commit of its own (``task.started``); the look at its
run after it found nothing to decide (``bus.orchestrator.second_look`` says why), a
whole step per model-like task. A step that passed over the stream while that commit
was in flight still gets its look.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from orchkit import FAST, is_, make_agent, plan, task, tid, wait_for

from cardbus.agents.cards import TaskCard
from cardbus.bus.orchestrator.loop_items import TICK, Changed
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev

#: no clock ticks during a test: each would look at every open run
QUIET_CLOCK = dataclasses.replace(FAST, tick_s=60)


def _gated(gate: asyncio.Event) -> Any:
    async def handler(card: TaskCard, inputs: Any, ctx: Any) -> dict[str, str]:
        await gate.wait()
        return {"text": inputs.text}

    return handler


def _record_looks(rt: Any, store: SqliteEventStore) -> list[tuple[int, frozenset[str]]]:
    """Each ``Changed`` put on the decision loop's queue: (commits so far, its roots)."""
    looks: list[tuple[int, frozenset[str]]] = []
    queue = rt.orch._queue
    put = queue.put_nowait

    def recording(item: object) -> None:
        if isinstance(item, Changed):
            looks.append((store.commits, item.roots))
        put(item)

    queue.put_nowait = recording
    return looks


def _started_only(appends: Any) -> bool:
    return all(all(type(e.data) is ev.TaskStarted for e in a.events) for a in appends)


async def test_a_start_alone_is_not_looked_at_again(
    store: SqliteEventStore, make_runtime: Any
) -> None:
    gate = asyncio.Event()
    # the Started long after the creation's own looks and steps
    rt = await make_runtime(
        [make_agent("echo", handler=_gated(gate))], policy=QUIET_CLOCK, started_after_s=0.2
    )
    looks = _record_looks(rt, store)
    commits: list[bool] = []  # per commit: only task.started
    append_many = store.append_many

    async def noting(appends: Any) -> Any:
        commits.append(_started_only(appends))
        return await append_many(appends)

    store.append_many = noting  # type: ignore[method-assign]
    before = store.commits
    root = await rt.orch.submit(plan(task("a")))
    await wait_for(store, is_(ev.TaskStarted, tid(root, "a")))
    for _ in range(100):  # its commit settled
        if not rt.orch._busy:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    assert commits == [False, True]  # the creation with the dispatch, the start
    assert [n - before for n, roots in looks if root in roots] == [1]  # the creation's
    gate.set()
    result = await rt.orch.wait(root, 10)
    assert result.status == "completed"
    # the result's commit (with the run's end) is looked at, as every other commit
    assert [n - before for n, roots in looks if root in roots] == [1, 3]


async def test_a_start_passed_over_while_written_is_looked_at(
    store: SqliteEventStore, make_runtime: Any
) -> None:
    gate, held = asyncio.Event(), asyncio.Event()
    rt = await make_runtime(
        [make_agent("echo", handler=_gated(gate))], policy=QUIET_CLOCK, started_after_s=0.2
    )
    looks = _record_looks(rt, store)
    append_many = store.append_many
    writing = asyncio.Event()

    async def holding(appends: Any) -> Any:
        if _started_only(appends):
            writing.set()
            await held.wait()  # the start's append stays in flight
        return await append_many(appends)

    store.append_many = holding  # type: ignore[method-assign]
    stepped = asyncio.Event()
    step = rt.orch._step

    async def noting_ticks(items: list[object]) -> None:
        await step(items)
        if TICK in items:
            stepped.set()

    rt.orch._step = noting_ticks
    before = store.commits
    root = await rt.orch.submit(plan(task("a")))
    await asyncio.wait_for(writing.wait(), 5)
    rt.orch._queue.put_nowait(TICK)  # a look at every run: it passes over the busy task
    await asyncio.wait_for(stepped.wait(), 5)
    held.set()
    for _ in range(200):
        if any(n - before == 2 and root in roots for n, roots in looks):
            break
        await asyncio.sleep(0.01)
    assert [n - before for n, roots in looks if root in roots] == [1, 2]
    gate.set()
    assert (await rt.orch.wait(root, 10)).status == "completed"
