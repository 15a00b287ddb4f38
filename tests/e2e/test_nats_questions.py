"""A typed question on NATS JetStream (issue 31 item 2): asked, its orchestrator gone
(stopped without giving anything back, as a process that dies), answered from another
connection (refused naming ``amount`` first, the question still open), then another
orchestrator resumes the run and completes it with the answer. A real nats-server."""

from __future__ import annotations

import contextlib

import pytest
from natsprocs import FAST_BUS, until
from natsserver import NatsServer

from cardbus.agents.demo import Payer
from cardbus.bus import Plan, PlanTask
from cardbus.bus.orchestrator.questions import QuestionRefused, answer_question, open_questions
from cardbus.bus.runtime.nats import NatsRuntime
from cardbus.eventstore import events as ev
from cardbus.eventstore.nats import NatsEventStore
from cardbus.eventstore.nats.connection import NatsOptions


def _runtime(url: str) -> NatsRuntime:
    return NatsRuntime(NatsOptions(url=url), [Payer], bus_options=FAST_BUS, name="orchestrator")


async def test_a_question_on_nats_outlives_its_orchestrator(nats_server: NatsServer) -> None:
    url = nats_server.url
    first = _runtime(url)
    await first.__aenter__()
    try:
        pay = PlanTask(id="pay", capability="pay", inputs={"payee": "Ada"})
        root = await first.submit(Plan(tasks=[pay], goal="pay Ada"))

        async def asked() -> bool:
            events = await first.store.read_correlation(root)
            return any(
                isinstance(e.data, ev.ApprovalRequested) and e.data.reason == "question"
                for e in events
            )

        await until(asked, what="the question asked")
        await first.orchestrator.stop(give_back=False)  # as a process that dies
    finally:
        with contextlib.suppress(Exception):
            await first.__aexit__(None, None, None)

    foreign = await NatsEventStore.connect(url)
    second = _runtime(url)
    try:
        [q] = await open_questions(foreign, root)
        assert q.schema["properties"]["currency"]["enum"] == ["EUR", "USD"]
        with pytest.raises(QuestionRefused) as refused:
            await answer_question(foreign, root, {"amount": "lots", "currency": "EUR"}, by="ada")
        assert refused.value.field == "amount"
        assert [x.task_id for x in await open_questions(foreign, root)] == [q.task_id]
        await answer_question(foreign, root, {"amount": 30, "currency": "EUR"}, by="ada")
        await second.__aenter__()
        result = await second.orchestrator.wait(root, 30)
        assert result.status == "completed", result
        assert result.outputs["pay"]["text"] == "pay 30 EUR to Ada"
        log = await foreign.read_correlation(root)
        answers = [e for e in log if isinstance(e.data, ev.QuestionAnswered)]
        assert [(e.actor, e.data.answer) for e in answers] == [
            ("ada", {"amount": 30, "currency": "EUR"})
        ]
    finally:
        with contextlib.suppress(Exception):
            await second.__aexit__(None, None, None)
        await foreign.close()
