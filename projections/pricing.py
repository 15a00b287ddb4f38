"""Prices of model calls: tokens -> US dollars, from a table the user gives and genai-prices.

A :class:`PriceTable` answers what ``input_tokens`` and ``output_tokens`` of a
model cost, in USD. It looks in, first to last:

1. the user's table (``PriceTable.load(path)``, or the file named by
   ``CARDBUS_PRICES``): their own models and endpoints, and any price they want
   to override. A JSON or TOML file; each entry is a model name or a glob
   (``fnmatch``, case-insensitive) with the USD price per million input and
   output tokens::

       # prices.toml                      // prices.json
       [models."my-llama"]                {"models": {
       input = 0.20                         "my-llama": {"input": 0.2, "output": 0.6},
       output = 0.60                        "ollama/*": {"input": 0, "output": 0}}}
       [models."ollama/*"]
       input = 0
       output = 0

   An exact name wins over a glob; of several globs, the first in the file.
   ``input_mtok`` / ``output_mtok`` (genai-prices' names) are read too.
2. cardbus's own entries: the deterministic mock (``mock*``) is free.
3. genai-prices (the ``prices`` extra), **its bundled data only**, with its
   provider matching: a provider-prefixed name as LiteLLM writes it
   (``openai/gpt-4o-mini``, ``anthropic/claude-3-5-haiku-latest``) is that
   provider's model, as is a name a provider answers with
   (``gpt-4o-mini-2024-07-18``). cardbus
   builds its own snapshot from ``genai_prices.data.providers`` and never asks
   ``calc_price`` (which would use a snapshot another library may have fetched
   with ``UpdatePrices``) and never starts an update, so nothing is downloaded,
   ever. Tiered prices (e.g. long-context rates) are applied per call.

A model in none of them has no price: :meth:`PriceTable.cost` answers None,
shown as "unknown price", never as 0; a sum with an unknown part is shown as
"at least" its known part (:class:`Money`). :func:`how_to_price` is the one
line that says how to give such a model a price (an entry of a price file).
"""

from __future__ import annotations

import fnmatch
import functools
import json
import math
import os
import tomllib
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

from cardbus.eventstore.errors import ConfigError

__all__ = [
    "ENV_PRICES",
    "Money",
    "Price",
    "PriceTable",
    "format_usd",
    "how_to_price",
]

#: the environment variable naming the user's price table (JSON or TOML)
ENV_PRICES = "CARDBUS_PRICES"

_MTOK = 1_000_000


class Price(NamedTuple):
    """USD per million tokens, and where the price came from (user | cardbus | genai-prices)."""

    input_per_mtok: float
    output_per_mtok: float
    source: str = "user"

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (
            max(0, input_tokens) * self.input_per_mtok
            + max(0, output_tokens) * self.output_per_mtok
        ) / _MTOK


#: cardbus's own entries: its mock model costs nothing
_BUILTIN: tuple[tuple[str, Price], ...] = (("mock*", Price(0.0, 0.0, "cardbus")),)


@functools.cache
def _bundled() -> Any:
    """genai-prices' bundled data as a snapshot of our own (None: the extra is not installed).

    Never ``genai_prices.calc_price``: it uses ``data_snapshot.get_snapshot()``,
    which is whatever an ``UpdatePrices`` in the same process last downloaded.
    """
    try:
        from genai_prices.data import providers
        from genai_prices.data_snapshot import DataSnapshot
    except ImportError:
        return None
    return DataSnapshot(providers=list(providers), from_auto_update=False)


def genai_prices_installed() -> bool:
    return _bundled() is not None


