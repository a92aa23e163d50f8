"""A loopback OpenAI-compatible server with scripted, deterministic replies.

Used by the project's tests and its offline demo through the real ``openai`` client::

    with LoopbackServer([Reply(tool_calls=[ToolCall("read_csv", {"path": "a.csv"})]), "done"]) as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="any")
        client.chat.completions.create(model="loopback-1", messages=[...])
        client.responses.create(model="loopback-1", input="...")

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/responses``, ``GET /v1/models`` and
``GET /_stats`` (the counters of :meth:`LoopbackServer.stats`).

Guarantees:

- The reply depends on the request alone: its *round* is the number of assistant turns already
  in the request, and the reply is ``script[round]`` (past the end of the script, a plain
  final text ``"done"``). In ``messages`` every ``assistant`` message is a turn. In a
  Responses ``input`` a turn starts at every assistant message and at every ``function_call``
  item that does not directly follow an assistant message or another ``function_call``, so
  one response's output (an optional message, then its function calls) counts once. Ids
  (completion, response and item ids, tool-call ids ``call_{round}_{i}``) are derived from the
  request too, so a restarted server, or one in another process, answers the same request
  the same way.
- Requests are validated like the real API (missing model, messages or input, unknown roles
  or item types, tool results that answer no tool call, tool calls left unanswered, bad
  token caps, invalid JSON) and refused with HTTP 400 and the OpenAI error JSON, so the
  client raises ``openai.BadRequestError``.
- Every response carries ``usage``, counted with :mod:`durable_nb.llm.tokens` for the requested
  model (the API's billing rule, offline).
- Token caps are honoured like the real API: a reply longer than ``max_tokens`` /
  ``max_completion_tokens`` (chat) or ``max_output_tokens`` (responses) is cut to exactly
  the cap (text first, then tool calls, whose arguments may be cut to invalid JSON), with
  ``finish_reason="length"`` or ``status="incomplete"``.
- ``stream=True`` answers with ``chat.completion.chunk`` server-sent events ending in
  ``data: [DONE]`` (with a final ``choices: []`` usage chunk when
  ``stream_options.include_usage`` is set), or with the Responses event sequence
  (``response.created`` ... ``response.completed``).
- A request whose first system (or developer) message, or whose ``instructions``, contains
  ``summary_marker`` is a summarisation request: it gets a short deterministic summary and
  is counted apart.

A test can hold streams: :meth:`LoopbackServer.hold_streams` makes every streamed reply wait
after its first event until the returned :class:`StreamHold` is released, so a client can be
shown to see chunks before the server finished sending.

Faults, for testing retry logic: :meth:`LoopbackServer.fail_next` answers the next valid
requests with an HTTP error (any status >= 400, an optional body and ``retry-after``), and
:meth:`LoopbackServer.drop_next` resets the connection without answering.

Quirks of real OpenAI-compatible servers, each an explicit switch of :class:`Quirks` (all
off by default, so the default server behaves like OpenAI): ``no_stream_usage``,
``repeat_tool_call_ids``, ``require_content``, ``require_string_content`` and
``ignore_completion_caps`` (llama-cpp-python), ``loading_for`` and
``final_empty_choices_usage`` (llama-server), ``extra_prompt_tokens`` (both),
``chunk_per_token`` (streamed text one token per chunk, as all of them send it),
``sparse_replies`` (fields a client can do without left out, as llama-server leaves them
out of Responses replies) and ``no_usage``. They apply to chat completions; of them only
``loading_for``, ``extra_prompt_tokens``, ``sparse_replies`` and ``no_usage`` apply to
``/v1/responses`` too. Requests are answered at ``/v1/...`` and at Azure OpenAI's paths
(``/openai/deployments/NAME/chat/completions?api-version=...``, ``/openai/responses``).

Run ``python -m durable_nb.testing [--port P] [--script FILE.json] [--quirks a,b=2]`` to serve
in the foreground; the first stdout line is ``LOOPBACK_URL=http://127.0.0.1:PORT/v1``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import json
import math
import re
import socket
import struct
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator, Mapping, Sequence

from .llm.tokens import context_window, count_message_tokens, encoding_for

__all__ = [
    "DEMO_SCRIPT",
    "LoopbackServer",
    "Quirks",
    "Reply",
    "StreamHold",
    "ToolCall",
    "load_script",
    "main",
]

DEFAULT_SUMMARY_MARKER = "Summarise the conversation"
FINAL_TEXT = "done"
ROLES = ("system", "developer", "user", "assistant", "tool", "function")
INPUT_ROLES = ("assistant", "system", "developer", "user")
INPUT_ITEM_TYPES = ("message", "function_call", "function_call_output")
KINDS = ("chat", "summary", "failure", "invalid", "dropped")
ENDPOINTS = {"/v1/chat/completions": "chat/completions", "/v1/responses": "responses"}
# Where clients send requests: /v1/... (OpenAI, a custom base_url), and Azure OpenAI's
# /openai/deployments/NAME/chat/completions?api-version=... (azure_endpoint), its
# base_url form BASE/deployments/NAME/... and /openai/responses; the query is ignored.
_ROUTE = re.compile(r"^/(?:v1|openai|openai/v1)(?:/deployments/[^/]+)?/(chat/completions|responses)$")


def _endpoint(path: str) -> str | None:
    match = _ROUTE.match(path.split("?", 1)[0])
    return ENDPOINTS.get(f"/v1/{match.group(1)}") if match else None
MIN_OUTPUT_TOKENS = 16  # the Responses API refuses a smaller max_output_tokens


@dataclass(frozen=True)
class ToolCall:
    """One scripted tool call; ``arguments`` is a dict (sent as JSON) or a JSON string."""

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)

    @property
    def arguments_json(self) -> str:
        """The arguments exactly as the server sends them."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments)


