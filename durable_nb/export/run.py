"""Export a run as a notebook (or JSON) that tells its story: goal, rounds, approvals, result.

The export is built from the journal alone (:func:`durable_nb.get_run`), so it holds what the
journal holds: what each model call was asked (its new messages), step results, model
responses, decisions, tokens, cost and timings. Client configuration (API keys, headers, base
URLs) is never journaled and never added here. Exporting only reads the journal. A run's
keyed values (its LangGraph thread: checkpoints holding the graph's state as the graph held
it) are not exported: the steps tell the run, and a graph's state may hold what its
author never meant to share.

The notebook validates under ``nbformat.validate`` (without warnings), names its kernel
(``python3``, with its ``language_info``) and contains no outputs: markdown cells tell
the run, and the run's source (when it was recorded) is one code cell without outputs, so
opening the notebook executes nothing. Each cell carries its part of the structured data in
``metadata["durable_nb"]``; the JSON export is that same data as one document::

    {"export_version": 1, "run": {...}, "rounds": [...], "result": {...},
     "attempts": {"dropped": 0, "list": [...]}, "code": [{"from_step": 0, "source": ...}]}

``attempts`` are the run's executions (:mod:`durable_nb.execution.attempts`, without host and pid);
``code`` pairs each part of the run with the code that made it: when the cell changed
between executions (``on_change="rerun"``, a resumed run), the notebook shows each version
of the code right before the steps it made, and says that the code changed there.

A round is one chat step and the steps after it up to the next chat step; steps before the
first chat step form round 0, whose ``chat`` is None. Step results are shown as plain JSON:
the tags of :mod:`durable_nb.serde` (tuples, models, datetimes ...) are unwrapped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..execution import attempts
from ..approvals.history import history
from ..approvals.wording import verdict_words
from ..journal import LLM_KINDS, Journal, open_journal
from ..llm.messages import tool_names
from ..notify.audit import notifications
from ..registry import RunInfo, get_run
from ..summary import (
    cost_of,
    format_cost,
    is_free,
    item_messages,
    llm_reply,
    load_chat_request,
    plain,
    price_sources,
    replay_savings,
    request_items,
)
from ..timestamps import format_time, utc_offset
from . import markdown as md
from .markdown import EXPORT_VERSION

if TYPE_CHECKING:
    import nbformat

__all__ = ["EXPORT_VERSION", "FORMATS", "export_data", "export_notebook", "export_run"]

FORMATS = ("ipynb", "json")

# The run record fields an export shows; ``owner`` (pid, host) is left out of shared files.
_RUN_FIELDS = ("run_id", "title", "status", "parent", "source", "created_at", "updated_at",
               "deadline", "iteration", "max_iterations", "prompt_tokens", "completion_tokens",
               "max_tokens", "cost", "max_cost", "step_count", "context_summary",
               "pending_approval", "forked_from", "finished_at")


def export_run(run_id: str, path: str | os.PathLike, *, format: str | None = None,
               journal: Journal | str | None = None) -> Path:
    """Write run ``run_id`` to ``path`` as a notebook (``format="ipynb"``) or JSON
    (``"json"``); by default the format comes from the file extension.

    Raises :class:`~durable_nb.errors.UnknownRun` for a run the journal does not have and
    ``ValueError`` for a format it cannot tell. The file is replaced whole or not at all.
    """
    path = Path(path)
    fmt = _format_for(path, format)
    source = open_journal(journal, read_only=True)
    data = export_data(get_run(run_id, journal=source), journal=source)
    if fmt == "json":
        text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    else:
        text = md.nbformat().writes(export_notebook(data))
    md.write_whole(path, text)
    return path


def _format_for(path: Path, format: str | None) -> str:
    if format is not None:
        if format not in FORMATS:
            raise ValueError(f"unknown export format {format!r}: use one of {', '.join(FORMATS)}")
        return format
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in FORMATS:
        raise ValueError(f"cannot tell the export format from the file name {str(path)!r}: "
                         f"name it .ipynb or .json, or pass the format "
                         f"(--format ipynb|json, format='ipynb'|'json')")
    return suffix


# -- the structured data ----------------------------------------------------------------------

def export_data(info: RunInfo, *, journal: Journal | None = None) -> dict[str, Any]:
    """The run as JSON data: ``{"export_version", "run", "rounds", "result", "attempts",
    "code", "notifications", "history"}``: ``notifications`` are the deliveries of its
    requests for approval, without where their senders ran; ``history`` what people and
    policies did about them (:mod:`durable_nb.approvals.history`).

    ``journal`` (the one ``info`` came from) lets child steps name their child run's status.
    """
    rounds: list[dict[str, Any]] = []
    seen: set[str] = set()  # chat messages sent in an earlier request (blob digests)
    goal = None
    for entry in info.steps:
        if entry.kind in LLM_KINDS:
            number = sum(1 for r in rounds if r["chat"] is not None) + 1
            chat = _chat(entry)
            request = _chat_request(entry, info.run_id, journal, seen)
            if request is not None:
                chat["request"] = request
                if goal is None:
                    goal = next((m.get("content") for m in request["new_messages"]
                                 if isinstance(m, dict) and m.get("role") == "user"), None)
            rounds.append({"round": number, "chat": chat, "steps": []})
            continue
        if not rounds:
            rounds.append({"round": 0, "chat": None, "steps": []})
        rounds[-1]["steps"].append(_step(entry, journal))
    for round_ in rounds:
        _pair_tool_calls(round_)
    run = {name: getattr(info, name) for name in _RUN_FIELDS}
    run["status"] = str(info.status)
    run["goal"] = goal if isinstance(goal, str) else (_plain(goal) if goal is not None else None)
    return {"export_version": EXPORT_VERSION, "run": run, "rounds": rounds,
            "result": _result(info), "attempts": _attempts(info), "code": _code_parts(info),
            "notifications": (notifications(journal, info.run_id, private=False)
                              if journal is not None else []),
            "history": history(journal, info.run_id, private=False) if journal is not None else []}


# Where an attempt ran (host, pid, kernel) stays out of shared files, as the owner does.
_PRIVATE_ATTEMPT_KEYS = ("host", "pid", "kernel")


def _attempts(info: RunInfo) -> dict[str, Any]:
    """The run's executions, oldest first: ``{"dropped": N, "list": [...]}``."""
    kept = [{k: v for k, v in a.items() if k not in _PRIVATE_ATTEMPT_KEYS}
            for a in info.attempts or ()]
    for shown, attempt in zip(kept, info.attempts or ()):
        shown["words"] = attempts.describe(attempt, where=False)
    return {"dropped": info.attempts_dropped, "list": kept}


