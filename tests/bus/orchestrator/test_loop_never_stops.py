"""Hypothesis: no plan and no announcement stops the decision loop.

Random plans (any shape of the plan format, valid or not) are submitted and
random agent cards announced on the bus; each plan is either refused with a
``CardbusError`` naming the problem or starts a run, each announcement is
recorded or dead-lettered (``Orchestrator.bad_messages``), no step fails
(no traceback from the orchestrator), and afterwards a normal plan still
completes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from orchkit import Runtime, make_agent, plan, task

from cardbus.agents.cards import AgentCard, AgentConstraints, Announce, CapabilitySpec
from cardbus.bus import Policy
from cardbus.bus.orchestrator import RetryPolicy
from cardbus.eventstore import MemoryEventStore
from cardbus.eventstore.errors import CardbusError

QUICK = Policy(retry=RetryPolicy(initial_interval_s=0.01, max_attempts=1), tick_s=0.01)

ids = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["a", "b", "echo", "x" * 600, "a.b", "a~b", "é", "\x00", " "]),
)
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["text", "$dep", "path", "x"]) | st.text(max_size=5), inner, max_size=3
        )
    ),
    max_leaves=12,
)
plan_task = st.fixed_dictionaries(
    {"id": ids, "capability": st.sampled_from(["echo", "cap-x", "plan", "review"]) | ids},
    optional={
        "inputs": st.dictionaries(st.sampled_from(["text", "n"]), values, max_size=2),
        "deps": st.lists(ids, max_size=2),
        "timeout_s": st.floats(),
        "fanout": st.integers(min_value=-2, max_value=4),
        "max_attempts": st.integers(min_value=-1, max_value=3),
        "review_by": st.sampled_from(["echo", "cap-x"]) | ids,
        "requires_approval": st.booleans(),
        "constraints": st.dictionaries(st.text(max_size=5), values, max_size=2),
        "retry": st.dictionaries(st.sampled_from(["max_attempts", "backoff"]), values, max_size=2),
        "unknown": values,
    },
)
plans = st.fixed_dictionaries(
    {"goal": st.text(max_size=20) | st.integers() | st.none()},
    optional={
        "tasks": st.lists(plan_task, max_size=4) | values,
        "plan_id": ids | st.none(),
        "budget_tokens": st.integers(min_value=-5, max_value=2**70) | st.none(),
        "session": st.dictionaries(st.text(max_size=5), values, max_size=2),
        "limits": st.dictionaries(st.sampled_from(["max_tasks", "capabilities"]), values),
    },
)
cards = st.builds(
    AgentCard,
    # not "echo": the agent that runs the final plan (replacing its card by announcing
    # is the registration authority's concern, tests/e2e/test_nats_forgery.py)
    agent_id=ids.filter(lambda s: s != "echo"),
    name=st.text(max_size=10),
    capabilities=st.lists(
        st.builds(
            CapabilitySpec,
            name=st.sampled_from(["cap-x", "plan", "review"]) | ids.map(lambda s: "cap-" + s),
            input_schema=st.dictionaries(st.sampled_from(["type", "required", "$ref"]), values),
            output_schema=st.dictionaries(st.sampled_from(["type", "properties"]), values),
        ),
        max_size=2,
    ),
    constraints=st.builds(
        AgentConstraints,
        max_timeout_s=st.floats() | st.none(),
        max_concurrency=st.integers(min_value=-1, max_value=3),
        limits=st.dictionaries(st.text(max_size=5), values, max_size=2),
    ),
)


async def feed(feeding: list[tuple[str, Any]]) -> tuple[str, list[str]]:
    rt = Runtime(MemoryEventStore(), [make_agent("echo")], policy=QUICK)
    await rt.start()
    try:
        for kind, item in feeding:
            if kind == "plan":
                try:
                    await asyncio.wait_for(rt.orch.submit(item), 5)
                except CardbusError:
                    pass  # refused with a reason: fine
            else:
                await rt.bus.reply(Announce(card=item))
        await asyncio.sleep(0.05)  # the loop decides on what it was fed
        result = await rt.run(plan(task("after", timeout_s=5.0)), timeout=20)
        return result.status, [r for _, r in rt.orch.bad_messages]
    finally:
        await rt.stop()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(st.tuples(st.just("plan"), plans) | st.tuples(st.just("card"), cards), max_size=5))
def test_no_plan_or_announcement_stops_the_decision_loop(
    feeding: list[tuple[str, Any]],
) -> None:
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("cardbus.bus.orchestrator")
    logger.addHandler(handler)
    try:
        status, _ = asyncio.run(feed(feeding))
    finally:
        logger.removeHandler(handler)
    assert status == "completed"
    failed_steps = [r.getMessage() for r in records if r.exc_info]
    assert failed_steps == []


def test_an_over_long_announcement_is_dead_lettered_and_the_loop_goes_on() -> None:
    """The measured case, without hypothesis: it used to abort the decision step."""
    card = AgentCard(agent_id="x" * 600, name="long")
    status, bad = asyncio.run(feed([("card", card), ("card", card)]))
    assert status == "completed"
    assert len(bad) == 2 and all("MAX_ID_CHARS" in r for r in bad)
