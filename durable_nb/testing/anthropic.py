"""The loopback server's Anthropic Messages API (``POST /v1/messages``): a request read as
the chat messages the scripts answer, and the answer in the Messages API's shape, so that a
client speaking that protocol (Pydantic AI's ``AnthropicModel``, the ``anthropic`` SDK) is
served from the same scripts as the OpenAI endpoints, round by round (one round per assistant
message in the request), whole or streamed (``"stream": true``: the Messages API's events)."""

from __future__ import annotations

import json
from typing import Any, Iterator

from .quirks import Quirks
from .replies import Answer
from .requests import Invalid

__all__ = ["ENDPOINT", "as_chat", "events", "message", "validate_messages"]

#: The name of the endpoint in the server's counters.
ENDPOINT = "messages"


def validate_messages(body: Any) -> None:
    """Raise :class:`Invalid` (answered 400) for what the Messages API refuses too."""
    if not isinstance(body, dict):
        raise Invalid("The request body must be a JSON object.")
    for field in ("model", "max_tokens", "messages"):
        if field not in body:
            raise Invalid(f"{field}: Field required", param=field)
    if not isinstance(body["messages"], list) or not body["messages"]:
        raise Invalid("messages: at least one message is required", param="messages")
    for i, m in enumerate(body["messages"]):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise Invalid(f"messages.{i}.role: Input should be 'user' or 'assistant'",
                          param=f"messages.{i}.role")


def _blocks(content: Any) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or [] if isinstance(b, dict)]


def _text(content: Any) -> str:
    return "".join(b.get("text", "") for b in _blocks(content) if b.get("type") == "text")


def as_chat(body: dict) -> tuple[list[dict], list[dict] | None]:
    """The request's messages and tools as chat-completions messages and tools."""
    chat: list[dict] = []
    system = body.get("system")
    if system:
        chat.append({"role": "system", "content": _text(system)})
    for m in body["messages"]:
        blocks = _blocks(m.get("content"))
        if m["role"] == "assistant":
            calls = [{"id": b.get("id"), "type": "function",
                      "function": {"name": b.get("name"),
                                   "arguments": json.dumps(b.get("input") or {})}}
                     for b in blocks if b.get("type") == "tool_use"]
            message: dict[str, Any] = {"role": "assistant", "content": _text(blocks) or None}
            if calls:
                message["tool_calls"] = calls
            chat.append(message)
            continue
        for b in blocks:
            if b.get("type") == "tool_result":
                chat.append({"role": "tool", "tool_call_id": b.get("tool_use_id"),
                             "content": _text(b.get("content"))})
        text = _text(blocks)
        if text:
            chat.append({"role": "user", "content": text})
    tools = [{"type": "function", "function": {"name": t.get("name"),
                                               "description": t.get("description", ""),
                                               "parameters": t.get("input_schema") or {}}}
             for t in body.get("tools") or [] if isinstance(t, dict) and "name" in t]
    return chat, tools or None


def message(a: Answer, model: str, quirks: Quirks | None = None) -> dict:
    """The answer as a Messages API ``message``; with ``quirks.no_usage``, its usage counts
    nothing (zeros: the API's client requires the field)."""
    content: list[dict] = []
    if a.reply.content:
        content.append({"type": "text", "text": a.reply.content})
    for cid, call in zip(a.call_ids, a.reply.tool_calls):
        arguments = json.loads(call.arguments_json) if call.arguments_json else {}
        content.append({"type": "tool_use", "id": cid.replace("call_", "toolu_"),
                        "name": call.name, "input": arguments})
    no_usage = quirks is not None and quirks.no_usage
    stop = "max_tokens" if a.truncated else ("tool_use" if a.reply.tool_calls else "end_turn")
    return {"id": f"msg_{a.digest}", "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": 0 if no_usage else a.prompt_tokens,
                      "output_tokens": 0 if no_usage else a.completion_tokens,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}


def events(a: Answer, model: str, quirks: Quirks | None = None
           ) -> Iterator[tuple[str, dict]]:
    """The answer as the Messages API's server-sent events (name, data): the message, then
    each content block (text in pieces, a tool call's input as one JSON delta), the stop."""
    whole = message(a, model, quirks)
    start = dict(whole, content=[], stop_reason=None,
                 usage=dict(whole["usage"], output_tokens=min(1, whole["usage"]["output_tokens"])))
    yield "message_start", {"type": "message_start", "message": start}
    for index, block in enumerate(whole["content"]):
        if block["type"] == "text":
            head, deltas = {"type": "text", "text": ""}, [
                {"type": "text_delta", "text": piece} for piece in _pieces(block["text"])]
        else:
            head = dict(block, input={})
            deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block["input"])}]
        yield "content_block_start", {"type": "content_block_start", "index": index,
                                      "content_block": head}
        for delta in deltas:
            yield "content_block_delta", {"type": "content_block_delta", "index": index,
                                          "delta": delta}
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    yield "message_delta", {"type": "message_delta",
                            "delta": {"stop_reason": whole["stop_reason"], "stop_sequence": None},
                            "usage": {"output_tokens": whole["usage"]["output_tokens"]}}
    yield "message_stop", {"type": "message_stop"}


def _pieces(text: str, n: int = 3) -> list[str]:
    size = max(1, -(-len(text) // n))
    return [text[i:i + size] for i in range(0, len(text), size)]
