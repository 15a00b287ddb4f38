"""The ``store`` fixture: every EventStore backend, one fresh store per test.

A backend joins the contract suite by adding the name of its fixture prefix to
``BACKENDS``: the fixture ``<name>_store`` must yield a fresh, empty store
(see ``tests/conftest.py``). Every backend takes ``max_event_bytes`` as a
keyword when built and keeps it in the attribute of the same name, which the
size-limit tests lower on the live store.
"""

from __future__ import annotations

import pytest

from cardbus.eventstore import EventStore

BACKENDS = ["memory", "sqlite", "nats"]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest) -> EventStore:
    backend: EventStore = request.getfixturevalue(f"{request.param}_store")
    return backend
