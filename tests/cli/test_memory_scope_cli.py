"""``cardbus memory`` by scope, and ``cardbus run --user/--tenant/--reuse``, on an SQLite file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from memory_agents import Doubler

from cardbus.bus.orchestrator.memory import LongTermMemory
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.tools.cli import cli


async def _seed(path: Path) -> None:
    store = await SqliteEventStore.open(path)
    try:
        m = LongTermMemory(store)
        await m.remember("plan/secret", "acme's", text="launch plan", scope="tenant:acme")
        await m.remember("plan/secret", "globex's", text="launch plan", scope="tenant:globex")
        await m.remember("plan/secret", "ann's", text="launch plan", scope="tenant:acme/user:ann")
        await m.remember("motto", "be kind", text="launch motto")
    finally:
        await store.close()


@pytest.fixture
def db(tmp_path: Path) -> str:
    path = tmp_path / "cardbus.db"
    asyncio.run(_seed(path))
    return str(path)


def _cli(*args: str) -> tuple[int, str]:
    """Exit code and output: stdout alone when it succeeded (JSON), else all of it."""
    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, r.stdout if r.exit_code == 0 else r.output


def _listed(*args: str) -> list[tuple[str, str, str]]:
    code, out = _cli("memory", *args, "--json")
    assert code == 0, out
    rows = json.loads(out)
    rows = [r.get("record", r) for r in rows]
    return sorted((r["scope"], r["key"], r["value"]) for r in rows)


def test_memory_list_search_show_by_scope(db: str) -> None:
    assert len(_listed("list", "--store", db)) == 4  # the operator sees every scope
    assert _listed("list", "--store", db, "--scope", "tenant:globex") == [
        ("tenant:globex", "plan/secret", "globex's")
    ]
    # what a run of ann at acme sees: her record shadows acme's; never globex's
    assert _listed("list", "--store", db, "--user", "ann", "--tenant", "acme") == [
        ("global", "motto", "be kind"),
        ("tenant:acme/user:ann", "plan/secret", "ann's"),
    ]
    assert _listed("search", "launch", "--store", db, "--tenant", "globex") == [
        ("global", "motto", "be kind"),
        ("tenant:globex", "plan/secret", "globex's"),
    ]
    code, out = _cli("memory", "show", "plan/secret", "--store", db, "--tenant", "globex")
    assert code == 0 and json.loads(out)["value"] == "globex's"
    code, out = _cli("memory", "list", "--store", db)  # the table names each record's scope
    assert code == 0 and "tenant:acme/user:ann" in out


@pytest.mark.parametrize(
    "args",
    [
        ("--scope", "tenant:acme/team:x"),
        ("--scope", "Global"),
        ("--user", "ann bob"),
        ("--tenant", "a/b"),
        ("--scope", "global", "--user", "ann"),
    ],
)
def test_a_bad_scope_is_a_one_line_usage_error(db: str, args: tuple[str, ...]) -> None:
    code, out = _cli("memory", "list", "--store", db, *args)
    assert code == 2 and "Traceback" not in out
    assert "scope" in out or "id" in out or "not both" in out


def test_forget_names_the_scope_when_several_hold_the_key(db: str) -> None:
    code, out = _cli("memory", "forget", "plan/secret", "--store", db)
    assert code == 1 and "several scopes" in out and "tenant:globex" in out
    code, out = _cli("memory", "forget", "plan/secret", "--store", db, "--scope", "tenant:globex")
    assert code == 0, out
    assert _listed("list", "--store", db, "--tenant", "globex") == [("global", "motto", "be kind")]
    assert len(_listed("list", "--store", db)) == 3  # the other tenants' records stay


def test_run_with_user_tenant_and_reuse(tmp_path: Path) -> None:
    Doubler.calls = []
    db = str(tmp_path / "run.db")
    plan = {
        "goal": "double",
        "agents": ["memory_agents:Doubler"],
        "tasks": [{"id": "d", "capability": "double", "inputs": {"n": 21}}],
    }
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    base = ("run", str(path), "--store", db, "--json", "--tenant", "acme", "--user", "ann")
    outs = []
    for _ in range(2):
        code, out = _cli(*base, "--reuse")
        assert code == 0, out
        outs.append(json.loads(out))
    assert [o["outputs"] for o in outs] == [{"d": {"n": 42}}] * 2
    assert Doubler.calls == [21]  # the second run was answered from memory
    code, out = _cli(*base)  # no --reuse: the agent runs again
    assert code == 0 and Doubler.calls == [21, 21]

    async def started_and_done() -> tuple[ev.RunStarted, ev.TaskCompleted]:
        store = await SqliteEventStore.open(db)
        try:
            events = await store.read_stream(outs[1]["root_id"])
            started = events[0].data
            assert isinstance(started, ev.RunStarted)
            done = (await store.read_stream(started.task_ids[0]))[-1].data
            assert isinstance(done, ev.TaskCompleted)
            return started, done
        finally:
            await store.close()

    started, done = asyncio.run(started_and_done())
    assert (started.user, started.tenant) == ("ann", "acme")
    assert done.reused is not None and done.reused.scope == "tenant:acme/user:ann"
    assert done.reused.source_root_id == outs[0]["root_id"]
    code, out = _cli("run", str(path), "--store", db, "--tenant", "no/pe")
    assert code == 2 and "tenant id" in out and "Traceback" not in out
