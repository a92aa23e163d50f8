"""What the loopback server reads: requests validated as the real API validates them (refused
with :class:`Invalid`, answered 400), and a Responses request read as the equivalent chat
messages, so both endpoints follow one set of rules."""

from __future__ import annotations

from typing import Any

__all__ = ["INPUT_ITEM_TYPES", "INPUT_ROLES", "Invalid", "MIN_OUTPUT_TOKENS", "ROLES",
           "first_system_text", "responses_messages", "text_of", "validate_chat",
           "validate_responses"]

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
INPUT_ROLES = ("assistant", "system", "developer", "user")
INPUT_ITEM_TYPES = ("message", "function_call", "function_call_output")
MIN_OUTPUT_TOKENS = 16  # the Responses API refuses a smaller max_output_tokens


# --- validation -----------------------------------------------------------------------

class Invalid(Exception):
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


def _missing(param: str) -> Invalid:
    return Invalid(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")


def _check_cap(body: dict, name: str, minimum: int) -> None:
    value = body.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise Invalid(f"Invalid type for '{name}': expected an integer, but got {_a(value)} "
                       f"instead.", name, "invalid_type")
    if value < minimum:
        raise Invalid(f"Invalid '{name}': integer below minimum value. Expected a value >= "
                       f"{minimum}, but got {value} instead.", name, "integer_below_min_value")


def validate_chat(body: Any) -> None:
    if not isinstance(body, dict):
        raise Invalid("Invalid body: expected a JSON object.")
    if not body.get("model"):
        raise Invalid("you must provide a model parameter")
    messages = body.get("messages")
    if messages is None:
        raise _missing("messages")
    if not isinstance(messages, list) or not messages:
        raise Invalid("Invalid 'messages': expected a non-empty array of messages.", "messages",
                       "invalid_value")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m:
            raise _missing(f"messages[{i}].role")
        if m["role"] not in ROLES:
            raise Invalid(f"Invalid value: {m['role']!r}. Supported values are: 'system', "
                           f"'assistant', 'user', 'function', 'tool', and 'developer'.",
                           f"messages[{i}].role", "invalid_value")
        calls = m.get("tool_calls") or []
        if not isinstance(calls, list) or not all(isinstance(c, dict) and c.get("id")
                                                  for c in calls):
            raise Invalid(f"Invalid 'messages[{i}].tool_calls': expected an array of tool calls, "
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
                raise Invalid("An assistant message with 'tool_calls' must be followed by tool "
                               "messages responding to each 'tool_call_id'. The following "
                               f"tool_call_ids did not have response messages: {', '.join(missing)}",
                               f"messages.[{i}].role")
        elif m["role"] == "tool" and m.get("tool_call_id") not in (last_calls or set()):
            raise Invalid("Invalid parameter: messages with role 'tool' must be a response to a "
                           "preceding message with 'tool_calls' (tool_call_id "
                           f"{m.get('tool_call_id')!r} matches none of them).",
                           f"messages.[{i}].role")


def validate_responses(body: Any) -> None:
    if not isinstance(body, dict):
        raise Invalid("Invalid body: expected a JSON object.")
    if not body.get("model"):
        raise _missing("model")
    if body.get("previous_response_id"):  # nothing is stored, so no response can be found
        raise Invalid(f"Previous response with id '{body['previous_response_id']}' not found.",
                       "previous_response_id", "previous_response_not_found")
    if body.get("instructions") is not None and not isinstance(body["instructions"], str):
        raise Invalid(f"Invalid type for 'instructions': expected a string, but got "
                       f"{_a(body['instructions'])} instead.", "instructions", "invalid_type")
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise Invalid(f"Invalid type for 'tools': expected an array, but got {_a(tools)} "
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
        raise Invalid(f"Invalid type for 'input': expected one of a string or array of input "
                       f"items, but got {_a(items)} instead.", "input", "invalid_type")
    calls: set[str] = set()
    outputs: set[str] = set()
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise Invalid(f"Invalid type for '{where}': expected an input item, but got "
                           f"{_a(item)} instead.", where, "invalid_type")
        kind = item.get("type", "message")
        if kind not in INPUT_ITEM_TYPES:
            raise Invalid(f"Invalid value: {kind!r}. Supported values are: 'message', "
                           f"'function_call', and 'function_call_output'.", f"{where}.type",
                           "invalid_value")
        if kind == "message":
            if "role" not in item:
                raise _missing(f"{where}.role")
            if item["role"] not in INPUT_ROLES:
                raise Invalid(f"Invalid value: {item['role']!r}. Supported values are: "
                               f"'assistant', 'system', 'developer', and 'user'.",
                               f"{where}.role", "invalid_value")
            if "content" not in item:
                raise _missing(f"{where}.content")
            if not isinstance(item["content"], (str, list)):
                raise Invalid(f"Invalid type for '{where}.content': expected one of a string "
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
                raise Invalid(f"Invalid type for '{where}.arguments': expected a string, but "
                               f"got {_a(item['arguments'])} instead.", f"{where}.arguments",
                               "invalid_type")
            calls.add(item["call_id"])
        elif item["call_id"] not in calls:
            raise Invalid("No tool call found for function call output with call_id "
                           f"{item['call_id']}.", "input")
        else:
            outputs.add(item["call_id"])
    unanswered = sorted(calls - outputs)
    if unanswered:
        raise Invalid(f"No tool output found for function call {unanswered[0]}.", "input")


# --- requests as chat messages ----------------------------------------------------------

def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: only text parts carry text
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def responses_messages(body: dict) -> list[dict]:
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
                             "content": text_of(item["output"])})
            joinable = False
        else:
            messages.append({"role": item["role"], "content": text_of(item["content"])})
            joinable = item["role"] == "assistant"
    return messages


def first_system_text(messages: list[dict]) -> str:
    for m in messages:
        if m["role"] in ("system", "developer"):
            return text_of(m.get("content"))
    return ""
