"""Pydantic AI's serialized messages (what a ``model`` step journals: ``ModelRequest`` and
``ModelResponse`` as JSON data) read as chat messages, for people and for token estimates.
Data only: Pydantic AI need not be installed to read a journal that holds them."""

from __future__ import annotations

import json
from typing import Any

from .langchain_messages import is_langchain_message, langchain_messages, langchain_reply

__all__ = ["model_messages", "model_reply"]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # a user prompt of parts: its text parts
        return "".join(p if isinstance(p, str) else str(p.get("content") or "")
                       for p in content if isinstance(p, (str, dict)))
    return json.dumps(content, default=str) if content is not None else ""


def _arguments(args: Any) -> str:
    return args if isinstance(args, str) else json.dumps(args or {})


def model_messages(item: Any) -> list[dict[str, Any]]:
    """One serialized Pydantic AI message as chat messages: a request's instructions, system
    and user prompts and tool returns; a response as one assistant message with its text and
    tool calls. A LangChain message (the LangGraph integration's ``model`` steps) likewise."""
    if is_langchain_message(item):
        return langchain_messages(item)
    if not isinstance(item, dict):
        return []
    parts = [p for p in item.get("parts") or [] if isinstance(p, dict)]
    if item.get("kind") == "response":
        text = "".join(str(p.get("content") or "") for p in parts if p.get("part_kind") == "text")
        calls = [{"id": p.get("tool_call_id"), "type": "function",
                  "function": {"name": p.get("tool_name"), "arguments": _arguments(p.get("args"))}}
                 for p in parts if p.get("part_kind") == "tool-call"]
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            message["tool_calls"] = calls
        return [message]
    out: list[dict[str, Any]] = []
    if item.get("instructions"):
        out.append({"role": "system", "content": str(item["instructions"])})
    for p in parts:
        kind = p.get("part_kind")
        if kind == "system-prompt":
            out.append({"role": "system", "content": _text(p.get("content"))})
        elif kind == "user-prompt":
            out.append({"role": "user", "content": _text(p.get("content"))})
        elif kind in ("tool-return", "retry-prompt"):
            out.append({"role": "tool", "tool_call_id": p.get("tool_call_id"),
                        "content": _text(p.get("content"))})
    return out


def model_reply(response: Any) -> dict[str, Any] | None:
    """A journaled ``ModelResponse`` (or an older streamed result holding one under
    ``response``) as ``{"content", "refusal", "finish_reason", "tool_calls"}``, the tool calls
    as ``{"id", "name", "arguments"}``; None if it is not one. A LangChain ``LLMResult``
    likewise."""
    if isinstance(response, dict) and "generations" in response:
        return langchain_reply(response)
    if isinstance(response, dict) and isinstance(response.get("response"), dict):
        response = response["response"]
    if not isinstance(response, dict) or response.get("kind") != "response":
        return None
    message = model_messages(response)[0]
    calls = [{"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
             for c in message.get("tool_calls", [])]
    return {"content": message["content"], "refusal": None,
            "finish_reason": response.get("finish_reason"), "tool_calls": calls}