def _code_parts(info: RunInfo) -> list[dict[str, Any]]:
    """The code that produced the run, part by part: ``{"from_step", "attempt",
    "source"}``, a new part wherever the code that made the steps changed."""
    return [{"from_step": start, "attempt": attempt["n"] if attempt else None, "source": source,
             "started_at": attempt.get("started_at") if attempt else None}
            for start, attempt, source in attempts.step_sources(info)]


def _chat_request(entry: Any, run_id: str, journal: Journal | None,
                  seen: set[str]) -> dict[str, Any] | None:
    """What an LLM step was asked: its model, tools, and the messages new in this request
    (those an earlier request of the run sent are counted, not repeated). A Responses
    request's input items are shown as the chat messages they stand for."""
    stored = entry.request if isinstance(entry.request, dict) else None
    if stored is None or journal is None:
        return None
    def get_blob(digest: str) -> str | None:
        return journal.get_blob(run_id, digest)

    whole, refs = load_chat_request(entry.kind, stored, get_blob)
    items = request_items(entry.kind, whole)
    if refs is not None and len(refs) == len(items):
        new = [item for item, digest in zip(items, refs) if digest not in seen]
        seen.update(refs)
    else:
        new = items
    tools = whole.get("tools")
    names = tool_names(tools if isinstance(tools, list) else None)
    options = {k: v for k, v in whole.items()
               if k not in ("model", "messages", "input", "tools")}
    return {"model": whole.get("model"), "messages": len(items),
            "new_messages": [m for item in new for m in item_messages(entry.kind, item)],
            "tools": names, **({"options": options} if options else {})}


