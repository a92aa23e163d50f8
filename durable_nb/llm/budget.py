"""Budgets that hold: the check before each LLM call, and what each call's entry records.

Before a call that must really be made (not on replay), :func:`check_budget` stops the run
(:class:`~durable_nb.errors.BudgetExhausted`, the run FAILED, resumable with a higher limit)
when the call could take it past ``max_iterations``, ``max_tokens`` or ``max_cost``, or when
the request does not fit the model's context window. What the call may take:

- **prompt tokens**: the offline estimate (:mod:`durable_nb.llm.tokens`, exact for OpenAI
  models) *calibrated* with the earlier calls of this run to the same model, whose entries
  hold both the estimate and the server's reported prompt tokens (a server with its own
  tokenizer and chat template counts otherwise: llama.cpp's SmolLM2 template adds a
  23-token system prompt). The latest call's reported count, plus the tokens the request
  adds since it, counted at the slope (reported over estimated growth, at least 1) between
  the latest two calls, or 1.5 times with only one call so far; a shorter request (after a
  compaction) keeps the latest call's offset. Before any reply, a model tiktoken does not
  know (a local model, an Azure deployment name) is taken at ``1.5 x estimate + 32``, an
  OpenAI model at the estimate.
- **completion tokens**: the request's cap (``max_tokens``, ``max_completion_tokens`` or
  ``max_output_tokens``, times ``n``), or :data:`DEFAULT_COMPLETION_RESERVE` when it sets none.

So with completion caps set (and honoured by the server), a run never ends above its
``max_tokens``; ``max_cost`` likewise, priced with :mod:`durable_nb.llm.pricing` (a model whose
price is not known stops the run before its first call, since the budget could not hold).

Each chat, respond and compact entry's meta (:func:`llm_meta`) records ``model`` (the
response's), ``prompt_estimate`` (the offline estimate, for calibration), ``cost`` (dollars,
when the price is known) and ``price_source`` (where the price came from: see
:mod:`durable_nb.llm.pricing`), ``cached`` (cached prompt tokens, when reported), ``reasoning``
(reasoning tokens, when reported), ``endpoint`` (the client's base URL, without credentials
or query) and ``estimated: True`` when the server sent no usage and the tokens are estimates.
"""

from __future__ import annotations

import math
import threading
import weakref
from typing import Any

import tiktoken

from ..errors import BudgetExhausted
from .endpoints import endpoint_url
from .pricing import cost, price_for, quote_for
from .tokens import context_window, count_message_tokens

__all__ = ["DEFAULT_COMPLETION_RESERVE", "Calibration", "calibration", "chat_estimate",
           "check_budget", "completion_cap", "llm_meta"]

#: Completion tokens a request without a cap is assumed to take, for the budget check.
DEFAULT_COMPLETION_RESERVE = 512

#: Before the first reply of a model tiktoken does not know: estimate * 1.5 + 32.
_UNKNOWN_FACTOR = 1.5
_UNKNOWN_EXTRA = 32
#: With one reply to calibrate with, tokens the request adds since it are counted 1.5 times
#: (the server's tokenizer may count text more densely); with two, at the measured slope.
_ONE_POINT_MARGIN = 0.5
_MAX_SLOPE = 3.0
_MIN_SPREAD = 8
_KEEP = 8
_CAP_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
_LLM_ENTRY_KINDS = ("chat", "respond", "compact", "model")


def _known_model(model: str) -> bool:
    name = model.strip().lower().removeprefix("openai/").removeprefix("ft:")
    try:
        tiktoken.encoding_name_for_model(name)
        return True
    except KeyError:
        return False