class StreamHold:
    """Holds streamed replies after their first event until :meth:`release`, or for
    ``timeout`` seconds at most (so that a client that waits for the whole stream before
    reading fails its test instead of hanging): :attr:`released` tells which."""

    def __init__(self, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self._released = threading.Event()

    @property
    def released(self) -> bool:
        """Whether :meth:`release` was called (not merely timed out)."""
        return self._released.is_set()

    def release(self) -> None:
        self._released.set()

    def wait(self) -> None:
        self._released.wait(self.timeout)


@dataclass(frozen=True)
class Reply:
    """One scripted assistant reply: text, tool calls, or both.

    ``delay`` seconds are waited before answering (on top of the server's own ``delay``),
    so a test can kill a process while a model call is in flight.
    """

    content: str | None = None
    tool_calls: Sequence[ToolCall] = ()
    delay: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "tool_calls", tuple(self.tool_calls))
        if self.content is None and not self.tool_calls:
            raise ValueError("a Reply needs content, tool_calls, or both; got neither")

    @classmethod
    def coerce(cls, item: Reply | str | Mapping[str, Any]) -> Reply:
        """Accept a Reply, a plain string (final text), or the JSON script form
        ``{"content": ..., "tool_calls": [{"name": ..., "arguments": {...}}], "delay": 0}``."""
        if isinstance(item, Reply):
            return item
        if isinstance(item, str):
            return cls(content=item)
        if isinstance(item, Mapping):
            unknown = set(item) - {"content", "tool_calls", "delay"}
            if unknown:
                raise ValueError(f"unknown keys {sorted(unknown)} in script entry {item!r}; "
                                 f"allowed: content, tool_calls, delay")
            calls = [ToolCall(c["name"], c.get("arguments", {})) for c in item.get("tool_calls", [])]
            return cls(content=item.get("content"), tool_calls=calls,
                       delay=float(item.get("delay", 0.0)))
        raise TypeError(f"a script entry must be a Reply, a str or a dict, not {type(item).__name__}")


