"""What the loopback server sends: a reply counted and cut to the request's token cap, as a
chat completion (or its chunks) or a Responses object (or its events), and the error bodies
of the real API and of real local servers."""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from ..llm.tokens import context_window, encoding_for
from .quirks import Quirks
from .requests import text_of
from .scripts import Reply, ToolCall

__all__ = ["CONTENT_VALIDATION_FAILURE", "LOADING_BODY", "TEMPLATE_FAILURE", "Answer",
           "cap_reply", "chunks", "completion", "default_failure", "digest_of", "error_body",
           "output_items", "response", "response_events", "summary_text"]

# --- token counting -------------------------------------------------------------------

def _encode(model: str, text: str) -> list[int]:
    return encoding_for(model).encode(text, disallowed_special=())


def _completion_tokens(model: str, content: str | None, tool_calls: Sequence[ToolCall]) -> int:
    """Completion tokens: the reply text plus each tool call's name and JSON arguments."""
    return len(_encode(model, content or "")) + sum(
        len(_encode(model, call.name + call.arguments_json)) for call in tool_calls)


def cap_reply(model: str, reply: Reply, cap: int | None) -> tuple[Reply, int, bool]:
    """(reply, completion tokens, truncated): the reply cut to ``cap`` tokens, generated in
    order (text, then each call's name and arguments), like a model stopped at the cap."""
    full = _completion_tokens(model, reply.content, reply.tool_calls)
    if cap is None or full <= cap:
        return reply, full, False
    decode = encoding_for(model).decode
    budget = cap
    content = None
    if reply.content is not None:
        tokens = _encode(model, reply.content)
        content = decode(tokens[:budget])
        budget -= min(budget, len(tokens))
    calls = []
    for call in reply.tool_calls:
        if budget == 0:
            break
        tokens = _encode(model, call.name + call.arguments_json)
        text = decode(tokens[:budget])
        budget -= min(budget, len(tokens))
        arguments = text[len(call.name):] if text.startswith(call.name) else ""
        calls.append(ToolCall(call.name, arguments))
    return Reply(content=content, tool_calls=calls, delay=reply.delay), cap, True


