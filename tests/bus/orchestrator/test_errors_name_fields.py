"""Failure reasons name the field and why (issue 15 item 7), checked on the events written.

* an input that breaks the agents' schema: ``$.text: expected str, got int``;
* a ``$dep`` path that leads nowhere: ``$dep 'q' has no path 'nosuch.field'``;
* a failed run names each failed plan task and its reason (``run.failed.detail``).
"""

from __future__ import annotations

import msgspec
from orchkit import make_agent, plan, run_log, task, tid

from cardbus.eventstore import events as ev


class Region(msgspec.Struct, frozen=True):
    region: str


async def test_a_dep_path_that_leads_nowhere_is_named_and_the_run_names_its_failed_task(
    make_runtime, store
) -> None:  # type: ignore[no-untyped-def]
    rt = await make_runtime(
        [make_agent("echoer", "echo"), make_agent("r", "regions", input_type=Region)]
    )
    p = plan(
        task("q"),  # outputs {"text": "q"}
        task(
            "w",
            "regions",
            deps=["q"],
            inputs={"region": {"$dep": "q", "path": "nosuch.field"}},
        ),
    )
    result = await rt.run(p, timeout=10)
    assert result.status == "failed"
    log = await run_log(store, result.root_id)
    failed = log.first(ev.TaskFailed, tid(result.root_id, "w")).data
    assert failed.reason == "no_capable_agent"
    assert "$dep 'q' has no path 'nosuch.field'" in failed.error
    assert "$.region: expected str, got None" in failed.error  # the field, and why
    run_failed = log.first(ev.RunFailed, result.root_id).data
    assert run_failed.failed_tasks == [tid(result.root_id, "w")]
    assert run_failed.detail.startswith("w: no_capable_agent (")
    assert "nosuch.field" in run_failed.detail
    assert result.detail == run_failed.detail  # what `cardbus run` prints after the status


async def test_a_wrong_input_type_in_a_plan_is_refused_naming_the_field(
    make_runtime, store
) -> None:  # type: ignore[no-untyped-def]
    import pytest

    from cardbus.eventstore.errors import InvalidPlan

    rt = await make_runtime([make_agent("r", "regions", input_type=Region)])
    with pytest.raises(InvalidPlan, match=r"\$\.region: expected str, got int"):
        await rt.run(plan(task("w", "regions", inputs={"region": 5})), timeout=10)
    events = await store.read_all(0, 1000)
    assert not any(isinstance(e.data, ev.RunStarted) for e in events)  # nothing of the run


async def test_a_required_input_left_out_of_a_plan_is_refused_naming_it_and_its_type(
    make_runtime, store
) -> None:  # type: ignore[no-untyped-def]
    import pytest

    from cardbus.eventstore.errors import InvalidPlan

    rt = await make_runtime([make_agent("r", "regions", input_type=Region)])
    with pytest.raises(InvalidPlan) as refused:
        await rt.run(plan(task("w", "regions", inputs={})), timeout=10)
    # not a bare "r: input_schema_mismatch": the field, and what it must be
    assert "r: input_schema_mismatch ($.region: required field missing (expected str))" in str(
        refused.value
    )
    events = await store.read_all(0, 1000)
    assert not any(isinstance(e.data, ev.RunStarted) for e in events)


async def test_a_constraint_no_agent_meets_is_named_with_what_the_agent_offers(
    make_runtime, store
) -> None:  # type: ignore[no-untyped-def]
    import pytest

    from cardbus.agents.cards import AgentConstraints
    from cardbus.eventstore.errors import InvalidPlan

    offers = AgentConstraints(limits={"model": ["small"]})
    rt = await make_runtime([make_agent("r", "regions", input_type=Region, constraints=offers)])
    p = plan(task("w", "regions", inputs={"region": "eu"}, constraints={"model": "huge"}))
    with pytest.raises(
        InvalidPlan, match=r"r: over_constraint \(model='huge' not in \['small'\]\)"
    ):
        await rt.run(p, timeout=10)


async def test_an_agents_own_refusal_is_named_in_the_failure_not_just_rejected_it(
    make_runtime, store
) -> None:  # type: ignore[no-untyped-def]
    """An agent whose card declares no input schema (the orchestrator cannot check it)
    refuses the card itself: the task's failure, and so the run's one line, carries why."""
    strict = make_agent("strict", "regions", input_type=Region)
    bare = msgspec.structs.replace(
        strict.card(),
        capabilities=[
            msgspec.structs.replace(c, input_schema={}) for c in strict.card().capabilities
        ],
    )
    strict.card = classmethod(lambda cls: bare)  # type: ignore[method-assign,assignment]
    rt = await make_runtime([strict])
    result = await rt.run(plan(task("w", "regions", inputs={"place": "eu"})), timeout=10)
    assert result.status == "failed"
    log = await run_log(store, result.root_id)
    rejected = log.first(ev.TaskRejected, tid(result.root_id, "w")).data
    assert rejected.reason == "input_schema_mismatch" and "`region`" in rejected.detail
    failed = log.first(ev.TaskFailed, tid(result.root_id, "w")).data
    assert f"strict: rejected it: input_schema_mismatch ({rejected.detail})" in failed.error
    assert "`region`" in result.detail  # what `cardbus run` prints last
