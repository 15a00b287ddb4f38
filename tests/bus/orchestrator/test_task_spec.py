"""One task spec: PlanTask, TaskCreated and TaskCard inherit it, and convert with `restate`."""

from __future__ import annotations

import msgspec
from orchkit import CARDS, ev, make_agent, plan, run_log, task, tid

from cardbus.agents.cards import TaskCard
from cardbus.bus.orchestrator import PlanTask
from cardbus.eventstore.taskspec import RetryOverride, TaskOptions, TaskSpec, restate


def _shared(a: type, b: type) -> set[str]:
    return set(a.__struct_fields__) & set(b.__struct_fields__)


def test_the_three_inherit_the_spec_instead_of_declaring_it() -> None:
    assert issubclass(PlanTask, TaskOptions) and issubclass(ev.TaskCreated, TaskOptions)
    assert issubclass(TaskCard, TaskSpec) and not issubclass(TaskCard, TaskOptions)
    assert set(PlanTask.__struct_fields__) - set(TaskOptions.__struct_fields__) == {
        "id",
        "max_attempts",
        "child",  # a child run's spec (bus.orchestrator.children), kept as given on task.created
    }


def test_the_fields_each_conversion_carries_are_pinned() -> None:
    """``restate`` carries the fields both types declare: a new same-named field shows here."""
    spec = set(TaskSpec.__struct_fields__)
    options = set(TaskOptions.__struct_fields__)
    assert _shared(PlanTask, ev.TaskCreated) == options | {"max_attempts", "child"}
    assert _shared(ev.TaskCreated, TaskCard) == spec | {
        "root_id",
        "parent_id",
        "max_attempts",
        "budget_tokens",
    }


def test_restate_copies_the_shared_fields_and_applies_changes() -> None:
    t = PlanTask(
        id="a",
        capability="write",
        goal="g",
        inputs={"x": 1},
        constraints={"lang": "en"},
        deps=["b"],
        timeout_s=4.0,
        requires_approval=True,
        fanout=2,
        review_by="review",
        max_review_rounds=1,
        retry=RetryOverride(jitter=0.0),
    )
    created = restate(t, ev.TaskCreated, root_id="r", max_attempts=5, plan_id=t.id)
    assert created == ev.TaskCreated(
        root_id="r",
        capability="write",
        goal="g",
        inputs={"x": 1},
        constraints={"lang": "en"},
        deps=["b"],
        timeout_s=4.0,
        max_attempts=5,
        requires_approval=True,
        fanout=2,
        review_by="review",
        max_review_rounds=1,
        retry=RetryOverride(jitter=0.0),
        plan_id="a",
    )
    card = restate(created, TaskCard, task_id="a-1", attempt=2)
    assert card == TaskCard(
        task_id="a-1",
        root_id="r",
        capability="write",
        goal="g",
        inputs={"x": 1},
        constraints={"lang": "en"},
        deps=["b"],
        timeout_s=4.0,
        max_attempts=5,
        attempt=2,
    )


async def test_a_card_carries_the_spec_from_the_log(make_runtime, store):
    rt = await make_runtime([make_agent("echo")])
    r = await rt.run(plan(task("a", goal="say it", constraints={}, timeout_s=3.0, max_attempts=2)))
    log = await run_log(store, r.root_id)
    created = log.first(ev.TaskCreated, tid(r.root_id, "a")).data

    (card,) = CARDS["echo"]
    for name in TaskSpec.__struct_fields__:
        assert getattr(card, name) == getattr(created, name)
    assert (card.max_attempts, card.root_id, card.task_id) == (2, r.root_id, tid(r.root_id, "a"))


def test_restate_between_types_sharing_one_field_or_none() -> None:
    """The fields shared are worked out once a pair of types: one shared field gives that
    value (not a 1-tuple), none gives only the changes."""

    class One(msgspec.Struct, kw_only=True):
        goal: str
        other: int = 0

    class Neither(msgspec.Struct, kw_only=True):
        note: str = ""

    t = PlanTask(id="a", capability="write", goal="g")
    assert restate(t, One) == One(goal="g")
    assert restate(t, One, other=3) == One(goal="g", other=3)
    assert restate(t, Neither) == Neither()
    assert restate(t, Neither, note="n") == Neither(note="n")
    assert restate(One(goal="x", other=2), One, goal="y") == One(goal="y", other=2)