def summary_text(messages: list[dict]) -> str:
    tools = [c.get("function", {}).get("name", "?")
             for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    first_user = next((text_of(m.get("content")) for m in messages if m["role"] == "user"), "")
    return (f"Summary of {len(messages)} messages: the user asked {first_user[:80]!r}; "
            f"tools called: {', '.join(tools) or 'none'}.")


def digest_of(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def _pieces(text: str, n: int = 3) -> list[str]:
    """Split text into about n non-empty pieces that join back to it."""
    size = max(1, -(-len(text) // n))
    return [text[i:i + size] for i in range(0, len(text), size)]


def _token_pieces(text: str, model: str) -> list[str]:
    """Split text into its tokens (a character of several tokens stays whole)."""
    enc = encoding_for(model)
    pieces, pending = [], b""
    for token in enc.decode_tokens_bytes(enc.encode(text, disallowed_special=())):
        pending += token
        try:
            pieces.append(pending.decode("utf-8"))
        except UnicodeDecodeError:
            continue
        pending = b""
    return pieces


@dataclass(frozen=True)
class Answer:
    """What one request is answered with, before it is put in the endpoint's shape; the ids
    are derived from the request (``digest``), so the same request gets the same answer."""

    kind: str  # "chat" or "summary"
    round: int
    reply: Reply  # cut to the cap when truncated
    call_ids: tuple[str, ...]
    digest: str
    prompt_tokens: int
    completion_tokens: int
    truncated: bool

    @property
    def finish_reason(self) -> str:
        if self.truncated:
            return "length"
        return "tool_calls" if self.reply.tool_calls else "stop"

    @property
    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}


def error_body(message: str, type_: str, param: str | None = None,
                code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


_FAILURE_MESSAGES = {
    408: ("Request timed out (injected by the loopback server).", "timeout", None),
    409: ("Conflict with a concurrent request (injected by the loopback server).",
          "invalid_request_error", "conflict"),
    429: ("Rate limit reached (injected by the loopback server).", "requests", "rate_limit_exceeded"),
    502: ("Bad gateway (injected by the loopback server).", "server_error", None),
    503: ("The server is overloaded or not ready yet (injected by the loopback server).",
          "server_error", None),
    504: ("Gateway timeout (injected by the loopback server).", "server_error", None),
}


def default_failure(status: int, endpoint: str, answer: Answer, model: str) -> dict:
    if status == 400:  # the real API's own wording, with this request's numbers
        if endpoint == "responses":
            return error_body("Your input exceeds the context window of this model. Please "
                               "adjust your input and try again.", "invalid_request_error",
                               "input", "context_length_exceeded")
        return error_body(f"This model's maximum context length is {context_window(model)} "
                           f"tokens. However, your messages resulted in {answer.prompt_tokens} "
                           f"tokens. Please reduce the length of the messages.",
                           "invalid_request_error", "messages", "context_length_exceeded")
    message, type_, code = _FAILURE_MESSAGES.get(status, (
        f"The server had an error while processing your request (injected status {status}).",
        "server_error", None))
    return error_body(message, type_, None, code)


LOADING_BODY = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
# llama-cpp-python's answer when chatml's template (jinja2, StrictUndefined) meets an
# assistant message without 'content'.
TEMPLATE_FAILURE = error_body("'dict object' has no attribute 'content'", "internal_server_error")
# Its answer (pydantic, shortened) to an assistant message whose content is null.
CONTENT_VALIDATION_FAILURE = error_body(
    "1 validation error:\n  {'type': 'string_type', 'loc': ('body', 'messages', 1, "
    "'ChatCompletionRequestAssistantMessage', 'content'), 'msg': 'Input should be a valid "
    "string', 'input': None}\n\n  File \"llama_cpp/server/app.py\", line 376, in "
    "create_chat_completion\n    POST /v1/chat/completions", "internal_server_error")


# --- chat completions -------------------------------------------------------------------

# What a chat reply (and each of its chunks) leaves out under Quirks.sparse_replies.
_SPARSE_CHAT_FIELDS = ("created", "system_fingerprint", "refusal", "logprobs")


def _sparse(data: dict) -> dict:
    """``data`` (a completion, a chunk, or a part of one) without the fields
    ``Quirks.sparse_replies`` leaves out, at every depth."""
    return {k: _sparse(v) if isinstance(v, dict) else
            [_sparse(x) if isinstance(x, dict) else x for x in v] if isinstance(v, list) else v
            for k, v in data.items() if k not in _SPARSE_CHAT_FIELDS}


def completion(a: Answer, model: str, quirks: Quirks) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": a.reply.content, "refusal": None}
    if a.reply.tool_calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function",
             "function": {"name": call.name, "arguments": call.arguments_json}}
            for cid, call in zip(a.call_ids, a.reply.tool_calls)]
    completion = {
        "id": f"chatcmpl-{a.digest}", "object": "chat.completion", "created": int(time.time()),
        "model": model, "system_fingerprint": "loopback",
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": a.finish_reason}],
        "usage": a.usage}
    if quirks.no_usage:
        del completion["usage"]
    return _sparse(completion) if quirks.sparse_replies else completion


def chunks(a: Answer, model: str, include_usage: bool, quirks: Quirks) -> Iterator[dict]:
    created = int(time.time())
    include_usage = include_usage and not (quirks.no_stream_usage or quirks.no_usage)
    separate_usage = quirks.final_empty_choices_usage

    def chunk(delta: dict, finish_reason: str | None = None) -> dict:
        c: dict[str, Any] = {
            "id": f"chatcmpl-{a.digest}", "object": "chat.completion.chunk", "created": created,
            "model": model, "system_fingerprint": "loopback",
            "choices": [{"index": 0, "delta": delta, "logprobs": None,
                         "finish_reason": finish_reason}]}
        if include_usage:
            c["usage"] = a.usage if finish_reason and not separate_usage else None
        return _sparse(c) if quirks.sparse_replies else c

    # Like the real API: the role chunk has content "" for text replies, null for tool calls.
    yield chunk({"role": "assistant", "content": "" if a.reply.content is not None else None,
                 "refusal": None})
    text = a.reply.content or ""
    for piece in _token_pieces(text, model) if quirks.chunk_per_token else _pieces(text):
        yield chunk({"content": piece})
    for i, (cid, call) in enumerate(zip(a.call_ids, a.reply.tool_calls)):
        head = {"index": i, "id": cid, "type": "function"}
        yield chunk({"tool_calls": [{**head, "function": {"name": call.name, "arguments": ""}}]})
        for piece in _pieces(call.arguments_json):
            if quirks.repeat_tool_call_ids:
                delta = {**head, "function": {"name": call.name, "arguments": piece}}
            else:
                delta = {"index": i, "function": {"arguments": piece}}
            yield chunk({"tool_calls": [delta]})
    yield chunk({}, a.finish_reason)
    if include_usage and separate_usage:
        final = chunk({})
        final["choices"], final["usage"] = [], a.usage
        yield final


# --- responses --------------------------------------------------------------------------

def output_items(a: Answer) -> list[dict]:
    """The ``output`` of a finished response: a message for the text, then one
    ``function_call`` per tool call; when the reply was cut, its last item is incomplete."""
    items: list[dict] = []
    if a.reply.content is not None:
        items.append({"id": f"msg_{a.digest}", "type": "message", "role": "assistant",
                      "status": "completed", "content": [
                          {"type": "output_text", "text": a.reply.content, "annotations": []}]})
    for i, (cid, call) in enumerate(zip(a.call_ids, a.reply.tool_calls)):
        items.append({"id": f"fc_{a.digest}_{i}", "type": "function_call", "call_id": cid,
                      "name": call.name, "arguments": call.arguments_json,
                      "status": "completed"})
    if a.truncated:
        items[-1]["status"] = "incomplete"
    return items


# What a response holds under Quirks.sparse_replies (llama-server's Responses replies).
_SPARSE_RESPONSE_FIELDS = ("id", "object", "created_at", "completed_at", "status", "model",
                           "output", "usage")


def response(a: Answer, body: dict, created: int, output: list[dict] | None,
             quirks: Quirks) -> dict:
    """The response object; ``output=None`` gives the in-progress one streams start with."""
    status = "in_progress" if output is None else "incomplete" if a.truncated else "completed"
    usage = None if output is None or quirks.no_usage else {
        "input_tokens": a.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": a.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": a.prompt_tokens + a.completion_tokens}
    if usage is not None and quirks.sparse_replies:
        usage["input_tokens_details"] = {"cached_tokens": 0}
        del usage["output_tokens_details"]
    response = {
        "id": f"resp_{a.digest}", "object": "response", "created_at": created,
        "status": status, "completed_at": created if status == "completed" else None,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": body["model"], "output": output or [],
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": None, "temperature": body.get("temperature", 1.0),
        "top_p": body.get("top_p", 1.0), "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [], "text": {"format": {"type": "text"}},
        "truncation": "disabled", "metadata": body.get("metadata") or {}, "usage": usage}
    if quirks.sparse_replies:
        return {k: v for k, v in response.items() if k in _SPARSE_RESPONSE_FIELDS}
    return response


def response_events(a: Answer, body: dict, quirks: Quirks) -> Iterator[dict]:
    """The Responses streaming events, in the real API's order."""
    created = int(time.time())
    sequence = itertools.count()

    def event(type_: str, **fields: Any) -> dict:
        return {"type": type_, "sequence_number": next(sequence), **fields}

    pending = response(a, body, created, None, quirks)
    yield event("response.created", response=pending)
    yield event("response.in_progress", response=pending)
    items = output_items(a)
    for index, item in enumerate(items):
        ref = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            part = item["content"][0]
            yield event("response.output_item.added", output_index=index,
                        item={**item, "status": "in_progress", "content": []})
            yield event("response.content_part.added", **ref, content_index=0,
                        part={**part, "text": ""})
            for piece in _pieces(part["text"]):
                yield event("response.output_text.delta", **ref, content_index=0, delta=piece,
                            logprobs=[])
            yield event("response.output_text.done", **ref, content_index=0, text=part["text"],
                        logprobs=[])
            yield event("response.content_part.done", **ref, content_index=0, part=part)
        else:
            yield event("response.output_item.added", output_index=index,
                        item={**item, "status": "in_progress", "arguments": ""})
            for piece in _pieces(item["arguments"]):
                yield event("response.function_call_arguments.delta", **ref, delta=piece)
            yield event("response.function_call_arguments.done", **ref, name=item["name"],
                        arguments=item["arguments"])
        yield event("response.output_item.done", output_index=index, item=item)
    final = response(a, body, created, items, quirks)
    yield event(f"response.{final['status']}", response=final)
