"""What the loopback server answers: scripted replies, the demo's script, and the generic echo
mode for your own cells.

A script is either a sequence of :class:`Reply` (round ``n`` of a conversation gets entry ``n``;
past the end a plain final text, :data:`FINAL_TEXT`), or :data:`ECHO`, which answers from the
request itself. Both answer a request the same way every time: the reply depends on the request
alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

from .requests import text_of

__all__ = ["DEMO_SCRIPT", "ECHO", "FINAL_TEXT", "SCRIPT_NAMES", "Echo", "Reply", "Script",
           "ToolCall", "example_arguments", "load_script", "script_named"]

#: The reply to a round past the end of a scripted sequence.
FINAL_TEXT = "done"


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


def _first_type(schema: Mapping[str, Any]) -> str | None:
    kind = schema.get("type")
    if isinstance(kind, list):  # ["string", "null"]: the first that is not null
        kind = next((k for k in kind if k != "null"), "null")
    return kind if isinstance(kind, str) else None


def _example(schema: Any, root: Mapping[str, Any], depth: int = 0) -> Any:
    """A value that ``schema`` accepts, made up from the schema alone: its ``const``, first
    ``enum`` value, ``default`` or first of ``examples``, else a placeholder of its type."""
    if not isinstance(schema, Mapping) or depth > 8:
        return None
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):  # pydantic puts nested models in $defs
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, Mapping) else None
        return _example(target, root, depth + 1)
    for key in ("const", "default"):
        if key in schema:
            return schema[key]
    for key in ("enum", "examples"):
        if isinstance(schema.get(key), list) and schema[key]:
            return schema[key][0]
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            usable = [o for o in options if not (isinstance(o, Mapping)
                                                 and o.get("type") == "null")]
            return _example((usable or options)[0], root, depth + 1)
    kind = _first_type(schema) or ("object" if "properties" in schema else None)
    if kind == "object":
        return example_arguments(schema, root, depth + 1)
    if kind == "array":
        item = schema.get("items")
        return [_example(item, root, depth + 1)] if isinstance(item, Mapping) else []
    return {"string": "example", "integer": 1, "number": 1, "boolean": True}.get(kind or "")


def example_arguments(schema: Any, root: Mapping[str, Any] | None = None,
                      depth: int = 0) -> dict[str, Any]:
    """Arguments for a tool whose parameters are the JSON schema ``schema``: one made-up value
    (see :class:`Echo`) for each of its ``required`` properties, nothing for the others."""
    if not isinstance(schema, Mapping):
        return {}
    root = schema if root is None else root
    properties = schema.get("properties") if isinstance(schema.get("properties"), Mapping) \
        else {}
    required = schema.get("required") if isinstance(schema.get("required"), list) else []
    return {name: _example(properties.get(name, {}), root, depth)
            for name in required if isinstance(name, str)}


def _function(tool: Any) -> tuple[str, Any] | None:
    """(name, parameters) of a function tool in chat form (``{"type": "function", "function":
    {...}}``) or Responses form (``{"type": "function", "name": ...}``); None for others."""
    if not isinstance(tool, Mapping) or tool.get("type", "function") != "function":
        return None
    spec = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
    name = spec.get("name")
    return (name, spec.get("parameters") or {}) if isinstance(name, str) and name else None


class Echo:
    """The generic mode, for your own cells (``python -m durable_nb.testing`` serves it unless
    a script is chosen). Round by round:

    - a request that ends with tool results gets a final text naming the tool and what it
      returned (``"echo: get_weather returned 'sunny'"``);
    - else, a request that offers function tools (and no ``tool_choice="none"``) gets one
      call of the first tool, with arguments made from its JSON schema: a value for each
      required property (its ``const``, first ``enum`` value, ``default`` or first example,
      else ``"example"``, ``1``, ``true``, ``[...]`` or ``{...}`` by type);
    - else the last user message comes back as the answer: ``"echo: <message>"``.

    It is not a model and says so: every HTTP response carries ``X-Loopback-Script: echo``.
    """

    name = "echo"

    def reply(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any]) -> Reply:
        """The reply to a request of chat ``messages`` offering ``tools``."""
        last = messages[-1] if messages else {}
        if last.get("role") == "tool":
            return Reply(content=f"echo: {self._tool_results(messages)}")
        offered = [f for f in map(_function, tools) if f is not None]
        if offered:
            name, parameters = offered[0]
            return Reply(tool_calls=[ToolCall(name, example_arguments(parameters))])
        said = next((text_of(m.get("content")) for m in reversed(messages)
                     if m.get("role") == "user"), "")
        return Reply(content=f"echo: {said}")

    @staticmethod
    def _tool_results(messages: Sequence[Mapping[str, Any]]) -> str:
        results = []
        for m in reversed(messages):
            if m.get("role") != "tool":
                break
            results.append(m)
        names = {c.get("id"): (c.get("function") or {}).get("name", "?")
                 for m in messages if m.get("role") == "assistant"
                 for c in m.get("tool_calls") or [] if isinstance(c, Mapping)}
        return "; ".join(f"{names.get(m.get('tool_call_id'), 'a tool')} returned "
                         f"{text_of(m.get('content'))[:200]!r}" for m in reversed(results))

    def __repr__(self) -> str:
        return "ECHO"


#: The generic mode (see :class:`Echo`).
ECHO = Echo()

#: What a server answers from: a sequence of replies taken round by round, or :data:`ECHO`.
Script = Union[Sequence[Reply], Echo]

#: The scripts ``python -m durable_nb.testing --script NAME`` and ``LoopbackServer(NAME)`` know.
SCRIPT_NAMES = ("echo", "demo")


def script_named(name: str) -> Script:
    """The script called ``name`` (:data:`SCRIPT_NAMES`); a ValueError naming them else."""
    if name == "echo":
        return ECHO
    if name == "demo":
        return DEMO_SCRIPT
    raise ValueError(f"no script is called {name!r}; use one of {', '.join(SCRIPT_NAMES)} or "
                     f"a JSON file")
