"""A step of a run as the panel's timeline shows it: its row (kind, name, time, how it was
got, tokens and cost), and what the row opens to: what the step was asked and what came back,
read from the journal and rendered once per step."""

from __future__ import annotations

import html
import json
from typing import Any

from ..execution import load_request
from ..approvals.request import short
from ..approvals.wording import content_words
from ..journal import LLM_KINDS, Journal, Status, StepEntry
from ..llm.messages import tool_names
from ..summary import (
    format_duration,
    item_messages,
    llm_reply,
    load_chat_request,
    plain,
    request_items,
    step_cost,
    stored_digests,
)

__all__ = ["ESTIMATED", "STATUS_COLOURS", "STOPPED_COLOUR", "StepView", "badge", "clip",
           "origin_badge"]

#: The colour of each status badge, in a run's panel and a batch's.
STATUS_COLOURS = {
    Status.RUNNING: "#1f6feb", Status.WAITING_APPROVAL: "#bf8700", Status.DONE: "#1a7f37",
    Status.FAILED: "#cf222e", Status.CANCELLED: "#6e7781",
}
#: The colour of a badge that says an execution stopped while the journal keeps the status.
STOPPED_COLOUR = "#9a6700"


def badge(text: str, colour: str) -> str:
    return (f'<span style="background:{colour};color:white;border-radius:8px;padding:1px 8px;'
            f'font-size:0.85em">{html.escape(text)}</span>')


def origin_badge(replayed: bool | None) -> str:
    """How this panel's executions got a step: executed, replayed from the journal, or
    neither (None: journaled by an earlier execution that this panel did not see)."""
    if replayed is None:
        return ('<span title="recorded by an earlier execution; none shown here touched it">'
                + badge("journaled", "#8c959f") + "</span>")
    return badge("replayed", "#6e7781") if replayed else badge("executed", "#1a7f37")


TEXT_LIMIT = 2000  # characters of one message, argument or result shown in a step's details


def clip(text: str, limit: int = TEXT_LIMIT) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\u2026 ({len(text) - limit:,} more characters: `%durable show` / export)"


def pre(value: Any) -> str:
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            text = repr(value)
    return f"<pre>{html.escape(clip(text))}</pre>"


ESTIMATED = "tokens estimated by durable_nb: the server sent no usage"


def message_html(message: Any) -> str:
    if not isinstance(message, dict):
        return pre(message)
    role = html.escape(str(message.get("role", "?")))
    parts = [f"<div class='dnb-role'>{role}</div>"]
    content = message.get("content")
    if content not in (None, ""):
        parts.append(pre(content))
    for call in message.get("tool_calls") or []:
        function = (call or {}).get("function") or {}
        parts.append(f"<div>&rarr; calls <code>{html.escape(str(function.get('name')))}</code>"
                     f"</div>{pre(arguments_of(function.get('arguments')))}")
    return "".join(parts)


