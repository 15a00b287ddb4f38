"""A question's answer written while an orchestrator starts is folded once (invariant 10).

A run waits on a typed question (the demo ``Payer`` asks how much, in which currency); its
process died. A new orchestrator starts on the same SQLite file and resumes it while another
process (a second connection, as ``cardbus answer`` or the console would be) answers the
question, injected at every await point of the start-up, the resume, the follower and the
decisions that follow (``tests/interleave.py``). Every trial must end as the reference does
(completed, paying what was answered), every event folded once, no attempt dispatched twice,
and exactly one answer in the log.
"""

from __future__ import annotations

from collections.abc import Awaitable
from pathlib import Path

from interleave import TIMED, Points, Trial, explore, report
from orchkit import FAST, plan, task, wait_for
from resumekit import LogTrial, copy_log

from cardbus.agents.demo import Payer
from cardbus.bus import InProcessBus, Orchestrator
from cardbus.bus.orchestrator.questions import answer_question
from cardbus.bus.runtime.worker import AgentWorker
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev

ANSWER = {"amount": 12.5, "currency": "EUR"}


async def _asking_run(folder: Path) -> tuple[Path, str]:
    """A log whose run waits for a person's answer; its process died (no give-back)."""
    folder.mkdir()
    db = folder / "cardbus.db"
    store = await SqliteEventStore.open(db, poll_interval=0.01)
    bus = InProcessBus()
    orch = Orchestrator(store, bus, FAST, snapshot=None)
    orch.attempts_survive_restart = False
    worker = AgentWorker(bus, Payer)
    await orch.start([worker.agent.card()])
    await worker.start()
    root = await orch.submit(plan(task("pay", "pay", inputs={"payee": "Ada"})))
    await wait_for(
        store, lambda e: isinstance(e.data, ev.ApprovalRequested) and e.data.reason == "question"
    )
    await orch.stop(give_back=False)  # as a process that dies
    await bus.close()
    await store.close()
    return db, root


async def _resume_asking(points: Points, db: Path, root: str) -> Trial:
    """A new orchestrator resumes the run on a copy of ``db``; the answer comes from
    another connection at the point ``points`` says."""

    def answer(foreign: SqliteEventStore) -> Awaitable[object]:
        return answer_question(foreign, root, ANSWER, by="alice", door="cli")

    async with LogTrial(points, copy_log(db), answer, snapshot=None) as t:
        await t.resume([Payer])
        try:
            result = await t.orch.wait(root, 5)
            end: tuple[str, ...] = (result.status, result.reason)
            paid = result.outputs.get("pay", {})
            if result.status == "completed" and paid.get("text") != "pay 12.5 EUR to Ada":
                t.problems.append(f"paid {paid}, not what was answered")
        except TimeoutError:
            end = ("still waiting",)
        log = await t.check()
        answers = [e for e in log if isinstance(e.data, ev.QuestionAnswered)]
        if len(answers) != 1 or answers[0].actor != "alice":
            t.problems.append(f"{len(answers)} answers in the log: {answers}")
    return Trial(end, points, t.problems)


async def test_an_answer_at_any_await_point_of_a_resume_is_folded_once(tmp_path: Path) -> None:
    db, root = await _asking_run(tmp_path / "template")

    async def scenario(points: Points) -> Trial:
        return await _resume_asking(points, db, root)

    reference, trials = await explore(scenario, seed=31)
    problems, injected, reached = report(reference, trials)
    print(f"{len(trials)} trials, written at {len(injected)} call sites: {sorted(injected)}")
    print(f"  timed sites reached, not written at: {sorted(reached - injected)}")
    assert not problems, "\n".join(problems)
    assert reference.end[0] == "completed", reference.end
    # the answer landed at every call site a trial reached, the start-up window among them
    assert not reached - injected - TIMED, sorted(reached - injected)
    assert any(name.startswith("_started/") for name in injected), sorted(injected)
    assert len(trials) >= 10
