"""Which OpenTelemetry meter provider cardbus records its metrics into, and whether any.

Only the OpenTelemetry API is used (never the SDK: tools and users configure that).
The metrics are recorded into the global meter provider, or into the one given to
:func:`use_meter_provider` (tests, or an application that keeps its provider to
itself). Without an SDK provider, :func:`enabled` is False and the callers fold
nothing: metrics cost one check per event.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import _internal as _metrics_internal

__all__ = ["METER_NAME", "enabled", "instruments", "meter", "use_meter_provider"]

#: the meter (instrumentation scope) of every cardbus metric
METER_NAME = "cardbus"

_provider: metrics.MeterProvider | None = None
_enabled = False
# with this env var the API loads a provider lazily: always ask it then
_LAZY_PROVIDER = "OTEL_PYTHON_METER_PROVIDER" in os.environ
# instruments made per maker (a module's set), for the provider they were made on
_made: dict[Callable[[metrics.Meter], Any], Any] = {}


def use_meter_provider(provider: metrics.MeterProvider | None) -> None:
    """Record into ``provider`` instead of the global one (None: the global again)."""
    global _provider
    _provider = provider
    _made.clear()


def enabled() -> bool:
    """True once an SDK meter provider is set globally, or one is in use through
    :func:`use_meter_provider` (a yes is remembered: the global is set once)."""
    global _enabled
    if _enabled or _provider is not None:
        return True
    # imported once with the module, not here: this runs for every event folded (the
    # import statement's lookup was about 1 us, 6 events a step)
    if not _LAZY_PROVIDER and _metrics_internal._METER_PROVIDER is None:
        return False
    provider = metrics.get_meter_provider()
    noop = (metrics.NoOpMeterProvider, _metrics_internal._ProxyMeterProvider)
    _enabled = not isinstance(provider, noop)
    return _enabled


def meter() -> metrics.Meter:
    """The ``cardbus`` meter of the provider in use."""
    provider = _provider if _provider is not None else metrics.get_meter_provider()
    return provider.get_meter(METER_NAME)


def instruments(make: Callable[[metrics.Meter], Any]) -> Any:
    """``make(meter())``, made once per provider in use (instruments are cheap to keep,
    costly to look up on every record)."""
    found = _made.get(make)
    if found is None:
        found = _made[make] = make(meter())
    return found
