"""Long-term memory per scope, per-agent grants, and results kept for reuse, end to end.

Real SQLite file, embedded runtime, agents on the in-process bus: what an agent
sees of memory is what its run's scope chain holds (never another tenant's or
user's, by key, by list or by search); a write it is not granted is refused with
a reason in its task's stream; a kept result answers an identical later task of
the same scope without calling the agent, and says so in the log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest

from cardbus.agents.agent import Agent, Capability, TaskContext
from cardbus.agents.cards import TaskCard
from cardbus.bus.orchestrator.access import AccessPolicy
from cardbus.bus.orchestrator.plan import Plan, PlanTask
from cardbus.bus.orchestrator.reuse import ReusePolicy, inputs_digest, result_key
from cardbus.bus.runtime.embedded import EmbeddedRuntime
from cardbus.eventstore import SqliteEventStore
from cardbus.eventstore import events as ev
from cardbus.eventstore.errors import CardbusError, ConfigError, InvalidPlan
from cardbus.projections import replay


class Probe(msgspec.Struct, frozen=True):
    key: str = "plan/secret"
    other_scope: str = ""  # a scope string the agent names explicitly
    foreign_key: str = ""  # a key only another tenant has


async def _try(coro: Any) -> dict[str, Any]:
    try:
        return {"ok": await coro}
    except CardbusError as e:
        return {"error": type(e).__name__}


class Peek(Agent):
    """Reads memory every way it can, including a scope that is not its run's."""

    agent_id = "peek"
    capabilities = [Capability("peek", Probe, dict)]

    async def handle(self, task: TaskCard, inputs: Probe, ctx: TaskContext) -> dict:
        lt = ctx.long_term
        out = {
            "get": await _try(lt.get(inputs.key)),
            "list": await _try(lt.list(limit=50)),
            "search": await _try(lt.search("the secret launch plan", k=20)),
            "get_tenant": await _try(lt.get(inputs.key, scope="tenant")),
            "get_foreign": await _try(lt.get(inputs.foreign_key or "none")),
        }
        if inputs.other_scope:
            out["get_other"] = await _try(lt.get(inputs.key, scope=inputs.other_scope))
            out["list_other"] = await _try(lt.list(scope=inputs.other_scope))
            out["search_other"] = await _try(lt.search("secret", scope=inputs.other_scope))
        return out


def _peek_plan(user: str, tenant: str, other_scope: str = "", foreign_key: str = "") -> Plan:
    inputs = {"other_scope": other_scope, "foreign_key": foreign_key}
    return Plan(
        goal="peek",
        user=user,
        tenant=tenant,
        tasks=[PlanTask(id="p", capability="peek", inputs=inputs)],
    )


async def _seed(rt: EmbeddedRuntime) -> None:
    m = rt.memory
    for tenant, word in (("acme", "anvils"), ("globex", "globes")):
        await m.remember(
            "plan/secret", f"{tenant} launches {word}", text=f"the secret launch plan: {word}",
            scope=f"tenant:{tenant}",
        )  # fmt: skip
        await m.remember(
            f"only/{tenant}", word, text=f"the secret launch plan of {tenant}",
            scope=f"tenant:{tenant}",
        )  # fmt: skip
    await m.remember(
        "plan/secret", "ann's own plan", text="the secret launch plan of ann",
        scope="tenant:acme/user:ann",
    )  # fmt: skip
    await m.remember("motto", "be kind", text="the public launch plan motto")  # global


def _keys(result: dict[str, Any], part: str) -> set[tuple[str, str]]:
    got = result[part]["ok"]
    records = [h.get("record", h) for h in got]
    return {(r["scope"], r["key"]) for r in records}


