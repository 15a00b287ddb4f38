"""SqliteEventStore keeps the EventStore contract (cardbus.testing)."""

import pytest

from cardbus.eventstore import SqliteEventStore
from cardbus.testing import EventStoreContract


class TestSqliteStoreContract(EventStoreContract):
    @pytest.fixture
    def store(self, sqlite_store: SqliteEventStore) -> SqliteEventStore:
        return sqlite_store
