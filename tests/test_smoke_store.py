"""A first end-to-end check of both backends; the full contract lives in tests/contract."""

from __future__ import annotations

import pytest

from eventstore import ConcurrencyError, EventStore, NewEvent
from eventstore import events as ev


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest) -> EventStore:
    return request.getfixturevalue(f"{request.param}_store")


async def test_append_read_and_conflict(store: EventStore) -> None:
    new = NewEvent(data=ev.TaskCreated(root_id="r", capability="c"), correlation_id="r")
    [env] = await store.append("t", [new], 0)
    assert (env.version, env.position) == (1, 1)
    assert [e.event_id for e in await store.read_stream("t")] == [new.event_id]
    with pytest.raises(ConcurrencyError) as info:
        await store.append("t", [NewEvent(data=ev.TaskFailed(reason="x"), correlation_id="r")], 0)
    assert (info.value.expected, info.value.actual) == (0, 1)
    assert await store.verify() == []
