"""A retried attempt answered from the journal spends nothing again: every token once.

The folds count the results' usage (``task.result_submitted``); a replayed
``model.answered`` has tokens 0 and the handler's usage counts live calls only,
so the totals are what the model was actually asked for, not more.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from journal_log import ANSWERS, write_journal_runs

from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.projections import Cost, ProjectionRunner, Runs


async def _fold(path: Path, root: str) -> tuple[dict, dict, list[ev.ModelAnswered]]:
    store = await SqliteEventStore.open(path)
    try:
        runner = ProjectionRunner.open(store, ":memory:", [Cost(), Runs()])
        await runner.catch_up()
        cost = Cost().get(runner.conn, "root", root)
        run = Runs().get(runner.conn, root)
        runner.close()
        answered = [
            e.data
            for e in await store.read_correlation(root)
            if isinstance(e.data, ev.ModelAnswered)
        ]
    finally:
        await store.close()
    assert cost is not None and run is not None
    return cost, run, answered


def test_a_run_with_a_retry_counts_each_token_once(tmp_path: Path) -> None:
    runs = asyncio.run(write_journal_runs(tmp_path / "log.db"))
    cost, run, answered = asyncio.run(_fold(runs.db, runs.retry_root))
    spent_in = sum(i for _, i, _ in ANSWERS)  # the stub's three answers, each asked once
    spent_out = sum(o for _, _, o in ANSWERS)
    assert (cost["input_tokens"], cost["output_tokens"]) == (spent_in, spent_out)
    assert (run["input_tokens"], run["output_tokens"]) == (spent_in, spent_out)
    assert cost["results"] == 2  # the failed attempt's result and the completed one's
    # the journal agrees: live answers carry the tokens, replayed ones none
    live = [a for a in answered if a.replayed_from is None]
    replayed = [a for a in answered if a.replayed_from is not None]
    assert len(live) == 3 and len(replayed) == 2
    assert sum(a.input_tokens for a in live) == spent_in
    assert all(a.input_tokens == a.output_tokens == 0 for a in replayed)
