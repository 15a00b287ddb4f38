"""Plans as DAGs: parallel where independent, ordered where dependent, isolated context."""

from __future__ import annotations

import asyncio
import hashlib
import os

import msgspec
import pytest
from orchkit import CARDS, TextOut, ev, is_, make_agent, plan, run_log, task, tid, wait_for

from cardbus.eventstore import Append, InvalidPlan
from cardbus.projections.replay import build_timeline


async def _slow(task_card, inputs, ctx):  # type: ignore[no-untyped-def]
    await asyncio.sleep(0.15)
    return TextOut(text=inputs.text.upper())


class JoinIn(msgspec.Struct, frozen=True):
    left: str
    right: str


async def test_independent_tasks_run_in_parallel_dependent_ones_wait(make_runtime, store):
    a = make_agent("slow_a", "a", _slow)
    b = make_agent("slow_b", "b", _slow)
    join = make_agent(
        "joiner", "join", lambda t, i, c: TextOut(text=i.left + i.right), input_type=JoinIn
    )
    rt = await make_runtime([a, b, join])
    result = await rt.run(
        plan(
            task("A", "a", "x"),
            task("B", "b", "y"),
            task(
                "C",
                "join",
                deps=["A", "B"],
                inputs={
                    "left": {"$dep": "A", "path": "text"},
                    "right": {"$dep": "B", "path": "text"},
                },
            ),
        )
    )
    assert result.status == "completed"
    assert result.outputs["C"] == {"text": "XY"}
    log = await run_log(store, result.root_id)
    A, B, C = (tid(result.root_id, n) for n in "ABC")
    disp = {s: log.first(ev.TaskDispatched, s).position for s in (A, B, C)}
    res = {s: log.first(ev.TaskResultSubmitted, s).position for s in (A, B, C)}
    done = {s: log.first(ev.TaskCompleted, s).position for s in (A, B, C)}
    # both independent tasks were out before either answered: they overlapped in time
    assert max(disp[A], disp[B]) < min(res[A], res[B])
    # the dependent one waited for both
    assert disp[C] > max(done[A], done[B])
    assert len(log.of(ev.TaskDispatched, C)) == 1


async def test_agent_receives_only_its_inputs_with_declared_deps_resolved(make_runtime, store):
    echo = make_agent("echo", "echo")
    upper = make_agent("upper", "upper", lambda t, i, c: TextOut(text=i.text.upper()))
    rt = await make_runtime([echo, upper])
    result = await rt.run(
        plan(
            task("secret", "echo", "other task's SECRET output"),
            task("src", "echo", "public facts"),
            task(
                "use",
                "upper",
                deps=["src"],
                inputs={"text": {"$dep": "src", "path": "text"}},
            ),
            session={"request": "session SECRET the agent must not see"},
        )
    )
    assert result.status == "completed"
    card = CARDS["upper"][0]
    src = tid(result.root_id, "src")
    assert card.inputs == {"text": "public facts"}
    assert card.deps == [src]
    assert card.task_id == tid(result.root_id, "use")
    assert card.review == [] and card.supplement is None
    assert b"SECRET" not in msgspec.json.encode(card)
    # the dispatched event pins exactly what was sent
    log = await run_log(store, result.root_id)
    sent = log.first(ev.TaskDispatched, card.task_id).data
    digest = hashlib.sha256(msgspec.json.encode(card.inputs, order="sorted")).hexdigest()
    assert sent.inputs_digest == digest
    assert result.outputs["use"] == {"text": "PUBLIC FACTS"}


async def test_whole_output_of_a_dep_when_no_path(make_runtime):
    class Whole(msgspec.Struct, frozen=True):
        text: TextOut

    wrap = make_agent(
        "wrap", "wrap", lambda t, i, c: TextOut(text="got " + i.text.text), input_type=Whole
    )
    rt = await make_runtime([make_agent("echo"), wrap])
    result = await rt.run(
        plan(task("a", text="v"), task("b", "wrap", deps=["a"], inputs={"text": {"$dep": "a"}}))
    )
    assert result.outputs["b"] == {"text": "got v"}
    assert CARDS["wrap"][0].inputs == {"text": {"text": "v"}}


async def test_plan_reading_an_undeclared_dep_is_refused(make_runtime, store):
    rt = await make_runtime([make_agent("echo")])
    before = await store.last_position()
    bad = plan(task("a"), task("b", inputs={"text": {"$dep": "a", "path": "text"}}))
    with pytest.raises(InvalidPlan, match=r"'b' reads the output of 'a' without declaring it"):
        await rt.orch.submit(bad)
    assert await store.last_position() == before
    assert "echo" not in CARDS