class PriceTable:
    """Model -> price; see the module docstring for the order of lookup."""

    def __init__(
        self,
        user: Mapping[str, Price | tuple[float, float]] | None = None,
        *,
        bundled: bool = True,
        source: str = "",
    ) -> None:
        """``user``: model name or glob -> ``Price`` (or ``(input, output)`` USD per million);
        ``bundled``: also ask genai-prices' bundled data; ``source``: where ``user`` came
        from (a file name, shown by ``describe``)."""
        self.source = source
        self.bundled = bundled
        self._exact: dict[str, Price] = {}
        self._globs: list[tuple[str, Price]] = []
        for name, price in (user or {}).items():
            if not isinstance(price, Price):
                price = Price(*_check_pair(name, price))
            key = str(name).lower()
            if any(c in key for c in "*?["):
                self._globs.append((key, price))
            else:
                self._exact[key] = price
        self._found: dict[str, Price | None] = {}

    # -- construction --------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path, *, bundled: bool = True) -> PriceTable:
        """The user's table from a JSON or TOML file (``ConfigError`` naming what is wrong)."""
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"price table {p}: {e}") from e
        doc: Any
        try:
            if p.suffix.lower() == ".toml":
                doc = tomllib.loads(text)
            elif p.suffix.lower() == ".json":
                doc = json.loads(text)
            else:  # either: JSON first
                try:
                    doc = json.loads(text)
                except ValueError:
                    doc = tomllib.loads(text)
        except (ValueError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"price table {p} is neither JSON nor TOML: {e}") from e
        if not isinstance(doc, dict):
            raise ConfigError(f"price table {p}: expected a table of models")
        models = doc.get("models", doc)
        if not isinstance(models, dict):
            raise ConfigError(f"price table {p}: 'models' must be a table")
        entries = {str(k): Price(*_check_entry(p, str(k), v)) for k, v in models.items()}
        return cls(entries, bundled=bundled, source=str(p))

    @classmethod
    def default(cls, path: str | Path | None = None) -> PriceTable:
        """``path``'s table, else the one ``CARDBUS_PRICES`` names, else none of the user's;
        with genai-prices' bundled data when installed."""
        chosen = path or os.environ.get(ENV_PRICES) or None
        return cls.load(chosen) if chosen else cls()

    # -- lookups -------------------------------------------------------------

    def price(self, model: str) -> Price | None:
        """The model's price per million tokens (genai-prices: its base rate now)."""
        key = (model or "").strip().lower()
        if not key:
            return None
        if key in self._found:
            return self._found[key]
        found = self._user(key)
        if found is None and self.bundled:
            found = _genai_price(key)
        if len(self._found) < 10_000:
            self._found[key] = found
        return found

    def _user(self, key: str) -> Price | None:
        if key in self._exact:
            return self._exact[key]
        for pattern, price in (*self._globs, *_BUILTIN):
            if fnmatch.fnmatchcase(key, pattern):
                return price
        return None

    def known(self, model: str) -> bool:
        return self.price(model) is not None

    def unpriced(self, models: Iterable[str]) -> list[str]:
        """The names among ``models`` with no price, each once, sorted."""
        return sorted({m for m in models if m and not self.known(m)})

    def cost(self, model: str, input_tokens: int, output_tokens: int) -> float | None:
        """USD for one call (or a sum of calls) of ``model``; None when its price is unknown."""
        price = self.price(model)
        if price is None:
            return None
        if price.source == "genai-prices":
            exact = _genai_cost(model.strip().lower(), input_tokens, output_tokens)
            if exact is not None:
                return exact
        return price.cost(input_tokens, output_tokens)

    def describe(self) -> str:
        parts = [f"user table {self.source}"] if self.source else []
        if self.bundled and genai_prices_installed():
            parts.append("genai-prices (bundled data)")
        return ", ".join(parts) or "no price table"


def how_to_price(model: str) -> str:
    """How to give ``model`` a price, in one line: the entry of a price file it needs."""
    entry = json.dumps({"models": {model: {"input": 0, "output": 0}}})
    entry = entry.replace('"input": 0', '"input": IN').replace('"output": 0', '"output": OUT')
    return (
        f"price it in a price file ({ENV_PRICES}=FILE or --prices FILE): {entry},"
        " IN and OUT its USD per million input and output tokens"
    )


def _find(key: str) -> Any:
    """genai-prices' (provider, model) for ``key``; ``LookupError`` when it has none.

    A name as it is (``gpt-4o-mini``, or the dated name a provider answers with),
    else a ``provider/model`` name as LiteLLM writes it, matched as genai-prices
    matches a call through LiteLLM: the prefix names the provider, when it knows it.
    """
    snapshot = _bundled()
    if snapshot is None:
        raise LookupError("genai-prices is not installed")
    try:
        return snapshot.find_provider_model(key, None, None, None)
    except LookupError:
        if "/" not in key:
            raise
        return snapshot.find_provider_model(key, None, "litellm", None)


