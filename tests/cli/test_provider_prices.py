"""Provider-prefixed model names (LiteLLM's ``provider/model``) are priced, and a money cap
works through them: runs against the loopback OpenAI-compatible stub, which answers
with the very name asked for, as a LiteLLM proxy does.

The expected cost is genai-prices' own price of the bare model at its provider
(``gpt-4o-mini`` at ``openai``), times the tokens the log's ``model.answered``
events hold. A name nobody prices is shown as "unknown price", said once with how
to price it, and under a money cap its call is refused with that line.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

pytest.importorskip("genai_prices")
from genai_prices import Usage, calc_price

from cardbus.agents.llm import schema_instance
from cardbus.eventstore import events as ev
from cardbus.eventstore.sqlite import SqliteEventStore
from cardbus.tools.cli import cli
from tests.agents.openai_stub import OpenAIStub, Reply

#: the name a user writes -> (genai-prices' provider, the bare model)
NAMES = {
    "openai/gpt-4o-mini": ("openai", "gpt-4o-mini"),
    "anthropic/claude-3-5-haiku-latest": ("anthropic", "claude-3-5-haiku-latest"),
}
UNPRICED = "ollama/llama-unpriced-7b"


def _plan(path: Path, plan_id: str) -> Path:
    plan = {
        "plan_id": plan_id,
        "goal": "Research tides under a cap",
        "agents": ["cardbus.agents.demo:Researcher"],
        "budget_usd": 1.0,
        "tasks": [{"id": "research", "capability": "research", "inputs": {"topic": "tides"}}],
    }
    path.write_text(json.dumps(plan))
    return path


def _schema(body: Any) -> Any:
    fmt = body.get("response_format") if isinstance(body, dict) else None
    inner = fmt.get("json_schema") if isinstance(fmt, dict) else None
    return inner.get("schema") if isinstance(inner, dict) else None


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIStub]:
    with OpenAIStub() as s:
        monkeypatch.setenv("OPENAI_BASE_URL", s.url)
        monkeypatch.delenv("CARDBUS_PRICES", raising=False)
        yield s


def _as(stub: OpenAIStub, model: str) -> None:
    """The stub answers every call as ``model`` (a valid instance of the asked schema)."""

    def answer(body: Any) -> Reply:
        schema = _schema(body)
        content = json.dumps(schema_instance(schema, "stub")) if schema else "stub answer"
        return Reply(content=content, model=model)

    stub.responder = answer


def _cli(*args: str, code: int = 0) -> str:
    out = CliRunner().invoke(cli, list(args), terminal_width=400)
    assert out.exit_code == code, out.output
    return out.stdout  # stderr says which LLM it asks


def _answers(db: Path) -> list[ev.ModelAnswered]:
    async def go() -> list[ev.ModelAnswered]:
        store = await SqliteEventStore.open(db)
        try:
            events = await store.read_all(1, 100_000)
        finally:
            await store.close()
        return [e.data for e in events if type(e.data) is ev.ModelAnswered]

    return asyncio.run(go())


@pytest.mark.parametrize("name", sorted(NAMES))
def test_a_provider_prefixed_name_is_priced_and_a_money_cap_runs(
    name: str, stub: OpenAIStub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _as(stub, name)
    monkeypatch.setenv("CARDBUS_MODEL", name)
    db = tmp_path / "runs.db"
    result = json.loads(
        _cli("run", str(_plan(tmp_path / "p.json", "capped")), "--db", str(db), "--json")
    )
    assert result["status"] == "completed", result  # not refused for want of a price
    answers = _answers(db)
    assert answers and {a.model for a in answers} == {name}
    assert stub.requests and {r["body"]["model"] for r in stub.requests} == {name}

    provider, bare = NAMES[name]
    expected = sum(
        float(
            calc_price(
                Usage(input_tokens=a.input_tokens, output_tokens=a.output_tokens),
                bare,
                provider_id=provider,
            ).total_price
        )
        for a in answers
    )
    (row,) = json.loads(_cli("runs", "--db", str(db), "--json"))
    assert row["cost"]["complete"] is True, row["cost"]
    assert expected > 0
    assert row["cost"]["usd"] == pytest.approx(expected)
    assert "unknown price" not in _cli("runs", "--db", str(db))


def test_an_unpriced_name_says_so_once_and_a_money_cap_says_how_to_price_it(
    stub: OpenAIStub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _as(stub, UNPRICED)
    monkeypatch.setenv("CARDBUS_MODEL", UNPRICED)
    db = tmp_path / "runs.db"
    capped = _plan(tmp_path / "p.json", "capped")
    result = json.loads(_cli("run", str(capped), "--db", str(db), "--json", code=1))
    assert result["status"] == "failed"
    assert not stub.requests  # refused before it was sent

    async def refusals() -> list[ev.BudgetRefused]:
        store = await SqliteEventStore.open(db)
        try:
            return [
                e.data for e in await store.read_all(1, 100_000) if type(e.data) is ev.BudgetRefused
            ]
        finally:
            await store.close()

    (refused,) = asyncio.run(refusals())
    why = refused.reason
    assert "\n" not in why
    assert f"no price known for model {UNPRICED!r}" in why
    assert "CARDBUS_PRICES" in why and f'"{UNPRICED}"' in why  # the entry to add

    # the same plan without a cap runs (twice: two runs, each with a call of that model);
    # their cost is unknown, and that is said once, with the way out
    free = json.loads(capped.read_text())
    del free["budget_usd"]
    for plan_id in ("free-1", "free-2"):
        free["plan_id"] = plan_id
        (tmp_path / "free.json").write_text(json.dumps(free))
        done = json.loads(_cli("run", str(tmp_path / "free.json"), "--db", str(db), "--json"))
        assert done["status"] == "completed"
    assert len(stub.requests) == 2
    text = _cli("runs", "--db", str(db))
    rows = json.loads(_cli("runs", "--db", str(db), "--json"))
    unknown = [r for r in rows if r["cost"]["text"] == "unknown price"]
    assert {r["plan_id"] for r in unknown} == {"free-1", "free-2"}
    said = [line for line in text.splitlines() if f"no price known for model {UNPRICED!r}" in line]
    assert len(said) == 1, text
    assert "CARDBUS_PRICES" in said[0]
    replayed = _cli("replay", unknown[0]["root_id"], "--db", str(db))
    assert replayed.count(f"no price known for model {UNPRICED!r}") == 1, replayed
