"""The a2a-sdk import, with the extra to install named when it is missing."""

from __future__ import annotations

try:
    import a2a
    import a2a.server.routes  # noqa: F401
    import starlette  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "cardbus.bus.a2a needs a2a-sdk with its HTTP server: pip install 'cardbus[a2a]'"
    ) from e
