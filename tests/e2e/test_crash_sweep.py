"""A sample of the crash sweep (``python -m tests.e2e.crashsweep`` runs all of it).

Each trial kills the process running an LLM-and-tools run right after one of its
writes to the log, restarts it, and checks the three figures (see ``crashsweep``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.e2e.crashsweep import run_sweep


@pytest.mark.timeout(600)
def test_a_sample_of_kill_points_on_both_stores(tmp_path: Path) -> None:
    # mid-task points: in the first task's model and tool calls, in the second's
    figures = run_sweep(["sqlite", "nats"], [9, 27], tmp_path, verbose=False)
    for kind, f in figures.items():
        assert f.failures == [], kind
        assert f.trials == 2 and f.killed == 2, kind
        assert f.completed_same == f.trials, kind
        assert f.resent_after_durable == 0, kind
        assert f.effects_twice == 0, kind


@pytest.mark.timeout(600)
def test_the_sweep_sees_calls_sent_again_when_replay_is_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: without the journal's replay the same kill re-sends answered calls
    (killed once the second task's second answer is durable: its first two are sent again;
    with replay on, none is)."""
    (tmp_path / "on").mkdir()
    (tmp_path / "off").mkdir()
    replayed = run_sweep(["sqlite"], None, tmp_path / "on", False, after_answers=7)["sqlite"]
    monkeypatch.setitem(os.environ, "CARDBUS_SWEEP_NO_REPLAY", "1")
    fresh = run_sweep(["sqlite"], None, tmp_path / "off", False, after_answers=7)["sqlite"]
    assert replayed.killed == fresh.killed == 1
    assert replayed.resent_after_durable == 0 and replayed.completed_same == 1
    assert fresh.resent_after_durable >= 2
