"""The runtimes' Python API (issue 15, item 9): a plan in any form, used only when started,
and no failure leaves the process unable to exit."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import msgspec
import pytest

import cardbus
from cardbus import Agent, Capability, TaskCard, TaskContext
from cardbus.bus.runtime.nats import NatsRuntime
from cardbus.bus.runtime.plans import plan_of
from cardbus.eventstore.events import RunStarted, TaskCompleted
from cardbus.eventstore.nats.connection import NatsOptions


class Text(msgspec.Struct):
    text: str


class Upper(Agent):
    agent_id = "upper"
    capabilities = [Capability("upper", Text, Text, "upper-case a text")]

    async def handle(self, task: TaskCard, inputs: Text, ctx: TaskContext) -> Text:
        return Text(text=inputs.text.upper())


PLAN = {
    "goal": "shout",
    "tasks": [{"id": "u", "capability": "upper", "inputs": {"text": "hi"}}],
}


@pytest.mark.parametrize(
    "form",
    [
        PLAN,
        json.dumps(PLAN),
        json.dumps(PLAN).encode(),
        bytearray(json.dumps(PLAN).encode()),
        cardbus.Plan(goal="shout", tasks=[cardbus.PlanTask(id="u", capability="upper")]),
    ],
    ids=["dict", "str", "bytes", "bytearray", "Plan"],
)
def test_a_plan_in_any_form(form: object) -> None:
    plan = plan_of(form)  # type: ignore[arg-type]
    assert isinstance(plan, cardbus.Plan) and plan.goal == "shout"
    assert [t.id for t in plan.tasks] == ["u"]


@pytest.mark.parametrize(
    ("form", "words"),
    [
        (["not", "a", "plan"], "not list"),
        (42, "not int"),
        ("{not json", "not valid JSON of the plan format"),
        (b'{"goal": "g", "tasks": [{"id": "a"}]}', "capability"),
        ({"goal": "g", "tasks": [], "nosuch": 1}, "nosuch"),
    ],
)
def test_anything_else_is_invalid_plan_saying_what(form: object, words: str) -> None:
    with pytest.raises(cardbus.InvalidPlan, match=words):
        plan_of(form)  # type: ignore[arg-type]


async def test_a_runtime_not_entered_says_so() -> None:
    rt = NatsRuntime(NatsOptions(url="nats://127.0.0.1:1"), [Upper])
    with pytest.raises(cardbus.NotStarted, match=r"NatsRuntime is not started.*async with"):
        await rt.run(PLAN)
    with pytest.raises(RuntimeError):  # also a RuntimeError, and a CardbusError
        await rt.submit(PLAN)
    assert issubclass(cardbus.NotStarted, cardbus.CardbusError)


async def test_nats_runtime_runs_json_text_and_refuses_after_the_block(nats_url: str) -> None:
    async with NatsRuntime(NatsOptions(url=nats_url), [Upper]) as rt:
        result = await rt.run(json.dumps({**PLAN, "plan_id": "json-1"}), timeout=30)
        events = await rt.store.read_correlation(result.root_id)
    assert result.status == "completed", result.reason
    assert [e.data.plan_id for e in events if isinstance(e.data, RunStarted)] == ["json-1"]
    (done,) = [e.data for e in events if isinstance(e.data, TaskCompleted)]
    assert done.output == {"text": "HI"}
    with pytest.raises(cardbus.NotStarted, match="was stopped"):
        await rt.run(PLAN)


_ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("where", ["inside async with", "store never closed"])
def test_a_failure_never_leaves_the_process_unable_to_exit(tmp_path: Path, where: str) -> None:
    """An exception with an SQLite store open (its threads running) still ends the process."""
    body = {
        "inside async with": """
            async with cardbus.EmbeddedRuntime(store, [Upper]) as rt:
                await rt.run({"goal": "g", "tasks": [{"id": "u", "capability": "upper",
                              "inputs": {"text": "hi"}}]})
                raise RuntimeError("boom inside async with")
        """,
        "store never closed": """
            await store.append("s", [cardbus.eventstore.NewEvent(
                data=cardbus.eventstore.events.RunCompleted(outputs={}), correlation_id="s")], 0)
            raise RuntimeError("boom with the store open")
        """,
    }[where]
    script = textwrap.dedent(
        """
        import asyncio, sys
        import msgspec
        import cardbus, cardbus.eventstore, cardbus.eventstore.events
        from cardbus import Agent, Capability

        class Text(msgspec.Struct):
            text: str

        class Upper(Agent):
            agent_id = "upper"
            capabilities = [Capability("upper", Text, Text, "upper-case")]

            async def handle(self, task, inputs, ctx):
                return Text(text=inputs.text.upper())

        async def main():
            store = await cardbus.SqliteEventStore.open(sys.argv[1])
        {body}
        asyncio.run(main())
        """
    ).replace("{body}", textwrap.indent(textwrap.dedent(body), "    "))
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "log.db")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,  # a hang fails here; an exit takes about a second
    )
    assert proc.returncode == 1, proc.stderr
    assert "RuntimeError: boom" in proc.stderr


async def test_embedded_runtime_runs_json_and_refuses_outside_its_block() -> None:
    store = cardbus.MemoryEventStore()
    rt = cardbus.EmbeddedRuntime(store, [Upper])
    with pytest.raises(cardbus.NotStarted, match=r"EmbeddedRuntime is not started.*async with"):
        await rt.run(PLAN)  # before: not "no registered agent offers capability"
    assert await store.last_position() == 0  # nothing was written
    async with rt:
        result = await rt.run(json.dumps({**PLAN, "plan_id": "text"}).encode())
    assert result.status == "completed", result.reason
    events = await store.read_correlation(result.root_id)
    assert [e.data.plan_id for e in events if isinstance(e.data, RunStarted)] == ["text"]
    assert any(isinstance(e.data, TaskCompleted) for e in events)
    with pytest.raises(cardbus.NotStarted, match="was stopped"):
        await rt.run(PLAN)