def _base(entry: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"position": entry.position, "kind": entry.kind, "name": entry.name,
                            "ok": entry.ok, "started_at": entry.started_at,
                            "duration": round(entry.duration, 6)}
    if entry.prompt_tokens or entry.completion_tokens:
        data["tokens"] = {"prompt": entry.prompt_tokens, "completion": entry.completion_tokens}
        dollars, estimated, unpriced = cost_of([entry])
        if not unpriced:
            data["cost"] = {"dollars": round(dollars, 8), "estimated": estimated,
                            "source": (entry.meta or {}).get("price_source")}
    if not entry.ok:
        data["error"] = entry.error
    return data


def _chat(entry: Any) -> dict[str, Any]:
    """An LLM step: the model's message and tool calls read from the journaled response."""
    data = _base(entry)
    data["model"] = entry.name
    response = _plain(entry.result) if entry.ok else None
    reply = llm_reply(entry.kind, response)
    if reply is None:
        if entry.ok:  # not an OpenAI chat completion or Response: show it as it is
            data["response"] = response
        return data
    data["content"] = reply["content"]
    if reply["refusal"]:
        data["refusal"] = reply["refusal"]
    data["finish_reason"] = reply["finish_reason"]
    data["tool_calls"] = [_tool_call(call) for call in reply["tool_calls"]]
    return data


def _tool_call(call: dict) -> dict[str, Any]:
    raw = call["arguments"]
    try:
        arguments = json.loads(raw) if raw else {}
    except ValueError:  # the model's JSON was invalid: show what it sent
        arguments = raw
    return {"id": call["id"], "name": call["name"], "arguments": arguments}


def _step(entry: Any, journal: Journal | None) -> dict[str, Any]:
    data = _base(entry)
    if entry.ok:
        data["result"] = _plain(entry.result)
    if entry.meta:
        data["meta"] = _plain(entry.meta)
    child_id = (entry.meta or {}).get("run_id") if entry.kind == "child" else None
    if child_id:
        child = journal.find_run(child_id) if journal is not None else None
        data["child"] = {"run_id": child_id} if child is None else {
            "run_id": child_id, "title": child.title, "status": str(child.status),
            "tokens": child.tokens, "steps": child.step_count}
    return data


def _pair_tool_calls(round_: dict[str, Any]) -> None:
    """Mark which step answered which tool call of the round's message.

    ``ctx.call_tools`` asks every approval first, then runs the approved calls, each step
    named after its tool, in call order; a rejected call never runs.
    """
    calls = (round_["chat"] or {}).get("tool_calls") or []
    to_decide = list(calls)
    rejected: list[dict] = []
    for step in round_["steps"]:
        if step["kind"] != "approval":
            continue
        call = next((c for c in to_decide if c["name"] == step["name"]), None)
        if call is not None:
            to_decide.remove(call)
            step["tool_call_id"] = call["id"]
            if not (step.get("result") or {}).get("approved"):
                rejected.append(call)
    to_run = [c for c in calls if c not in rejected]
    for step in round_["steps"]:
        if step["kind"] != "run":
            continue
        call = next((c for c in to_run if c["name"] == step["name"]), None)
        if call is not None:
            to_run.remove(call)
            step["tool_call_id"] = call["id"]