async def test_two_tenants_never_see_each_others_memory(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "cardbus.db", poll_interval=0.01)
    try:
        async with EmbeddedRuntime(store, [Peek]) as rt:
            await _seed(rt)
            ann = await rt.run(_peek_plan("ann", "acme", "tenant:globex", "only/globex"))
            bob = await rt.run(_peek_plan("bob", "globex", "tenant:acme/user:ann", "only/acme"))
        assert ann.status == bob.status == "completed", (ann, bob)
        a, b = ann.outputs["p"], bob.outputs["p"]
        # by key: the most specific scope of one's own chain
        assert a["get"]["ok"]["value"] == "ann's own plan"
        assert a["get"]["ok"]["scope"] == "tenant:acme/user:ann"
        assert a["get_tenant"]["ok"]["value"] == "acme launches anvils"
        assert b["get"]["ok"]["value"] == "globex launches globes"
        # a key only the other tenant has: not there, as far as either run can tell
        assert a["get_foreign"] == b["get_foreign"] == {"ok": None}
        # by list and by search: the chain's records only (a shadowed key once)
        mine_a = {("tenant:acme/user:ann", "plan/secret"), ("tenant:acme", "only/acme")}
        mine_a.add(("global", "motto"))
        assert _keys(a, "list") == mine_a
        assert _keys(a, "search") == mine_a
        mine_b = {("tenant:globex", "plan/secret"), ("tenant:globex", "only/globex")}
        mine_b.add(("global", "motto"))
        assert _keys(b, "list") == mine_b
        assert _keys(b, "search") == mine_b
        # naming another tenant's or user's scope is refused, for get, list and search
        for out in (a, b):
            for part in ("get_other", "list_other", "search_other"):
                assert out[part] == {"error": "AccessDenied"}, (part, out[part])
        # ... each refusal recorded with its reason; each read with the scopes it saw
        for result, chain in (
            (ann, ["tenant:acme/user:ann", "tenant:acme", "global"]),
            (bob, ["tenant:globex/user:bob", "tenant:globex", "global"]),
        ):
            started = (await store.read_stream(result.root_id))[0].data
            assert isinstance(started, ev.RunStarted)
            (task_id,) = started.task_ids
            events = [e.data for e in await store.read_stream(task_id)]
            refused = [d for d in events if isinstance(d, ev.AccessRefused)]
            assert [(d.action, d.reason) for d in refused] == [
                ("memory.get", "memory_scope_not_visible"),
                ("memory.list", "memory_scope_not_visible"),
                ("memory.search", "memory_scope_not_visible"),
            ]
            reads = [d for d in events if isinstance(d, ev.MemoryRead)]
            assert [d.scopes for d in reads][:3] == [chain, chain, chain]
        # no value of the other tenant's records reached either run's log
        for result, foreign in ((ann, [b"globes"]), (bob, [b"anvils", b"ann's own plan"])):
            started = (await store.read_stream(result.root_id))[0].data
            (task_id,) = started.task_ids  # type: ignore[union-attr]
            body = b"".join(msgspec.json.encode(e.data) for e in await store.read_stream(task_id))
            assert not [v for v in foreign if v in body]
        assert await store.verify() == []
    finally:
        await store.close()


class Writer(Agent):
    agent_id = "writer"
    capabilities = [Capability("write", dict, dict)]

    async def handle(self, task: TaskCard, inputs: dict, ctx: TaskContext) -> dict:
        lt = ctx.long_term
        return {
            "own": await _try(lt.put("notes/seen", {"n": 1}, text="a note")),
            "global": await _try(lt.put("notes/all", "x", scope="global")),
            "forged": await _try(lt.put("result/write/abc", {"output": 1}, kind="result")),
        }


def _write_plan() -> Plan:
    return Plan(goal="w", user="ann", tenant="acme", tasks=[PlanTask(id="w", capability="write")])


async def _refusals(store: SqliteEventStore, root_id: str) -> list[tuple[str, str, str]]:
    started = (await store.read_stream(root_id))[0].data
    (task_id,) = started.task_ids  # type: ignore[union-attr]
    return [
        (d.action, d.target, d.reason)
        for d in (e.data for e in await store.read_stream(task_id))
        if isinstance(d, ev.AccessRefused)
    ]


