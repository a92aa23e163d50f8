"""``ctx.compact``: keep a long agent conversation inside the model's context window.

When a conversation's estimated prompt tokens pass ``threshold`` of the model's window, its
older rounds are replaced by a summary that one journaled LLM call writes (a step of kind
``compact``). On replay the journaled summary rebuilds the same messages without a call.

The shape of a compacted conversation::

    system message(s) and the user's goal   kept verbatim (everything up to the first user message)
    one user message: SUMMARY_PREFIX + summary
    the last ``keep_last`` rounds           kept verbatim

A *round* is an assistant message, the ``tool`` messages that answer it, and the user
messages just before it; rounds are kept or summarised whole, so a tool call is never
separated from its results.

A compaction always shrinks the conversation. The summary is held to its cap
(``max_completion_tokens``) even when the server ignores the cap, as llama-cpp-python does:
the summary is streamed, reading stops a little past the cap (closing the stream, which ends
the generation there instead of at the end of the model's window), and a longer summary is
cut to the cap by tokens, ending in ``[...]``. (A server that refuses to stream the summary
model is asked again without streaming.) A compaction whose result
would not have fewer tokens than the conversation (few or short rounds summarised) is not
applied: ``ctx.compact`` returns the messages unchanged. The summary call is journaled either
way (its tokens were paid) with the decision, so a replay takes the same path; the entry's
meta says ``skipped`` with a ``note`` ("compaction skipped: would not shrink (x -> y
tokens)") for the panel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .budget import check_budget, llm_meta
from .endpoints import call_with_retries, default_client, without_retries
from ..errors import JournalMismatch
from ..execution import Execution
from .chat import ChatCall, completion_usage, usage_details
from .tokens import as_dict, context_window, count_message_tokens, encoding_for

__all__ = ["DEFAULT_KEEP_LAST", "DEFAULT_THRESHOLD", "SUMMARY_MAX_TOKENS", "SUMMARY_PREFIX",
           "compact"]

#: Rounds kept verbatim after the summary: the agent's recent working memory.
DEFAULT_KEEP_LAST = 4

#: Compact once the estimate passes this fraction of the window. The other 40 % is room for
#: the summary call itself and for the turns around it. ``ctx.compact`` runs between turns,
#: so the conversation it sees may already be one tool result past the threshold; the
#: summary call then needs its input (the older rounds: less than the conversation, plus
#: about 300 tokens of instructions) and its output (at most SUMMARY_MAX_TOKENS) in the
#: window. At 0.6, a turn may add up to 0.4 * window - 1,300 tokens and the call still fits
#: whole: about 50,000 tokens on a 128k model, 2,000 on an 8k one. A larger turn (or a
#: summary model with a smaller window) does not overflow either: the longest texts sent to
#: the summariser are then shortened in the middle until the call fits, losing detail only.
DEFAULT_THRESHOLD = 0.6

#: Upper bound of the summary's length in tokens (and at most an eighth of the summary
#: model's window), sent as ``max_completion_tokens`` and stated in the prompt in words.
SUMMARY_MAX_TOKENS = 1000

#: How the message carrying the summary begins; it marks that message, so that the next
#: compaction folds the previous summary in instead of keeping it as a round.
SUMMARY_PREFIX = "Summary of earlier work (older messages of this conversation were replaced by it):"

# The loopback test server recognises a summarisation request by the opening words.
_SUMMARY_PROMPT = """\
Summarise the conversation below so that an AI agent can continue its task from your summary \
alone: the summarised messages will be deleted and replaced by your summary.

