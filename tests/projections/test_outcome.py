"""``first_failure``: the task whose end failed a run, not its collateral."""

from __future__ import annotations

from lifecycle_log import T0, Writer, write_run

from cardbus.eventstore import MemoryEventStore
from cardbus.eventstore import events as ev
from cardbus.projections.outcome import first_failure


async def test_the_first_task_to_fail_is_named_with_its_attempts_and_the_rest_counted() -> None:
    store = MemoryEventStore()
    ids = await write_run(store)  # code fails (attempts exhausted), then loop is halted
    failure = first_failure(await store.read_correlation(ids.root))
    assert failure is not None
    assert (failure.task_id, failure.capability, failure.ended) == (ids.code, "code", "failed")
    assert (failure.reason, failure.error) == ("attempts_exhausted", "timed out")
    assert (failure.attempts, failure.max_attempts, failure.others) == (2, 2, 1)


async def test_a_task_cancelled_because_another_failed_is_not_the_cause() -> None:
    store = MemoryEventStore()
    w = Writer(store, "run-c", T0)
    await w.emit("run-c", ev.RunStarted(goal="g", plan_id="p"))
    await w.emit("a", ev.TaskCreated(root_id="run-c", capability="first", plan_id="a"))
    await w.emit("b", ev.TaskCreated(root_id="run-c", capability="second", plan_id="b"))
    # b is cancelled first in the log, but because of a: a is the cause
    await w.emit("b", ev.TaskCancelled(reason="dependency_failed", cause_task_id="a"))
    await w.emit("a", ev.TaskFailed(reason="agent_error", error="boom", attempts=1))
    failure = first_failure(await store.read_correlation("run-c"))
    assert failure is not None and (failure.task_id, failure.name) == ("a", "a")
    assert failure.others == 0


async def test_a_run_whose_tasks_all_completed_has_no_failure() -> None:
    store = MemoryEventStore()
    w = Writer(store, "run-ok", T0)
    await w.emit("run-ok", ev.RunStarted(goal="g", plan_id="p"))
    await w.emit("a", ev.TaskCreated(root_id="run-ok", capability="first"))
    await w.emit("a", ev.TaskDispatched(attempt=1, agent_id="x"))
    await w.emit("a", ev.TaskCompleted(attempt=1, agent_id="x", output={}))
    assert first_failure(await store.read_correlation("run-ok")) is None
