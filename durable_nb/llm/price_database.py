"""Prices from genai-prices, the price database Pydantic AI uses (many providers, kept up to
date by its maintainers), read from the data its wheel ships: nothing is fetched at run time.

Loaded on the first lookup (about 0.4 s of CPU, once per process), never at import. Without
the package (it needs Python 3.11 or later) every lookup answers None and the built-in table
of :mod:`~durable_nb.llm.pricing` is used instead.
"""

from __future__ import annotations

import functools
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

__all__ = ["DatabasePrice", "database_version", "lookup"]

#: (input, cached input, output) in US dollars per million tokens, and where they came from.
DatabasePrice = tuple[float, float, float, str]


@functools.lru_cache(maxsize=1)
def database_version() -> str | None:
    """genai-prices' version, or None when it is not installed."""
    try:
        import genai_prices
    except ImportError:
        return None
    return str(genai_prices.__version__)


def _dollars(value: Any) -> float | None:
    """Dollars per million tokens of a flat price, or of a tiered price's base tier (the
    tier of a request under the first threshold, usually 200k tokens)."""
    value = getattr(value, "base", value)
    return float(value) if isinstance(value, (Decimal, int, float)) else None


def lookup(model: str, endpoint: str | None = None) -> DatabasePrice | None:
    """The price of ``model`` today, as genai-prices knows it: from the provider ``endpoint``
    (a base URL) belongs to when it is one genai-prices knows, else from the provider whose
    models match the name; None when it knows neither or has no token price for the model.
    :func:`~durable_nb.llm.pricing.quote_for` remembers the answers."""
    version = database_version()
    if version is None or not model:
        return None
    from genai_prices.data_snapshot import get_snapshot

    snapshot = get_snapshot()
    found = None
    for url in ([endpoint, None] if endpoint else [None]):
        try:
            found = snapshot.find_provider_model(model, None, None, url)
            break
        except LookupError:
            continue
    if found is None:
        return None
    provider, info = found
    try:
        prices = info.get_prices(datetime.now(timezone.utc))
    except (LookupError, ValueError, TypeError):  # no price in force today: not known
        return None
    input_, output = _dollars(prices.input_mtok), _dollars(prices.output_mtok)
    if input_ is None and output is None:
        return None
    cached = _dollars(prices.cache_read_mtok)
    return (input_ or 0.0, (input_ or 0.0) if cached is None else cached, output or 0.0,
            f"genai-prices {version}, {provider.name}")