async def test_a_write_without_a_grant_is_refused_with_a_reason(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "cardbus.db", poll_interval=0.01)
    try:
        async with EmbeddedRuntime(store, [Writer]) as rt:  # the default: nobody writes
            result = await rt.run(_write_plan())
            assert await rt.memory.list() == []
        out = result.outputs["w"]
        assert out == {k: {"error": "AccessDenied"} for k in ("own", "global", "forged")}
        assert await _refusals(store, result.root_id) == [
            ("memory.put", "notes/seen", "memory_write_not_allowed"),
            ("memory.put", "notes/all", "memory_write_not_allowed"),
            ("memory.put", "result/write/abc", "memory_kind_reserved"),
        ]
    finally:
        await store.close()


async def test_a_granted_write_goes_to_the_runs_own_scope_only(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "cardbus.db", poll_interval=0.01)
    access = AccessPolicy(memory_write=("writer@user",))
    try:
        async with EmbeddedRuntime(store, [Writer], access=access) as rt:
            result = await rt.run(_write_plan())
            records = await rt.memory.list()
        out = result.outputs["w"]
        assert out["own"]["ok"]["scope"] == "tenant:acme/user:ann"
        assert out["global"] == out["forged"] == {"error": "AccessDenied"}
        assert [(r.scope, r.key, r.agent_id, r.root_id) for r in records] == [
            ("tenant:acme/user:ann", "notes/seen", "writer", result.root_id)
        ]
        assert [r[2] for r in await _refusals(store, result.root_id)] == [
            "memory_write_not_allowed",
            "memory_kind_reserved",
        ]
    finally:
        await store.close()


class Counted(Agent):
    agent_id = "counted"
    capabilities = [Capability("square", dict, dict)]
    calls: ClassVar[list[Any]] = []

    async def handle(self, task: TaskCard, inputs: dict, ctx: TaskContext) -> dict:
        type(self).calls.append(inputs["n"])
        return {"square": inputs["n"] ** 2}


def _square_plan(tenant: str, n: int = 7) -> Plan:
    return Plan(
        goal="square",
        tenant=tenant,
        tasks=[
            PlanTask(id="sq", capability="square", inputs={"n": n}),
            PlanTask(
                id="again",
                capability="square",
                deps=["sq"],
                inputs={"n": {"$dep": "sq", "path": "square"}},
            ),
        ],
    )


async def _completion(store: SqliteEventStore, root_id: str, plan_id: str) -> ev.TaskCompleted:
    started = (await store.read_stream(root_id))[0].data
    assert isinstance(started, ev.RunStarted)
    task_id = next(t for t in started.task_ids if t.startswith(f"{plan_id}-"))
    last = (await store.read_stream(task_id))[-1].data
    assert isinstance(last, ev.TaskCompleted)
    return last