Keep:
- the steps already finished and the facts established, with their results;
- the key data the agent will need again: names, paths, ids, numbers, figures, decisions;
- every attempt that failed, with the reason it failed, so that it is not repeated;
- what remains to be done, if the conversation says.
Drop repeated information and bulky tool output: keep only the values that matter from it.
If a previous summary is given, fold it in: your summary replaces it, so carry over what \
still matters.
Write compact plain notes of at most {words} words. Do not continue the task and do not \
call tools."""

# Tokens set aside for what counting cannot see exactly (tokens merging where texts join).
_SAFETY_TOKENS = 32
_CLIP_MARKER = "\n[... {n} tokens omitted ...]\n"

Message = dict[str, Any]


def _as_dict(message: Any) -> Message:
    return as_dict(message, "a message for ctx.compact")


def _is_summary(message: Message) -> bool:
    content = message.get("content")
    return (message.get("role") == "user" and isinstance(content, str)
            and content.startswith(SUMMARY_PREFIX))


def _summary_message(summary: str) -> Message:
    return {"role": "user", "content": f"{SUMMARY_PREFIX}\n{summary}"}


def _split(messages: list[Message]) -> tuple[list[Message], str | None, list[list[Message]]]:
    """(head kept verbatim, the previous summary if any, the rounds after the head)."""
    roles = [m.get("role") for m in messages]
    goal = next((i for i, m in enumerate(messages)
                 if roles[i] == "user" and not _is_summary(m)), None)
    if goal is None:  # no user message: keep the leading system messages only
        goal = next((i for i, r in enumerate(roles) if r not in ("system", "developer")),
                    len(messages)) - 1
    head, body = messages[:goal + 1], messages[goal + 1:]
    previous = None
    rounds: list[list[Message]] = []
    current: list[Message] = []
    for message in body:
        if _is_summary(message):
            previous = message["content"][len(SUMMARY_PREFIX):].lstrip("\n")
            continue
        # A tool message always joins the round of the assistant message it answers; any
        # other message after that assistant message starts the next round.
        if message.get("role") != "tool" and any(m.get("role") == "assistant" for m in current):
            rounds.append(current)
            current = []
        current.append(message)
    if current:
        rounds.append(current)
    return head, previous, rounds


def _rebuild(head: list[Message], summary: str, kept: list[list[Message]]) -> list[Message]:
    return [*head, _summary_message(summary), *(m for r in kept for m in r)]


def _text(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        part = _as_dict(part) if not isinstance(part, str) else {"type": "text", "text": part}
        kind = part.get("type")
        parts.append(part.get(kind, "") if kind in ("text", "refusal") else f"[{kind}]")
    return "".join(str(p) for p in parts)


def _transcript(goal: str, previous: str | None,
                rounds: list[list[Message]]) -> list[tuple[str, str]]:
    """The summariser's input as (header, text) entries; only texts are ever shortened."""
    entries = [("The user's goal:", goal)]
    if previous:
        entries.append(("Previous summary (fold it in):", previous))
    entries.append(("Conversation to summarise:", ""))
    names: dict[str, str] = {}
    for message in (m for r in rounds for m in r):
        role = message.get("role", "?")
        if role == "tool":
            call_id = message.get("tool_call_id", "")
            header = f"[result of {names.get(call_id, 'a tool')} ({call_id})]"
        else:
            header = f"[{role}]"
        text = _text(message.get("content"))
        if text or role == "tool":  # an assistant message may carry tool calls only
            entries.append((header, text))
        for call in message.get("tool_calls") or []:
            function = call.get("function") or call.get("custom") or {}
            names[call.get("id", "")] = name = function.get("name", "?")
            arguments = function.get("arguments") or function.get("input") or ""
            entries.append((f"[{role} calls {name} ({call.get('id', '')})]", arguments))
    return entries


def _fit(entries: list[tuple[str, str]], model: str, budget: int) -> str:
    """Join the entries, shortening the longest texts in the middle until their tokens fit
    ``budget`` (the largest cap per text that fits: short texts are never touched)."""
    enc = encoding_for(model)
    tokens = [enc.encode(text, disallowed_special=()) for _, text in entries]
    marker = len(enc.encode(_CLIP_MARKER.format(n=10**9)))

    def cost(cap: int) -> int:
        return sum(len(t) if len(t) <= cap + marker else cap + marker for t in tokens)

    cap = max((len(t) for t in tokens), default=0)
    if cost(cap) > budget:
        low, high = 0, cap
        while low < high:  # the largest cap whose cost fits
            mid = (low + high + 1) // 2
            low, high = (mid, high) if cost(mid) <= budget else (low, mid - 1)
        cap = low
    texts = []
    for (header, text), toks in zip(entries, tokens):
        if len(toks) > cap + marker:
            half = cap // 2
            text = (enc.decode(toks[:half]) + _CLIP_MARKER.format(n=len(toks) - cap)
                    + enc.decode(toks[len(toks) - (cap - half):]))
        texts.append(f"{header}\n{text}" if text else header)
    return "\n\n".join(texts)


