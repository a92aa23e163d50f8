"""LangChain's objects as journal data and back: a chat model's ``LLMResult``, a tool's output
(a ``ToolMessage``, plain data, or a ``Command`` holding messages), and a request's messages as
the inputs a replay compares.

Data only: messages are ``message_to_dict`` form and are rebuilt with ``messages_from_dict``,
whose classes are LangChain's message classes chosen by the entry's ``type`` field; nothing in a
journal names a class to import.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import BaseMessage, message_to_dict, messages_from_dict
from langchain_core.outputs import ChatGeneration, LLMResult

from ...errors import SerializationError

__all__ = ["decode_result", "decode_tool_output", "encode_result", "encode_tool_output",
           "prompt_messages"]

# Markers of LangChain objects inside a journaled tool output.
_MESSAGE = "langchain_message"
_COMMAND = "langgraph_command"


def _plain(value: Any) -> Any:
    """``value`` as JSON data; what JSON cannot hold (a provider's object in response
    metadata) as its text."""
    return json.loads(json.dumps(value, default=str))


def _message(data: dict) -> BaseMessage:
    return messages_from_dict([data])[0]


def encode_result(result: LLMResult) -> dict[str, Any]:
    """A chat model's ``LLMResult`` as JSON data: each generation's message and info."""
    return _plain({
        "generations": [[{"message": message_to_dict(g.message),  # type: ignore[attr-defined]
                          "generation_info": g.generation_info} for g in prompt]
                        for prompt in result.generations],
        "llm_output": result.llm_output,
    })


def decode_result(data: dict[str, Any]) -> LLMResult:
    """The ``LLMResult`` an :func:`encode_result` journaled."""
    return LLMResult(
        generations=[[ChatGeneration(message=_message(g["message"]),
                                     generation_info=g.get("generation_info"))
                      for g in prompt] for prompt in data["generations"]],
        llm_output=data.get("llm_output"))


def encode_tool_output(value: Any) -> Any:
    """A tool's output as JSON data: messages and LangGraph ``Command`` objects (a tool
    that updates the graph's state) marked, everything else as it is (the journal refuses
    what JSON cannot hold)."""
    from langgraph.types import Command

    if isinstance(value, BaseMessage):
        return {_MESSAGE: _plain(message_to_dict(value))}
    if isinstance(value, Command):
        return {_COMMAND: {"graph": value.graph, "update": encode_tool_output(value.update),
                           "resume": encode_tool_output(value.resume),
                           "goto": encode_tool_output(value.goto)}}
    if isinstance(value, dict):
        return {str(k): encode_tool_output(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode_tool_output(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise SerializationError(
        f"a tool returned a {type(value).__name__}, which the journal cannot hold: return "
        f"text, JSON data, a ToolMessage or a Command")


def decode_tool_output(data: Any) -> Any:
    """The tool output an :func:`encode_tool_output` journaled."""
    if isinstance(data, dict):
        if set(data) == {_MESSAGE}:
            return _message(data[_MESSAGE])
        if set(data) == {_COMMAND}:
            from langgraph.types import Command

            fields = data[_COMMAND]
            goto = decode_tool_output(fields["goto"])
            return Command(graph=fields["graph"], update=decode_tool_output(fields["update"]),
                           resume=decode_tool_output(fields["resume"]),
                           goto=goto if goto is not None else ())
        return {k: decode_tool_output(v) for k, v in data.items()}
    if isinstance(data, list):
        return [decode_tool_output(v) for v in data]
    return data


def _prompt_message(message: BaseMessage) -> dict[str, Any]:
    """What of a message reaches the model: its role, content, tool calls and tool call
    id. Not its ``id`` (``add_messages`` gives each new message a random one at every
    execution) nor the metadata of a reply."""
    shown: dict[str, Any] = {"type": message.type, "content": message.content}
    if getattr(message, "name", None):
        shown["name"] = message.name
    calls = getattr(message, "tool_calls", None)
    if calls:
        shown["tool_calls"] = [{"name": c["name"], "args": c["args"], "id": c.get("id")}
                               for c in calls]
    if getattr(message, "tool_call_id", None):
        shown["tool_call_id"] = message.tool_call_id  # type: ignore[attr-defined]
    return shown


def prompt_messages(prompts: Sequence[Sequence[BaseMessage]]) -> list[Any]:
    """The messages of a ``generate`` call as the step's inputs: one prompt's list, or
    each prompt's for a batch."""
    shown = [[_prompt_message(m) for m in prompt] for prompt in prompts]
    return _plain(shown[0] if len(shown) == 1 else shown)
