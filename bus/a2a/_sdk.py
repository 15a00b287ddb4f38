"""The a2a-sdk import, with the extra to install named when it is missing."""

from __future__ import annotations

from cardbus.eventstore.errors import MissingExtra

try:
    import a2a
    import a2a.server.routes  # noqa: F401
    import starlette  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise MissingExtra("a2a", "the A2A gateway and remote A2A agents") from e
