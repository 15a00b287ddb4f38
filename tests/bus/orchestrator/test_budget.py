"""Token budget: usage from result cards is summed per root; over the budget halts."""

from __future__ import annotations

from orchkit import CARDS, TextOut, ev, make_agent, plan, run_log, task, tid


def _spend(tokens: int):  # type: ignore[no-untyped-def]
    def handler(t, i, c):  # type: ignore[no-untyped-def]
        c.usage(input_tokens=tokens // 2, output_tokens=tokens - tokens // 2)
        return TextOut(text=i.text)

    return handler


def _chain():  # type: ignore[no-untyped-def]
    return (
        task("a"),
        task("b", deps=["a"]),
        task("c", deps=["b"]),
    )


async def test_usage_over_the_budget_halts_the_run(make_runtime, store):
    rt = await make_runtime([make_agent("spender", handler=_spend(100))])
    r = await rt.run(plan(*_chain(), budget_tokens=150))
    assert r.status == "halted" and r.reason == "budget_exceeded"
    log = await run_log(store, r.root_id)
    used = [x.usage.input_tokens + x.usage.output_tokens for x in log.of(ev.TaskResultSubmitted)]
    assert used == [100, 100]
    assert log.first(ev.RunStarted).data.budget_tokens == 150
    halted = log.first(ev.RunHalted).data
    assert halted.reason == "budget_exceeded" and "200" in halted.detail
    c = tid(r.root_id, "c")
    assert log.first(ev.TaskHalted, c).data.reason == "budget_exceeded"
    assert not log.of(ev.TaskDispatched, c)
    assert len(CARDS["spender"]) == 2


async def test_within_the_budget_the_run_completes(make_runtime, store):
    rt = await make_runtime([make_agent("spender", handler=_spend(100))])
    r = await rt.run(plan(*_chain(), budget_tokens=300))
    assert r.status == "completed"
    log = await run_log(store, r.root_id)
    assert not log.of(ev.RunHalted) and not log.of(ev.TaskHalted)


async def test_negative_usage_does_not_buy_budget_back(make_runtime, store):
    def cheat(t, i, c):  # type: ignore[no-untyped-def]
        if t.task_id.startswith("a"):
            c.usage(input_tokens=100)
        else:  # a broken agent reports a negative count
            c.usage(input_tokens=-1000, output_tokens=100)
        return TextOut(text=i.text)

    rt = await make_runtime([make_agent("cheat", handler=cheat)])
    r = await rt.run(plan(*_chain(), budget_tokens=150))
    assert r.status == "halted" and r.reason == "budget_exceeded"
    log = await run_log(store, r.root_id)
    assert "200 tokens" in log.first(ev.RunHalted).data.detail
    assert not log.of(ev.TaskDispatched, tid(r.root_id, "c"))
