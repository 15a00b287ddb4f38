"""A sample of the optional-task crash sweep (``python -m tests.e2e.optional_crash`` runs
every kill point): a process killed right after one of its writes to the log, and a new
one resuming the run, end it exactly as a run never killed: completed, degraded."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.optional_crash import sweep


@pytest.mark.timeout(600)
def test_a_degraded_run_killed_at_a_write_ends_the_same_when_resumed(tmp_path: Path) -> None:
    # kill points: while the optional task fails (its first attempt, its retry), and once
    # the dependent was dispatched without its output
    base, problems = sweep(tmp_path, [2, 5, 8])
    assert (base["status"], base["reason"], base["degraded"]) == (
        "completed",
        "degraded",
        ["facts"],
    )
    assert base["outputs"] == {
        "side": {"text": "report on [side]"},
        "report": {"text": "report on []"},
    }
    assert base["writes"] >= 8
    assert problems == []
