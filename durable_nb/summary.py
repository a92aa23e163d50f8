"""What people read about a run: plain values out of the journal's encoding, costs, durations,
what replay saves, what an LLM step was asked and answered. Shared by the CLI, the panels
and exports."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .execution import load_request
from .journal import LLM_KINDS, RunRecord, Status, StepEntry, entry_cost
from .journal.blobs import expand_list
from .llm.pydantic_ai_messages import model_messages, model_reply

__all__ = ["cost_of", "elapsed", "format_cost", "format_duration", "is_free", "item_messages",
           "llm_reply", "load_chat_request", "one_line", "plain", "price_sources",
           "replay_savings", "request_items", "shown_value", "step_cost", "stored_digests"]


def plain(data: Any) -> Any:
    """Encoded journal data as plain JSON: serde's tags unwrapped, for reading."""
    if isinstance(data, list):
        return [plain(v) for v in data]
    if not isinstance(data, dict):
        return data
    tag = data.get("$t")
    if tag is None:
        return {k: plain(v) for k, v in data.items()}
    if tag == "dict":
        pairs = [(plain(k), plain(v)) for k, v in data.get("v", [])]
        if all(isinstance(k, str) for k, _ in pairs):
            return dict(pairs)
        return [list(pair) for pair in pairs]
    return plain(data.get("v"))


def format_cost(dollars: float | None, *, estimated: bool = False) -> str:
    """``$0.0021``, ``$1.23``, ``$0.000031``; ``-`` for None."""
    if dollars is None:
        return "-"
    prefix = "~" if estimated else ""
    if dollars == 0:
        return f"{prefix}$0"
    if dollars < 0.0001:  # two significant digits: four decimals would show "$0.0000"
        return f"{prefix}${dollars:.{1 - math.floor(math.log10(dollars))}f}"
    if dollars < 0.01:
        return f"{prefix}${dollars:.4f}"
    if dollars < 100:
        return f"{prefix}${dollars:,.2f}" if dollars >= 1 else f"{prefix}${dollars:.3f}"
    return f"{prefix}${dollars:,.0f}"


def format_duration(seconds: float) -> str:
    """``0.4 s``, ``12.3 s``, ``3 min 5 s``, ``2 h 4 min``."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


def elapsed(record: RunRecord) -> float:
    """Seconds from the run's creation to its end (DONE, FAILED, CANCELLED: the last update
    of that execution; a DONE run replayed later does not grow), or to now while it runs."""
    if not record.created_at:
        return 0.0  # not created yet
    if record.status is Status.DONE:
        end = record.finished_at or record.updated_at
    elif record.status in (Status.RUNNING, Status.WAITING_APPROVAL):
        end = time.time()
    else:
        end = record.updated_at
    return max(0.0, end - record.created_at)


def cost_of(entries: Iterable[StepEntry]) -> tuple[float, bool, list[str]]:
    """(dollars, whether any is estimated, models without a known price) of LLM entries."""
    total, estimated, unpriced = 0.0, False, []
    for entry in entries:
        if entry.kind not in LLM_KINDS and entry.kind != "compact":
            continue
        meta = entry.meta or {}
        if not isinstance(meta.get("cost"), (int, float)) or isinstance(meta.get("cost"), bool):
            model = str(meta.get("model") or entry.name)
            if entry.tokens and model not in unpriced:
                unpriced.append(model)
            continue
        total += entry_cost(entry)
        estimated = estimated or bool(meta.get("estimated"))
    return total, estimated, unpriced


def price_sources(entries: Iterable[StepEntry]) -> list[str]:
    """Where the prices of these LLM entries came from (``meta["price_source"]``: override,
    genai-prices with its version and provider, built-in table), each once, in order."""
    sources: dict[str, None] = {}
    for entry in entries:
        source = (entry.meta or {}).get("price_source")
        if entry.kind in LLM_KINDS or entry.kind == "compact":
            if isinstance(source, str) and source:
                sources[source] = None
    return list(sources)


def is_free(entries: Sequence[StepEntry]) -> bool:
    """Whether these entries made LLM calls and every one had a known price of zero (a local
    model): what a run's cost line says once as "free" rather than "$0" per step."""
    dollars, _, unpriced = cost_of(entries)
    return not unpriced and dollars == 0 and any(
        isinstance((e.meta or {}).get("cost"), (int, float)) for e in entries
        if e.kind in LLM_KINDS or e.kind == "compact")


def step_cost(entry: StepEntry) -> str:
    """What one step cost, for a timeline: empty when its price is not known or is zero (a
    free model says so once, on the run's cost line; see :func:`is_free`)."""
    meta = entry.meta or {}
    if not isinstance(meta.get("cost"), (int, float)) or not entry_cost(entry):
        return ""
    return format_cost(entry_cost(entry), estimated=bool(meta.get("estimated")))


