"""A loop that pauses the run for a person (``Policy.on_loop="pause"``) instead of halting."""

from __future__ import annotations

import dataclasses

import pytest
from orchkit import CARDS, FAST, ev, make_agent, plan, run_log, task, tid, wait_for

from cardbus.bus.orchestrator.loop_pause import answer_pause
from cardbus.eventstore import CardbusError, ValidationError

PAUSE = dataclasses.replace(FAST, on_loop="pause", loop_threshold=2)


def _looping():  # type: ignore[no-untyped-def]
    # the same capability and inputs on three tasks: the third is a loop (threshold 2)
    return plan(
        task("a", text="same"),
        task("b", text="same", deps=["a"]),
        task("c", text="same", deps=["b"]),
    )


async def test_a_loop_pauses_and_a_person_resumes_with_a_changed_input(make_runtime, store):
    rt = await make_runtime([make_agent("echo")], policy=PAUSE)
    root = await rt.orch.submit(_looping())
    paused = await wait_for(store, lambda e: isinstance(e.data, ev.RunPaused))
    c = tid(root, "c")
    data = paused.data
    assert (paused.stream, data.reason, data.task_id, data.count) == (root, "loop_detected", c, 3)
    assert data.capability == "echo" and data.inputs == {"text": "same"}
    assert data.tasks == sorted([tid(root, "a"), tid(root, "b")])
    log = await run_log(store, root)
    assert not log.of(ev.TaskDispatched, c) and not log.of(ev.RunHalted)
    with pytest.raises(ValidationError, match="inputs go with resume"):
        await answer_pause(store, root, "stop", by="ada", inputs={"text": "x"})
    await answer_pause(
        store, root, "resume", by="ada", note="try another", inputs={"text": "other"}
    )
    r = await rt.orch.wait(root, 10)
    assert r.status == "completed"
    assert r.outputs["c"] == {"text": "other"}
    log = await run_log(store, root)
    answered = log.first(ev.RunPauseAnswered)
    assert (answered.actor, answered.data.decision, answered.data.task_id) == ("ada", "resume", c)
    assert log.first(ev.TaskDispatched, c).position > answered.position
    assert [x.inputs for x in CARDS["echo"]][-1] == {"text": "other"}
    with pytest.raises(CardbusError, match="is not paused"):
        await answer_pause(store, root, "resume", by="ada")


async def test_resumed_with_a_note_alone_the_task_goes_past_the_loop(make_runtime, store):
    rt = await make_runtime([make_agent("echo")], policy=PAUSE)
    root = await rt.orch.submit(_looping())
    await wait_for(store, lambda e: isinstance(e.data, ev.RunPaused))
    await answer_pause(store, root, "resume", by="ada", note="it is meant to")
    r = await rt.orch.wait(root, 10)
    assert r.status == "completed" and r.outputs["c"] == {"text": "same"}
    assert len((await run_log(store, root)).of(ev.RunPaused)) == 1


async def test_stopped_the_run_halts(make_runtime, store):
    rt = await make_runtime([make_agent("echo")], policy=PAUSE)
    root = await rt.orch.submit(_looping())
    await wait_for(store, lambda e: isinstance(e.data, ev.RunPaused))
    await answer_pause(store, root, "stop", by="bob")
    r = await rt.orch.wait(root, 10)
    assert r.status == "halted" and r.reason == "loop_detected"
    log = await run_log(store, root)
    assert "stopped by bob" in log.first(ev.RunHalted).data.detail
    assert log.first(ev.TaskHalted, tid(root, "c"))


async def test_without_pause_a_loop_still_halts(make_runtime):
    rt = await make_runtime([make_agent("echo")], policy=dataclasses.replace(PAUSE, on_loop="halt"))
    r = await rt.run(_looping())
    assert r.status == "halted" and r.reason == "loop_detected"


async def test_tasks_sent_together_hold_the_looping_one_on_sqlite(tmp_path):
    """Four tasks ready at once, through the embedded runtime (the decide loop): the pause
    is written while the other dispatches are; a step deciding before it is folded must
    not send the task it holds (it did, on loop counts missing the dispatches in flight)."""
    from cardbus.bus.runtime.embedded import EmbeddedRuntime
    from cardbus.eventstore import SqliteEventStore

    # a plan id: its claim is written first, then the run decided by the decide loop
    four = plan(*[task(n, text="same") for n in ("one", "two", "three", "four")], plan_id="four")
    policy = dataclasses.replace(PAUSE, loop_threshold=3)
    async with (
        await SqliteEventStore.open(tmp_path / "log.db", poll_interval=0.01) as store,
        EmbeddedRuntime(store, [make_agent("echo")], policy) as rt,
    ):
        root = await rt.orchestrator.submit(four)
        await wait_for(store, lambda e: isinstance(e.data, ev.RunPaused))
        for name in ("one", "two", "three"):
            await wait_for(
                store,
                lambda e, n=name: isinstance(e.data, ev.TaskCompleted) and e.stream == tid(root, n),
            )
        assert await rt.orchestrator.caught_up(30)
        log = await run_log(store, root)
        assert not log.of(ev.TaskDispatched, tid(root, "four")), log.summary()
        evidence = log.first(ev.RunPaused).data.tasks
        assert evidence == sorted(tid(root, n) for n in ("one", "two", "three"))
        await answer_pause(store, root, "resume", by="ada", inputs={"text": "new"})
        r = await rt.orchestrator.wait(root, 10)
    assert r.status == "completed" and r.outputs["four"] == {"text": "new"}


async def test_a_pause_survives_a_restart_from_the_snapshot(tmp_path):
    """The pause is in the log and in the snapshot a stop writes: a new process holds the
    task as the first did, and the person's answer reaches it."""
    from orchkit import Runtime

    from cardbus.eventstore import SqliteEventStore

    db = tmp_path / "log.db"
    store = await SqliteEventStore.open(db, poll_interval=0.01)
    rt = await Runtime(store, [make_agent("echo")], policy=PAUSE).start()
    root = await rt.orch.submit(_looping())
    await wait_for(store, lambda e: isinstance(e.data, ev.RunPaused))
    await rt.stop()  # writes the snapshot beside the log
    await store.close()
    assert db.with_suffix(".db.snap").exists()
    store = await SqliteEventStore.open(db, poll_interval=0.01)
    try:
        rt = await Runtime(store, [make_agent("echo")], policy=PAUSE).start()
        try:
            assert rt.orch.snapshot_position > 0  # started from the snapshot
            assert rt.orch.state.runs[root].paused is not None
            await answer_pause(store, root, "resume", by="ada", inputs={"text": "later"})
            r = await rt.orch.wait(root, 10)
        finally:
            await rt.stop()
    finally:
        await store.close()
    assert r.status == "completed" and r.outputs["c"] == {"text": "later"}
