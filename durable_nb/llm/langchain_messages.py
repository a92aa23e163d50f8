"""LangChain's messages as a LangGraph integration's ``model`` step journals them, read as chat
messages, for people and for traces: a request's messages (``{"type", "content",
"tool_calls", "tool_call_id"}``) and a result's ``generations``. Data only: LangChain need not
be installed to read a journal that holds them."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["is_langchain_message", "langchain_messages", "langchain_reply"]

_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}


def is_langchain_message(item: Any) -> bool:
    """Whether ``item`` is a journaled LangChain message (not a Pydantic AI one)."""
    return isinstance(item, dict) and item.get("type") in _ROLES and "kind" not in item


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content blocks: their text
        return "".join(p if isinstance(p, str) else str(p.get("text") or "")
                       for p in content if isinstance(p, (str, dict)))
    return "" if content is None else json.dumps(content, default=str)


def langchain_messages(item: Any) -> list[dict[str, Any]]:
    """One journaled LangChain message as chat messages (none if it is not one)."""
    if not is_langchain_message(item):
        return []
    message: dict[str, Any] = {"role": _ROLES[item["type"]], "content": _text(item.get("content"))}
    calls = [{"id": c.get("id"), "type": "function",
              "function": {"name": c.get("name"), "arguments": json.dumps(c.get("args") or {})}}
             for c in item.get("tool_calls") or [] if isinstance(c, dict)]
    if calls:
        message["tool_calls"] = calls
    if item.get("tool_call_id"):
        message["tool_call_id"] = item["tool_call_id"]
    return [message]


def langchain_reply(result: Any) -> dict[str, Any] | None:
    """A journaled ``LLMResult`` (its first generation) as ``{"content", "refusal",
    "finish_reason", "tool_calls"}``, the tool calls as ``{"id", "name", "arguments"}``; None
    if it is not one."""
    try:
        data = result["generations"][0][0]["message"]["data"]
    except (KeyError, IndexError, TypeError):
        return None
    metadata = data.get("response_metadata") or {}
    return {"content": _text(data.get("content")), "refusal": None,
            "finish_reason": metadata.get("finish_reason") or metadata.get("stop_reason"),
            "tool_calls": [{"id": c.get("id"), "name": c.get("name"),
                            "arguments": json.dumps(c.get("args") or {})}
                           for c in data.get("tool_calls") or [] if isinstance(c, dict)]}