def replay_savings(entries: Sequence[StepEntry], verb: str = "replayed",
                   saved: str = "saved", count: int | None = None) -> str:
    """``7 steps replayed: 1,427 tokens, $0.0021 saved`` for entries answered by the
    journal (tokens and dollars not spent again); ``count`` steps (default: the entries)."""
    tokens = sum(e.tokens for e in entries)
    dollars, estimated, _ = cost_of(entries)
    count = len(entries) if count is None else count
    steps = f"{count:,} step{'s' if count != 1 else ''} {verb}"
    if not tokens:
        return steps
    # Nothing said of money when none was saved: a free model is said "free" once, on the
    # run's cost line.
    money = f", {format_cost(dollars, estimated=estimated)} {saved}" if dollars else ""
    return f"{steps}: {tokens:,} tokens{money}"


# -- what an LLM step was asked and answered -------------------------------------------------

def _field(kind: str) -> str:
    return "input" if kind == "respond" else "messages"


def stored_digests(kind: str, stored: Any, get_blob: Callable[[str], str | None]
                   ) -> list[str] | None:
    """The blob digests of a chat request's messages (a respond request's input items) as
    its entry stores them, in order (``get_blob`` reads the list's nodes); None when they
    are kept inline."""
    refs = stored.get(_field(kind)) if isinstance(stored, dict) else None
    if isinstance(refs, dict) and isinstance(refs.get("$list"), str):
        return expand_list(refs["$list"], get_blob)
    digests = refs.get("$blobs") if isinstance(refs, dict) else None
    return [str(d) for d in digests] if isinstance(digests, list) else None


def load_chat_request(kind: str, stored: Any, get_blob: Callable[[str], str | None]
                      ) -> tuple[Any, list[str] | None]:
    """A chat (or respond) request as its entry stores it, loaded whole, and
    :func:`stored_digests` of it: the list of its messages is read from the journal once."""
    digests = stored_digests(kind, stored, get_blob)
    if digests is not None:
        stored = {**stored, _field(kind): {"$blobs": digests}}
    return load_request(stored, get_blob), digests


def request_items(kind: str, request: dict) -> list[Any]:
    """A chat request's messages, or a respond request's input items (a plain string
    input as one user message)."""
    items = request.get(_field(kind))
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    return items if isinstance(items, list) else []


def item_messages(kind: str, item: Any) -> list[Any]:
    """One request item as chat messages, for reading (a Responses item may be a function
    call or its output; a ``model`` step's item is a Pydantic AI message)."""
    if kind == "model":
        return model_messages(item)
    if kind == "respond":
        # Here, not at the top: durable_nb.llm.responses imports openai, which reading a
        # journal (the command line, the panel) need not pay for unless a run used it.
        from .llm.responses import response_messages

        return response_messages({"input": [item]})
    return [item]


def llm_reply(kind: str, response: Any) -> dict[str, Any] | None:
    """The model's reply in a chat or respond entry's result (plain JSON): ``content``,
    ``refusal``, ``finish_reason`` (a Response's ``status``) and ``tool_calls`` as ``{"id",
    "name", "arguments"}`` with the arguments' JSON text as sent; None if the result is not
    an OpenAI chat completion or Response (a ``model`` step's: Pydantic AI's ``ModelResponse``)."""
    if not isinstance(response, dict):
        return None
    if kind == "model":
        return model_reply(response)
    if kind == "respond":
        output = response.get("output")
        if not isinstance(output, list):
            return None
        texts, refusal, calls = [], None, []
        for item in output:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "function_call":
                calls.append({"id": item.get("call_id"), "name": item.get("name"),
                              "arguments": item.get("arguments") or ""})
            for part in (item.get("content") or []) if item.get("type") == "message" else ():
                if isinstance(part, dict) and part.get("type") == "output_text":
                    texts.append(str(part.get("text") or ""))
                elif isinstance(part, dict) and part.get("type") == "refusal":
                    refusal = part.get("refusal")
        return {"content": "".join(texts) or None, "refusal": refusal,
                "finish_reason": response.get("status"), "tool_calls": calls}
    choices = response.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else {}
    message = first.get("message") if isinstance(first, dict) else None
    if not isinstance(message, dict):
        return None
    calls = [{"id": call.get("id"), "name": (call.get("function") or {}).get("name"),
              "arguments": (call.get("function") or {}).get("arguments") or ""}
             for call in message.get("tool_calls") or [] if isinstance(call, dict)]
    return {"content": message.get("content"), "refusal": message.get("refusal"),
            "finish_reason": first.get("finish_reason"), "tool_calls": calls}


def one_line(text: str, limit: int) -> str:
    """``text`` on one line (whitespace runs made one space), cut to ``limit`` with an
    ellipsis."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"


def shown_value(value: Any, limit: int) -> str:
    """Journaled data for reading: a string as it is, a mapping as ``key: value`` pairs,
    anything else as compact JSON; on one line, shortened to ``limit``."""
    value = plain(value)
    if isinstance(value, str):
        return one_line(value, limit)
    if isinstance(value, dict) and value:
        return one_line(", ".join(
            f"{k}: {v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str)}"
            for k, v in value.items()), limit)
    return one_line(json.dumps(value, ensure_ascii=False, default=str), limit)
