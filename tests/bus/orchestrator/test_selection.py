"""Selection: a hard filter, then the hybrid score; the choice is in the dispatched event."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from orchkit import TableEmbedder, TextOut, ev, make_agent, plan, run_log, task, tid

from cardbus.agents.cards import AgentConstraints
from cardbus.bus import Policy
from cardbus.bus.orchestrator.selection import Weights


class NumIn(msgspec.Struct, frozen=True):
    n: int


async def test_hard_filter_on_capability(make_runtime, store):
    rt = await make_runtime([make_agent("echoer", "echo"), make_agent("other", "translate")])
    result = await rt.run(plan(task("t", "echo")))
    log = await run_log(store, result.root_id)
    d = log.first(ev.TaskDispatched).data
    assert d.agent_id == "echoer"
    assert [c.agent_id for c in d.candidates] == ["echoer"]


async def test_hard_filter_on_input_schema(make_runtime, store):
    num = make_agent("numbers", "echo", lambda t, i, c: TextOut(text=str(i.n)), input_type=NumIn)
    rt = await make_runtime([num, make_agent("texts", "echo")])
    r1 = await rt.run(plan(task("t", inputs={"text": "hello"})))
    r2 = await rt.run(plan(task("n", inputs={"n": 7})))
    for r, agent in ((r1, "texts"), (r2, "numbers")):
        d = (await run_log(store, r.root_id)).first(ev.TaskDispatched).data
        assert d.agent_id == agent
        assert [c.agent_id for c in d.candidates] == [agent]
    assert r2.outputs["n"] == {"text": "7"}


async def test_hard_filter_on_constraints(make_runtime, store):
    en = make_agent("en", constraints=AgentConstraints(limits={"language": ["en"]}))
    fr = make_agent("fr", constraints=AgentConstraints(limits={"language": ["fr", "de"]}))
    short = make_agent(
        "short", constraints=AgentConstraints(max_timeout_s=1.0, limits={"language": ["fr"]})
    )
    rt = await make_runtime([en, fr, short])
    result = await rt.run(plan(task("t", constraints={"language": "fr"}, timeout_s=2.0)))
    d = (await run_log(store, result.root_id)).first(ev.TaskDispatched).data
    assert d.agent_id == "fr"
    assert [c.agent_id for c in d.candidates] == ["fr"]


async def test_hybrid_score_and_candidates_in_dispatched_event(make_runtime, store):
    emb = TableEmbedder({"alpha": 0.9, "beta": 0.2})
    rt = await make_runtime(
        [make_agent("b", description="beta"), make_agent("a", description="alpha")],
        embedder=emb,
    )
    result = await rt.run(plan(task("t")))
    d = (await run_log(store, result.root_id)).first(ev.TaskDispatched).data
    assert d.agent_id == "a"
    assert [c.agent_id for c in d.candidates] == ["a", "b"]
    best = d.candidates[0]
    assert d.score == best.score
    # no history: success and speed priors of 0.5; default weights 0.5/0.3/0.2
    assert best.similarity == pytest.approx(0.9)
    assert best.success_rate == pytest.approx(0.5) and best.speed == pytest.approx(0.5)
    assert best.score == pytest.approx(0.5 * 0.9 + 0.3 * 0.5 + 0.2 * 0.5)
    assert d.candidates[1].score == pytest.approx(0.5 * 0.2 + 0.3 * 0.5 + 0.2 * 0.5)


async def test_weights_are_configurable(make_runtime, store):
    emb = TableEmbedder({"alpha": 0.9, "beta": 0.2})
    policy = Policy(weights=Weights(similarity=0.0, success=1.0, speed=0.0), tick_s=0.01)
    rt = await make_runtime(
        [make_agent("b", description="beta"), make_agent("a", description="alpha")],
        embedder=emb,
        policy=policy,
    )
    result = await rt.run(plan(task("t")))
    d = (await run_log(store, result.root_id)).first(ev.TaskDispatched).data
    # similarity weighs nothing: both score the success prior, the tie goes by agent id
    assert [c.score for c in d.candidates] == [pytest.approx(0.5), pytest.approx(0.5)]


async def test_speed_weight_picks_the_faster_agent_from_past_events(store, make_runtime):
    async def slow(t, i, c):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0.2)
        c.confidence = 0.5
        return TextOut(text="slow")

    def quick(t, i, c):  # type: ignore[no-untyped-def]
        c.confidence = 0.9
        return TextOut(text="quick")

    agents = [
        make_agent("slow", handler=slow, description="alpha"),
        make_agent("quick", handler=quick, description="beta"),
    ]
    emb = TableEmbedder({"alpha": 0.9, "beta": 0.5})
    rt = await make_runtime(agents, embedder=emb)
    # one fanned-out task gives both agents a history
    warm = await rt.run(plan(task("warm", fanout=2)))
    assert warm.outputs["warm"] == {"text": "quick"}
    r = await rt.run(plan(task("t")))
    assert (await run_log(store, r.root_id)).first(ev.TaskDispatched).data.agent_id == "slow"
    await rt.stop()

    speedy = Policy(weights=Weights(similarity=0.1, success=0.0, speed=0.9), tick_s=0.01)
    rt2 = await make_runtime(agents, embedder=emb, policy=speedy)
    r2 = await rt2.run(plan(task("t2")))
    d = (await run_log(store, r2.root_id)).first(ev.TaskDispatched).data
    assert d.agent_id == "quick"
    by_id = {c.agent_id: c for c in d.candidates}
    assert by_id["quick"].speed > by_id["slow"].speed


async def test_a_failing_agent_loses_to_a_succeeding_one_after_some_runs(make_runtime, store):
    def boom(t, i, c):  # type: ignore[no-untyped-def]
        raise RuntimeError("flaky")

    emb = TableEmbedder({"flaky": 0.9, "steady": 0.8})
    rt = await make_runtime(
        [
            make_agent("flaky", handler=boom, description="flaky"),
            make_agent("steady", description="steady"),
        ],
        embedder=emb,
    )
    firsts = []
    for i in range(3):
        r = await rt.run(plan(task(f"t{i}")))
        assert r.status == "completed"
        log = await run_log(store, r.root_id)
        firsts.append(log.first(ev.TaskDispatched).data)
        assert log.first(ev.TaskCompleted).data.agent_id == "steady"
    assert firsts[0].agent_id == "flaky"
    assert firsts[-1].agent_id == "steady"
    flaky = next(c for c in firsts[-1].candidates if c.agent_id == "flaky")
    assert flaky.success_rate == 0.0


async def test_retry_reselects_within_the_task(make_runtime, store):
    def boom(t, i, c):  # type: ignore[no-untyped-def]
        raise RuntimeError("flaky")

    emb = TableEmbedder({"flaky": 0.9, "steady": 0.8})
    rt = await make_runtime(
        [
            make_agent("flaky", handler=boom, description="flaky"),
            make_agent("steady", description="steady"),
        ],
        embedder=emb,
    )
    r = await rt.run(plan(task("t")))
    log = await run_log(store, r.root_id)
    t = tid(r.root_id, "t")
    assert [d.agent_id for d in log.of(ev.TaskDispatched, t)] == ["flaky", "steady"]