class Calibration:
    """The latest (offline estimate, reported prompt tokens) pairs of each model in one
    execution's run: live calls as they are journaled, earlier ones read back from the
    journal (newest first) the first time a model is asked for."""

    def __init__(self, execution: Any) -> None:
        self._journal = execution.journal
        self._run_id = execution.run_id
        self._unscanned = execution.replay_log.size  # journal positions below: not read yet
        self._points: dict[str, list[tuple[int, int]]] = {}  # newest first
        self._lock = threading.Lock()

    def observe(self, model: str, estimate: int, reported: int) -> None:
        """A live call's numbers: newer than anything in the journal."""
        if estimate > 0 and reported > 0:
            with self._lock:
                points = self._points.setdefault(model, [])
                points.insert(0, (estimate, reported))
                del points[_KEEP:]

    def points(self, model: str) -> list[tuple[int, int]]:
        """Up to the newest few (estimate, reported) pairs of ``model``, newest first."""
        with self._lock:
            while len(self._points.get(model, ())) < _KEEP and self._unscanned > 0:
                self._unscanned -= 1
                self._read(self._unscanned)
            return list(self._points.get(model, ()))

    def _read(self, position: int) -> None:
        entry = self._journal.get_step(self._run_id, position)
        meta = entry.meta if entry is not None and entry.ok else None
        if (entry is None or entry.kind not in _LLM_ENTRY_KINDS or not isinstance(meta, dict)
                or meta.get("estimated") or entry.prompt_tokens <= 0):
            return
        estimate = meta.get("prompt_estimate")
        if not isinstance(estimate, int) or isinstance(estimate, bool) or estimate <= 0:
            return
        model = str(meta.get("summary_model") if entry.kind == "compact" else entry.name)
        points = self._points.setdefault(model, [])
        if len(points) < _KEEP:
            points.append((estimate, entry.prompt_tokens))  # older than those already held

    def calibrated(self, model: str, estimate: int) -> int:
        """The prompt tokens the server will count, at most, for a request whose offline
        estimate is ``estimate`` (see the module docstring)."""
        points = self.points(model)
        if not points:
            return estimate if _known_model(model) else math.ceil(
                estimate * _UNKNOWN_FACTOR) + _UNKNOWN_EXTRA
        last_estimate, last_reported = points[0]
        offset = last_reported - last_estimate
        growth = estimate - last_estimate
        if growth <= 0:  # a shorter request (after a compaction): its offset is the same
            return max(0, estimate + offset)
        earlier = next(((e, r) for e, r in points[1:] if e < last_estimate - _MIN_SPREAD), None)
        if earlier is None:  # one reply: the growth counted with a margin
            return max(0, estimate + offset + math.ceil(growth * _ONE_POINT_MARGIN))
        slope = (last_reported - earlier[1]) / (last_estimate - earlier[0])
        slope = min(_MAX_SLOPE, max(1.0, slope))
        return max(0, last_reported + math.ceil(growth * slope))

    def best_guess(self, model: str, estimate: int) -> int:
        """What the server probably counted for a request it sent no usage for."""
        points = self.points(model)
        if not points:
            return estimate
        return max(1, estimate + points[0][1] - points[0][0])


_calibrations: "weakref.WeakKeyDictionary[Any, Calibration]" = weakref.WeakKeyDictionary()
_calibrations_lock = threading.Lock()


def calibration(execution: Any) -> Calibration:
    """The execution's :class:`Calibration` (made on first use)."""
    with _calibrations_lock:
        found = _calibrations.get(execution)
        if found is None:
            found = _calibrations[execution] = Calibration(execution)
        return found


def chat_estimate(kwargs: dict) -> int:
    """Offline estimate of a chat request's prompt tokens."""
    return count_message_tokens(kwargs.get("messages") or [], str(kwargs.get("model") or ""),
                                kwargs.get("tools"))


def completion_cap(kwargs: dict) -> tuple[int, bool]:
    """(completion tokens the request may take, whether the request itself caps them)."""
    caps = [v for k in _CAP_KEYS if isinstance(v := kwargs.get(k), int)
            and not isinstance(v, bool) and v > 0]
    n = kwargs.get("n")
    choices = n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1
    if caps:
        return min(caps) * choices, True
    return DEFAULT_COMPLETION_RESERVE * choices, False