def _result(info: RunInfo) -> dict[str, Any]:
    def seconds(kind: str) -> float:
        return round(sum(e.duration for e in info.steps if e.kind == kind), 6)

    dollars, estimated, unpriced = cost_of(info.steps)
    end = info.finished_at or info.updated_at
    return {"status": str(info.status), "result": _plain(info.result), "error": info.error,
            "failed_step": info.failed_step, "pending_approval": info.pending_approval,
            "tokens": {"prompt": info.prompt_tokens, "completion": info.completion_tokens,
                       "total": info.tokens},
            "cost": {"dollars": round(info.cost or dollars, 8), "estimated": estimated,
                     "unpriced_models": unpriced, "max": info.max_cost,
                     "free": is_free(info.steps), "sources": price_sources(info.steps)},
            "replay": replay_savings(info.steps, "from the journal", "not spent again"),
            "timing": {"created_at": info.created_at, "updated_at": info.updated_at,
                       "finished_at": info.finished_at,
                       "elapsed": round(max(0.0, end - info.created_at), 6),
                       "model": seconds("chat"), "tools": seconds("run"),
                       "approval_wait": seconds("approval"), "steps": len(info.steps)}}


_plain = plain  # the name used below


# -- the notebook ------------------------------------------------------------------------------

def export_notebook(data: dict[str, Any]) -> nbformat.NotebookNode:
    """The notebook telling the run in ``data`` (from :func:`export_data`); valid under
    ``nbformat.validate``, without outputs."""
    nbf = md.nbformat()
    markdown_cell, code_cell = md.markdown_cell, nbf.v4.new_code_cell
    run = data["run"]
    parts = [part for part in data.get("code", _legacy_code(run)) if part["source"]]
    cells = [markdown_cell(_title_md(run, data["result"], len(parts)),
                           metadata={"durable_nb": run})]
    history = data.get("attempts") or {}
    if len(history.get("list") or ()) > 1 or history.get("dropped"):
        cells.append(markdown_cell(_attempts_md(history), metadata={"durable_nb": history}))
    if parts and parts[0]["from_step"] == 0:
        first = parts.pop(0)
        cells.append(code_cell(first["source"], metadata={"durable_nb": {
            "source_of": run["run_id"], "from_step": 0, "attempt": first["attempt"]}}))

    def code_changed(position: int) -> list:
        """The cells of the code parts that start at or before ``position``."""
        changed = []
        while parts and parts[0]["from_step"] <= position:
            part = parts.pop(0)
            changed += [markdown_cell(_code_change_md(part)),
                        code_cell(part["source"], metadata={"durable_nb": {
                            "source_of": run["run_id"], "from_step": part["from_step"],
                            "attempt": part["attempt"]}})]
        return changed

    for round_ in data["rounds"]:
        summary = {k: v for k, v in round_.items() if k != "steps"}
        if round_["chat"] is not None:
            cells += code_changed(round_["chat"]["position"])
        cells.append(markdown_cell(_round_md(round_), metadata={"durable_nb": summary}))
        for step in round_["steps"]:
            cells += code_changed(step["position"])
            cells.append(markdown_cell(_step_md(step), metadata={"durable_nb": step}))
    # What was done about its approvals, then how the run ended: the result cell is last.
    if data.get("notifications"):
        cells.append(markdown_cell(_notifications_md(data["notifications"]),
                                   metadata={"durable_nb": {"notifications":
                                                            data["notifications"]}}))
    if data.get("history"):
        cells.append(markdown_cell(_history_md(data["history"]),
                                   metadata={"durable_nb": {"history": data["history"]}}))
    cells.append(markdown_cell(_result_md(data["result"]),
                               metadata={"durable_nb": data["result"]}))
    nb = nbf.v4.new_notebook(cells=cells, metadata={
        **md.KERNEL_METADATA,
        "durable_nb": {"export_version": data["export_version"], "run_id": run["run_id"]}})
    nbf.validate(nb)
    return nb


