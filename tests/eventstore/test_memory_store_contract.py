"""MemoryEventStore keeps the EventStore contract (cardbus.testing)."""

import pytest

from cardbus.eventstore import MemoryEventStore
from cardbus.testing import EventStoreContract


class TestMemoryStoreContract(EventStoreContract):
    @pytest.fixture
    def store(self, memory_store: MemoryEventStore) -> MemoryEventStore:
        return memory_store
