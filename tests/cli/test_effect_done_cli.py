"""``cardbus approve TASK --done --result JSON``: an operator records an unknown effect as done.

A run's process dies while a non-idempotent tool (``charge``) is mid-effect, beside a
parallel ``lookup`` that completed. The resumed run asks an operator about ``charge``
(``tool_effect_unknown``). The operator knows the charge went through and what it
returned: ``cardbus approve TASK --done --result '{...}'`` (another process's writer on
the same SQLite file, as a shell would be) records it, with the operator as the actor;
the run goes on, the model gets that result as the tool's answer, and the tool never
runs again.

Real parts: ``EmbeddedRuntime`` on a SQLite file, the OpenAI-compatible stub on
loopback, a real ``ToolRegistry``, the ``cardbus`` command through click's runner.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from cardbus.agents.llm import OpenAIChatLLM
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import events as ev
from cardbus.eventstore.sqlite import SqliteEventStore
from cardbus.tools.cli import cli
from cardbus.tools.progress import RunProgress
from tests.agents.openai_stub import OpenAIStub, Reply
from tests.bus.orchestrator.test_journal_effects import (
    CALLS,
    FINAL,
    Biller,
    Effects,
    _asked,
    _called,
    _events,
    _plan,
    _policy,
    _requested,
    _settled,
    _until,
)

RECEIPT = {"charged": 7, "receipt": "R-1"}


def _cardbus(db: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, [*args, "--store", str(db)])


async def test_an_operator_records_an_unknown_effect_as_done_and_the_run_completes(
    tmp_path: Path,
) -> None:
    effects = Effects()
    path = tmp_path / "log.db"
    with OpenAIStub() as stub:
        stub.script(Reply(tool_calls=[CALLS["lookup"], CALLS["charge"]]), FINAL)
        llm = OpenAIChatLLM(stub.url, "stub-model", max_retries=0)
        async with (
            await SqliteEventStore.open(path, poll_interval=0.01) as store,
            EmbeddedRuntime(
                store, [Biller], _policy(), llm=llm, tools=effects.registry(dying=True)
            ) as rt,
        ):
            root = await rt.orchestrator.submit(_plan("effect-done"))
            await _until(
                store, root, lambda es: bool(_requested(es, "charge") and _called(es, "lookup"))
            )
        lines: list[str] = []
        async with (
            await SqliteEventStore.open(path, poll_interval=0.01) as store,
            RunProgress(store, "effect-done", f" --store {path}", live=False, echo=lines.append),
            EmbeddedRuntime(
                store, [Biller], _policy(), llm=llm, tools=effects.registry(dying=False)
            ) as rt,
        ):
            events = await _until(store, root, _settled(2))
            task_id = _requested(events, "charge")[0].task_id
            # what `cardbus run` prints while it waits names the three answers
            await _until(store, root, lambda _: any("effect is unknown" in x for x in lines))
            (asking,) = [x for x in lines if "effect is unknown" in x]
            assert f"cardbus approve {task_id} --store {path} calls it again" in asking
            assert "--done --result JSON records it as done, or cardbus deny" in asking

            def cardbus(*args: str) -> Result:
                return _cardbus(path, *args)

            # misuse first: each refused with a reason, nothing written
            wrong = await asyncio.to_thread(cardbus, "approve", task_id, "--result", "{}")
            assert wrong.exit_code == 2 and "--done" in wrong.output
            bare = await asyncio.to_thread(cardbus, "approve", task_id[:12], "--done")
            assert bare.exit_code == 1 and "no result for charge" in bare.stderr
            assert "--result JSON" in bare.stderr
            junk = await asyncio.to_thread(
                cardbus, "approve", task_id, "--done", "--result", "{charged"
            )
            assert junk.exit_code == 2 and "not JSON" in junk.output
            answered = await asyncio.to_thread(
                cardbus,
                "approve",
                task_id[:12],
                "--done",
                "--result",
                json.dumps(RECEIPT),
                "--by",
                "ops",
                "--note",
                "the bank shows it",
                "--json",
            )
            assert answered.exit_code == 0, answered.output
            done = await rt.orchestrator.wait(root, timeout=60)
            envs = await store.read_correlation(root)
        last = stub.bodies()[-1]["messages"]
    assert done.status == "completed", done
    assert done.outputs["b"] == {"answer": "billed"}
    said = json.loads(answered.stdout)
    first = _requested([e.data for e in envs], "charge")[0]
    assert said == {
        "task_id": task_id,
        "answer": "done",
        "by": "ops",
        "note": "the bank shows it",
        "call": envs[[e.data for e in envs].index(first)].event_id,
        "tool": "charge",
        "key": said["call"],
    }
    # the tool ran once, before the crash; the operator's result stands for it
    assert len(effects.keys("charge")) == 1 and effects.keys("charge")[0] == said["key"]
    (recorded,) = [e for e in envs if isinstance(e.data, ev.ToolCalled) and e.data.recorded_by]
    assert recorded.actor == "ops" and recorded.data.result == RECEIPT
    assert recorded.data.idempotency_key == said["key"]
    granted = [e for e in envs if isinstance(e.data, ev.ApprovalGranted)]
    assert [(e.actor, e.data.by, e.data.note) for e in granted] == [
        ("ops", "ops", "the bank shows it")
    ]
    # the next attempt replayed it (and the lookup) and gave it to the model
    replays = [e.data for e in envs if isinstance(e.data, ev.ToolCalled) and e.data.replayed_from]
    assert recorded.event_id in {e.replayed_from for e in replays if e.tool == "charge"}
    assert len(effects.keys("lookup")) == 1
    answers = [json.loads(m["content"]) for m in last if m["role"] == "tool"]
    assert RECEIPT in answers
    # the timeline says who recorded it
    shown = await asyncio.to_thread(_cardbus, path, "replay", root)
    assert shown.exit_code == 0, shown.output
    text = shown.stdout
    assert "tool charge recorded as done by ops" in text


async def test_done_refuses_a_task_that_waits_for_no_tool_call(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    plan = {
        "plan_id": "gate",
        "goal": "bill ada",
        "tasks": [
            {
                "id": "b",
                "capability": "bill",
                "inputs": {"question": "bill ada"},
                "requires_approval": True,
            }
        ],
    }
    effects = Effects()
    with OpenAIStub() as stub:
        stub.script(FINAL)
        llm = OpenAIChatLLM(stub.url, "stub-model", max_retries=0)
        async with (
            await SqliteEventStore.open(path, poll_interval=0.01) as store,
            EmbeddedRuntime(
                store, [Biller], _policy(), llm=llm, tools=effects.registry(dying=False)
            ) as rt,
        ):
            root = await rt.orchestrator.submit(plan)
            events = await _until(store, root, _asked)
            task_id = next(
                e.stream
                for e in await store.read_correlation(root)
                if isinstance(e.data, ev.ApprovalRequested)
            )
            refused = await asyncio.to_thread(_cardbus, path, "approve", task_id, "--done")
            assert refused.exit_code == 1
            assert "does not wait for an operator's word on a tool call" in refused.stderr
            after: list[Any] = await _events(store, root)
    assert len(after) == len(events)