def _summary_request(model: str, window: int, goal: str, previous: str | None,
                     rounds: list[list[Message]]) -> dict[str, Any]:
    """The chat completion request that summarises ``rounds``, fitted into ``window``."""
    max_out = max(64, min(SUMMARY_MAX_TOKENS, window // 8))
    system = {"role": "system", "content": _SUMMARY_PROMPT.format(words=max_out * 3 // 4)}
    entries = _transcript(goal, previous, rounds)
    headers_only = "\n\n".join(h for h, _ in entries)
    fixed = count_message_tokens([system, {"role": "user", "content": headers_only}], model)
    budget = window - max_out - fixed - _SAFETY_TOKENS
    user = {"role": "user", "content": _fit(entries, model, max(0, budget))}
    return {"model": model, "messages": [system, user], "max_completion_tokens": max_out}


def compact(execution: Execution, messages: Sequence[Any], *,
            keep_last: int = DEFAULT_KEEP_LAST, threshold: float = DEFAULT_THRESHOLD,
            model: str | None = None, summary_model: str | None = None,
            tools: Sequence[Any] | None = None, client: Any = None) -> list[Any]:
    """``ctx.compact``: the messages, or a shorter list when they pass ``threshold``.

    See :meth:`durable_nb.context.Context.compact`.
    """
    if keep_last < 0:
        raise ValueError(f"keep_last must be 0 or more rounds, got {keep_last}")
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold is a fraction of the context window in (0, 1], got "
                         f"{threshold}; the default {DEFAULT_THRESHOLD} leaves room for the "
                         f"summary call")
    model = model or execution.options.model
    if not model:
        raise ValueError("ctx.compact needs the model the messages are for: pass model= or "
                         "set the run's model option (model=... in execute or the cell)")
    dicts = [_as_dict(m) for m in messages]
    before = count_message_tokens(dicts, model, tools)
    unchanged = messages if isinstance(messages, list) else list(messages)
    # Decided from the messages alone, so a replay takes the same branch as the first run.
    if before <= threshold * context_window(model, execution.options.context_windows):
        return unchanged
    head, previous, rounds = _split(dicts)
    if len(rounds) <= keep_last:
        return unchanged  # nothing old enough to summarise
    summarised = len(rounds) - keep_last
    summary_model = summary_model or model
    made: dict[str, Any] = {}

    def prepare() -> None:  # only when the summary must really be made
        goal = _text(head[-1].get("content")) if head and head[-1].get("role") == "user" else ""
        window = context_window(summary_model, execution.options.context_windows)
        request = made["request"] = _summary_request(summary_model, window, goal, previous,
                                                     rounds[:summarised])
        made["estimate"] = count_message_tokens(request["messages"], summary_model)
        check_budget(execution, request, estimate=made["estimate"])

    def summarise() -> dict[str, Any]:
        request = made["request"]
        chosen = without_retries(client or execution.options.client or default_client())
        live = made["live"] = ChatCall(execution, request, summary_model, show_text=False)
        live.estimate = made["estimate"]
        live.client = chosen
        completion = call_with_retries(execution, "ctx.compact", summary_model, chosen,
                                       lambda: live.streamed_or_plain(chosen))
        choice = completion.choices[0]
        summary = (choice.message.content or "").strip()
        if not summary:
            raise RuntimeError(
                f"the summary model {summary_model!r} returned no text (finish_reason "
                f"{choice.finish_reason!r}); a reasoning model may spend the whole "
                f"{request['max_completion_tokens']}-token limit on reasoning: pass a chat "
                f"model as summary_model=")
        summary, made["cut"] = _hold_to_cap(summary, summary_model,
                                            request["max_completion_tokens"])
        made["completion"] = completion
        after = made["after"] = count_message_tokens(
            _rebuild(head, summary, rounds[summarised:]), model, tools)
        if after >= before:
            return {"summary": summary, "rounds_summarised": summarised, "applied": False}
        # Set here so that the record is written with the step, in the same transaction.
        execution.record.context_summary = summary
        return {"summary": summary, "rounds_summarised": summarised}

    def meta(result: dict[str, Any]) -> dict[str, Any]:
        completion = made["completion"]
        prompt, completed = completion_usage(completion)
        cached, reasoning = usage_details(completion.usage)
        data = {"tokens_before": before, "tokens_after": made["after"],
                "rounds_summarised": summarised, "summary_model": summary_model,
                **llm_meta(execution, requested=summary_model, model=completion.model,
                           prompt=prompt, completion=completed, cached=cached,
                           reasoning=reasoning, estimated=made["live"].estimated,
                           prompt_estimate=made["estimate"], client=made["live"].client)}
        if made["cut"]:
            data["summary_truncated"] = True
        if result.get("applied") is False:
            data["skipped"] = True
            data["note"] = (f"compaction skipped: would not shrink ({before} -> "
                            f"{made['after']} tokens)")
        return data

    inputs = {"model": model, "summary_model": summary_model, "keep_last": keep_last,
              "messages": dicts}
    result = execution.step(
        "compact", model, summarise, inputs=inputs,
        usage=lambda _: completion_usage(made["completion"]), before_live=prepare, meta=meta)
    if int(result["rounds_summarised"]) > len(rounds):
        raise JournalMismatch(
            execution.run_id, -1, f"compact {model!r}", f"compact {model!r}",
            reason=(f"a compaction summarised {result['rounds_summarised']} rounds, but the "
                    f"messages passed to ctx.compact now hold only {len(rounds)}"))
    if result.get("applied") is False:
        return unchanged  # it would not have shrunk the conversation
    execution.record.context_summary = result["summary"]
    return _rebuild(head, result["summary"], rounds[int(result["rounds_summarised"]):])


_CUT_MARKER = " [...]"


def _hold_to_cap(summary: str, model: str, cap: int) -> tuple[str, bool]:
    """(the summary cut to at most ``cap`` tokens, whether it was cut): for servers that
    ignore ``max_completion_tokens``."""
    enc = encoding_for(model)
    tokens = enc.encode(summary, disallowed_special=())
    if len(tokens) <= cap:
        return summary, False
    keep = cap - len(enc.encode(_CUT_MARKER))
    while keep > 0:
        cut = enc.decode(tokens[:keep]).rstrip() + _CUT_MARKER
        if len(enc.encode(cut, disallowed_special=())) <= cap:
            return cut, True
        keep -= 1
    return enc.decode(tokens[:cap]), True
