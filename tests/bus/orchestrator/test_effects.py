"""``record_effect_done``: an operator's word that a tool call whose effect was unknown happened.

On a log written through the ``EventStore`` interface (a real SQLite file): a task
whose two parallel tool calls were cut mid-effect, both asked about. The operator must
name the call when two wait; the task resumes (``approval.granted``) only once none
waits; each record is a ``tool.called`` with ``recorded_by`` and the operator as actor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from lifecycle_log import Writer

from cardbus.bus.orchestrator import record_effect_done, unknown_effects
from cardbus.bus.orchestrator.effects import NO_RESULT
from cardbus.eventstore import NewEvent
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import CardbusError, StreamNotFound
from cardbus.eventstore.sqlite import SqliteEventStore

ROOT, TASK = "run-effects", "task-pay"


async def _two_waiting(store: SqliteEventStore) -> list[str]:
    """A task whose two tool calls (charge, refund) were cut and asked about; their
    tool.requested ids."""
    w = Writer(store, ROOT)
    await w.emit(ROOT, ev.RunStarted(goal="pay", plan_id="plan-effects"))
    await w.emit(TASK, ev.TaskCreated(root_id=ROOT, capability="pay"))
    for seq, tool in ((1, "charge"), (2, "refund")):
        await w.emit(
            TASK,
            ev.ToolRequested(
                task_id=TASK,
                agent_id="payer",
                tool=tool,
                request_id=f"req-{seq}",
                arguments={"amount": seq},
                arguments_digest=f"digest-{seq}",
                attempt=1,
                execution="exec-1",
                seq=seq,
            ),
        )
    ids = [e.event_id for e in await store.read_stream(TASK)][1:]
    for seq, (tool, requested) in enumerate(zip(("charge", "refund"), ids, strict=True), 1):
        await w.emit(
            TASK,
            ev.ToolEffectUnknown(
                task_id=TASK,
                agent_id="payer",
                tool=tool,
                requested_event_id=requested,
                idempotency_key=requested,
                attempt=2,
                execution="exec-2",
                seq=seq,
            ),
        )
    await w.emit(TASK, ev.ApprovalRequested(reason="tool_effect_unknown", detail="charge"))
    return ids


async def test_each_waiting_call_is_named_and_the_task_resumes_when_none_waits(
    tmp_path: Path,
) -> None:
    async with await SqliteEventStore.open(tmp_path / "log.db") as store:
        charge, refund = await _two_waiting(store)
        waiting = await unknown_effects(store, TASK)
        assert [(u.call, u.tool, u.key, u.has_result) for u in waiting] == [
            (charge, "charge", charge, False),
            (refund, "refund", refund, False),
        ]
        assert waiting[0].arguments == {"amount": 1}
        with pytest.raises(CardbusError, match=f"2 tool calls of {TASK} wait; name one"):
            await record_effect_done(store, TASK, by="ops", result={"ok": True})
        with pytest.raises(CardbusError, match="names none"):
            await record_effect_done(store, TASK, by="ops", result={}, call="nope")
        with pytest.raises(CardbusError, match="no result for refund"):
            await record_effect_done(store, TASK, by="ops", result=NO_RESULT, call=refund)
        with pytest.raises(CardbusError, match="must be JSON"):
            await record_effect_done(store, TASK, by="ops", result={1j}, call=refund)
        before = len(await store.read_stream(TASK))
        done = await record_effect_done(store, TASK, by="ops", result={"refunded": 2}, call=refund)
        assert done.tool == "refund"
        after = await store.read_stream(TASK)
        # one tool.called, no approval yet: charge still waits
        assert [type(e.data) for e in after[before:]] == [ev.ToolCalled]
        recorded = after[-1]
        assert recorded.actor == "ops" and recorded.data.recorded_by == "ops"
        assert (recorded.data.execution, recorded.data.seq) == ("exec-1", 2)
        assert recorded.data.result == {"refunded": 2} and recorded.data.result_digest
        assert [u.tool for u in await unknown_effects(store, TASK)] == ["charge"]
        # the last one needs no name, and resumes the task
        await record_effect_done(store, TASK, by="ann", result=None, note="nothing came back")
        tail = (await store.read_stream(TASK))[len(after) :]
        assert [type(e.data) for e in tail] == [ev.ToolCalled, ev.ApprovalGranted]
        assert tail[0].data.tool == "charge" and tail[0].data.result is None
        granted = tail[1]
        assert granted.actor == "ann" and granted.data.by == "ann"
        assert granted.data.note == "nothing came back" and granted.data.resume == "pending"
        with pytest.raises(CardbusError, match="does not wait for an operator's word"):
            await unknown_effects(store, TASK)
        with pytest.raises(StreamNotFound):
            await record_effect_done(store, "no-such-task", by="ops", result={})


class _LateSibling:
    """The real store, with one more writer: just before the first append of the
    operator's answer, the asking attempt's last journal write lands (a sibling's
    result), so that answer's expected version is stale."""

    def __init__(self, store: SqliteEventStore) -> None:
        self.store = store
        self.appends = 0
        self.read_stream = store.read_stream

    async def append(self, stream: str, events: list[Any], expected: int) -> Any:
        self.appends += 1
        if self.appends == 1:
            late = ev.ToolCalled(
                task_id=TASK,
                agent_id="payer",
                tool="lookup",
                result={"found": 1},
                attempt=2,
                execution="exec-2",
                seq=3,
            )
            head = len(await self.store.read_stream(stream))
            await self.store.append(stream, [NewEvent(data=late, correlation_id=ROOT)], head)
        return await self.store.append(stream, events, expected)


async def test_an_answer_that_loses_a_race_to_the_attempts_last_write_is_decided_again(
    tmp_path: Path,
) -> None:
    async with await SqliteEventStore.open(tmp_path / "log.db") as store:
        charge, _ = await _two_waiting(store)
        racing = _LateSibling(store)
        await record_effect_done(racing, TASK, by="ops", result={"charged": 1}, call=charge)
        tail = (await store.read_stream(TASK))[-2:]
    assert racing.appends == 2  # the first lost to the late write; read again, then written
    assert [type(e.data) for e in tail] == [ev.ToolCalled, ev.ToolCalled]
    assert tail[0].data.tool == "lookup" and tail[1].data.recorded_by == "ops"
