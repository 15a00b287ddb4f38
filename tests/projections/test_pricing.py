"""Prices: genai-prices' bundled data, the user's table (which wins), unknown models as unknown."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cardbus.eventstore.errors import ConfigError
from cardbus.projections.pricing import ENV_PRICES, Money, PriceTable, format_usd, how_to_price


def test_a_known_model_is_priced_from_genai_prices_bundled_data() -> None:
    table = PriceTable()
    price = table.price("gpt-4o")
    assert price is not None and price.source == "genai-prices"
    assert price.input_per_mtok > 0 and price.output_per_mtok > price.input_per_mtok
    cost = table.cost("gpt-4o", 1_000_000, 1_000_000)
    assert cost == pytest.approx(price.input_per_mtok + price.output_per_mtok)
    # a dated name of the same model is the same model
    assert table.cost("gpt-4o-2024-08-06", 1000, 0) == pytest.approx(price.input_per_mtok / 1000)


@pytest.mark.parametrize(
    ("written", "bare"),
    [
        ("openai/gpt-4o-mini", "gpt-4o-mini"),
        ("anthropic/claude-3-5-haiku-latest", "claude-3-5-haiku-latest"),
        ("OpenAI/GPT-4o-mini", "gpt-4o-mini"),
    ],
)
def test_a_provider_prefixed_name_is_its_providers_model(written: str, bare: str) -> None:
    table = PriceTable()
    price, plain = table.price(written), table.price(bare)
    assert price is not None and plain is not None and price == plain
    assert table.cost(written, 12_345, 678) == pytest.approx(table.cost(bare, 12_345, 678))
    # the user's table still wins over the provider's price, by the name as written
    mine = PriceTable({written: (1.0, 1.0)})
    assert mine.cost(written, 1_000_000, 0) == pytest.approx(1.0)


def test_how_to_price_is_one_line_naming_the_entry() -> None:
    line = how_to_price("ollama/llama3")
    assert "\n" not in line
    assert ENV_PRICES in line and '{"models": {"ollama/llama3": {"input": IN' in line
    assert PriceTable().price("ollama/llama3") is None


def test_the_users_table_wins_and_globs_match(tmp_path: Path) -> None:
    path = tmp_path / "prices.toml"
    path.write_text(
        '[models."gpt-4o"]\ninput = 1.0\noutput = 2.0\n'
        '[models."my-llama"]\ninput_mtok = 0.2\noutput_mtok = 0.6\n'
        '[models."ollama/*"]\ninput = 0\noutput = 0\n'
    )
    table = PriceTable.load(path)
    assert table.cost("gpt-4o", 1_000_000, 1_000_000) == pytest.approx(3.0)
    assert table.price("GPT-4o") is not None and table.price("gpt-4o").source == "user"  # type: ignore[union-attr]
    assert table.cost("my-llama", 500_000, 1_000_000) == pytest.approx(0.7)
    assert table.cost("ollama/qwen3", 10**6, 10**6) == 0.0
    as_json = tmp_path / "prices.json"
    as_json.write_text(json.dumps({"models": {"stub-*": {"input": 3, "output": 4}}}))
    assert PriceTable.load(as_json).cost("stub-model-2024", 10**6, 0) == pytest.approx(3.0)


def test_an_unknown_model_has_no_price_never_zero() -> None:
    table = PriceTable()
    assert table.price("my-private-model") is None
    assert table.cost("my-private-model", 100, 100) is None
    assert Money.total([None]).text() == "unknown price"
    assert Money.total([0.5, None]).text() == "at least $0.50"
    assert Money.total([0.5, 0.25]).text() == "$0.75"
    assert table.cost("mock-1", 100, 100) == 0.0  # cardbus's mock is free, and known to be
    assert format_usd(0.0000153) == "$0.0000153"


@pytest.mark.parametrize(
    "body",
    [
        '{"models": {"m": {"input": -1, "output": 1}}}',
        '{"models": {"m": {"input": 1}}}',
        '{"models": {"m": {"input": 1, "output": 1, "cached": 2}}}',
        '{"models": {"m": {"input": "cheap", "output": 1}}}',
        "not [ json or toml",
    ],
)
def test_a_bad_table_is_a_config_error(tmp_path: Path, body: str) -> None:
    path = tmp_path / "prices"
    path.write_text(body)
    with pytest.raises(ConfigError):
        PriceTable.load(path)


def test_the_env_var_names_the_default_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "p.json"
    path.write_text('{"my-model": {"input": 1, "output": 1}}')
    monkeypatch.setenv(ENV_PRICES, str(path))
    assert PriceTable.default().cost("my-model", 10**6, 0) == pytest.approx(1.0)


_NO_NETWORK = """
import socket, sys
real_connect = socket.socket.connect
def connect(self, address):
    host = address[0] if isinstance(address, tuple) else address
    if host not in ("127.0.0.1", "::1", "localhost"):
        raise OSError(f"network refused in this test: {address!r}")
    return real_connect(self, address)
socket.socket.connect = connect
socket.socket.connect_ex = lambda self, address: connect(self, address) or 0
def no_dns(*a, **k):
    raise OSError(f"DNS refused in this test: {a!r}")
socket.getaddrinfo = no_dns

# another library in the process fetched prices (UpdatePrices): cardbus must not use them
from genai_prices import data_snapshot
data_snapshot.set_custom_snapshot(data_snapshot.DataSnapshot(providers=[], from_auto_update=True))

from cardbus.projections.pricing import PriceTable
table = PriceTable()
cost = table.cost("gpt-4o", 1000, 1000)
assert cost is not None and cost > 0, cost
assert table.cost("claude-sonnet-4-5", 1000, 1000) > 0
import threading
assert [t.name for t in threading.enumerate()] == ["MainThread"], threading.enumerate()
print("ok", cost)
"""


def test_pricing_touches_no_network_and_only_bundled_data() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _NO_NETWORK], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok")