@dataclass(frozen=True)
class Quirks:
    """Behaviours of real OpenAI-compatible servers that clients must survive.

    ``Quirks()`` is OpenAI's own behaviour. Measured on llama-cpp-python 0.3.36 (its
    ``llama_cpp.server``) and on llama.cpp's ``llama-server`` (see
    ``shared/real-llm/README.md``). All but ``loading_for``, ``extra_prompt_tokens``,
    ``sparse_replies`` and ``no_usage`` affect chat completions only.
    """

    no_stream_usage: bool = False
    """llama-cpp-python: streams never carry usage (no ``usage`` field, no usage chunk),
    whatever ``stream_options.include_usage`` says."""

    chunk_per_token: bool = False
    """A streamed chat reply's text one token per chunk, as OpenAI and both llama servers
    send it (off: about three chunks per text, which keeps the tests' streams short)."""

    repeat_tool_call_ids: bool = False
    """llama-cpp-python: every streamed tool-call delta piece repeats the call's ``id``,
    ``type`` and ``function.name`` (OpenAI sends them in the first piece only), so an
    accumulator that concatenates strings, such as the openai SDK's
    ``chat.completions.stream()``, ends up with ``"call_0_0call_0_0..."``."""

    require_content: bool = False
    """llama-cpp-python: a request with an assistant message that has no ``content`` key
    (a tool-call-only message dumped with ``exclude_none=True``) makes its chat template
    fail: HTTP 500 ``internal_server_error`` "'dict object' has no attribute 'content'",
    every time the same request is sent."""

    require_string_content: bool = False
    """llama-cpp-python: its request model wants every assistant message's ``content`` to be
    a string, so ``"content": null`` (a tool-call-only message as OpenAI returns it) fails the
    request's validation: HTTP 500 ``internal_server_error`` "... Input should be a valid
    string ...", every time the same request is sent. With ``require_content`` too, a missing
    ``content`` gives the template failure instead."""

    ignore_completion_caps: bool = False
    """llama-cpp-python (which ignores ``max_completion_tokens``; this switch ignores
    ``max_tokens`` too): the full scripted reply is sent, ``finish_reason`` never "length"."""

    loading_for: int = 0
    """llama-server while it loads its model: the first ``loading_for`` POST requests
    (chat completions or responses, valid or not, counted from server start) are answered
    503 ``{"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}``
    before the request is parsed or validated; the client's ``e.body`` is the inner
    object. ``GET /v1/models``
    answers meanwhile, as llama-server's does. Counted as ``kind="failure"``, round None."""

    extra_prompt_tokens: int = 0
    """A server with a chat template of its own (llama.cpp's and llama-cpp-python's): it
    counts this many prompt tokens more than OpenAI's rule (:mod:`durable_nb.llm.tokens`) for
    every request, chat or responses, as SmolLM2's template does with the default system
    prompt it adds (measured: 31 prompt tokens for a lone "hi" that OpenAI's rule counts as
    8), so an offline estimate undercounts."""

    final_empty_choices_usage: bool = True
    """With ``stream_options.include_usage``: a last chunk with ``choices: []`` and the usage
    (OpenAI and llama-server), every other chunk with ``"usage": null``. On by default since
    it is OpenAI's behaviour; ``False`` puts the usage on the finish-reason chunk instead,
    as some other servers do."""

    sparse_replies: bool = False
    """Replies leave out fields OpenAI always sends and a client can do without, some of
    which the openai client's types mark required (it builds replies without validating
    them, so they work). Responses (as llama.cpp's llama-server answers, measured): a
    response holds only ``id``, ``object``, ``created_at``, ``completed_at``, ``status``,
    ``model``, ``output`` and ``usage``, whose ``input_tokens_details`` holds
    ``cached_tokens`` alone (openai 3.57 requires ``cache_write_tokens`` too) and which has
    no ``output_tokens_details``; streamed events carry such responses. Chat completions and
    their chunks: no ``created``, ``system_fingerprint``, ``refusal`` or ``logprobs``, and a
    usage without ``*_details``."""

    no_usage: bool = False
    """The server reports no usage at all: chat completions and chunks have no ``usage``
    (whatever ``stream_options`` says), Responses replies and events ``"usage": null``."""

    def __post_init__(self) -> None:
        for name in ("loading_for", "extra_prompt_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a whole number >= 0, got {value!r}")

    @classmethod
    def parse(cls, spec: str) -> Quirks:
        """``"no_stream_usage,loading_for=2,final_empty_choices_usage=false"``: a bare name
        switches a quirk on; ``name=value`` sets it (a whole number or true/false)."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for entry in filter(None, (e.strip() for e in spec.split(","))):
            name, _, value = entry.partition("=")
            name = name.strip().replace("-", "_")
            if name not in fields:
                raise ValueError(f"unknown quirk {name!r}; known: {', '.join(fields)}")
            if fields[name].type in (int, "int"):
                try:
                    values[name] = int(value) if value else 1
                except ValueError:
                    raise ValueError(f"quirk {name} needs a whole number, got {value!r}") from None
            elif value.strip().lower() in ("", "1", "true", "on", "yes"):
                values[name] = True
            elif value.strip().lower() in ("0", "false", "off", "no"):
                values[name] = False
            else:
                raise ValueError(f"quirk {name} needs true or false, got {value!r}")
        return cls(**values)


DEMO_SCRIPT: tuple[Reply, ...] = (
    Reply(tool_calls=[ToolCall("read_csv", {"path": "sales.csv"})]),
    Reply(tool_calls=[ToolCall("analyse", {"column": "revenue"})]),
    Reply(tool_calls=[ToolCall("write_report", {"title": "Q3 sales"})]),
    Reply(tool_calls=[ToolCall("send_email", {"to": "team@example.com",
                                              "subject": "Q3 sales report"})]),
    Reply(content="The Q3 sales report is done: I read sales.csv, analysed the revenue column, "
                  "wrote the report 'Q3 sales' and emailed it to team@example.com."),
)
"""The offline demo's "sales report" agent: four tool calls, then a final answer."""


def load_script(path: str) -> list[Reply]:
    """Read a JSON script: a list whose entries are strings or
    ``{"content": ..., "tool_calls": [{"name": ..., "arguments": {...}}]}``."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, list):
        raise ValueError(f"the script {path} must hold a JSON list of replies, "
                         f"not {type(data).__name__}")
    return [Reply.coerce(item) for item in data]


# --- token counting -------------------------------------------------------------------

def _encode(model: str, text: str) -> list[int]:
    return encoding_for(model).encode(text, disallowed_special=())


def _completion_tokens(model: str, content: str | None, tool_calls: Sequence[ToolCall]) -> int:
    """Completion tokens: the reply text plus each tool call's name and JSON arguments."""
    return len(_encode(model, content or "")) + sum(
        len(_encode(model, call.name + call.arguments_json)) for call in tool_calls)


def _cap_reply(model: str, reply: Reply, cap: int | None) -> tuple[Reply, int, bool]:
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


# --- validation -----------------------------------------------------------------------

class _Invalid(Exception):
    """A request the real API would refuse with 400."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


def _a(value: Any) -> str:
    """The JSON type of a value, as OpenAI's error messages name it."""
    for kind, name in ((bool, "a boolean"), (str, "a string"), (dict, "an object"),
                       (list, "an array"), ((int, float), "a number")):
        if isinstance(value, kind):
            return name
    return "null"


