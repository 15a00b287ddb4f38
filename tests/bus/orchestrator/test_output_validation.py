"""Output validation: an output that breaks the capability's output schema is retried."""

from __future__ import annotations

from orchkit import TextOut, ev, make_agent, plan, run_log, task, tid


async def test_wrong_output_type_is_retried_with_output_schema_mismatch(make_runtime, store):
    def sloppy(t, i, c):  # type: ignore[no-untyped-def]
        if t.attempt == 1:
            return {"words": ["not", "the", "schema"]}  # wrong shape
        return TextOut(text="fixed")

    rt = await make_runtime([make_agent("sloppy", handler=sloppy)])
    r = await rt.run(plan(task("t")))
    assert r.status == "completed" and r.outputs["t"] == {"text": "fixed"}
    log = await run_log(store, r.root_id)
    t = tid(r.root_id, "t")
    first = log.first(ev.TaskResultSubmitted, t).data
    assert first.status == "completed" and first.output == {"words": ["not", "the", "schema"]}
    retry = log.first(ev.TaskRetryScheduled, t).data
    assert retry.attempt == 2
    assert retry.reason.startswith("output_schema_mismatch")
    assert "text" in retry.reason  # names the missing field
    assert len(log.of(ev.TaskCompleted, t)) == 1


async def test_schema_mismatch_counts_against_the_agent(make_runtime, store):
    rt = await make_runtime([make_agent("sloppy", handler=lambda t, i, c: "just a string")])
    r = await rt.run(plan(task("t", max_attempts=2)))
    assert r.status == "failed"
    log = await run_log(store, r.root_id)
    failed = log.first(ev.TaskFailed).data
    assert failed.reason == "output_schema_mismatch" and failed.attempts == 2
    stat = rt.orch.state.get("sloppy", "echo")
    assert stat.runs == 2 and stat.success_rate == 0.0
