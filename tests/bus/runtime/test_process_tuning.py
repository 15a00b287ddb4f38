"""The runtimes' process settings: uvloop when installed, the collector's thresholds."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from cardbus.bus.runtime.loop import GC_THRESHOLDS, loop_factory, run, tune_gc


@pytest.fixture
def thresholds() -> Iterator[None]:
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_run_uses_uvloop_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    # the dev extra installs the fast one (uvloop): no skip, it must be there
    monkeypatch.delenv("CARDBUS_UVLOOP", raising=False)
    assert run(_loop_module()).startswith("uvloop")


def test_uvloop_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CARDBUS_UVLOOP", "0")
    assert loop_factory() is None
    assert run(_loop_module()).startswith("asyncio")


def test_tune_gc_raises_never_lowers(thresholds: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CARDBUS_GC", raising=False)
    gc.set_threshold(700, 10, 10)
    tune_gc()
    assert gc.get_threshold() == GC_THRESHOLDS
    gc.set_threshold(100_000, 20, 10)  # above ours: kept
    tune_gc()
    assert gc.get_threshold() == (100_000, 20, GC_THRESHOLDS[2])


def test_tune_gc_leaves_a_disabled_or_default_collector(
    thresholds: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CARDBUS_GC", raising=False)
    gc.set_threshold(0, 10, 10)
    tune_gc()
    assert gc.get_threshold()[0] == 0
    monkeypatch.setenv("CARDBUS_GC", "default")
    gc.set_threshold(700, 10, 10)
    tune_gc()
    assert gc.get_threshold() == (700, 10, 10)
