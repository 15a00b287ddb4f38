"""``cardbus cancel``: a run cancelled from the terminal on SQLite and on NATS, each
cancellation an event whose actor is who cancelled, shown by ``cardbus replay``."""

from __future__ import annotations

import json

from test_any_store import APPROVE, DENY, GATE_ROOT, Log, cardbus, log, ok

__all__ = ["log"]  # the fixture: the same log on SQLite and on a real nats-server


def test_cancel_a_waiting_run_and_replay_shows_who(log: Log) -> None:
    out = json.loads(
        ok(
            cardbus(log, "cancel", "plan-gate", "--by", "ops-alice", "--note", "wrong", "--json")
        ).stdout
    )
    assert out == {"root_id": GATE_ROOT, "cancelled": [APPROVE, DENY], "by": "ops-alice"}
    rows = json.loads(ok(cardbus(log, "tasks", "--root", GATE_ROOT, "--json")).stdout)
    assert {r["status"] for r in rows} == {"cancelled"}
    tree = ok(cardbus(log, "replay", GATE_ROOT)).stdout
    assert tree.count("(by ops-alice)") == 2 and "cancelled_by_user: wrong" in tree
    timeline = json.loads(ok(cardbus(log, "replay", GATE_ROOT, "--json")).stdout)
    steps = [s for t in timeline["tasks"] for s in t["steps"] if s["kind"] == "cancelled"]
    assert [(s["actor"], s["status"]) for s in steps] == [("ops-alice", "cancelled")] * 2
    # nothing left to cancel; a finished run is left alone
    again = ok(cardbus(log, "cancel", GATE_ROOT)).stdout
    assert "nothing to cancel" in again
    assert json.loads(ok(cardbus(log, "cancel", log.ids.root, "--json")).stdout)["cancelled"] == []
    missing = cardbus(log, "cancel", "no-such-run")
    assert missing.exit_code == 1 and "no-such-run" in missing.output
