"""``cardbus runs``, ``stats`` and ``replay`` show money: the demo against the loopback stub.

The demo's LLM agents ask the OpenAI-compatible stub (its model answers as
``stub-model-2024``, each answer with its token counts); a user's price table
prices that model. Expected figures come from the log's ``model.answered``
events, priced by hand; without the table the model has no price and is shown
as "unknown price", never as $0.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cardbus.eventstore import events as ev
from cardbus.eventstore.sqlite import SqliteEventStore
from cardbus.tools.cli import cli
from tests.agents.openai_stub import OpenAIStub

IN_PRICE, OUT_PRICE = 2.0, 8.0  # USD per million tokens, the user's table


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    tmp = tmp_path_factory.mktemp("cost")
    prices = tmp / "prices.toml"
    prices.write_text(f'[models."stub-*"]\ninput = {IN_PRICE}\noutput = {OUT_PRICE}\n')
    with OpenAIStub() as stub, pytest.MonkeyPatch.context() as mp:
        stub.honour_schema = True
        mp.setenv("OPENAI_BASE_URL", stub.url)
        mp.setenv("CARDBUS_MODEL", "demo-model")
        mp.delenv("CARDBUS_PRICES", raising=False)
        db = tmp / "demo.db"
        out = CliRunner().invoke(cli, ["demo", "--db", str(db)])
        assert out.exit_code == 0, out.output
        assert stub.requests
    yield db, prices


def _answers(db: Path) -> list[ev.ModelAnswered]:
    async def go() -> list[ev.ModelAnswered]:
        store = await SqliteEventStore.open(db)
        try:
            return [
                e.data for e in await store.read_all(1, 100_000) if type(e.data) is ev.ModelAnswered
            ]
        finally:
            await store.close()

    return asyncio.run(go())


def _cli(*args: str) -> str:
    out = CliRunner().invoke(cli, list(args), terminal_width=300)
    assert out.exit_code == 0, out.output
    return out.output


def _usd(answers: list[ev.ModelAnswered]) -> float:
    live = [a for a in answers if a.replayed_from is None and a.error is None]
    return (
        sum(a.input_tokens for a in live) * IN_PRICE
        + sum(a.output_tokens for a in live) * OUT_PRICE
    ) / 1e6


def test_runs_shows_the_runs_cost_in_usd(demo: tuple[Path, Path]) -> None:
    db, prices = demo
    answers = _answers(db)
    assert answers and {a.model for a in answers} == {"stub-model-2024"}
    (row,) = json.loads(_cli("runs", "--db", str(db), "--json", "--prices", str(prices)))
    assert row["cost"]["complete"] is True
    assert row["cost"]["usd"] == pytest.approx(_usd(answers))
    text = _cli("runs", "--db", str(db), "--prices", str(prices))
    assert row["cost"]["text"] in text and row["cost"]["text"].startswith("$")
    # without the table the stub's model has no price: unknown, never $0
    (bare,) = json.loads(_cli("runs", "--db", str(db), "--json"))
    assert bare["cost"] == {"usd": 0.0, "complete": False, "text": "unknown price"}
    assert "unknown price" in _cli("runs", "--db", str(db))


def test_stats_shows_money_per_model_agent_and_run(
    demo: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    db, prices = demo
    answers = _answers(db)
    monkeypatch.setenv("CARDBUS_PRICES", str(prices))  # the environment names the table
    doc: dict[str, Any] = json.loads(_cli("stats", "--db", str(db), "--json"))
    money = doc["money"]
    (model,) = money["model"]
    assert model["model"] == "stub-model-2024"
    assert model["calls"] == len([a for a in answers if a.replayed_from is None])
    assert model["money"]["usd"] == pytest.approx(_usd(answers))
    (run,) = money["run"]
    assert run["money"]["usd"] == pytest.approx(_usd(answers))
    by_agent = {r["agent_id"]: r["money"]["usd"] for r in money["agent"]}
    for agent in {a.agent_id for a in answers}:
        mine = [a for a in answers if a.agent_id == agent]
        assert by_agent[agent] == pytest.approx(_usd(mine))
    text = _cli("stats", "--db", str(db))
    assert "Cost (USD; prices: user table" in text and "stub-model-2024" in text


def test_replay_shows_the_cost_of_each_call_task_and_run(demo: tuple[Path, Path]) -> None:
    db, prices = demo
    answers = _answers(db)
    (row,) = json.loads(_cli("runs", "--db", str(db), "--json"))
    doc = json.loads(
        _cli("replay", row["root_id"], "--db", str(db), "--json", "--prices", str(prices))
    )
    assert doc["cost"]["usd"] == pytest.approx(_usd(answers))
    calls = [
        c
        for t in doc["tasks"]
        for s in t["spans"]
        for c in s["calls"]
        if c["kind"] == "model" and c["replayed_from"] is None
    ]
    assert calls and all(
        c["cost"]
        == pytest.approx((c["input_tokens"] * IN_PRICE + c["output_tokens"] * OUT_PRICE) / 1e6)
        for c in calls
    )
    text = _cli("replay", row["root_id"], "--db", str(db), "--prices", str(prices))
    assert f"cost {doc['cost']['text']}" in text
