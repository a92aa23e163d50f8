"""Retry policies for steps: how many attempts, how long to wait between them."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from ..errors import TerminalError

__all__ = ["NO_RETRY", "RetryPolicy"]

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """Retry a step's function on the exceptions in ``retry_on``, with exponential backoff.

    Attempt ``n`` (from 1) waits ``min(max_delay, initial_delay * multiplier**(n-1))`` seconds,
    give or take ``jitter`` (a fraction), before attempt ``n+1``. A :class:`TerminalError` is
    never retried. ``sleep`` is injectable so tests need not wait.
    """

    max_attempts: int = 3
    initial_delay: float = 0.5
    max_delay: float = 30.0
    multiplier: float = 2.0
    jitter: float = 0.2
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    sleep: Callable[[float], Any] = field(default=time.sleep, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based)."""
        base = min(self.max_delay, self.initial_delay * self.multiplier ** (attempt - 1))
        return max(0.0, base * (1 + random.uniform(-self.jitter, self.jitter)))

    def retries(self, exc: BaseException) -> bool:
        return isinstance(exc, self.retry_on) and not isinstance(exc, TerminalError)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call ``fn`` until it returns, a non-retryable exception, or attempts run out."""
        attempt = 1
        while True:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                if attempt >= self.max_attempts or not self.retries(exc):
                    raise
            self.sleep(self.delay(attempt))
            attempt += 1

    async def call_async(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """:meth:`call` for a coroutine function; waits with ``asyncio.sleep``."""
        attempt = 1
        while True:
            try:
                return await fn(*args, **kwargs)
            except Exception as exc:
                if attempt >= self.max_attempts or not self.retries(exc):
                    raise
            delay = self.delay(attempt)
            if self.sleep is time.sleep:
                await asyncio.sleep(delay)
            else:
                self.sleep(delay)
            attempt += 1


NO_RETRY = RetryPolicy(max_attempts=1)