def arguments_of(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


class StepView:
    """The rows and details of run ``run_id``'s steps, their requests read from ``journal``
    (None: shown without them). Remembers which chat messages each request added
    (:meth:`note_messages`, in step order), so that a request's details show those first."""

    def __init__(self, journal: Journal | None, run_id: str) -> None:
        self.journal = journal
        self.run_id = run_id
        self.new_messages: dict[int, list[str]] = {}
        self._seen: set[str] = set()
        self._rendered: dict[int, str] = {}

    def note_messages(self, entry: StepEntry) -> None:
        """Remember which chat messages this request added (by their blob digests)."""
        digests = stored_digests(entry.kind, entry.request, self._get_blob)
        if digests is None:
            return
        self.new_messages[entry.position] = [d for d in digests if d not in self._seen]
        self._seen.update(str(d) for d in digests)

    def row(self, entry: StepEntry, replayed: bool | None) -> str:
        mark = origin_badge(replayed)
        outcome = "" if entry.ok else badge("failed", "#cf222e")
        extra = ""
        time_cell = f"{entry.duration * 1000:,.1f} ms"
        if entry.kind == "approval":
            time_cell = "&ndash;"  # a person's wait is not step time
            waited = f"waited {format_duration(entry.duration)}"
            if entry.ok and isinstance(entry.result, dict):
                decided = entry.result
                outcome = (badge("approved", "#1a7f37") if decided.get("approved")
                           else badge("rejected", "#cf222e"))
                if isinstance(decided.get("answer"), dict):  # a server's question answered
                    action = str(decided["answer"].get("action"))
                    outcome = badge(f"answered {action}", "#1a7f37" if action == "accept"
                                    else "#6e7781")
                note = f": {decided['note']}" if decided.get("note") else ""
                said = content_words(decided)
                beyond = f" {clip(said)}" if said else ""
                extra = html.escape(f"by {decided.get('by')}{beyond}{note} \u00b7 {waited}")
            else:
                extra = html.escape(waited)
        meta = entry.meta or {}
        if entry.prompt_tokens or entry.completion_tokens:
            extra = f"{entry.prompt_tokens:,}+{entry.completion_tokens:,} tok"
            if meta.get("estimated"):  # the server sent no usage: our count
                extra = f"<span title='{ESTIMATED}'>~{extra} (estimated)</span>"
            money = step_cost(entry)
            if money:
                source = meta.get("price_source")
                if isinstance(source, str):
                    money = f"<span title='price: {html.escape(source, quote=True)}'>{money}</span>"
                extra += f" &middot; {money}"
        if entry.kind == "compact" and meta:
            extra = f"{meta.get('tokens_before')} &rarr; {meta.get('tokens_after')} tok"
            if meta.get("skipped"):
                extra = f"skipped, would not shrink: {extra}"
            if meta.get("summary_truncated"):
                extra += " &middot; summary cut at its cap"
        summary = (f"<summary><span>{entry.position}</span><span>{html.escape(entry.kind)}</span>"
                   f"<span class='dnb-name' title='{html.escape(entry.name)}'>"
                   f"{html.escape(entry.name)}</span><span>{time_cell}</span>"
                   f"<span>{mark} {outcome}</span><span>{extra}</span></summary>")
        return f"<details>{summary}<div class='dnb-step-body'>{self.body(entry)}</div></details>"

    def body(self, entry: StepEntry) -> str:
        cached = self._rendered.get(entry.position)
        if cached is None:
            try:
                cached = self.render(entry)
            except Exception as exc:  # a detail view must never break the panel
                cached = f"<i>cannot show this step: {html.escape(str(exc))}</i>"
            self._rendered[entry.position] = cached
        return cached

    def _get_blob(self, digest: str) -> str | None:
        if self.journal is None:
            return None
        return self.journal.get_blob(self.run_id, digest)

    def _request(self, entry: StepEntry) -> tuple[Any, list[str] | None]:
        """The entry's request loaded whole, and for an LLM step the digests of its
        messages (see :func:`~durable_nb.summary.stored_digests`)."""
        if entry.request is None or self.journal is None:
            return None, None
        if entry.kind in LLM_KINDS:
            return load_chat_request(entry.kind, entry.request, self._get_blob)
        return load_request(entry.request, self._get_blob), None

    def render(self, entry: StepEntry) -> str:
        parts: list[str] = []
        request, refs = self._request(entry)
        result = plain(entry.result) if entry.ok else None
        if entry.kind in LLM_KINDS and isinstance(request, dict):
            parts.append(self._chat_request_html(entry, request, refs or []))
        elif entry.kind == "approval":
            details = (entry.meta or {}).get("details")
            parts.append(f"<div><b>Asked</b> for approval of <code>{html.escape(entry.name)}"
                         f"</code>:</div>{pre(plain(details))}")
        elif isinstance(request, dict) and request:
            shown = request.get("arguments", request)
            if set(request) <= {"args", "kwargs"}:
                shown = {k: v for k, v in request.items() if v}
            parts.append(f"<div><b>Asked</b> with:</div>{pre(shown)}")
        elif entry.kind not in ("now", "uuid", "random"):
            parts.append("<div><b>Asked</b> with no arguments.</div>")
        if not entry.ok:
            error = entry.error or {}
            parts.append(f"<div style='color:#cf222e'><b>Failed:</b> "
                         f"{html.escape(str(error.get('type', 'error')))}: "
                         f"{html.escape(str(error.get('message', '')))}</div>")
        elif entry.kind in LLM_KINDS:
            parts.append(self._reply_html(entry.kind, result))
        elif entry.kind == "approval" and isinstance(result, dict):
            verdict = "approved" if result.get("approved") else "rejected"
            note = f": {result['note']}" if result.get("note") else ""
            request = (f" (details digest {short(result['digest'])})" if result.get("digest")
                       else "")
            parts.append(f"<div><b>Decision:</b> {verdict} by "
                         f"{html.escape(str(result.get('by')))}{html.escape(note)}, after "
                         f"{html.escape(format_duration(entry.duration))}{request}</div>")
            if result.get("args") is not None:
                parts.append(f"<div><b>Edited arguments</b> (the tool ran with these):</div>"
                             f"{pre(result['args'])}")
            if result.get("message"):
                parts.append(f"<div><b>Message to the model:</b> "
                             f"{html.escape(str(result['message']))}</div>")
            if isinstance(result.get("answer"), dict):
                parts.append(f"<div><b>Answer to the server:</b> "
                             f"{html.escape(str(result['answer'].get('action')))}</div>"
                             f"{pre(result['answer'].get('content') or {})}")
        else:
            parts.append(f"<div><b>Result:</b></div>{pre(result)}")
        facts = [f"{entry.duration * 1000:,.1f} ms" if entry.kind != "approval"
                 else f"waited {format_duration(entry.duration)}"]
        if entry.tokens:
            facts.append(f"{entry.prompt_tokens:,} prompt + {entry.completion_tokens:,} "
                         f"completion tokens")
            meta = entry.meta or {}
            if meta.get("cached"):
                facts.append(f"{meta['cached']:,} cached")
            if meta.get("estimated"):
                facts.append(ESTIMATED)
            money = step_cost(entry)  # none for a free model or one with no known price
            if money:
                source = meta.get("price_source")
                facts.append(money + (f" (price: {html.escape(source)})"
                                      if isinstance(source, str) else ""))
        if entry.kind == "compact":
            facts += [html.escape(str(note)) for note in (
                (entry.meta or {}).get("note"),
                "the summary was cut at its token cap (the server ignored max_completion_tokens)"
                if (entry.meta or {}).get("summary_truncated") else None) if note]
        facts.append(f"step key {html.escape(entry.key)}")
        parts.append(f"<div style='color:#6e7781'>{' &middot; '.join(facts)}</div>")
        return "".join(parts)

    def _chat_request_html(self, entry: StepEntry, request: dict, refs: list[str]) -> str:
        items = request_items(entry.kind, request)
        new = set(self.new_messages.get(entry.position, refs))
        fresh = [m for m, d in zip(items, refs) if d in new] if refs else items
        earlier = [m for m, d in zip(items, refs) if d not in new] if refs else []
        tools = request.get("tools")
        names = tool_names(tools if isinstance(tools, list) else None)
        what = "input items" if entry.kind == "respond" else "messages"
        head = (f"<div><b>Asked</b> <code>{html.escape(str(request.get('model', entry.name)))}"
                f"</code> with {len(items)} {what}"
                + (f" and tools {html.escape(', '.join(names))}" if names else "")
                + f"; {len(fresh)} new in this request:</div>")
        instructions = request.get("instructions")
        if isinstance(instructions, str) and instructions:
            head += f"<div class='dnb-role'>instructions</div>{pre(instructions)}"
        body = "".join(message_html(m) for item in fresh
                       for m in item_messages(entry.kind, item))
        if earlier:
            listed = "".join(
                f"<div><span class='dnb-role'>{html.escape(str(m.get('role', '?')))}</span>: "
                f"{html.escape(clip(str(m.get('content') or ''), 160))}</div>"
                if isinstance(m, dict) else ""
                for item in earlier for m in item_messages(entry.kind, item))
            body = (f"<details><summary>{len(earlier)} earlier {what} (sent before)</summary>"
                    f"{listed}</details>") + body
        return head + body

    def _reply_html(self, kind: str, response: Any) -> str:
        reply = llm_reply(kind, response)
        if reply is None:
            return f"<div><b>Reply:</b></div>{pre(response)}"
        message = {"role": "assistant", "content": reply["content"] or reply["refusal"],
                   "tool_calls": [{"id": c["id"], "function": {"name": c["name"],
                                                                "arguments": c["arguments"]}}
                                  for c in reply["tool_calls"]]}
        return f"<div><b>Reply</b> ({html.escape(str(reply['finish_reason']))}):</div>" \
               + message_html(message)
