"""Bad input never crashes the bus nor corrupts the log (issue 3, item 6).

Invalid plans are refused before anything runs, with a message naming the
problem; broken agents produce failure or timeout events with the reason and
the run goes on; malformed bytes on the bus are reported, not fatal.
"""

from __future__ import annotations

import asyncio
import math

import pytest
from orchkit import CARDS, TextOut, ev, make_agent, plan, run_log, task, tid

from cardbus.agents.cards import ResultCard, encode
from cardbus.bus import Plan, PlanTask, decode_plan
from cardbus.eventstore import InvalidPlan

# -- invalid plans -------------------------------------------------------------

INVALID_PLANS = {
    "cycle": (
        plan(task("a", deps=["b"]), task("b", deps=["a"]), task("c")),
        r"dependency cycle among \['a', 'b'\]",
    ),
    "self dependency": (plan(task("a", deps=["a"])), r"dependency cycle among \['a'\]"),
    "unknown dependency": (plan(task("a", deps=["ghost"])), r"'a' depends on unknown task 'ghost'"),
    "undeclared dependency read": (
        plan(task("a"), task("b", inputs={"text": {"$dep": "a"}})),
        r"'b' reads the output of 'a' without declaring it",
    ),
    "unknown capability": (
        plan(task("a", "teleport")),
        r"'a': no registered agent offers capability 'teleport'",
    ),
    "unknown reviewer capability": (
        plan(task("a", review_by="judge")),
        r"'a': no registered agent offers capability 'judge'",
    ),
    "bad inputs": (
        plan(task("a", inputs={"text": 5})),
        r"'a': no agent accepts its inputs \(echo: input_schema_mismatch \(\$\.text: expected str",
    ),
    "missing inputs": (
        plan(task("a", inputs={})),
        r"'a': no agent accepts its inputs",
    ),
    "duplicate ids": (plan(task("a"), task("a")), r"task id 'a' appears twice"),
    "bad id": (plan(task("a.b")), r"task id 'a.b' must be"),
    # a goal alone is planned, by an agent offering "plan": here there is none
    "no tasks, no planner": (plan(), r"no registered agent offers capability .plan."),
    "no tasks, no goal": (plan(goal=" "), r"needs a goal"),
    "zero timeout": (plan(task("a", timeout_s=0)), r"'a'.*timeout_s"),
    "nan timeout": (plan(task("a", timeout_s=math.nan)), r"'a'.*timeout_s"),
    "infinite timeout": (plan(task("a", timeout_s=math.inf)), r"'a'.*timeout_s"),
    "zero attempts": (plan(task("a", max_attempts=0)), r"'a'.*max_attempts"),
    "zero fanout": (plan(task("a", fanout=0)), r"'a'.*fanout"),
    "negative budget": (plan(task("a"), budget_tokens=-1), r"budget_tokens"),
    "inputs over the event size limit": (
        plan(task("a"), task("big", text="x" * (2 * 1024 * 1024))),
        r"task 'big' is \d+ bytes, over the event size limit",
    ),
}


@pytest.mark.parametrize("name", sorted(INVALID_PLANS))
async def test_an_invalid_plan_is_refused_and_nothing_is_appended(name, make_runtime, store):
    bad, message = INVALID_PLANS[name]
    rt = await make_runtime([make_agent("echo")])
    before = await store.last_position()
    with pytest.raises(InvalidPlan, match=message):
        await rt.orch.submit(bad)
    await asyncio.sleep(0.05)
    assert await store.last_position() == before
    assert not CARDS
    # the orchestrator is fine afterwards
    assert (await rt.run(plan(task("ok")))).status == "completed"


MALFORMED_JSON = {
    "not json": b"{not json",
    "not utf-8": b"\xff\xfe\x00garbage",
    "empty": b"",
    "a list": b"[]",
    "goal of the wrong type": b'{"goal": 1, "tasks": []}',
    "task without capability": b'{"goal": "g", "tasks": [{"id": "a"}]}',
    "unknown field": b'{"goal": "g", "tasks": [], "tasks_typo": []}',
    "unknown task field": b'{"goal": "g", "tasks": [{"id": "a", "capability": "c", "dep": []}]}',
    "deps not a list": b'{"goal": "g", "tasks": [{"id": "a", "capability": "c", "deps": "b"}]}',
}


@pytest.mark.parametrize("name", sorted(MALFORMED_JSON))
def test_malformed_plan_json_is_an_invalid_plan(name):
    with pytest.raises(InvalidPlan, match="plan is not valid JSON of the plan format") as info:
        decode_plan(MALFORMED_JSON[name])
    assert info.value.__cause__ is not None  # translated at the boundary


async def test_a_decoded_plan_is_still_validated_on_submit(make_runtime, store):
    rt = await make_runtime([make_agent("echo")])
    data = b"""{"goal": "g", "tasks": [
        {"id": "a", "capability": "echo", "inputs": {"text": "x"}, "deps": ["b"]},
        {"id": "b", "capability": "echo", "inputs": {"text": "y"}, "deps": ["a"]}]}"""
    p = decode_plan(data)
    assert isinstance(p, Plan) and isinstance(p.tasks[0], PlanTask)
    before = await store.last_position()
    with pytest.raises(InvalidPlan, match="cycle"):
        await rt.orch.submit(p)
    assert await store.last_position() == before


# -- broken agents ---------------------------------------------------------------


async def _hang(t, i, c):  # type: ignore[no-untyped-def]
    await asyncio.sleep(3600)


def _raise(t, i, c):  # type: ignore[no-untyped-def]
    raise ValueError("the agent has a bug")


#: the words of a timed-out attempt, by who timed it out: the first to see it says so
HUNG = {
    "orchestrator": "no result from hangs by the deadline",
    "worker": "TimeoutError: still running",
}

