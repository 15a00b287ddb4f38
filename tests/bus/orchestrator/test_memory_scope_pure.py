"""Memory scopes, pure: the scope strings, the fold's scope chains, old records, and
the pure parts of grants and reuse (no store, no clock)."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cardbus.bus.orchestrator.memory_access import memory_scopes, parse_grants
from cardbus.bus.orchestrator.reuse import ResultIndex, ReusePolicy, inputs_digest, result_key
from cardbus.eventstore import Envelope
from cardbus.eventstore import events as ev
from cardbus.eventstore.envelope import decode_body
from cardbus.eventstore.errors import InvalidScope
from cardbus.projections.memory import MEMORY_STREAM, MemoryFold
from cardbus.projections.scope import (
    GLOBAL,
    check_key,
    level_of,
    normalize_scope,
    parse_scope,
    scope_chain,
    scope_of,
)

ids = st.text(
    alphabet=st.sampled_from("abcXYZ019._@+-"),
    min_size=1,
    max_size=20,
)


@given(user=st.one_of(st.just(""), ids), tenant=st.one_of(st.just(""), ids))
def test_a_scope_string_round_trips(user: str, tenant: str) -> None:
    scope = scope_of(user, tenant)
    assert parse_scope(scope) == (user, tenant)
    assert normalize_scope(scope) == scope
    chain = scope_chain(user, tenant)
    assert chain[0] == scope and chain[-1] == GLOBAL
    assert len(set(chain)) == len(chain) == 1 + bool(user) + bool(tenant)
    assert level_of(scope) == ("user" if user else "tenant" if tenant else "global")


@settings(max_examples=300)
@given(text=st.text(max_size=60))
def test_any_text_is_a_scope_or_a_typed_error(text: str) -> None:
    try:
        user, tenant = parse_scope(text)
    except InvalidScope as e:
        assert "memory scope" in str(e)
        return
    assert scope_of(user, tenant) == text  # only the canonical spelling is accepted


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "Global",
        "tenant:",
        "user:",
        "tenant:a/",
        "tenant:a/tenant:b",
        "user:a/tenant:b",
        "tenant:a/user:b/user:c",
        "tenant:a b",
        "user:ann\n",
        "tenant:" + "x" * 129,
        "team:a",
    ],
)
def test_malformed_scopes_are_refused(bad: str) -> None:
    with pytest.raises(InvalidScope):
        parse_scope(bad)


@given(key=st.text(max_size=600))
def test_a_key_is_checked_or_a_typed_error(key: str) -> None:
    try:
        assert check_key(key) == key
    except InvalidScope:
        assert not key or len(key) > 512 or any(ord(c) < 32 or ord(c) == 127 for c in key)
    else:
        assert 0 < len(key) <= 512


@given(
    key=st.text(min_size=1, max_size=40).filter(lambda k: check_key_ok(k)),
    user=st.one_of(st.just(""), ids),
    tenant=st.one_of(st.just(""), ids),
)
def test_a_record_is_seen_only_from_its_own_chain(key: str, user: str, tenant: str) -> None:
    scope = scope_of(user, tenant)
    fold = MemoryFold()
    fold.apply(_env(1, ev.MemoryWritten(key=key, value=1, scope=scope)))
    assert fold.get(key, scope_chain(user, tenant)) is not None
    stranger = scope_chain("someone-else", "other-tenant")
    if scope != GLOBAL:
        assert fold.get(key, stranger) is None
        assert fold.list(scopes=stranger) == []


def check_key_ok(key: str) -> bool:
    try:
        check_key(key)
    except InvalidScope:
        return False
    return True


def _env(version: int, data: ev.Event, at: float = 0.0) -> Envelope:
    return Envelope(
        event_id=f"e{version}",
        stream=MEMORY_STREAM,
        version=version,
        recorded_at=at or time.time(),
        correlation_id=MEMORY_STREAM,
        data=data,
        position=version,
    )


def decode_data(tag: str, fields: bytes) -> ev.Event:
    """The data of a stored body as an older cardbus wrote it (no scope fields)."""
    body = (
        b'{"event_id":"e","stream":"memory","version":1,"recorded_at":1.0,'
        b'"correlation_id":"memory","data":{"type":"' + tag.encode() + b'",' + fields[1:] + b"}"
    )
    return decode_body(body).data


def test_a_record_written_before_scopes_decodes_and_reads_as_global() -> None:
    old = b'{"key":"pref/ann/format","value":"md","kind":"preference","policy":"reusable.v1"}'
    data = decode_data("memory.written.v1", old)
    assert isinstance(data, ev.MemoryWritten) and data.scope == ""
    forgot = decode_data("memory.forgotten.v1", b'{"key":"pref/ann/format"}')
    assert isinstance(forgot, ev.MemoryForgotten) and forgot.scope == ""
    started = decode_data("run.started.v1", b'{"goal":"g","plan_id":"p"}')
    assert isinstance(started, ev.RunStarted) and (started.user, started.tenant) == ("", "")
    fold = MemoryFold()
    fold.apply(_env(1, data))
    record = fold.get("pref/ann/format", scope_chain("ann", "acme"))
    assert record is not None and record.scope == GLOBAL
    fold.apply(_env(2, forgot))  # an old forget: of the global record
    assert fold.records == {}


def test_the_most_specific_scope_shadows_the_broader_ones() -> None:
    fold = MemoryFold()
    for i, scope in enumerate(["global", "tenant:acme", "tenant:acme/user:ann"], start=1):
        fold.apply(_env(i, ev.MemoryWritten(key="k", value=scope, text="same text", scope=scope)))
    chain = scope_chain("ann", "acme")
    assert fold.get("k", chain).value == "tenant:acme/user:ann"  # type: ignore[union-attr]
    assert [r.scope for r in fold.list(scopes=chain)] == ["tenant:acme/user:ann"]
    assert [r.scope for r in fold.list(scopes=chain[1:])] == ["tenant:acme"]
    assert len(fold.list()) == 3  # the operator sees all three


def _started(user: str = "ann", tenant: str = "acme") -> ev.RunStarted:
    return ev.RunStarted(goal="g", plan_id="p", user=user, tenant=tenant)


def test_grants_name_agents_or_capabilities_and_levels() -> None:
    read = parse_grants("P", "memory_read", ["*@global", "capability:sum*", "boss"])
    write = parse_grants("P", "memory_write", ["writer@user", "capability:admin@tenant"])
    chain = list(scope_chain("ann", "acme"))

    def where(agent: str, cap: str, kind: str, asked: object = None) -> object:
        got = memory_scopes(_started(), agent, cap, kind, asked, read, write)
        return got.problem or list(got.scopes)

    assert where("boss", "x", "memory.list") == chain
    assert where("summarizer", "summarize", "memory.get") == chain  # by capability
    assert where("clerk", "file", "memory.get") == ["global"]  # only what it may read
    assert where("clerk", "file", "memory.get", "user") == "memory_read_not_allowed"
    assert where("clerk", "file", "memory.get", "tenant:globex") == "memory_scope_not_visible"
    assert where("boss", "x", "memory.get", "tenant:acme") == ["tenant:acme"]
    assert where("writer", "w", "memory.put") == ["tenant:acme/user:ann"]
    assert where("writer", "w", "memory.put", "tenant") == "memory_write_not_allowed"
    assert where("anyone", "admin", "memory.put", "tenant") == ["tenant:acme"]
    assert where("anyone", "admin", "memory.put") == "memory_write_not_allowed"  # user level
    # a run with no tenant has no tenant level to name
    none = memory_scopes(_started("ann", ""), "boss", "x", "memory.get", "tenant", read, write)
    assert none.problem == "memory_scope_not_visible"


def _result(version: int, scope: str, at: float, capability: str = "sq") -> Envelope:
    digest = inputs_digest({"n": 2})
    return _env(
        version,
        ev.MemoryWritten(
            key=result_key(capability, digest),
            value={"output": {"v": version}, "agent_id": "a"},
            kind="result",
            scope=scope,
            root_id=f"run{version}",
        ),
        at=at,
    )


def test_reuse_takes_the_chains_freshest_allowed_result_within_its_age() -> None:
    index = ResultIndex(ReusePolicy(keep=True, reuse=True, max_age_s=100))
    index.apply(_result(1, "tenant:acme", at=1000.0))
    index.apply(_result(2, "tenant:globex", at=1000.0))
    created = ev.TaskCreated(root_id="r", capability="sq")
    inputs = {"n": 2}

    def answer(user: str, tenant: str, now: float, c: ev.TaskCreated = created) -> object:
        done = index.answer(_started(user, tenant), c, "t", inputs, now)
        return None if done is None else (done.output, done.reused.scope)  # type: ignore[union-attr]

    assert answer("ann", "acme", now=1050.0) == ({"v": 1}, "tenant:acme")
    assert answer("bob", "globex", now=1050.0) == ({"v": 2}, "tenant:globex")
    assert answer("ann", "initech", now=1050.0) is None  # nobody's result of its chain
    assert answer("ann", "acme", now=1101.0) is None  # too old
    assert (
        answer("ann", "acme", 1050.0, ev.TaskCreated(root_id="r", capability="sq", role="review"))
        is None
    )
    assert index.answer(_started(), created, "t", {"n": 3}, 1050.0) is None  # other inputs
    index.apply(
        _env(
            3, ev.MemoryForgotten(key=result_key("sq", inputs_digest(inputs)), scope="tenant:acme")
        )
    )
    assert answer("ann", "acme", now=1050.0) is None  # forgotten
    off = ResultIndex(ReusePolicy(keep=True))
    off.apply(_result(1, "tenant:acme", at=1000.0))
    assert off.answer(_started(), created, "t", inputs, 1050.0) is None  # reuse off


def test_the_result_index_is_bounded() -> None:
    index = ResultIndex(ReusePolicy(reuse=True, max_results=3))
    for i in range(1, 8):
        index.apply(_result(i, "global", at=1.0, capability=f"c{i}"))
    assert len(index.entries) == 3
    assert sorted(k.split("/")[1] for _, k in index.entries) == ["c5", "c6", "c7"]


@settings(max_examples=60, deadline=None)
@given(scope=st.text(max_size=30), key=st.text(max_size=30))
def test_remember_writes_a_good_scope_and_key_or_nothing(scope: str, key: str) -> None:
    import asyncio

    from cardbus.bus.orchestrator.memory import LongTermMemory
    from cardbus.eventstore import MemoryEventStore

    async def go() -> None:
        store = MemoryEventStore()
        memory = LongTermMemory(store)
        try:
            await memory.remember(key, 1, scope=scope)
        except InvalidScope:
            assert await store.read_stream(MEMORY_STREAM) == []  # nothing half-written
            assert not (check_key_ok(key) and _scope_ok(scope))
            return
        (env,) = await store.read_stream(MEMORY_STREAM)
        assert env.data == ev.MemoryWritten(
            key=key, value=1, scope=normalize_scope(scope), policy="explicit"
        )
        assert await memory.get(key, [normalize_scope(scope)]) is not None

    asyncio.run(go())


def _scope_ok(scope: str) -> bool:
    try:
        normalize_scope(scope)
    except InvalidScope:
        return False
    return True
