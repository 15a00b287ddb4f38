"""The console shows money and compares runs (issue 23): ``/api/runs`` and ``/api/runs/ID``
carry each run's cost (per task and per model too), ``/api/diff?a=&b=`` is ``cardbus diff``
as JSON, and the page draws them (a cost column, a cost line, ``#/diff/A/B``).

The log holds the two real runs of tests/journal_log.py (model calls answered by the
OpenAI-compatible stub, each with its token counts). A user's price table prices the
stub's model; expected figures are the log's ``model.answered`` events priced by hand.
Without the table the model has no price: null USD and "unknown price", never $0.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from journal_log import JournalRuns, write_journal_runs
from test_ui import Server

from cardbus.eventstore import events as ev
from cardbus.eventstore.sqlite import SqliteEventStore
from cardbus.projections.pricing import PriceTable

IN_PRICE, OUT_PRICE = 2.0, 8.0  # USD per million tokens, the user's table


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> tuple[JournalRuns, Path]:
    tmp = tmp_path_factory.mktemp("ui-cost")
    runs = asyncio.run(write_journal_runs(tmp / "log.db"))
    prices = tmp / "prices.toml"
    prices.write_text(f'[models."stub-*"]\ninput = {IN_PRICE}\noutput = {OUT_PRICE}\n')
    return runs, prices


@pytest.fixture(scope="module")
def retry_usd(logged: tuple[JournalRuns, Path]) -> float:
    """The retry run's cost at the user's prices (read before a page runs its own loop)."""
    runs, _ = logged
    return _usd(_answers(runs.db, runs.retry_root))


def _answers(db: Path, root: str) -> list[ev.ModelAnswered]:
    async def go() -> list[ev.ModelAnswered]:
        async with await SqliteEventStore.open(db) as store:
            return [
                e.data
                for e in await store.read_correlation(root)
                if type(e.data) is ev.ModelAnswered
                and e.data.replayed_from is None
                and e.data.error is None
            ]

    return asyncio.run(go())


def _usd(answers: list[ev.ModelAnswered]) -> float:
    return (
        sum(a.input_tokens for a in answers) * IN_PRICE
        + sum(a.output_tokens for a in answers) * OUT_PRICE
    ) / 1e6


def _client(db: Path, prices: PriceTable | None) -> Any:
    from starlette.testclient import TestClient

    from cardbus.tools.ui import create_app

    return TestClient(create_app(str(db), prices=prices), base_url="http://127.0.0.1")


def test_runs_and_a_run_carry_their_cost(logged: tuple[JournalRuns, Path]) -> None:
    runs, prices = logged
    answers = _answers(runs.db, runs.retry_root)
    assert answers and {a.model for a in answers} == {"stub-model-2024"}
    usd = _usd(answers)
    with _client(runs.db, PriceTable.load(prices)) as c:
        listed = {r["root_id"]: r for r in c.get("/api/runs").json()["runs"]}
        cost = listed[runs.retry_root]["cost"]
        assert cost["complete"] is True and cost["usd"] == pytest.approx(usd)
        assert cost["text"].startswith("$")
        body = c.get(f"/api/runs/{runs.retry_root}").json()
        assert body["cost"]["usd"] == pytest.approx(usd) and body["cost"]["complete"]
        assert "prices.toml" in body["prices"]
        (model,) = body["cost_by_model"]
        assert model["model"] == "stub-model-2024" and model["calls"] == len(answers)
        assert model["cost"]["usd"] == pytest.approx(usd)
        (task,) = body["cost_by_task"]
        assert task["task_id"] == runs.retry_task
        assert task["cost"]["usd"] == pytest.approx(usd)
    # no price for the stub's model: unknown, never 0
    with _client(runs.db, PriceTable(bundled=False)) as c:
        listed = {r["root_id"]: r for r in c.get("/api/runs").json()["runs"]}
        assert listed[runs.retry_root]["cost"] == {
            "usd": None,
            "complete": False,
            "text": "unknown price",
        }
        body = c.get(f"/api/runs/{runs.retry_root}").json()
        assert body["cost"]["usd"] is None and body["cost"]["text"] == "unknown price"
        assert [m["cost"]["usd"] for m in body["cost_by_model"]] == [None]


def test_the_diff_api_is_cardbus_diff_as_json(logged: tuple[JournalRuns, Path]) -> None:
    runs, _ = logged
    with _client(runs.db, None) as c:
        same = c.get("/api/diff", params={"a": runs.retry_root, "b": runs.retry_root})
        assert same.status_code == 200, same.text
        body = same.json()
        assert body["first_divergence"] is None
        assert body["a"]["root_id"] == body["b"]["root_id"] == runs.retry_root
        assert [t["key"] for t in body["tasks"]] == ["t"]
        other = c.get("/api/diff", params={"a": runs.retry_root, "b": runs.unknown_root}).json()
        first = other["first_divergence"]
        assert first is not None and first["summary"]
        assert other["b"]["root_id"] == runs.unknown_root
        assert any(t["differs"] for t in other["tasks"])
        assert c.get("/api/diff", params={"a": runs.retry_root}).status_code == 400
        assert c.get("/api/diff", params={"a": runs.retry_root, "b": "nope"}).status_code == 404


def test_the_diff_api_asks_for_the_token(logged: tuple[JournalRuns, Path]) -> None:
    from starlette.testclient import TestClient

    from cardbus.tools.ui import create_app

    runs, _ = logged
    app = create_app(str(runs.db), token="s3cret")
    with TestClient(app, base_url="http://127.0.0.1") as c:
        q = {"a": runs.retry_root, "b": runs.retry_root}
        assert c.get("/api/diff", params=q).status_code == 401
        assert c.get("/api/diff", params={**q, "token": "s3cret"}).status_code == 200


@pytest.mark.timeout(180)
def test_the_page_shows_cost_and_a_diff(
    logged: tuple[JournalRuns, Path], retry_usd: float, page: Any
) -> None:
    runs, prices = logged
    usd = retry_usd
    server = Server(runs.db, env={"CARDBUS_PRICES": str(prices)})
    try:
        server.wait_ready()
        page.goto(server.url)
        cell = page.locator(f'#runs tr[data-root="{runs.retry_root}"] td[data-cost] .cost')
        cell.wait_for()
        assert float(cell.get_attribute("data-usd")) == pytest.approx(usd)
        assert cell.get_attribute("data-complete") == "yes"
        assert cell.inner_text().startswith("$")
        assert "cost" in page.locator("#runs thead").inner_text()
        # the run view: its cost line, then "compare with" another run
        page.goto(f"{server.url}#/run/{runs.retry_root}")
        page.wait_for_selector("body[data-view='run'] #run-cost .cost")
        assert page.locator("#run-cost .cost").first.get_attribute("data-complete") == "yes"
        page.fill("#compare input[name=other]", runs.unknown_root)
        page.click("#compare button")
        page.wait_for_selector("body[data-view='diff'] #first-divergence")
        first = page.locator("#first-divergence")
        assert first.get_attribute("data-what") not in (None, "none")
        assert page.locator("#diff-tasks tr.differs").count() >= 1
        assert runs.unknown_root in page.locator("#diff-runs").inner_text()
    finally:
        server.stop()
    # without a price for the model: "unknown price", never $0
    server = Server(runs.db, env={"CARDBUS_PRICES": ""})
    try:
        server.wait_ready()
        page.goto(server.url)
        cell = page.locator(f'#runs tr[data-root="{runs.retry_root}"] td[data-cost] .cost')
        cell.wait_for()
        assert cell.inner_text() == "unknown price"
        assert cell.get_attribute("data-usd") == ""
    finally:
        server.stop()
