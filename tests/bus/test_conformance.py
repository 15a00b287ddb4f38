"""The conformance kit's judgements (``cardbus.bus.conformance``), and what it says when
there is no agent to check."""

from __future__ import annotations

from cardbus.agents.cards import ResultCard
from cardbus.agents.requests import AgentRequest
from cardbus.bus.conformance import (
    CLAUSES,
    CheckReport,
    Clause,
    _journal_clause,
    _Listener,
    _Seen,
    sample_inputs,
)
from cardbus.eventstore.events import Usage


def _req(kind: str, execution: str = "e1", seq: int = 0) -> AgentRequest:
    return AgentRequest(
        request_id=f"{kind}-{seq}",
        task_id="t",
        attempt=1,
        agent_id="a",
        kind=kind,  # type: ignore[arg-type]
        execution=execution,
        seq=seq,
    )


def _heard(
    requests: list[AgentRequest], results: tuple[float, ResultCard] | None = None
) -> _Listener:
    """A listener that took ``requests`` at times 1, 2, ... and ``results`` (arrival time,
    result) as replies."""
    listen = _Listener("a")
    listen.requests = list(requests)
    listen.requested_at = [float(i + 1) for i in range(len(requests))]
    if results is not None:
        at, result = results
        listen.replies = [(_Seen("cardbus.reply.a.t", b"", at), result)]
    return listen


def _result(tokens: int) -> ResultCard:
    usage = Usage(input_tokens=tokens, output_tokens=0, model="m")
    return ResultCard(task_id="t", attempt=1, agent_id="a", status="completed", usage=usage)


def test_a_model_call_without_its_answer_fails_the_journal_clause() -> None:
    assert _journal_clause(_heard([])).outcome == "not exercised"
    assert _journal_clause(_heard([_req("tool")])).outcome == "not exercised"
    both = [_req("model.request"), _req("model.answer")]
    assert _journal_clause(_heard(both)) == Clause("journal", "pass", "1 model call(s) journaled")
    unanswered = [_req("model.request"), _req("model.answer", seq=1)]
    assert _journal_clause(_heard(unanswered)).outcome == "fail"
    no_execution = [_req("model.request", execution=""), _req("model.answer", execution="")]
    assert _journal_clause(_heard(no_execution)).outcome == "fail"


def test_tokens_reported_with_no_call_journaled_fail_the_journal_clause() -> None:
    assert _journal_clause(_heard([], (5.0, _result(0)))).outcome == "not exercised"
    unjournaled = _journal_clause(_heard([], (5.0, _result(12))))
    assert unjournaled == Clause("journal", "fail", "t reported 12 model tokens, no call journaled")
    both = [_req("model.request"), _req("model.answer")]
    assert _journal_clause(_heard(both, (5.0, _result(12)))).outcome == "pass"


def test_a_result_before_its_model_answer_fails_the_journal_clause() -> None:
    both = [_req("model.request"), _req("model.answer")]  # answered at 1.0 and 2.0
    early = _journal_clause(_heard(both, (1.5, _result(12))))
    assert early == Clause("journal", "fail", "t: its result came before its model.answer")


def test_sample_inputs_fill_the_required_properties() -> None:
    direct = {
        "type": "object",
        "properties": {"text": {"type": "string"}, "n": {"type": "integer"}, "x": {}},
        "required": ["text", "n", "x"],
    }
    assert sample_inputs(direct) == {"text": "conformance", "n": 1, "x": "conformance"}
    # a msgspec schema: the object behind a $ref
    by_ref = {"$ref": "#/$defs/In", "$defs": {"In": direct | {"required": ["n"]}}}
    assert sample_inputs(by_ref) == {"n": 1}
    assert sample_inputs({}) == {}


def test_a_report_fails_when_one_clause_failed() -> None:
    report = CheckReport("a", [Clause(c, "pass") for c in CLAUSES])
    assert report.passed and report.lines()[-1] == "passed"
    report.clauses[-1] = Clause("journal", "not exercised", "no model call")
    assert report.passed
    report.clauses[0] = Clause("announce", "fail", "none")
    assert not report.passed and report.lines()[-1] == "FAILED: 1 clause(s)"
    assert "  FAIL           announce" in report.lines()[1]


async def test_no_agent_on_the_server_fails_the_announce_clause_and_exercises_nothing(
    nats_url: str,
) -> None:
    from cardbus.bus.conformance import check_agent

    report = await check_agent(nats_url, "nobody-here", timeout=0.5)
    assert not report.passed
    assert [(c.name, c.outcome) for c in report.clauses] == [("announce", "fail")] + [
        (name, "not exercised") for name in CLAUSES[1:]
    ]
    assert report.clauses[0].detail == "no announcement on cardbus.announce.nobody-here"
