"""Needs input: a supplementary task with its own id, then the asking task re-runs with it."""

from __future__ import annotations

from orchkit import CARDS, TextOut, ev, make_agent, plan, run_log, task, tid

from cardbus.agents.agent import NeedsInput


def _asker(t, i, c):  # type: ignore[no-untyped-def]
    if t.supplement is None:
        raise NeedsInput("the figures", capability="figures", inputs={"text": "figures please"})
    return TextOut(text=f"{i.text} with {t.supplement['text']}")


async def test_supplementary_task_then_input_provided_then_rerun(make_runtime, store):
    supplier = make_agent("supplier", "figures", lambda t, i, c: TextOut(text="42"))
    rt = await make_runtime([make_agent("asker", "outline", _asker), supplier])
    r = await rt.run(plan(task("ask", "outline", "report")))
    assert r.status == "completed"
    assert r.outputs["ask"] == {"text": "report with 42"}
    log = await run_log(store, r.root_id)
    a = tid(r.root_id, "ask")
    needs = log.first(ev.TaskNeedsInput, a).data
    supp = needs.supplementary_task_id
    assert supp and supp != a
    assert needs.missing == "the figures" and needs.agent_id == "asker"
    created = log.first(ev.TaskCreated, supp).data
    assert (created.parent_id, created.role, created.capability) == (a, "supplement", "figures")
    assert created.inputs == {"text": "figures please"}
    assert created.root_id == r.root_id
    assert log.first(ev.TaskCompleted, supp).data.agent_id == "supplier"
    provided = log.first(ev.InputProvided, a)
    assert provided.data.supplementary_task_id == supp
    assert provided.data.output == {"text": "42"}
    assert provided.position > log.first(ev.TaskCompleted, supp).position
    assert log.tags(a) == [
        "created",
        "dispatched",
        "result_submitted",
        "needs_input",
        "input_provided",
        "dispatched",
        "result_submitted",
        "completed",
    ]
    first, second = CARDS["asker"]
    assert first.supplement is None and second.supplement == {"text": "42"}
    assert first.inputs == second.inputs
    assert CARDS["supplier"][0].task_id == supp
    assert CARDS["supplier"][0].parent_id == a


async def test_needs_input_without_a_capability_fails(make_runtime, store):
    def asker(t, i, c):  # type: ignore[no-untyped-def]
        raise NeedsInput("something nobody can give")

    rt = await make_runtime([make_agent("asker", handler=asker)])
    r = await rt.run(plan(task("ask")))
    assert r.status == "failed"
    failed = (await run_log(store, r.root_id)).first(ev.TaskFailed).data
    assert failed.reason == "needs_input_unanswered"


async def test_a_failed_supplement_fails_the_asking_task(make_runtime, store):
    def broken(t, i, c):  # type: ignore[no-untyped-def]
        raise RuntimeError("no figures today")

    supplier = make_agent("supplier", "figures", broken)
    rt = await make_runtime([make_agent("asker", "outline", _asker), supplier])
    r = await rt.run(plan(task("ask", "outline", "report", max_attempts=1)))
    assert r.status == "failed"
    log = await run_log(store, r.root_id)
    a = tid(r.root_id, "ask")
    supp = log.first(ev.TaskNeedsInput, a).data.supplementary_task_id
    assert log.first(ev.TaskFailed, supp).data.reason == "agent_error"
    failed = log.first(ev.TaskFailed, a).data
    assert failed.reason == "supplementary_task_failed"
    assert log.first(ev.RunFailed).data.failed_tasks == [a]
