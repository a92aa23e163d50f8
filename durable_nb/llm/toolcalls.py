"""``ctx.call_tools``: run the tool calls of one assistant message (Chat Completions) or of
one response (the ``function_call`` output items of the Responses API) as journaled steps."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..execution import Execution, canonical
from .tools import Tool, parse_arguments, tool

__all__ = ["call_tools", "function_call_output", "rejection_text", "tool_message"]


def _field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def _as_tools(tools: Iterable[Tool | Callable[..., Any]] | Mapping[str, Any]) -> dict[str, Tool]:
    items = tools.values() if isinstance(tools, Mapping) else tools
    made = [t if isinstance(t, Tool) else tool(t) for t in items]
    return {t.name: t for t in made}


def tool_message(call_id: str, content: Any) -> dict[str, str]:
    """A ``tool`` role message answering ``call_id``; non-text content is sent as JSON."""
    if not isinstance(content, str):
        content = json.dumps(content, default=str, ensure_ascii=False)
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def function_call_output(call_id: str, content: Any) -> dict[str, str]:
    """A Responses API ``function_call_output`` input item answering ``call_id``; non-text
    content is sent as JSON."""
    if not isinstance(content, str):
        content = json.dumps(content, default=str, ensure_ascii=False)
    return {"type": "function_call_output", "call_id": call_id, "output": content}


def _calls(message: Any) -> tuple[list[tuple[Any, str, Any]], bool]:
    """((call id, tool name, arguments) of each call, whether they are Responses items).

    ``message``: an assistant message (its ``tool_calls``), a ChatCompletion (its first
    choice's message), a Response (its ``function_call`` output items) or a list of
    Responses output items."""
    if isinstance(message, (list, tuple)):
        items, responses = message, True
    elif _field(message, "tool_calls") is None and _field(message, "output") is not None:
        items, responses = _field(message, "output"), True
    else:
        choices = _field(message, "choices")
        if choices and _field(message, "message") is None:
            message = _field(choices[0], "message")
        items, responses = _field(message, "tool_calls") or [], False
    if responses:
        return [(_field(item, "call_id"), _field(item, "name") or "", _field(item, "arguments"))
                for item in items if _field(item, "type") == "function_call"], True
    calls = []
    for call in items:
        function = _field(call, "function")
        calls.append((_field(call, "id"), _field(function, "name") or "",
                      _field(function, "arguments")))
    return calls, False


def _prepare(execution: Execution, name: str, arguments: Any, by_name: dict[str, Tool]
             ) -> tuple[Any, str | None]:
    """Check one call; returns (what to run, None) or (None, an error text for the model)."""
    chosen = by_name.get(name)
    if chosen is None:
        return None, (f"error: there is no tool named {name!r}. Available tools: "
                      f"{', '.join(sorted(by_name)) or 'none'}.")
    try:
        args = chosen.validate(parse_arguments(chosen, arguments or ""))
    except ValueError as exc:
        return None, f"error: {exc}"
    if chosen.requires_approval(args):
        decision = execution.approval(name, {"tool": name, "arguments": args},
                                      chosen.approval_policy, chosen.approvers,
                                      schema=chosen.parameters)
        if not decision["approved"]:
            return None, rejection_text(name, decision)
        if decision.get("args") is not None:  # approved with edited arguments
            args = dict(decision["args"])
    return (chosen, args), None


def rejection_text(name: str, decision: Mapping[str, Any]) -> str:
    """What the model receives for a rejected call to tool ``name``: the person's message
    when they gave one (``reject(run, message=...)``), else the standard refusal."""
    if decision.get("message"):
        return str(decision["message"])
    note = f" Their note: {decision['note']}" if decision.get("note") else ""
    return (f"The user rejected this call to {name} (decided by "
            f"{decision.get('by')}).{note} Do not retry it unless the user asks.")


def _run(ctx: Any, chosen: Tool, args: dict[str, Any]) -> Callable[[], Any]:
    fn = (lambda **kw: chosen.fn(ctx, **kw)) if chosen.takes_ctx else chosen.fn
    return lambda: fn(**args)


def call_tools(execution: Execution, ctx: Any, message: Any, tools: Any, *,
               parallel: bool = False) -> list[dict[str, str]]:
    """Run every tool call of ``message`` and return the answers, in call order: ``tool``
    messages for an assistant message (or a ChatCompletion), ``function_call_output`` items
    for a Response (or a list of its output items).

    Each call is one journaled step named after its tool (approval first where the tool
    needs one; a rejection becomes an answer telling the model so). A call the model
    got wrong (unknown tool, arguments that are not JSON or do not fit the schema) and a
    tool that raises become error messages for the model, not a crash; a
    :class:`~durable_nb.errors.TerminalError` from a tool fails the run, live and on replay
    alike. With ``parallel`` the calls run concurrently; each takes the key of its place in
    the call order, so a replay matches. ``ctx`` is handed to tools that take one.
    """
    by_name = _as_tools(tools)
    calls, responses = _calls(message)
    answer = function_call_output if responses else tool_message
    prepared = [_prepare(execution, name, arguments, by_name) for _, name, arguments in calls]
    steps = [(chosen.name, _run(ctx, chosen, args), {"arguments": canonical(args)})
             for (todo, _) in prepared if todo for chosen, args in [todo]]
    outcomes = iter(execution.steps_in_order("run", steps, parallel=parallel))
    messages = []
    for (call_id, _, _), (todo, error) in zip(calls, prepared):
        if todo is None:
            messages.append(answer(call_id, error))
            continue
        ok, value = next(outcomes)
        messages.append(answer(call_id, value if ok else
                               f"error: the tool raised {type(value).__name__}: {value}"))
    return messages
