"""Messages in the form every OpenAI-compatible server accepts."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["assistant_message", "tool_names"]


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def _plain(value: Any) -> Any:
    """JSON data without None-valued fields (pydantic objects dumped)."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        value = dump(mode="json", exclude_none=True)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:  # a list of content parts: keep their text
        if isinstance(part, str):
            parts.append(part)
        else:
            kind = _get(part, "type")
            parts.append(str(_get(part, kind) or "") if kind in ("text", "refusal") else "")
    return "".join(parts)


def _tool_call(call: Any) -> dict[str, Any]:
    data = _plain(call)
    kind = data.get("type") or ("custom" if "custom" in data else "function")
    body = data.get(kind) or {}
    out: dict[str, Any] = {"id": data.get("id", ""), "type": kind}
    if kind == "function":
        out["function"] = {"name": body.get("name", ""), "arguments": body.get("arguments") or ""}
    else:
        out[kind] = body
    return out


def assistant_message(message: Any) -> dict[str, Any]:
    """The assistant message of a chat reply as a plain dict to append to ``messages``, in
    the form every OpenAI-compatible server accepts::

        reply = ctx.chat(model=..., messages=messages, tools=schemas)
        message = reply.choices[0].message
        messages.append(durable_nb.assistant_message(message))

    ``message`` is a ``ChatCompletionMessage`` (or a ``ChatCompletion``: its first choice's
    message, or a dict). The result has ``role`` and ``content``, always a string: the text,
    or ``""`` for a message with tool calls only (llama-cpp-python's chat template fails
    with HTTP 500 on an assistant message without ``content``, and its request validation on
    ``"content": null``; OpenAI, Azure and llama.cpp's server accept ``""``). ``tool_calls``
    are kept in the API's shape (``id``, ``type``, ``function.name``,
    ``function.arguments``); ``name`` and a ``refusal`` are kept when set, ``audio`` as its
    ``id``; ``None``-valued fields (``refusal``, ``audio``, ``annotations``,
    ``function_call``) and server extras (``reasoning_content``, which DeepSeek refuses back)
    are dropped. The deprecated ``function_call`` is kept only for a message without tool
    calls.
    """
    choices = _get(message, "choices")
    if choices is not None and _get(message, "message") is None:
        if not choices:
            raise ValueError("the ChatCompletion has no choices, so no assistant message")
        message = _get(choices[0], "message")
    if message is None:
        raise TypeError("assistant_message needs a ChatCompletionMessage, a ChatCompletion or "
                        "a dict, not None")
    role = _get(message, "role") or "assistant"
    if role != "assistant":
        raise ValueError(f"assistant_message needs an assistant message, not a {role!r} one")
    out: dict[str, Any] = {"role": "assistant", "content": _text(_get(message, "content"))}
    name = _get(message, "name")
    if isinstance(name, str) and name:
        out["name"] = name
    refusal = _get(message, "refusal")
    if isinstance(refusal, str) and refusal:
        out["refusal"] = refusal
    audio = _get(message, "audio")
    audio_id = _get(audio, "id") if audio is not None else None
    if audio_id:
        out["audio"] = {"id": audio_id}
    calls = _get(message, "tool_calls")
    if calls:
        out["tool_calls"] = [_tool_call(call) for call in calls]
    else:
        function_call = _get(message, "function_call")
        if function_call is not None:
            data = _plain(function_call)
            out["function_call"] = {"name": data.get("name", ""),
                                    "arguments": data.get("arguments") or ""}
    return out


def tool_names(tools: Iterable[Any] | None) -> list[str]:
    """Names of the function tools of a request (chat or Responses form, or Tool objects),
    in the request's order."""
    names: dict[str, None] = {}
    for entry in tools or ():
        entry = getattr(entry, "schema", entry)
        function = _get(entry, "function") or entry
        name = _get(function, "name")
        if isinstance(name, str):
            names[name] = None
    return list(names)
