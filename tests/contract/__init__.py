"""cardbus.testing: the contract suites, one abstract test class per interface.

Every backend of an interface must pass the same tests: cardbus runs them
against its own backends, and a third-party backend runs them against its own.

* ``EventStoreContract`` -- the ``EventStore`` contract
  (``cardbus.eventstore.store``); needs a ``store`` fixture.
* ``BusContract`` -- the ``Bus`` contract (``cardbus.bus.transport.interface``);
  needs a ``bus`` fixture.

A backend's test file is a subclass that provides the fixture: a fresh,
empty instance per test, closed afterwards. The names do not start with
``Test``, so pytest collects only the subclass::

    import pytest_asyncio

    from cardbus.testing import EventStoreContract
    from mypackage import RedisEventStore


    class TestRedisEventStore(EventStoreContract):
        @pytest_asyncio.fixture
        async def store(self):
            store = await RedisEventStore.connect("redis://127.0.0.1:6379/0")
            yield store
            await store.close()

The tests are ``async``: they need pytest and pytest-asyncio (both in
``cardbus[dev]``). The classes mark their tests ``asyncio`` themselves, so
pytest-asyncio's default strict mode works; there an ``async`` fixture needs
``@pytest_asyncio.fixture`` (with ``asyncio_mode = "auto"``, ``@pytest.fixture``
does). What each
fixture must offer beyond the interface (``max_event_bytes`` on a store,
``max_deliver``, ``send_raw`` and ``reply_raw`` on a bus) is in the docstring
of ``cardbus.testing.eventstore`` and ``cardbus.testing.bus``.

In the repository this package is the folder ``tests/contract``
(``package-dir`` in pyproject.toml maps it to ``cardbus.testing``).
"""

from __future__ import annotations

try:
    import pytest  # noqa: F401
    import pytest_asyncio  # noqa: F401
except ImportError as e:  # pragma: no cover - only without the test tools
    raise ImportError(
        "cardbus.testing runs its contract suites with pytest and pytest-asyncio: "
        "pip install 'cardbus[dev]' (or pytest pytest-asyncio)"
    ) from e

from cardbus.testing.bus import BusContract
from cardbus.testing.eventstore import EventStoreContract

__all__ = ["BusContract", "EventStoreContract"]
