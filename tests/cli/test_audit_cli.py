"""``cardbus head`` and ``cardbus verify --head``: the log's end kept outside it, checked later."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from click.testing import CliRunner, Result
from lifecycle_log import RunIds

from cardbus.tools.cli import cli


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_a_kept_head_catches_a_cut_tail_that_verify_alone_cannot(
    run_db: tuple[str, RunIds], tmp_path: Path
) -> None:
    db, _ = run_db
    r = invoke("head", "--db", db)
    assert r.exit_code == 0, r.output
    head = json.loads(r.stdout)
    assert head["position"] > 10 and len(head["log_hash"]) == 64 and head["signature"] == ""
    kept = tmp_path / "head.json"
    kept.write_text(r.stdout)
    assert invoke("verify", "--db", db, "--head", str(kept)).exit_code == 0
    with sqlite3.connect(db) as c:
        c.execute("DELETE FROM events WHERE position > ?", (head["position"] - 3,))
    assert invoke("verify", "--db", db).exit_code == 0  # a shorter log is still a log
    r = invoke("verify", "--db", db, "--head", str(kept))
    assert r.exit_code == 1
    first, last = head["position"] - 2, head["position"]
    assert f"events {first}..{last} missing (truncated)" in r.stdout
    out = json.loads(invoke("verify", "--db", db, "--head", str(kept), "--json").stdout)
    assert out["ok"] is False and out["head"]["position"] == last


def test_a_signed_head_is_checked_with_the_key(run_db: tuple[str, RunIds], tmp_path: Path) -> None:
    db, _ = run_db
    key = tmp_path / "key"
    key.write_text("s3cret\n")
    kept = tmp_path / "head.json"
    kept.write_text(invoke("head", "--db", db, "--key-file", str(key)).stdout)
    assert json.loads(kept.read_text())["signature"]
    assert invoke("verify", "--db", db, "--head", str(kept), "--key-file", str(key)).exit_code == 0
    other = tmp_path / "other"
    other.write_text("guess")
    r = invoke("verify", "--db", db, "--head", str(kept), "--key-file", str(other))
    assert r.exit_code == 1 and "not signed with that key" in r.stderr


def test_verify_refuses_an_empty_or_foreign_file_without_changing_it(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as c:
        c.execute("CREATE TABLE t (x)")
    for path in (empty, foreign, tmp_path / "missing.db"):
        before = path.read_bytes() if path.exists() else None
        r = invoke("verify", "--db", str(path))
        assert r.exit_code == 1
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and ("not a cardbus log" in lines[0] or "no event store" in lines[0])
        assert (path.read_bytes() if path.exists() else None) == before


def test_a_log_without_a_log_chain_verifies_saying_it_has_none(
    run_db: tuple[str, RunIds],
) -> None:
    db, _ = run_db
    ok = invoke("verify", "--db", db)
    assert ok.exit_code == 0 and "per-stream chains only" not in ok.stdout  # it has one
    assert json.loads(invoke("verify", "--db", db, "--json").stdout)["log_chain"] is True
    with sqlite3.connect(db) as c:  # as an older cardbus wrote it
        c.execute("ALTER TABLE events DROP COLUMN log_hash")
    r = invoke("verify", "--db", db)
    assert r.exit_code == 0
    assert r.stdout.startswith("OK: hash chains intact in the whole log")
    assert "(per-stream chains only: this log has no log chain" in r.stdout
    out = json.loads(invoke("verify", "--db", db, "--json").stdout)
    assert out["ok"] is True and out["log_chain"] is False
    assert out["note"].startswith("per-stream chains only")
    with sqlite3.connect(db) as c:  # an edit is still caught by the stream chains
        c.execute("UPDATE events SET body = replace(body, 'v', 'w') WHERE position = 3")
    bad = invoke("verify", "--db", db)
    assert bad.exit_code == 1 and "BAD event" in bad.stdout
    assert "per-stream chains only" in bad.stdout
    with sqlite3.connect(db) as c:
        columns = {row[1] for row in c.execute("PRAGMA table_info(events)")}
    assert "log_hash" not in columns  # verify only reads: it added none