def _genai_price(key: str) -> Price | None:
    try:
        _, model = _find(key)
        prices = model.get_prices(datetime.now(tz=UTC))
        inp = _base(getattr(prices, "input_mtok", None))
        out = _base(getattr(prices, "output_mtok", None))
    except Exception:  # LookupError: not known; anything else: not usable
        return None
    if inp is None and out is None:
        return None
    return Price(inp or 0.0, out or 0.0, "genai-prices")


def _base(value: Any) -> float | None:
    if value is None:
        return None
    base = getattr(value, "base", value)  # TieredPrices: its first tier
    try:
        return float(base)
    except (TypeError, ValueError):
        return None


def _genai_cost(key: str, input_tokens: int, output_tokens: int) -> float | None:
    try:
        from genai_prices import Usage

        provider, model = _find(key)
        calc = model.calc_price(
            Usage(input_tokens=max(0, input_tokens), output_tokens=max(0, output_tokens)),
            provider,
            genai_request_timestamp=datetime.now(tz=UTC),
        )
        return float(calc.total_price)
    except Exception:
        return None


def _number(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where} must be a number of USD per million tokens, not {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{where} must be a finite number >= 0, not {value!r}")
    return float(value)


def _check_pair(name: str, value: Any) -> tuple[float, float]:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ConfigError(f"price of {name!r}: give (input, output) USD per million tokens")
    return _number(f"{name!r} input", value[0]), _number(f"{name!r} output", value[1])


def _check_entry(path: Path, name: str, value: Any) -> tuple[float, float]:
    if not isinstance(value, dict):
        raise ConfigError(f"price table {path}: {name!r} must be a table with input and output")
    unknown = set(value) - {"input", "output", "input_mtok", "output_mtok"}
    if unknown:
        raise ConfigError(
            f"price table {path}: {name!r} has unknown fields {sorted(unknown)}"
            " (known: input, output: USD per million tokens)"
        )
    inp = value.get("input", value.get("input_mtok"))
    out = value.get("output", value.get("output_mtok"))
    if inp is None or out is None:
        raise ConfigError(f"price table {path}: {name!r} needs both input and output")
    return _number(f"{path}: {name!r} input", inp), _number(f"{path}: {name!r} output", out)


# -- sums with an unknown part -------------------------------------------------------


def format_usd(usd: float) -> str:
    """``$1.23``, ``$0.0042``, ``$0.000015``: enough digits to see a cheap call."""
    if usd == 0:
        return "$0"
    if abs(usd) >= 1:
        return f"${usd:,.2f}"
    digits = min(8, max(4, 2 - math.floor(math.log10(abs(usd))) + 1))
    whole, _, frac = f"{usd:.{digits}f}".partition(".")
    frac = frac.rstrip("0").ljust(2, "0")
    return f"${whole}.{frac}"


class Money:
    """A sum of costs of which some may be unknown: ``usd`` is the known part."""

    __slots__ = ("priced", "unknown", "usd")

    def __init__(self, usd: float = 0.0, unknown: int = 0, priced: int = 0) -> None:
        self.usd = usd
        self.unknown = unknown  # parts (calls, or rows of calls) without a known price
        self.priced = priced  # parts with one

    def add(self, usd: float | None) -> Money:
        if usd is None:
            self.unknown += 1
        else:
            self.usd += usd
            self.priced += 1
        return self

    def __iadd__(self, other: Money) -> Money:
        self.usd += other.usd
        self.unknown += other.unknown
        self.priced += other.priced
        return self

    @classmethod
    def total(cls, parts: Iterable[float | None]) -> Money:
        m = cls()
        for p in parts:
            m.add(p)
        return m

    @property
    def known(self) -> bool:
        return self.unknown == 0

    def text(self) -> str:
        """``$0.0123``; ``at least $0.0123`` with an unknown part; ``unknown price`` if all is."""
        if self.unknown and not self.priced:
            return "unknown price"
        if self.unknown:
            return f"at least {format_usd(self.usd)}"
        return format_usd(self.usd)

    def json(self) -> dict[str, Any]:
        """``{"usd": known part, "complete": bool, "text": ...}``: what ``--json`` shows."""
        return {"usd": round(self.usd, 10), "complete": self.known, "text": self.text()}

    def __repr__(self) -> str:
        return f"Money({self.text()})"