async def test_a_chain_runs_in_order(make_runtime, store):
    rt = await make_runtime(
        [make_agent("echo"), make_agent("up", "upper", lambda t, i, c: TextOut(text=i.text + "!"))]
    )
    result = await rt.run(
        plan(
            task("one", "upper", "a"),
            task("two", "upper", deps=["one"], inputs={"text": {"$dep": "one", "path": "text"}}),
            task("three", "upper", deps=["two"], inputs={"text": {"$dep": "two", "path": "text"}}),
        )
    )
    assert result.outputs["three"] == {"text": "a!!!"}
    log = await run_log(store, result.root_id)
    order = [e.stream.split("-")[0] for e in log.e((ev.TaskDispatched, ev.TaskCompleted))]
    assert order == ["one", "one", "two", "two", "three", "three"]
    assert isinstance(log.envs[-1].data, ev.RunCompleted)


# -- a completion and what follows it share one write -------------------------


async def test_a_dependent_is_dispatched_in_the_write_that_completes_its_dependency(
    make_runtime, store
):
    rt = await make_runtime([make_agent("echo")])
    r = await rt.run(plan(task("a", text="x"), task("b", deps=["a"], text="y")))
    assert r.status == "completed"
    log = await run_log(store, r.root_id)
    a, b = tid(r.root_id, "a"), tid(r.root_id, "b")
    completed_a = log.first(ev.TaskCompleted, a)
    # right after it, in the same commit: no round trip through the log in between
    assert log.first(ev.TaskDispatched, b).position == completed_a.position + 1
    assert log.first(ev.RunCompleted).position == log.first(ev.TaskCompleted, b).position + 1


async def test_a_completion_that_is_not_written_takes_what_follows_it_along(make_runtime, store):
    """The dependent's dispatch rests on a's result: if a's write fails, neither is logged."""
    real_append_many = store.append_many
    failed: list[str] = []

    async def failing_completion(appends):  # type: ignore[no-untyped-def]
        out = []
        for a in appends:
            if not failed and any(isinstance(e.data, ev.TaskCompleted) for e in a.events):
                failed.append(a.stream)
                a = Append(a.stream, a.events, a.expected_version + 99, a.after)  # refused
            out.append(a)
        return await real_append_many(out)

    store.append_many = failing_completion  # type: ignore[method-assign]
    rt = await make_runtime([make_agent("echo")])
    r = await rt.run(plan(task("a", text="x", timeout_s=0.3), task("b", deps=["a"], text="y")))
    assert failed, "the fault was not injected"
    assert r.status == "completed"
    log = await run_log(store, r.root_id)
    a, b = tid(r.root_id, "a"), tid(r.root_id, "b")
    # a's answer, its write refused, was decided again on the stream as it is (an attempt
    # whose card was taken without a Started would only time out at the queue limit)
    assert not log.of(ev.TaskTimedOut, a)
    assert log.first(ev.TaskCompleted, a).data.attempt == 1
    # b was dispatched once, after a's completion that is in the log
    (dispatched,) = log.e(ev.TaskDispatched, b)
    assert dispatched.position > log.first(ev.TaskCompleted, a).position


async def test_a_fast_answer_implies_the_start_a_slow_agent_reports_it(make_runtime, store):
    rt = await make_runtime([make_agent("echo")], started_after_s=30)  # answers well within
    fast = await rt.run(plan(task("f", text="x")))
    await rt.stop()
    log = await run_log(store, fast.root_id)
    f = tid(fast.root_id, "f")
    # no TaskStarted of its own: the result, right after the dispatch, says who ran it
    assert log.tags(f) == ["created", "dispatched", "result_submitted", "completed"]
    result = log.first(ev.TaskResultSubmitted, f).data
    assert result.replica_id and result.pid == os.getpid() and result.delivery == 1
    # ... and the timeline dates the attempt's start by it
    (span,) = build_timeline(log.envs, f, fast.root_id).tasks[0].spans
    assert span.started == log.first(ev.TaskResultSubmitted, f).recorded_at

    gate = asyncio.Event()

    async def gated(task_card, inputs, ctx):  # type: ignore[no-untyped-def]
        await gate.wait()
        return TextOut(text=inputs.text)

    rt = await make_runtime([make_agent("waiter", "wait", gated)], started_after_s=0.01)
    root = await rt.orch.submit(plan(task("s", "wait", text="y")))
    s = tid(root, "s")
    await wait_for(store, is_(ev.TaskStarted, s))  # while the handler still waits
    gate.set()
    slow = await rt.orch.wait(root, 10)
    assert slow.status == "completed"
    started = (await run_log(store, root)).first(ev.TaskStarted, s)
    assert started.data.implied is False  # the agent's own Started reply