def _legacy_code(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The code parts of an export made before they were listed: the run's source."""
    return [{"from_step": 0, "attempt": None, "source": run.get("source"), "started_at": None}]


def _attempts_md(history: dict[str, Any]) -> str:
    lines = ["## Attempts", "", "Each execution of the run, oldest first:", ""]
    if history.get("dropped"):
        lines += [f"- ({history['dropped']} earlier attempts not kept)"]
    lines += [f"- {attempt['words']}" for attempt in history.get("list") or ()]
    return "\n".join(lines)


def _code_change_md(part: dict[str, Any]) -> str:
    when = f", {format_time(part['started_at'])}" if part.get("started_at") else ""
    who = f" (attempt {part['attempt']}{when})" if part.get("attempt") else ""
    return (f"**The code changed here**{who}: the steps from step {part['from_step']} on "
            f"were made by the cell below (not executed here).")


def _title_md(run: dict[str, Any], result: dict[str, Any], code_parts: int = 1) -> str:
    money = _money(result["cost"])
    lines = [f"# {run['title'] or run['run_id']}", "",
             f"Durable run {md.code(run['run_id'])}, exported from its journal.", ""]
    if run.get("goal"):
        goal = run["goal"] if isinstance(run["goal"], str) else md.json_text(run["goal"])
        lines += ["**Goal** (the first user message):", "", _quote(goal), ""]
    lines += [f"- status: **{run['status']}**",
              f"- created: {format_time(run['created_at'])}, last update: "
              f"{format_time(run['updated_at'])} (local time, {utc_offset(run['created_at'])})",
              f"- LLM calls: {run['iteration']}"
              + (f" (limit {run['max_iterations']})" if run["max_iterations"] else ""),
              f"- tokens: {run['prompt_tokens']} prompt + {run['completion_tokens']} completion"
              + (f" (limit {run['max_tokens']})" if run["max_tokens"] else ""),
              f"- cost: {money}" + (f" (limit {format_cost(run['max_cost'])})"
                                    if run.get("max_cost") else ""),
              f"- steps: {result['timing']['steps']}; a re-run replays {result['replay']}"]
    if run["parent"]:
        lines.append(f"- child of run {md.code(run['parent'])}")
    if code_parts > 1:
        lines += ["", "The code changed while the run went on: each code cell stands before "
                      "the steps it made (not executed here)."]
    elif code_parts:
        lines += ["", "The cell below is the code that ran it (not executed here)."]
    return "\n".join(lines)


def _money(cost: dict[str, Any]) -> str:
    """``$0.0021``; ``unknown (no price known for M)`` when nothing could be priced."""
    unpriced = cost["unpriced_models"]
    if unpriced and not cost["dollars"]:
        return f"unknown (no price known for {', '.join(unpriced)})"
    text = "free" if cost.get("free") else format_cost(cost["dollars"],
                                                         estimated=cost["estimated"])
    text += f" (no price known for {', '.join(unpriced)})" if unpriced else ""
    return text + (f" (prices: {'; '.join(cost['sources'])})" if cost.get("sources") else "")


def _quote(text: str) -> str:
    return "\n".join("> " + line if line else ">" for line in str(text).splitlines() or [""])


def _message_md(message: Any) -> list[str]:
    if not isinstance(message, dict):
        return [md.fence(md.json_text(message), "json"), ""]
    role = str(message.get("role", "?"))
    content = message.get("content")
    lines = [f"*{role}*" + (f" (answering {md.code(message['tool_call_id'])})"
                            if message.get("tool_call_id") else "") + ":", ""]
    if isinstance(content, str) and content:
        lines += [_quote(content) if role in ("system", "user") else md.fence(content, "text"), ""]
    elif content:
        lines += [md.fence(md.json_text(content), "json"), ""]
    for call in message.get("tool_calls") or []:
        function = (call or {}).get("function") or {}
        lines += [f"- calls {md.code(function.get('name'))}", ""]
    return lines


def _round_md(round_: dict[str, Any]) -> str:
    chat = round_["chat"]
    if chat is None:
        return "## Before the first model call"
    cost = chat.get("cost")
    lines = [f"## Round {round_['round']}", "",
             f"Model {md.code(chat['model'])}, step {chat['position']}, {md.duration(chat['duration'])}"
             + (f", {chat['tokens']['prompt']} + {chat['tokens']['completion']} tokens"
                if "tokens" in chat else "")
             + (f", {format_cost(cost['dollars'], estimated=cost['estimated'])}"
                if cost and cost["dollars"] else "")]
    request = chat.get("request")
    if request:
        new = request["new_messages"]
        earlier = request["messages"] - len(new)
        lines += ["", f"**Prompt**: {request['messages']} messages"
                  + (f" ({earlier} sent before, {len(new)} new)" if earlier else "")
                  + (f"; tools {', '.join(md.code(t) for t in request['tools'])}"
                     if request["tools"] else "") + ".", ""]
        for message in new:
            lines += _message_md(message)
    if not chat["ok"]:
        lines += ["", _error_md(chat["error"])]
    if chat.get("content"):
        content = chat["content"]
        lines += ["", "**Assistant:**", "",
                  content if isinstance(content, str) else md.fence(md.json_text(content), "json")]
    if chat.get("refusal"):
        lines += ["", f"**Refusal:** {chat['refusal']}"]
    if chat.get("tool_calls"):
        lines += ["", "**Tool calls:**", ""]
        for call in chat["tool_calls"]:
            lines += [f"- {md.code(call['name'])} ({md.code(call['id'])})", "",
                      md.fence(md.json_text(call["arguments"]), "json"), ""]
    if "response" in chat:
        lines += ["", "**Response:**", "", md.fence(md.json_text(chat["response"]), "json")]
    return "\n".join(lines).rstrip()


def _step_md(step: dict[str, Any]) -> str:
    kind, name = step["kind"], step["name"]
    when = f"step {step['position']}, {md.duration(step['duration'])}"
    result = step.get("result")
    body: list[str] = []
    if kind == "run":
        head = (f"**Tool {md.code(name)}** (call {md.code(step['tool_call_id'])})"
                if "tool_call_id" in step else f"**Step {md.code(name)}**")
        body = ["", md.value_md(result)] if step["ok"] else []
    elif kind == "approval":
        head = f"**Approval {md.code(name)}**"
        if step["ok"] and isinstance(result, dict):
            note = f": {result['note']}" if result.get("note") else ""
            head += f": {md.text(verdict_words(result) + note)}"
        details = (step.get("meta") or {}).get("details")
        if details is not None:
            body = ["", "Details:", "", md.fence(md.json_text(details), "json")]
        if isinstance(result, dict) and result.get("args") is not None:
            body += ["", "Edited arguments (the tool ran with these):", "",
                     md.fence(md.json_text(result["args"]), "json")]
        if isinstance(result, dict) and result.get("message"):
            body += ["", "Message to the model:", "", md.fence(str(result["message"]), "text")]
        if isinstance(result, dict) and isinstance(result.get("answer"), dict):
            body += ["", f"Answer to the server: {result['answer'].get('action')}", "",
                     md.fence(md.json_text(result["answer"].get("content") or {}), "json")]
        for earlier in (step.get("meta") or {}).get("replaced") or ():  # --replace, in order
            body += ["", f"Replacing: {verdict_words(earlier)}"]
        when = f"step {step['position']}, waited {md.duration(step['duration'])}"
    elif kind == "compact":
        meta = step.get("meta") or {}
        sizes = f"{meta.get('tokens_before', '?')} → {meta.get('tokens_after', '?')} tokens"
        if meta.get("skipped"):
            head = (f"**Compaction skipped**: the summary would not have shrunk the "
                    f"conversation ({sizes}); the messages were kept as they were")
        else:
            head = f"**Context compacted**: {sizes}"
            if isinstance(result, dict) and "rounds_summarised" in result:
                head += f", {result['rounds_summarised']} rounds summarised"
        if meta.get("summary_truncated"):
            head += " (the summary was cut at its token cap: the server ignored it)"
        summary = result.get("summary") if isinstance(result, dict) else result
        if summary is not None:
            body = ["", "Summary:", "", summary if isinstance(summary, str)
                    else md.fence(md.json_text(summary), "json")]
    elif kind == "child":
        child = step.get("child") or {}
        head = f"**Child run {md.code(child.get('run_id', name))}** ({md.code(name)})"
        if "status" in child:
            head += f": {child['status']}, {child['steps']} steps, {child['tokens']} tokens"
        if child:
            body = ["", f"Its own story: `durable-nb export {child['run_id']} --to child.ipynb`"]
        if step["ok"]:
            body += ["", md.value_md(result)]
    elif kind == "state":
        change = result if isinstance(result, dict) else {}
        head = (f"**State** {md.code(name)} deleted" if "delete" in change and "set" not in change
                else f"**State** {md.code(name)} set")
        if "set" in change:
            body = ["", md.value_md(change["set"])]
    elif kind in ("now", "uuid", "random", "sleep") and step["ok"]:
        value = result.get("until") if kind == "sleep" and isinstance(result, dict) else result
        timed = kind in ("now", "sleep") and isinstance(value, (int, float))
        shown = format_time(value) if timed else md.code(str(value))
        head = f"**{kind.capitalize()}**: " + ("until " if kind == "sleep" else "") + shown
    else:  # a kind this exporter does not know yet: show what the journal holds
        head = f"**{kind} step {md.code(name)}**"
        body = (["", md.value_md(result)] if step["ok"] else []) + (
            ["", "Meta:", "", md.fence(md.json_text(step["meta"]), "json")] if step.get("meta") else [])
    lines = [f"{head} — {when}" + (f", {step['tokens']['prompt']} + "
                                   f"{step['tokens']['completion']} tokens"
                                   if "tokens" in step else "")]
    if not step["ok"]:
        lines += ["", _error_md(step.get("error"))]
    return "\n".join(lines + body)


def _result_md(result: dict[str, Any]) -> str:
    timing, tokens = result["timing"], result["tokens"]
    cost = result["cost"]
    lines = ["## Result", "", f"- status: **{result['status']}**",
             f"- tokens: {tokens['prompt']} prompt + {tokens['completion']} completion "
             f"= {tokens['total']}",
             f"- cost: {_money(cost)}",
             f"- a re-run replays {result['replay']}",
             f"- time: {md.duration(timing['elapsed'])} from creation to "
             f"{'the end' if timing.get('finished_at') else 'last update'}; "
             f"model {md.duration(timing['model'])}, tools {md.duration(timing['tools'])}, "
             f"waiting for approval {md.duration(timing['approval_wait'])}"]
    if result["error"]:
        lines.append(f"- error: {result['error']}"
                     + (f" (step {result['failed_step']})" if result["failed_step"] is not None
                        else ""))
    if result["pending_approval"]:
        lines.append(f"- waiting for approval of "
                     f"{md.code(str(result['pending_approval'].get('name')))}")
    if result["result"] is not None:
        lines += ["", md.value_md(result["result"])]
    return "\n".join(lines)


def _notifications_md(rows: list[dict[str, Any]]) -> str:
    lines = ["## Notifications", ""]
    for row in rows:
        attempts = row.get("attempts") or []
        errors = [a.get("error") for a in attempts if not a.get("ok")]
        lines.append(f"- {row.get('channel')}: **{row.get('state')}**, request "
                     f"{md.code(str(row.get('digest', ''))[:12])} ({md.code(str(row.get('name')))}), "
                     f"{len(attempts)} attempt{'' if len(attempts) == 1 else 's'}"
                     + (f"; last error: {errors[-1]}" if errors else ""))
    return "\n".join(lines)


def _history_md(events: list[dict[str, Any]]) -> str:
    lines = ["## History", ""]
    lines += [f"- {format_time(e.get('at'), '?')} **{e.get('kind')}**: "
              f"{md.text(str(e.get('text', '')))}"
              for e in events]
    return "\n".join(lines)


def _error_md(error: dict | None) -> str:
    error = error or {}
    return (f"**Failed**: {md.code(str(error.get('type', 'error')))}: {error.get('message', '')}"
            + (" (terminal)" if error.get("terminal") else ""))