def _missing(param: str) -> _Invalid:
    return _Invalid(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")


def _check_cap(body: dict, name: str, minimum: int) -> None:
    value = body.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Invalid(f"Invalid type for '{name}': expected an integer, but got {_a(value)} "
                       f"instead.", name, "invalid_type")
    if value < minimum:
        raise _Invalid(f"Invalid '{name}': integer below minimum value. Expected a value >= "
                       f"{minimum}, but got {value} instead.", name, "integer_below_min_value")


def _validate(body: Any) -> None:
    if not isinstance(body, dict):
        raise _Invalid("Invalid body: expected a JSON object.")
    if not body.get("model"):
        raise _Invalid("you must provide a model parameter")
    messages = body.get("messages")
    if messages is None:
        raise _missing("messages")
    if not isinstance(messages, list) or not messages:
        raise _Invalid("Invalid 'messages': expected a non-empty array of messages.", "messages",
                       "invalid_value")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m:
            raise _missing(f"messages[{i}].role")
        if m["role"] not in ROLES:
            raise _Invalid(f"Invalid value: {m['role']!r}. Supported values are: 'system', "
                           f"'assistant', 'user', 'function', 'tool', and 'developer'.",
                           f"messages[{i}].role", "invalid_value")
        calls = m.get("tool_calls") or []
        if not isinstance(calls, list) or not all(isinstance(c, dict) and c.get("id")
                                                  for c in calls):
            raise _Invalid(f"Invalid 'messages[{i}].tool_calls': expected an array of tool calls, "
                           f"each with an 'id'.", f"messages[{i}].tool_calls", "invalid_type")
    _check_cap(body, "max_tokens", 1)
    _check_cap(body, "max_completion_tokens", 1)
    _validate_tool_pairs(messages)


def _validate_tool_pairs(messages: list[dict]) -> None:
    last_calls: set[str] | None = None  # ids of the nearest preceding assistant message
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            last_calls = {c.get("id") for c in m.get("tool_calls") or []}
            answered = set()
            for follower in messages[i + 1:]:
                if follower["role"] != "tool":
                    break
                answered.add(follower.get("tool_call_id"))
            missing = [cid for cid in sorted(last_calls) if cid not in answered]
            if missing:
                raise _Invalid("An assistant message with 'tool_calls' must be followed by tool "
                               "messages responding to each 'tool_call_id'. The following "
                               f"tool_call_ids did not have response messages: {', '.join(missing)}",
                               f"messages.[{i}].role")
        elif m["role"] == "tool" and m.get("tool_call_id") not in (last_calls or set()):
            raise _Invalid("Invalid parameter: messages with role 'tool' must be a response to a "
                           "preceding message with 'tool_calls' (tool_call_id "
                           f"{m.get('tool_call_id')!r} matches none of them).",
                           f"messages.[{i}].role")


def _validate_responses(body: Any) -> None:
    if not isinstance(body, dict):
        raise _Invalid("Invalid body: expected a JSON object.")
    if not body.get("model"):
        raise _missing("model")
    if body.get("previous_response_id"):  # nothing is stored, so no response can be found
        raise _Invalid(f"Previous response with id '{body['previous_response_id']}' not found.",
                       "previous_response_id", "previous_response_not_found")
    if body.get("instructions") is not None and not isinstance(body["instructions"], str):
        raise _Invalid(f"Invalid type for 'instructions': expected a string, but got "
                       f"{_a(body['instructions'])} instead.", "instructions", "invalid_type")
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise _Invalid(f"Invalid type for 'tools': expected an array, but got {_a(tools)} "
                       f"instead.", "tools", "invalid_type")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise _missing(f"tools[{i}].type")
        if tool["type"] == "function" and not isinstance(tool.get("name"), str):
            raise _missing(f"tools[{i}].name")  # e.g. a chat-style {"function": {...}} entry
    _check_cap(body, "max_output_tokens", MIN_OUTPUT_TOKENS)
    items = body.get("input")
    if items is None:
        raise _missing("input")
    if isinstance(items, str):
        return
    if not isinstance(items, list):
        raise _Invalid(f"Invalid type for 'input': expected one of a string or array of input "
                       f"items, but got {_a(items)} instead.", "input", "invalid_type")
    calls: set[str] = set()
    outputs: set[str] = set()
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _Invalid(f"Invalid type for '{where}': expected an input item, but got "
                           f"{_a(item)} instead.", where, "invalid_type")
        kind = item.get("type", "message")
        if kind not in INPUT_ITEM_TYPES:
            raise _Invalid(f"Invalid value: {kind!r}. Supported values are: 'message', "
                           f"'function_call', and 'function_call_output'.", f"{where}.type",
                           "invalid_value")
        if kind == "message":
            if "role" not in item:
                raise _missing(f"{where}.role")
            if item["role"] not in INPUT_ROLES:
                raise _Invalid(f"Invalid value: {item['role']!r}. Supported values are: "
                               f"'assistant', 'system', 'developer', and 'user'.",
                               f"{where}.role", "invalid_value")
            if "content" not in item:
                raise _missing(f"{where}.content")
            if not isinstance(item["content"], (str, list)):
                raise _Invalid(f"Invalid type for '{where}.content': expected one of a string "
                               f"or array of content parts, but got {_a(item['content'])} "
                               f"instead.", f"{where}.content", "invalid_type")
            continue
        required = ("call_id", "name", "arguments") if kind == "function_call" else (
            "call_id", "output")
        for key in required:
            if item.get(key) is None:
                raise _missing(f"{where}.{key}")
        if kind == "function_call":
            if not isinstance(item["arguments"], str):
                raise _Invalid(f"Invalid type for '{where}.arguments': expected a string, but "
                               f"got {_a(item['arguments'])} instead.", f"{where}.arguments",
                               "invalid_type")
            calls.add(item["call_id"])
        elif item["call_id"] not in calls:
            raise _Invalid("No tool call found for function call output with call_id "
                           f"{item['call_id']}.", "input")
        else:
            outputs.add(item["call_id"])
    unanswered = sorted(calls - outputs)
    if unanswered:
        raise _Invalid(f"No tool output found for function call {unanswered[0]}.", "input")


# --- requests as chat messages ----------------------------------------------------------

def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: only text parts carry text
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _responses_messages(body: dict) -> list[dict]:
    """A valid Responses request as the equivalent chat ``messages``: its round, summary
    detection and token count then follow the chat rules. Function calls directly after an
    assistant message or another function call join that assistant message."""
    messages: list[dict] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    items = body["input"]
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    joinable = False  # may the next function call join messages[-1]?
    for item in items:
        kind = item.get("type", "message")
        if kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            if joinable:
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            joinable = True
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": _text_of(item["output"])})
            joinable = False
        else:
            messages.append({"role": item["role"], "content": _text_of(item["content"])})
            joinable = item["role"] == "assistant"
    return messages


def _first_system_text(messages: list[dict]) -> str:
    for m in messages:
        if m["role"] in ("system", "developer"):
            return _text_of(m.get("content"))
    return ""


def _summary_text(messages: list[dict]) -> str:
    tools = [c.get("function", {}).get("name", "?")
             for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    first_user = next((_text_of(m.get("content")) for m in messages if m["role"] == "user"), "")
    return (f"Summary of {len(messages)} messages: the user asked {first_user[:80]!r}; "
            f"tools called: {', '.join(tools) or 'none'}.")


def _digest(*parts: Any) -> str:
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
class _Answer:
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


@dataclass(frozen=True)
class _Fault:
    status: int | None  # None: drop the connection
    retry_after: float | None = None
    body: Mapping[str, Any] | str | None = None


# --- server ---------------------------------------------------------------------------

class LoopbackServer:
    """An OpenAI-compatible chat-completions and responses server on 127.0.0.1 with scripted
    replies.

    ``script`` entries are :class:`Reply`, plain strings or JSON-form dicts; ``None`` means
    :data:`DEMO_SCRIPT`. ``delay`` seconds are waited before every reply. ``quirks`` turns on
    behaviours of real local servers (:class:`Quirks`). Thread-safe.
    """

    def __init__(self, script: Sequence[Reply | str | Mapping[str, Any]] | None = None, *,
                 model: str = "loopback-1", host: str = "127.0.0.1", port: int = 0,
                 summary_marker: str = DEFAULT_SUMMARY_MARKER, delay: float = 0.0,
                 quirks: Quirks | None = None) -> None:
        self.script: tuple[Reply, ...] = tuple(
            Reply.coerce(item) for item in (DEMO_SCRIPT if script is None else script))
        self.model = model
        self.summary_marker = summary_marker
        self.delay = delay
        self.quirks = quirks or Quirks()
        self._host = host
        self._port = port
        self._lock = threading.Lock()
        self._requests: list[dict] = []
        self._counts: Counter[tuple[str, str, int | None]] = Counter()  # endpoint, kind, round
        self._faults: list[_Fault] = []
        self._loading_left = self.quirks.loading_for
        self._hold: StreamHold | None = None
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._serving = False  # shutdown() would wait forever on a server never served

    # lifecycle

    def bind(self) -> LoopbackServer:
        """Open the listening socket without serving yet."""
        if self._httpd is None:
            self._httpd = _HTTPServer((self._host, self._port), _Handler)
            self._httpd.loopback = self
            self._port = self._httpd.server_address[1]
        return self

    def start(self) -> LoopbackServer:
        """Serve in a daemon thread; returns self. The server answers once this returns."""
        self.bind()
        assert self._httpd is not None
        self._serving = True
        # A short poll interval: stop() waits up to one interval for the loop to notice.
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,),
                                        name=f"loopback-{self.port}", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in the calling thread until :meth:`stop` is called or the process ends."""
        self.bind()
        assert self._httpd is not None
        self._serving = True
        self._httpd.serve_forever()

    def stop(self) -> None:
        """Stop serving and close the socket. Safe to call twice."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        if self._serving:
            httpd.shutdown()
            self._serving = False
        httpd.server_close()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> LoopbackServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The bound port (the real one when constructed with port 0); kept after stop(),
        so ``LoopbackServer(port=old.port)`` restarts a server at the same URL."""
        if self._port == 0:
            raise RuntimeError("the loopback server has no port yet; call start() first")
        return self._port

    @property
    def url(self) -> str:
        """Base URL for ``openai.OpenAI(base_url=...)``, ending in ``/v1``."""
        return f"http://{self._host}:{self.port}/v1"

    # fault injection and counters

    def fail_next(self, n: int = 1, status: int = 500, *, retry_after: float | None = None,
                  body: Mapping[str, Any] | str | None = None) -> None:
        """Answer the next ``n`` valid requests (chat or responses) with HTTP ``status``
        instead of a reply, in the order faults were queued (see :meth:`drop_next`).

        ``body`` is sent as the response body: a mapping as JSON, a string as text (a
        proxy's error page). Without it the body is OpenAI's error JSON for the status: 400 is
        a deterministic "context length exceeded" (``code="context_length_exceeded"``), 429
        a rate limit, 408, 409 and 5xx server errors. ``retry_after`` seconds is sent as the
        ``retry-after-ms`` header and as ``retry-after`` (whole seconds, rounded up).
        Failed requests are counted as ``kind="failure"``, not as chat requests."""
        if not 400 <= status <= 599:
            raise ValueError(f"fail_next needs an error status (400-599), got {status}")
        with self._lock:
            self._faults.extend([_Fault(status, retry_after, body)] * n)

    def hold_streams(self, timeout: float = 30.0) -> StreamHold:
        """Make every streamed reply from now on wait after its first event until the
        returned hold is released (see :class:`StreamHold`)."""
        with self._lock:
            self._hold = StreamHold(timeout)
            return self._hold

    def drop_next(self, n: int = 1) -> None:
        """Reset the connection of the next ``n`` valid requests after reading them, without
        answering: the client sees a connection error (``openai.APIConnectionError``), which
        its retries may cover. Counted as ``kind="dropped"``."""
        with self._lock:
            self._faults.extend([_Fault(None)] * n)

    @property
    def requests(self) -> list[dict]:
        """Bodies of the valid requests that were not failed on purpose (chat and summary,
        on both endpoints), oldest first."""
        with self._lock:
            return list(self._requests)

    def count(self, round: int | None = None, *, kind: str = "chat",
              endpoint: str | None = None) -> int:
        """How many requests of ``kind`` ("chat", "summary", "failure", "invalid" or
        "dropped") were received, optionally only those of one ``round`` or one ``endpoint``
        ("chat/completions" or "responses")."""
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}; use one of {', '.join(KINDS)}")
        if endpoint is not None and endpoint not in ENDPOINTS.values():
            raise ValueError(f"unknown endpoint {endpoint!r}; use one of "
                             f"{', '.join(ENDPOINTS.values())}")
        with self._lock:
            return sum(n for (e, k, r), n in self._counts.items()
                       if k == kind and (round is None or r == round)
                       and (endpoint is None or e == endpoint))

    def stats(self) -> dict[str, Any]:
        """The counts served at ``GET /_stats``: total (every request to either endpoint),
        chat, by_round (chat requests per round), summaries, failures, invalid, dropped, and
        responses (how many of the total went to ``/v1/responses``)."""
        with self._lock:
            counts = list(self._counts.items())
        by_round: Counter[str] = Counter()
        totals: Counter[str] = Counter()
        responses = 0
        for (endpoint, kind, rnd), n in counts:
            totals[kind] += n
            responses += n if endpoint == "responses" else 0
            if kind == "chat":
                by_round[str(rnd)] += n
        return {"total": sum(totals.values()), "chat": totals["chat"],
                "by_round": dict(sorted(by_round.items(), key=lambda kv: int(kv[0]))),
                "summaries": totals["summary"], "failures": totals["failure"],
                "invalid": totals["invalid"], "dropped": totals["dropped"],
                "responses": responses}

    # request handling (called from handler threads)

    def _record(self, endpoint: str, kind: str, rnd: int | None, body: dict | None = None) -> None:
        with self._lock:
            self._counts[(endpoint, kind, rnd)] += 1
            if body is not None:
                self._requests.append(body)

    def _take_fault(self) -> _Fault | None:
        with self._lock:
            return self._faults.pop(0) if self._faults else None

    def _still_loading(self) -> bool:
        with self._lock:
            if self._loading_left > 0:
                self._loading_left -= 1
                return True
            return False

    def _answer(self, messages: list[dict], model: str, tools: Any, cap: int | None,
                digest: str) -> _Answer:
        rnd = sum(1 for m in messages if m["role"] == "assistant")
        if self.summary_marker in _first_system_text(messages):
            kind, reply = "summary", Reply(content=_summary_text(messages))
        else:
            kind = "chat"
            reply = self.script[rnd] if rnd < len(self.script) else Reply(content=FINAL_TEXT)
        reply, completion, truncated = _cap_reply(model, reply, cap)
        call_ids = tuple(f"call_{rnd}_{i}" for i in range(len(reply.tool_calls)))
        # Prompt tokens as the API bills them (durable_nb.llm.tokens follows OpenAI's method).
        prompt = count_message_tokens(messages, model, tools) + self.quirks.extra_prompt_tokens
        return _Answer(kind, rnd, reply, call_ids, digest, prompt, completion, truncated)

    def _answer_chat(self, body: dict) -> _Answer:
        caps = [body[k] for k in ("max_tokens", "max_completion_tokens") if body.get(k)]
        cap = None if self.quirks.ignore_completion_caps or not caps else min(caps)
        return self._answer(body["messages"], str(body["model"]), body.get("tools"), cap,
                            _digest(body.get("model"), body["messages"]))

    def _answer_responses(self, body: dict) -> _Answer:
        return self._answer(_responses_messages(body), str(body["model"]), body.get("tools"),
                            body.get("max_output_tokens"),
                            _digest(body.get("model"), body.get("instructions"), body["input"]))


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    loopback: LoopbackServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up mid-stream (a killed kernel) is normal here, not an error.
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


def _error_body(message: str, type_: str, param: str | None = None,
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


def _default_failure(status: int, endpoint: str, answer: _Answer, model: str) -> dict:
    if status == 400:  # the real API's own wording, with this request's numbers
        if endpoint == "responses":
            return _error_body("Your input exceeds the context window of this model. Please "
                               "adjust your input and try again.", "invalid_request_error",
                               "input", "context_length_exceeded")
        return _error_body(f"This model's maximum context length is {context_window(model)} "
                           f"tokens. However, your messages resulted in {answer.prompt_tokens} "
                           f"tokens. Please reduce the length of the messages.",
                           "invalid_request_error", "messages", "context_length_exceeded")
    message, type_, code = _FAILURE_MESSAGES.get(status, (
        f"The server had an error while processing your request (injected status {status}).",
        "server_error", None))
    return _error_body(message, type_, None, code)


_LOADING_BODY = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
# llama-cpp-python's answer when chatml's template (jinja2, StrictUndefined) meets an
# assistant message without 'content'.
_TEMPLATE_FAILURE = _error_body("'dict object' has no attribute 'content'", "internal_server_error")
# Its answer (pydantic, shortened) to an assistant message whose content is null.
_CONTENT_VALIDATION_FAILURE = _error_body(
    "1 validation error:\n  {'type': 'string_type', 'loc': ('body', 'messages', 1, "
    "'ChatCompletionRequestAssistantMessage', 'content'), 'msg': 'Input should be a valid "
    "string', 'input': None}\n\n  File \"llama_cpp/server/app.py\", line 376, in "
    "create_chat_completion\n    POST /v1/chat/completions", "internal_server_error")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the openai client expects
    # Headers and body go out in separate writes: with Nagle's algorithm on, the body waits
    # for the client's delayed ACK, about 40 ms per reply.
    disable_nagle_algorithm = True
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # tests read counts, not access logs

    def do_GET(self) -> None:
        lb = self.server.loopback
        if self.path == "/v1/models":
            self._send_json(200, {"object": "list", "data": [
                {"id": lb.model, "object": "model", "created": 0, "owned_by": "loopback"}]})
        elif self.path == "/_stats":
            self._send_json(200, lb.stats())
        else:
            self._not_found("GET")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        endpoint = _endpoint(self.path)
        if endpoint is None:
            self._not_found("POST")
            return
        lb = self.server.loopback
        if lb._still_loading():
            lb._record(endpoint, "failure", None)
            self._send_json(503, _LOADING_BODY)
            return
        chat = endpoint == "chat/completions"
        try:
            try:
                body = json.loads(raw)
            except ValueError:
                raise _Invalid("We could not parse the JSON body of your request. The OpenAI "
                               "API expects a JSON payload, but what was sent was not valid "
                               "JSON.") from None
            (_validate if chat else _validate_responses)(body)
        except _Invalid as e:
            lb._record(endpoint, "invalid", None)
            self._send_json(400, _error_body(str(e), "invalid_request_error", e.param, e.code))
            return

        answer = lb._answer_chat(body) if chat else lb._answer_responses(body)
        rnd = answer.round if answer.kind == "chat" else None
        fault = lb._take_fault()
        if fault is not None and fault.status is None:
            lb._record(endpoint, "dropped", rnd)
            self._reset_connection()
            return
        if fault is not None:
            lb._record(endpoint, "failure", rnd)
            self._send_failure(fault, _default_failure(fault.status, endpoint, answer,
                                                       str(body["model"])))
            return
        if chat and lb.quirks.require_content and any(
                m["role"] == "assistant" and "content" not in m for m in body["messages"]):
            lb._record(endpoint, "failure", rnd)
            self._send_json(500, _TEMPLATE_FAILURE)
            return
        if chat and lb.quirks.require_string_content and any(
                m["role"] == "assistant" and "content" in m and not isinstance(m["content"], str)
                for m in body["messages"]):
            lb._record(endpoint, "failure", rnd)
            self._send_json(500, _CONTENT_VALIDATION_FAILURE)
            return

        # Counted on receipt, so a client killed during the delay still shows its call.
        lb._record(endpoint, answer.kind, rnd, body)
        wait = lb.delay + answer.reply.delay
        if wait > 0:
            time.sleep(wait)
        model = body["model"]
        if chat and body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            self._send_events((None, c) for c in _chunks(answer, model, include_usage, lb.quirks))
            self._send_done()
        elif chat:
            self._send_json(200, _completion(answer, model, lb.quirks))
        elif body.get("stream"):
            self._send_events((e["type"], e) for e in _response_events(answer, body, lb.quirks))
        else:
            self._send_json(200, _response(answer, body, int(time.time()),
                                           _output_items(answer), lb.quirks))

    # responses

    def _send_json(self, status: int, payload: dict,
                   headers: Mapping[str, str] | None = None) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json", headers)

    def _send(self, status: int, data: bytes, content_type: str,
              headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_failure(self, fault: _Fault, default: dict) -> None:
        assert fault.status is not None
        headers = {}
        if fault.retry_after is not None:
            headers = {"retry-after-ms": str(int(fault.retry_after * 1000)),
                       "retry-after": str(math.ceil(fault.retry_after))}
        if isinstance(fault.body, str):
            self._send(fault.status, fault.body.encode(), "text/plain; charset=utf-8", headers)
        else:
            self._send_json(fault.status, dict(fault.body) if fault.body is not None else default,
                            headers)

    def _send_events(self, events: Iterator[tuple[str | None, dict]]) -> None:
        """Server-sent events, each ``data: JSON`` with an ``event:`` line when named."""
        # No length is known up front, so the end of the body is the end of the connection.
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        hold = self.server.loopback._hold
        for number, (name, data) in enumerate(events):
            if number == 1 and hold is not None:
                hold.wait()
            line = f"event: {name}\n" if name else ""
            self.wfile.write(f"{line}data: {json.dumps(data)}\n\n".encode())
            self.wfile.flush()

    def _send_done(self) -> None:
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _reset_connection(self) -> None:
        # SO_LINGER 0: closing sends a TCP reset instead of an orderly end of stream.
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        self.connection.close()
        self.rfile.close()  # the socket really closes once its last file is closed

    def _not_found(self, method: str) -> None:
        self._send_json(404, _error_body(f"Invalid URL ({method} {self.path})",
                                         "invalid_request_error"))


# --- chat completions -------------------------------------------------------------------

# What a chat reply (and each of its chunks) leaves out under Quirks.sparse_replies.
_SPARSE_CHAT_FIELDS = ("created", "system_fingerprint", "refusal", "logprobs")


def _sparse(data: dict) -> dict:
    """``data`` (a completion, a chunk, or a part of one) without the fields
    ``Quirks.sparse_replies`` leaves out, at every depth."""
    return {k: _sparse(v) if isinstance(v, dict) else
            [_sparse(x) if isinstance(x, dict) else x for x in v] if isinstance(v, list) else v
            for k, v in data.items() if k not in _SPARSE_CHAT_FIELDS}


def _completion(a: _Answer, model: str, quirks: Quirks) -> dict:
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


def _chunks(a: _Answer, model: str, include_usage: bool, quirks: Quirks) -> Iterator[dict]:
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

def _output_items(a: _Answer) -> list[dict]:
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


def _response(a: _Answer, body: dict, created: int, output: list[dict] | None,
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


def _response_events(a: _Answer, body: dict, quirks: Quirks) -> Iterator[dict]:
    """The Responses streaming events, in the real API's order."""
    created = int(time.time())
    sequence = itertools.count()

    def event(type_: str, **fields: Any) -> dict:
        return {"type": type_, "sequence_number": next(sequence), **fields}

    pending = _response(a, body, created, None, quirks)
    yield event("response.created", response=pending)
    yield event("response.in_progress", response=pending)
    items = _output_items(a)
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
    final = _response(a, body, created, items, quirks)
    yield event(f"response.{final['status']}", response=final)


# --- CLI ------------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> None:
    """``python -m durable_nb.testing``: serve in the foreground until killed."""
    parser = argparse.ArgumentParser(prog="python -m durable_nb.testing",
                                     description="Loopback OpenAI-compatible server with "
                                                 "scripted replies (default: the demo script).")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free)")
    parser.add_argument("--script", help="JSON file: a list of replies (strings or "
                                         "{'content': ..., 'tool_calls': [...]})")
    parser.add_argument("--model", default="loopback-1")
    parser.add_argument("--quirks", default="",
                        help="comma-separated quirks of real servers to imitate, e.g. "
                             "'no_stream_usage,repeat_tool_call_ids,loading_for=3' (known: "
                             f"{', '.join(f.name for f in dataclasses.fields(Quirks))})")
    args = parser.parse_args(argv)
    try:
        quirks = Quirks.parse(args.quirks)
    except ValueError as e:
        parser.error(f"--quirks: {e}")
    try:
        script = load_script(args.script) if args.script else None
    except (OSError, ValueError, TypeError, KeyError) as e:
        parser.error(f"cannot use the script {args.script}: {e}")
    server = LoopbackServer(script, model=args.model, port=args.port, quirks=quirks).bind()
    print(f"LOOPBACK_URL={server.url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