def check_budget(execution: Any, kwargs: dict, *, estimate: int | None = None) -> None:
    """Raise :class:`BudgetExhausted` (and mark the run to fail) before a call that could
    pass max_iterations, max_tokens or max_cost, or that does not fit the context window.
    ``estimate`` is the request's offline prompt estimate (default: a chat request's)."""
    record = execution.record
    model = str(kwargs.get("model") or "")
    problem = advice = None
    limits = "Raise the limit (--max-tokens / --max-cost / --max-iterations)"
    if record.max_iterations is not None and execution.iteration >= record.max_iterations:
        problem = (f"max_iterations reached: {execution.iteration} of {record.max_iterations} "
                   f"LLM calls made")
    else:
        estimate = chat_estimate(kwargs) if estimate is None else estimate
        window = context_window(model, execution.options.context_windows)
        if record.max_tokens is not None or record.max_cost is not None:
            prompt = calibration(execution).calibrated(model, estimate)
            cap, capped = completion_cap(kwargs)
            reply = ("its completion cap" if capped else
                     "reserved for the reply, as the request sets no max_tokens")
            if record.max_tokens is not None:
                used = execution.prompt_tokens + execution.completion_tokens
                if used + prompt + cap > record.max_tokens:
                    problem = (f"token budget exhausted: used {used} of {record.max_tokens}, "
                               f"and the next request may take {prompt + cap} more (about "
                               f"{prompt} prompt tokens + {cap} {reply})")
            if problem is None and record.max_cost is not None:
                prices = execution.options.prices
                if price_for(model, prices) is None:
                    problem = f"max_cost is set, but the price of model {model!r} is not known"
                    advice = (f"Give it with RunOptions(prices={{{model!r}: Price(input, "
                              f"cached_input, output)}}) (dollars per million tokens, from "
                              f"durable_nb.llm.pricing; Price(0, 0, 0) for a local model) and "
                              f"execute again.")
                else:
                    projected = cost(model, prompt, cap, overrides=prices) or 0.0
                    if execution.cost + projected > record.max_cost:
                        problem = (f"cost budget exhausted: spent ${execution.cost:.6f} of "
                                   f"${record.max_cost:.6f}, and the next request may cost "
                                   f"up to ${projected:.6f} more")
        if problem is None and estimate > window:
            problem = (f"the request has about {estimate} tokens, more than the context window "
                       f"of {model or 'the model'} ({window})")
            advice = ("Compact the messages (ctx.compact) or choose a model with a larger "
                      "window.")
    if problem is not None:
        exc = BudgetExhausted(f"run {execution.run_id!r} stopped before its next LLM call: "
                              f"{problem}. {advice or limits + ' and execute again to go on.'}")
        execution.budget_failure = exc
        raise exc
    gate = execution.options.call_gate
    if gate is not None:  # limits shared with other runs (a batch)
        prompt = calibration(execution).calibrated(model, estimate)
        cap, _ = completion_cap(kwargs)
        projected = cost(model, prompt, cap, overrides=execution.options.prices) or 0.0
        try:
            gate.before_call(execution.run_id, execution.step_key(), prompt + cap, projected)
        except BudgetExhausted as exc:
            execution.budget_failure = exc
            raise


def llm_meta(execution: Any, *, requested: str, model: str | None, prompt: int, completion: int,
             cached: int | None = None, reasoning: int | None = None, estimated: bool = False,
             prompt_estimate: int | None = None, client: Any = None) -> dict[str, Any]:
    """The meta of an LLM call's entry (see the module docstring), ``client`` the one that
    made it; feeds the calibration."""
    model = model or requested
    meta: dict[str, Any] = {"model": model}
    if getattr(client, "base_url", None) is not None:
        meta["endpoint"] = endpoint_url(client.base_url)
    if prompt_estimate is not None:
        meta["prompt_estimate"] = prompt_estimate
    prices, endpoint = execution.options.prices, meta.get("endpoint")
    quote = quote_for(model, prices, endpoint)
    if quote is None and requested != model:
        quote = quote_for(requested, prices, endpoint)
    if quote is not None:
        meta["cost"] = quote.price.dollars(prompt, completion, cached or 0)
        meta["price_source"] = quote.source
    if cached is not None:
        meta["cached"] = cached
    if reasoning:
        meta["reasoning"] = reasoning
    if estimated:
        meta["estimated"] = True
    elif prompt_estimate:
        calibration(execution).observe(requested, prompt_estimate, prompt)
    return meta
