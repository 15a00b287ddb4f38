"""Run priority: admission serves a higher priority first, and a queued run ages so that
a stream of urgent runs does not starve it for ever. Order is read from the log."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from orchkit import FAST, Runtime, TextOut, ev, is_, make_agent, plan, task, tid, wait_for

from cardbus.bus.orchestrator.admission import AGING_RUNS, admission_order
from cardbus.bus.orchestrator.runstate import RunView


def _run(name: str, position: int, priority: int = 0) -> RunView:
    started = ev.RunStarted(goal="g", plan_id=name, priority=priority)
    return RunView(name, started, position=position)


def test_higher_priority_first_then_the_log_order() -> None:
    runs = [_run("a", 1), _run("b", 2), _run("urgent", 3, priority=1), _run("c", 4)]
    assert [r.root_id for r in admission_order(runs)] == ["urgent", "a", "b", "c"]


def test_a_run_overtaken_long_enough_ages_past_a_newer_urgent_one() -> None:
    old = _run("old", 1)
    urgent = [_run(f"u{i}", 2 + i, priority=1) for i in range(AGING_RUNS + 1)]
    order = [r.root_id for r in admission_order([old, *urgent])]
    # overtaken by more than AGING_RUNS urgent runs started after it: worth more than
    # their priority now, it goes first
    assert order[:3] == ["old", "u0", "u1"]
    # overtaken by fewer, it still waits behind them
    fewer = [r.root_id for r in admission_order([old, *urgent[: AGING_RUNS - 1]])]
    assert fewer[-1] == "old"
    # runs of its own priority started after it do not age it: they queue behind it anyway
    same = [_run(f"s{i}", 2 + i) for i in range(3 * AGING_RUNS)]
    late = _run("late", 3 * AGING_RUNS + 10, priority=1)
    assert [r.root_id for r in admission_order([old, *same, late])][:2] == ["late", "old"]


async def test_a_high_priority_run_submitted_behind_a_queue_starts_first(store) -> None:
    gate = asyncio.Event()

    async def handle(t: Any, i: Any, c: Any) -> TextOut:
        if i.text == "hold":
            await gate.wait()
        return TextOut(text=i.text)

    policy = dataclasses.replace(FAST, max_runs_in_flight=1)
    rt = await Runtime(store, [make_agent("one", "echo", handle)], policy=policy).start()
    try:
        hold = await rt.orch.submit(plan(task("hold", timeout_s=60), plan_id="hold"))
        await wait_for(store, is_(ev.TaskStarted, tid(hold, "hold")), timeout=30)
        queued = [await rt.orch.submit(plan(task(f"q{i}"), plan_id=f"q{i}")) for i in range(20)]
        urgent = await rt.orch.submit(plan(task("urgent"), plan_id="urgent", priority=5))
        assert rt.orch.admission.queued(rt.orch.state)[0] == urgent
        gate.set()
        results = [await rt.orch.wait(r, 60) for r in [hold, urgent, *queued]]
        events = await store.read_all(1, 100_000)
    finally:
        await rt.stop()
    assert {r.status for r in results} == {"completed"}
    started = [e.data.root_id for e in events if isinstance(e.data, ev.TaskCreated)]
    dispatched = [e.stream for e in events if isinstance(e.data, ev.TaskDispatched)]
    assert started  # the runs' tasks are in the log
    order = [d for d in dispatched if d != tid(hold, "hold")]
    assert order[0] == tid(urgent, "urgent")
    assert order[1:] == [tid(r, f"q{i}") for i, r in enumerate(queued)]  # then the log's order


def test_behind_2000_queued_runs_an_urgent_one_takes_the_first_free_place() -> None:
    from types import SimpleNamespace

    from cardbus.bus.orchestrator.admission import Admission

    limit = 500
    runs = {f"r{i}": _run(f"r{i}", i + 1) for i in range(limit + 2000)}
    state = SimpleNamespace(open=dict(runs), runs=runs, runs_changed=0)
    admission = Admission(limit)
    admission.update(state, None)  # type: ignore[arg-type]
    assert len(admission.queued(state)) == 2000  # type: ignore[arg-type]
    state.open["urgent"] = _run("urgent", limit + 2001, priority=1)
    state.runs_changed += 1
    assert admission.update(state, None) == set()  # type: ignore[arg-type]  # no place free
    del state.open["r0"]  # one run in flight ends: one place comes free
    state.runs_changed += 1
    started = admission.update(state, None)  # type: ignore[arg-type]
    assert started == {"urgent"}  # not one of the 2,000 runs queued before it
