"""Loop detection: the same (capability, normalized inputs) on too many tasks halts the run."""

from __future__ import annotations

import hashlib
import re

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st
from orchkit import CARDS, FAST, ev, make_agent, plan, run_log, task, tid

from cardbus.agents.agent import NeedsInput
from cardbus.bus import Policy
from cardbus.bus.orchestrator.decisions import loop_hash


def _always_asking(t, i, c):  # type: ignore[no-untyped-def]
    raise NeedsInput("the same thing", capability="lookup", inputs={"text": "the same thing"})


async def test_an_agent_that_keeps_asking_for_the_same_input_halts_the_run(make_runtime, store):
    agents = [make_agent("asker", "ask", _always_asking), make_agent("lookup", "lookup")]
    rt = await make_runtime(agents)
    r = await rt.run(plan(task("ask", "ask"), task("later", "ask", deps=["ask"])))
    assert r.status == "halted" and r.reason == "loop_detected"
    log = await run_log(store, r.root_id)
    a = tid(r.root_id, "ask")
    halted_run = log.first(ev.RunHalted)
    assert halted_run.stream == r.root_id and halted_run.data.reason == "loop_detected"
    halted = {x.stream: x.data for x in log.e(ev.TaskHalted)}
    assert halted[a].reason == "loop_detected"
    assert halted[tid(r.root_id, "later")].reason == "loop_detected"
    # the supplementary lookups repeated the same hash on loop_threshold tasks, then it stopped
    lookups = [x for x in log.e(ev.TaskCreated) if x.data.role == "supplement"]
    hashes = {d.loop_hash for x in lookups for d in log.of(ev.TaskDispatched, x.stream)}
    assert len(hashes) == 1
    dispatched_lookups = [x for x in lookups if log.of(ev.TaskDispatched, x.stream)]
    assert len(dispatched_lookups) == FAST.loop_threshold
    assert len(log.of(ev.TaskNeedsInput, a)) == FAST.loop_threshold + 1
    # nothing was dispatched after the halt
    assert max(x.position for x in log.e(ev.TaskDispatched)) < halted_run.position
    assert len(CARDS["lookup"]) == FAST.loop_threshold


async def test_normalized_inputs_count_as_the_same(make_runtime, store):
    rt = await make_runtime([make_agent("echo")], policy=Policy(loop_threshold=1, tick_s=0.01))
    r = await rt.run(
        plan(task("a", text="Hello   World"), task("b", text=" hello world", deps=["a"]))
    )
    assert r.status == "halted" and r.reason == "loop_detected"
    log = await run_log(store, r.root_id)
    assert log.first(ev.TaskCompleted, tid(r.root_id, "a"))
    assert log.first(ev.TaskHalted, tid(r.root_id, "b")).data.reason == "loop_detected"
    assert not log.of(ev.TaskDispatched, tid(r.root_id, "b"))


async def test_different_inputs_are_not_a_loop(make_runtime, store):
    rt = await make_runtime([make_agent("echo")])
    n = FAST.loop_threshold + 3
    r = await rt.run(plan(*(task(f"t{i}", text=f"input {i}") for i in range(n))))
    assert r.status == "completed"
    log = await run_log(store, r.root_id)
    assert len({d.loop_hash for d in log.of(ev.TaskDispatched)}) == n
    assert not log.of(ev.RunHalted)


async def test_a_halt_drops_subtasks_decided_in_the_same_step_and_keeps_results():
    """The Decider is pure: a state folded from a log, a reply and a clock in; events out."""
    import time

    import msgspec

    from cardbus.agents.cards import ResultCard
    from cardbus.bus.orchestrator.decisions import Decider
    from cardbus.bus.orchestrator.runstate import RunState
    from cardbus.eventstore import MemoryEventStore, NewEvent
    from cardbus.eventstore.events import Usage

    store = MemoryEventStore()
    state = RunState()

    async def put(stream: str, *data: ev.Event) -> None:
        for env in await store.append(
            stream,
            [NewEvent(data=x, correlation_id="root") for x in data],
            await store.stream_version(stream),
        ):
            state.apply(env)

    for agent in (make_agent("asker", "ask"), make_agent("echo")):
        card = agent.card()
        await put(
            f"agent-{card.agent_id}",
            ev.AgentRegistered(agent_id=card.agent_id, card=msgspec.to_builtins(card)),
        )
    await put("root", ev.RunStarted(goal="g", plan_id="p", task_ids=["ask", "dup"]))
    await put(
        "ask", ev.TaskCreated(root_id="root", capability="ask", inputs={"text": "q"}, plan_id="ask")
    )
    await put(
        "dup",
        ev.TaskCreated(root_id="root", capability="echo", inputs={"text": "d"}, plan_id="dup"),
    )
    await put("ask", ev.TaskDispatched(attempt=1, agent_id="asker", deadline=time.time() + 60))

    decider = Decider(state, Policy(loop_threshold=0), time.time())
    decider.on_reply(
        ResultCard(
            task_id="ask",
            attempt=1,
            agent_id="asker",
            status="needs_input",
            missing="more",
            supplement_capability="echo",
            supplement_inputs={"text": "more"},
            usage=Usage(input_tokens=5),
        )
    )
    assert "ask~input1" in decider.d.events  # a supplementary task was decided...
    decider.advance(state.runs["root"])  # ...then dispatching "dup" trips the loop threshold
    d = decider.d
    assert "ask~input1" not in d.events  # ...so it is never created
    assert [type(e).__name__ for e in d.events["ask"]] == [
        "TaskResultSubmitted",
        "TaskHalted",
    ]
    assert [type(e).__name__ for e in d.events["dup"]] == ["TaskHalted"]
    assert [e.reason for e in d.events["root"]] == ["loop_detected"]
    assert not d.sends


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_loop_hash_folds_whitespace_and_case_as_the_pattern_says(text: str) -> None:
    # the hash is stored with every dispatch: its folding must stay exactly
    # "strip, lower, runs of whitespace (\s+) to one space"
    folded = re.sub(r"\s+", " ", text.strip().lower())
    assert loop_hash("echo", {"t": text}) == loop_hash("echo", {"t": folded})
    assert (
        loop_hash("echo", [text])
        == hashlib.sha256(b"echo\0" + msgspec.json.encode([folded])).hexdigest()[:32]
    )
