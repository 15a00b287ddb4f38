"""NatsEventStore keeps the EventStore contract (cardbus.testing), on this test's nats-server."""

import pytest

from cardbus.eventstore.nats import NatsEventStore
from cardbus.testing import EventStoreContract


class TestNatsStoreContract(EventStoreContract):
    @pytest.fixture
    def store(self, nats_store: NatsEventStore) -> NatsEventStore:
        return nats_store