async def test_a_kept_result_answers_an_identical_task_without_the_agent(tmp_path: Path) -> None:
    Counted.calls = []
    store = await SqliteEventStore.open(tmp_path / "cardbus.db", poll_interval=0.01)
    policy = ReusePolicy(keep=True, reuse=True, max_age_s=3600)
    try:
        async with EmbeddedRuntime(store, [Counted], reuse=policy) as rt:
            first = await rt.run(_square_plan("acme"))
            assert Counted.calls == [7, 49]
            second = await rt.run(_square_plan("acme"))
            assert Counted.calls == [7, 49]  # both answered from memory: no agent called
            other = await rt.run(_square_plan("globex"))  # another tenant: its own work
            assert Counted.calls == [7, 49, 7, 49]
            kept = await rt.memory.list(kind="result")
        assert first.outputs == second.outputs == other.outputs
        assert first.outputs["again"] == {"square": 2401}
        # kept in each run's own scope, keyed by capability and inputs digest
        key = result_key("square", inputs_digest({"n": 7}))
        assert {(r.scope, r.key) for r in kept} >= {("tenant:acme", key), ("tenant:globex", key)}
        # the reuse is in the log, saying where the result came from
        done = await _completion(store, second.root_id, "sq")
        source = await _completion(store, first.root_id, "sq")
        assert done.reused is not None and done.reused_from is not None
        assert done.reused.scope == "tenant:acme" and done.reused.key == key
        assert done.reused.source_root_id == first.root_id
        assert done.reused.agent_id == "counted" and done.output == source.output
        written = [e for e in await store.read_stream("memory") if e.event_id == done.reused_from]
        assert len(written) == 1 and written[0].data.kind == "result"  # type: ignore[union-attr]
        assert (await _completion(store, other.root_id, "sq")).reused is None
        # no dispatch for a reused task; replay shows where its result came from
        timeline = await replay(store, second.root_id)
        (node,) = [n for _, n in timeline.walk() if n.task_id.startswith("sq-")]
        assert [s.kind for s in node.steps] == ["created", "completed"]
        assert "reused from long-term memory (tenant:acme" in (node.steps[-1].detail or "")
        assert await store.verify() == []
    finally:
        await store.close()


async def test_reuse_is_off_by_default_and_keeps_nothing(tmp_path: Path) -> None:
    Counted.calls = []
    store = await SqliteEventStore.open(tmp_path / "cardbus.db", poll_interval=0.01)
    try:
        async with EmbeddedRuntime(store, [Counted]) as rt:
            await rt.run(_square_plan("acme"))
            await rt.run(_square_plan("acme"))
            assert await rt.memory.list(kind="result") == []
        assert Counted.calls == [7, 49, 7, 49]
    finally:
        await store.close()


async def test_kept_results_without_reuse_are_stored_and_not_used(tmp_path: Path) -> None:
    Counted.calls = []
    store = await SqliteEventStore.open(tmp_path / "cardbus.db", poll_interval=0.01)
    try:
        async with EmbeddedRuntime(store, [Counted], reuse=ReusePolicy(keep=True)) as rt:
            await rt.run(_square_plan("acme"))
            await rt.run(_square_plan("acme"))
            kept = await rt.memory.list(kind="result")
        assert Counted.calls == [7, 49, 7, 49]
        assert {r.scope for r in kept} == {"tenant:acme"} and len(kept) == 2
    finally:
        await store.close()


async def test_a_restarted_runtime_reuses_what_an_earlier_process_kept(tmp_path: Path) -> None:
    Counted.calls = []
    db = tmp_path / "cardbus.db"
    policy = ReusePolicy(keep=True, reuse=True)
    for _ in range(2):
        store = await SqliteEventStore.open(db, poll_interval=0.01)
        try:
            async with EmbeddedRuntime(store, [Counted], reuse=policy) as rt:
                result = await rt.run(_square_plan("acme", n=3))
            assert result.outputs["again"] == {"square": 81}
        finally:
            await store.close()
    assert Counted.calls == [3, 9]  # the second process called no agent


def test_bad_context_and_grants_are_typed_errors() -> None:
    with pytest.raises(ConfigError, match="memory_write"):
        AccessPolicy(memory_write=("writer@planet",))
    with pytest.raises(ConfigError, match="memory_read"):
        AccessPolicy(memory_read="*")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_age_s"):
        ReusePolicy(reuse=True, max_age_s=0)
    from cardbus.bus.orchestrator.plan import run_context

    with pytest.raises(InvalidPlan, match=r"plan\.tenant"):
        run_context(Plan(goal="g", tenant="acme/user:x"))
    with pytest.raises(InvalidPlan, match=r"plan.session\['user'\]"):
        run_context(Plan(goal="g", session={"user": "ann bob"}))
    assert run_context(Plan(goal="g", session={"user": "ann", "tenant": "acme"})) == (
        "ann",
        "acme",
    )
    assert run_context(Plan(goal="g", user="zed", session={"user": "ann"})) == ("zed", "")
