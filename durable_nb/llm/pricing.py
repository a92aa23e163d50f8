"""What LLM calls cost: a price table for OpenAI models, overridable per model.

Prices are US dollars per million tokens: input, cached input, output. The built-in table is
OpenAI's published standard-tier prices as of mid-2025 (https://openai.com/api/pricing); they
change, so check them, and override any model with ``RunOptions(prices={...})`` (a local
server: ``{"my-model": Price(0, 0, 0)}``). A model the table does not know costs 0, and the
run says its cost is unknown rather than guess.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .tokens import model_entry

__all__ = ["PRICES", "Price", "cost", "price_for"]


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


def price_for(model: str, overrides: Mapping[str, Price] | None = None) -> Price | None:
    """The price of ``model`` (overrides first; see :func:`~.tokens.model_entry`), or None
    when it is not known."""
    return model_entry(PRICES, model, overrides)


def cost(model: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0,
         overrides: Mapping[str, Price] | None = None) -> float | None:
    """Dollars for one call, or None when the model's price is not known. ``cached_tokens``
    are the part of ``prompt_tokens`` billed at the cached-input price."""
    price = price_for(model, overrides)
    return None if price is None else price.dollars(prompt_tokens, completion_tokens,
                                                    cached_tokens)
