"""InProcessBus keeps the Bus contract (cardbus.testing)."""

from collections.abc import AsyncIterator

import pytest

from cardbus.bus.transport.inprocess import InProcessBus
from cardbus.testing import BusContract


class TestInProcessBusContract(BusContract):
    @pytest.fixture
    async def bus(self) -> AsyncIterator[InProcessBus]:
        bus = InProcessBus(max_deliver=3)
        yield bus
        await bus.close()