BROKEN = {
    "garbage": (lambda t, i, c: object(), "agent_error", "Encoding objects of type object"),
    "garbage keys": (lambda t, i, c: {(1, 2): "x"}, "agent_error", "str-like or number-like"),
    "raises": (_raise, "agent_error", "ValueError: the agent has a bug"),
    # timed out by the orchestrator's deadline, or (its timer late on a busy machine) by
    # the worker's backstop, which cancels the handler: the same reason, each its own words
    "hangs": (_hang, "timeout", HUNG),
    "wrong type": (lambda t, i, c: ["a", "list"], "output_schema_mismatch", "expected object"),
    "huge output": (
        lambda t, i, c: TextOut(text="x" * (2 * 1024 * 1024)),
        "agent_error",
        "over the limit",
    ),
}


async def test_broken_agents_fail_with_the_reason_and_the_run_goes_on(make_runtime, store):
    agents = [make_agent("good", "good")]
    agents += [
        make_agent(name.replace(" ", "_"), name.replace(" ", "_"), h)
        for name, (h, _, _) in BROKEN.items()
    ]
    rt = await make_runtime(agents, concurrency=2)
    tasks = [task("first", "good"), task("second", "good", deps=["first"])]
    tasks += [
        task(n.replace(" ", "_"), n.replace(" ", "_"), timeout_s=0.5, max_attempts=2)
        for n in BROKEN
    ]
    r = await rt.run(plan(*tasks), timeout=15)
    assert r.status == "failed"
    log = await run_log(store, r.root_id)
    for n in ("first", "second"):
        assert log.first(ev.TaskCompleted, tid(r.root_id, n)).data.agent_id == "good"
    for name, (_, reason, detail) in BROKEN.items():
        t = tid(r.root_id, name.replace(" ", "_"))
        failed = log.first(ev.TaskFailed, t).data
        assert failed.reason == reason, (name, failed)
        retry = log.first(ev.TaskRetryScheduled, t).data
        assert retry.reason.startswith(reason), (name, retry)
        assert failed.attempts == 2
        if detail is not HUNG:
            assert detail in retry.reason, (name, retry.reason)
            continue
        # whoever timed attempt 1 out first, the log shows it did, in its words
        timed_out = [x.attempt for x in log.of(ev.TaskTimedOut, t)]
        backstop = [
            x.attempt
            for x in log.of(ev.TaskResultSubmitted, t)
            if x.status == "failed" and (x.error or "").startswith(HUNG["worker"])
        ]
        by = "orchestrator" if HUNG["orchestrator"] in retry.reason else "worker"
        assert HUNG[by] in retry.reason, retry.reason
        assert 1 in (timed_out if by == "orchestrator" else backstop), (by, log.summary())
    assert sorted(log.first(ev.RunFailed).data.failed_tasks) == sorted(
        tid(r.root_id, n.replace(" ", "_")) for n in BROKEN
    )
    assert await store.verify() == []


# -- malformed bytes on the bus -----------------------------------------------------


async def test_malformed_bytes_on_the_bus_are_reported_and_nothing_crashes(make_runtime, store):
    rt = await make_runtime([make_agent("echo")])
    before = await store.last_position()
    await rt.bus.send_raw("echo", b"\x00\x01 not a card")
    await rt.bus.send_raw("echo", b'{"type": "task_card", "task_id": 5}')
    await rt.bus.reply_raw(b"{not json")
    await rt.bus.reply_raw(b'{"type": "result_card", "task_id": "x"}')  # fields missing
    await rt.bus.reply_raw(b'{"type": "no_such_reply"}')
    # a well-formed result for a task that does not exist
    await rt.bus.reply_raw(
        encode(ResultCard(task_id="ghost", attempt=1, agent_id="echo", status="completed"))
    )
    for _ in range(100):
        if len(rt.orch.bad_messages) >= 6:
            break
        await asyncio.sleep(0.01)
    subjects = [s for s, _ in rt.orch.bad_messages]
    assert subjects.count("cardbus.agent.echo") == 2
    assert subjects.count("cardbus.reply") == 4
    assert all(reason for _, reason in rt.orch.bad_messages)
    assert any("ghost" in reason for _, reason in rt.orch.bad_messages)
    assert await store.last_position() == before  # nothing was written for any of it
    assert not CARDS
    r = await rt.run(plan(task("after")))  # the bus and the orchestrator still work
    assert r.status == "completed"


async def test_a_dependency_output_that_does_not_fit_fails_with_the_reason(make_runtime, store):
    rt = await make_runtime([make_agent("echo")])
    r = await rt.run(
        plan(task("a"), task("b", deps=["a"], inputs={"text": {"$dep": "a", "path": "nope"}}))
    )
    assert r.status == "failed"
    log = await run_log(store, r.root_id)
    b = tid(r.root_id, "b")
    failed = log.first(ev.TaskFailed, b).data
    assert failed.reason == "no_capable_agent"
    assert "echo: input_schema_mismatch" in failed.error
    assert not log.of(ev.TaskDispatched, b)
    assert [c.task_id for c in CARDS["echo"]] == [tid(r.root_id, "a")]


async def test_a_failing_observer_does_not_stop_the_orchestrator(make_runtime, store):
    rt = await make_runtime([make_agent("echo")])
    seen: list[str] = []

    def broken(env):  # type: ignore[no-untyped-def]
        seen.append(env.type)
        raise RuntimeError("observer bug")

    rt.orch.observers.append(broken)
    r = await rt.run(plan(task("a", text="x"), task("b", deps=["a"], text="y")))
    assert r.status == "completed"
    assert "run.completed.v1" in seen  # it kept being called, and the run went on
