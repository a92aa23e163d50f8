"""Limits shared by every run of a batch: the endpoint's rate and the batch-wide budgets.

Every LLM call an item makes passes :meth:`BatchLimits.before_call` first (it is the items'
``RunOptions.call_gate``; replayed calls do not pass it): it waits for room under
``requests_per_minute`` and ``tokens_per_minute`` (a token bucket each, refilled
continuously), waits out a pause that a 429's retry-after set for the whole batch, and stops
the item with :class:`~durable_nb.errors.BudgetExhausted` when the call could take the batch
past ``max_total_tokens`` or ``max_total_cost``. What a call may take is reserved until its
entry is journaled, so items in flight together cannot all pass the last bit of budget.
Every request sent again after a failure (a 5xx, a dropped connection, a 429) passes
:meth:`BatchLimits.before_retry`: it counts against ``requests_per_minute`` like the first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ..errors import BudgetExhausted
from ..journal import StepEntry, entry_cost

__all__ = ["BatchLimits"]


class _Bucket:
    """A token bucket holding at most one minute's worth, refilled continuously."""

    def __init__(self, per_minute: float, clock: Callable[[], float]) -> None:
        self.rate = per_minute / 60.0
        self.capacity = per_minute
        self.level = per_minute
        self.clock = clock
        self.stamp = clock()

    def wait_time(self, amount: float) -> float:
        """Seconds until ``amount`` fits (0 when it fits now)."""
        now = self.clock()
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now
        amount = min(amount, self.capacity)  # a call bigger than a minute's worth waits a minute
        return max(0.0, (amount - self.level) / self.rate)

    def take(self, amount: float) -> None:
        self.level -= min(amount, self.capacity)


class BatchLimits:
    """The gate every LLM call of a batch's items passes. Thread-safe."""

    def __init__(self, *, requests_per_minute: float | None = None,
                 tokens_per_minute: float | None = None, max_total_tokens: int | None = None,
                 max_total_cost: float | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        """``clock`` and ``sleep`` are injectable so that tests need not wait."""
        for name, value in (("requests_per_minute", requests_per_minute),
                            ("tokens_per_minute", tokens_per_minute),
                            ("max_total_tokens", max_total_tokens),
                            ("max_total_cost", max_total_cost)):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be more than 0, got {value}")
        self._requests = _Bucket(requests_per_minute, clock) if requests_per_minute else None
        self._tokens = _Bucket(tokens_per_minute, clock) if tokens_per_minute else None
        self._clock = clock
        self.max_total_tokens = max_total_tokens
        self.max_total_cost = max_total_cost
        self._sleep = sleep
        self._lock = threading.Lock()
        self._paused_until = 0.0
        self.used_tokens = 0
        self.used_cost = 0.0
        self._reserved: dict[tuple[str, str], tuple[int, float]] = {}  # (run, step) -> taken
        self.calls = 0  # requests let through, retries included
        self.waited = 0.0

    def start(self, tokens: int, cost: float) -> None:
        """What the batch's runs used before this execution of the batch."""
        with self._lock:
            self.used_tokens, self.used_cost = tokens, cost

    def before_call(self, run_id: str, key: str, tokens: int, cost: float) -> None:
        """Wait for room for step ``key`` of run ``run_id``, a call that may take ``tokens``
        and ``cost``; raise BudgetExhausted if it could pass a batch budget. What it may take
        stays reserved until its entry is journaled (:meth:`account`)."""
        with self._lock:
            self._check_budget(run_id, tokens, cost)
            self._reserved[(run_id, key)] = (tokens, cost)
        try:
            self._wait_for_rate(tokens)
        except BaseException:
            self.release_run(run_id)
            raise

    def _check_budget(self, run_id: str, tokens: int, cost: float) -> None:
        used = self.used_tokens + sum(t for t, _ in self._reserved.values())
        if self.max_total_tokens is not None and used + tokens > self.max_total_tokens:
            raise BudgetExhausted(
                f"run {run_id!r} stopped before its next LLM call: the batch's token budget "
                f"would be passed (used {used} of {self.max_total_tokens}, and the call may "
                f"take {tokens} more). Raise max_total_tokens (--max-total-tokens) and run "
                f"the batch again to go on.")
        spent = self.used_cost + sum(c for _, c in self._reserved.values())
        if self.max_total_cost is not None and spent + cost > self.max_total_cost:
            raise BudgetExhausted(
                f"run {run_id!r} stopped before its next LLM call: the batch's cost budget "
                f"would be passed (spent ${spent:.4f} of ${self.max_total_cost:.4f}, and the "
                f"call may cost ${cost:.4f} more). Raise max_total_cost (--max-total-cost) "
                f"and run the batch again to go on.")

    def _wait_for_rate(self, tokens: int) -> None:
        while True:
            with self._lock:
                delay = max(0.0, self._paused_until - self._clock(),
                            self._requests.wait_time(1) if self._requests else 0.0,
                            self._tokens.wait_time(tokens) if self._tokens else 0.0)
                if delay == 0.0:  # both fit: take both at once
                    if self._requests:
                        self._requests.take(1)
                    if self._tokens:
                        self._tokens.take(tokens)
                    self.calls += 1
                    return
                self.waited += delay
            self._sleep(delay)

    def release_run(self, run_id: str) -> None:
        """Drop what the run's calls still hold (it ended, or a call never got journaled)."""
        with self._lock:
            for taken in [k for k in self._reserved if k[0] == run_id]:
                del self._reserved[taken]

    def pause(self, seconds: float) -> None:
        """The endpoint said to slow down (a 429 with retry-after): no item of the batch
        calls it for ``seconds``."""
        with self._lock:
            self._paused_until = max(self._paused_until, self._clock() + seconds)

    def before_retry(self) -> None:
        """Before a call is sent again: wait out a pause set by :meth:`pause` and for room
        for one more request (its tokens were taken by :meth:`before_call`)."""
        self._wait_for_rate(0)

    def account(self, run_id: str, entry: StepEntry) -> None:
        """A step was journaled: its tokens and cost are spent, its reservation is free."""
        with self._lock:
            self._reserved.pop((run_id, entry.key), None)
            self.used_tokens += entry.tokens
            self.used_cost += entry_cost(entry)
