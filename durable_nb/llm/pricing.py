"""What LLM calls cost, and where each price came from.

Prices are US dollars per million tokens: input, cached input, output. A model's price is
looked up in this order (:func:`quote_for`), and the first that knows it wins:

1. ``RunOptions(prices={...})``, your overrides (a local server: ``{"my-model": Price(0, 0,
   0)}``), matched like the table below (the longest key that names the model or its family);
2. genai-prices (:mod:`~durable_nb.llm.price_database`), a maintained database of many
   providers' prices, shipped with its wheel (offline), by the client's endpoint when it is a
   provider's, else by the model's name;
3. :data:`PRICES`, a built-in table of OpenAI's standard-tier prices as of mid-2025, for when
   genai-prices is not installed (Python 3.10) or does not know the model.

A model none of them knows has no price: its calls record no cost and the run says its cost
is unknown rather than guess. Each priced call's entry records where its price came from
(``meta["price_source"]``: ``override``, ``genai-prices VERSION, PROVIDER`` or ``built-in
table``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

from .price_database import lookup
from .tokens import model_entry

__all__ = ["BUILT_IN", "OVERRIDE", "PRICES", "Price", "PriceQuote", "cost", "price_for",
           "quote_for"]

#: The ``price_source`` of a price from ``RunOptions(prices=...)``.
OVERRIDE = "override"
#: The ``price_source`` of a price from :data:`PRICES`.
BUILT_IN = "built-in table"


@dataclass(frozen=True)
class Price:
    """US dollars per million tokens."""

    input: float
    cached_input: float
    output: float

    def dollars(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
                ) -> float:
        """Dollars for one call at this price; ``cached_tokens`` are the part of
        ``prompt_tokens`` billed at the cached-input price."""
        fresh = max(0, prompt_tokens - cached_tokens)
        return (fresh * self.input + cached_tokens * self.cached_input
                + completion_tokens * self.output) / 1_000_000


@dataclass(frozen=True)
class PriceQuote:
    """A model's price and where it came from: :data:`OVERRIDE`, ``"genai-prices VERSION,
    PROVIDER"`` or :data:`BUILT_IN`."""

    price: Price
    source: str


#: By model name or family prefix; the longest key that prefixes the model wins (as for
#: context windows), so ``gpt-4o-2024-08-06`` is priced as ``gpt-4o``.
PRICES: dict[str, Price] = {
    "gpt-5": Price(1.25, 0.125, 10.00),
    "gpt-5-mini": Price(0.25, 0.025, 2.00),
    "gpt-5-nano": Price(0.05, 0.005, 0.40),
    "gpt-4.1": Price(2.00, 0.50, 8.00),
    "gpt-4.1-mini": Price(0.40, 0.10, 1.60),
    "gpt-4.1-nano": Price(0.10, 0.025, 0.40),
    "gpt-4o": Price(2.50, 1.25, 10.00),
    "gpt-4o-mini": Price(0.15, 0.075, 0.60),
    "o1": Price(15.00, 7.50, 60.00),
    "o3": Price(2.00, 0.50, 8.00),
    "o3-mini": Price(1.10, 0.55, 4.40),
    "o4-mini": Price(1.10, 0.275, 4.40),
    "gpt-4-turbo": Price(10.00, 10.00, 30.00),
    "gpt-4": Price(30.00, 30.00, 60.00),
    "gpt-3.5-turbo": Price(0.50, 0.50, 1.50),
}


def quote_for(model: str, overrides: Mapping[str, Price] | None = None,
              endpoint: str | None = None) -> PriceQuote | None:
    """The price of ``model`` with its source (overrides, genai-prices, the built-in table,
    in that order: see the module docstring), or None when none knows it. ``endpoint``: the
    client's base URL, which tells genai-prices the provider."""
    if overrides:
        price = model_entry({}, model, overrides)
        if price is not None:
            return PriceQuote(price, OVERRIDE)
    return _published_quote(model, endpoint)


@functools.lru_cache(maxsize=1024)
def _published_quote(model: str, endpoint: str | None) -> PriceQuote | None:
    """genai-prices', else the built-in table's; remembered, as every LLM call asks."""
    found = lookup(model, endpoint)
    if found is not None:
        return PriceQuote(Price(*found[:3]), found[3])
    price = model_entry(PRICES, model)
    return None if price is None else PriceQuote(price, BUILT_IN)


def price_for(model: str, overrides: Mapping[str, Price] | None = None,
              endpoint: str | None = None) -> Price | None:
    """The price of ``model`` (see :func:`quote_for`), or None when it is not known."""
    quote = quote_for(model, overrides, endpoint)
    return None if quote is None else quote.price


def cost(model: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0,
         overrides: Mapping[str, Price] | None = None, endpoint: str | None = None
         ) -> float | None:
    """Dollars for one call, or None when the model's price is not known. ``cached_tokens``
    are the part of ``prompt_tokens`` billed at the cached-input price."""
    price = price_for(model, overrides, endpoint)
    return None if price is None else price.dollars(prompt_tokens, completion_tokens,
                                                    cached_tokens)
