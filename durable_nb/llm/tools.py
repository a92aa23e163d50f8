"""Describe Python functions to the model as OpenAI tools, and check what the model sends back.

``@tool`` reads a function's signature, type hints and docstring once, at decoration, and
turns them into the JSON schema of an OpenAI ``tools`` entry. ``Tool.validate`` checks the
arguments the model produced against that schema; its errors are written to be sent back to
the model so it can correct the call.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, Union

# typing_extensions (a pydantic dependency) also recognises its own TypedDict on Python 3.10.
from typing_extensions import NotRequired, Required, is_typeddict

from ..approvals.policy import approvers_list
from ..approvals.policy import ApprovalPolicy, Duration
from ..schema_check import json_type, schema_problems

__all__ = ["Tool", "parse_arguments", "tool"]

_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what the OpenAI API accepts
_CONTEXT_PARAM = "ctx"
_NoneType = type(None)


@dataclasses.dataclass(frozen=True, eq=False)
class Tool:
    """A function the model may call, with the schema the model sees.

    Calling the Tool calls the function unchanged. ``takes_ctx`` says whether the function
    has a ``ctx`` parameter, which the runtime fills in and the model never sees.
    """

    fn: Callable[..., Any]
    name: str
    description: str
    parameters: dict[str, Any]
    needs_approval: bool | Callable[[dict[str, Any]], bool] = False
    takes_ctx: bool = False
    #: Who may approve a call of this tool (names or e-mail addresses), in place of the
    #: run's approvers; None, the run's (``RunOptions.approvers``).
    approvers: list[str] | None = None
    #: The deadline of this tool's approvals (``timeout=``, ``on_timeout=``, ...), or None.
    approval_policy: ApprovalPolicy | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    @property
    def __wrapped__(self) -> Callable[..., Any]:  # lets inspect.signature see the function
        return self.fn

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry for this tool (a fresh copy each time)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": copy.deepcopy(self.parameters),
            },
        }

    def requires_approval(self, args: Mapping[str, Any]) -> bool:
        """Whether this call must wait for a human's approval before it runs.

        A callable ``needs_approval`` is asked with the call's (validated) arguments.
        """
        if callable(self.needs_approval):
            return bool(self.needs_approval(dict(args)))
        return bool(self.needs_approval)

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Return the arguments as a new dict if they fit the schema, else raise ValueError.

        Checks required and unknown arguments and JSON types (nested too). The error lists
        every problem and what is expected, in words meant for the model.
        """
        if not isinstance(arguments, Mapping):
            raise ValueError(f"arguments for tool {self.name!r} must be a JSON object, "
                             f"got {json_type(arguments)}")
        problems = schema_problems(dict(arguments), self.parameters)
        if problems:
            raise ValueError(f"invalid arguments for tool {self.name!r}: " + "; ".join(problems)
                             + ". Call it again with corrected arguments.")
        return dict(arguments)


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None,
         description: str | None = None,
         needs_approval: bool | Callable[[dict[str, Any]], bool] = False,
         approvers: str | Iterable[str] | None = None,
         timeout: Duration | None = None, on_timeout: str = "reject",
         escalate_to: str | Sequence[str] | None = None,
         remind: Duration | Sequence[Duration] | None = None,
         ) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a function a :class:`Tool`: ``@tool``, ``@tool(needs_approval=True)``, ...

    ``approvers`` (with ``needs_approval``): who may approve its calls, in place of the run's
    approvers (``@tool(needs_approval=True, approvers=["ana"])``); a refused person gets
    :class:`~durable_nb.errors.NotAllowedToDecide`.

    The name defaults to the function's, the description to the docstring's first
    paragraph; parameter descriptions come from a Google-style ``Args:`` section or reST
    ``:param x:`` lines (or ``Annotated[X, "text"]``). Parameters with defaults are optional;
    an unannotated one accepts any JSON value. A parameter named ``ctx`` is left out of the
    schema (the runtime passes it; see ``Tool.takes_ctx``). ``TypeError``
    is raised at decoration for signatures the model cannot call (``*args``, ``**kwargs``,
    positional-only parameters, unsupported annotations).

    ``timeout``, ``on_timeout``, ``escalate_to`` and ``remind`` are the deadline of the
    call's approval, as for ``ctx.approval`` (checked here: :class:`ApprovalPolicyError`).
    """
    names = approvers_list(approvers, "@tool(approvers=...)")
    if names is not None and needs_approval is False:
        raise ValueError("@tool(approvers=...) names who may approve its calls, but the tool "
                         "asks for no approval: add needs_approval=True")
    policy = (None if timeout is None and on_timeout == "reject" and escalate_to is None
              and remind is None
              else ApprovalPolicy.of(timeout, on_timeout, escalate_to, remind))

    def make(func: Callable[..., Any]) -> Tool:
        built = dataclasses.replace(_build(func, name, description, needs_approval),
                                    approvers=names)
        return built if policy is None else dataclasses.replace(built, approval_policy=policy)

    return make if fn is None else make(fn)


def parse_arguments(tool: Tool, raw: str) -> dict[str, Any]:
    """Turn the model's JSON arguments string into a dict, or raise ValueError.

    An empty string means no arguments (some models send it for parameterless tools).
    """
    if not raw or not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"arguments are not valid JSON: {exc}. Send the arguments of tool "
                         f"{tool.name!r} as one JSON object.") from None
    if not isinstance(value, dict):
        raise ValueError(f"arguments for tool {tool.name!r} must be a JSON object, "
                         f"got {json_type(value)}")
    return value


# --- building the schema ----------------------------------------------------------------

def _build(fn: Callable[..., Any], name: str | None, description: str | None,
           needs_approval: bool | Callable[[dict[str, Any]], bool]) -> Tool:
    if not callable(fn):
        raise TypeError(f"@tool needs a function, got {type(fn).__name__}")
    tool_name = name or getattr(fn, "__name__", "")
    if not _NAME_RE.match(tool_name):
        raise ValueError(f"tool name {tool_name!r} is not allowed: OpenAI needs 1-64 letters, "
                         f"digits, '_' or '-'. Pass @tool(name=...).")
    summary, param_docs = _parse_docstring(inspect.getdoc(fn) or "")
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:  # noqa: BLE001 - NameError, TypeError from bad annotations
        raise TypeError(f"tool {tool_name!r}: cannot resolve its type hints ({exc}); define "
                        f"the types it uses at module level") from exc

    properties: dict[str, Any] = {}
    required: list[str] = []
    defs: dict[str, Any] = {}
    takes_ctx = False
    for param in inspect.signature(fn).parameters.values():
        if param.name == _CONTEXT_PARAM:
            takes_ctx = True
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            star = "*" if param.kind is param.VAR_POSITIONAL else "**"
            raise TypeError(f"tool {tool_name!r}: parameter {star}{param.name} cannot be "
                            f"described to the model; declare each argument by name")
        if param.kind is param.POSITIONAL_ONLY:
            raise TypeError(f"tool {tool_name!r}: parameter {param.name!r} is positional-only, "
                            f"but tools are called with keyword arguments; remove the '/'")
        where = f"tool {tool_name!r} parameter {param.name!r}"
        # An unannotated parameter accepts any JSON value.
        prop = _schema_for(hints[param.name], where, defs) if param.name in hints else {}
        if param.name in param_docs:  # more specific than a description the type carries
            prop["description"] = param_docs[param.name]
        if param.default is param.empty:
            required.append(param.name)
        elif _is_json_scalar(_plain(param.default)):
            prop["default"] = _plain(param.default)
        properties[param.name] = prop

    parameters: dict[str, Any] = {"type": "object", "properties": properties,
                                  "required": required, "additionalProperties": False}
    if defs:
        parameters["$defs"] = defs
    return Tool(fn=fn, name=tool_name,
                description=description if description is not None else summary,
                parameters=parameters, needs_approval=needs_approval, takes_ctx=takes_ctx)


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


def _is_json_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean", _NoneType: "null"}


def _schema_for(hint: Any, where: str, defs: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema of a type hint; pydantic ``$defs`` are collected into ``defs``."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is None:
        return {"type": "null"}
    if isinstance(hint, type) and hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    if hint is Any:
        return {}
    if origin is typing.Annotated:
        schema = dict(_schema_for(args[0], where, defs))
        texts = [m for m in args[1:] if isinstance(m, str)]
        if texts:
            schema["description"] = " ".join(texts)
        return schema
    if origin is Literal:
        values = [_plain(v) for v in args]
        kinds = {_SCALARS.get(type(v)) for v in values}
        return {"type": kinds.pop(), "enum": values} if len(kinds) == 1 else {"enum": values}
    if origin in (Union, types.UnionType):
        return {"anyOf": [_schema_for(a, where, defs) for a in args]}
    if hint is list or origin is list:
        return {"type": "array", **({"items": _schema_for(args[0], where, defs)} if args else {})}
    if hint is dict or origin is dict:
        if args and args[0] is not str:
            raise TypeError(f"{where}: dict keys must be str (JSON object keys), got {args[0]!r}")
        extra = {"additionalProperties": _schema_for(args[1], where, defs)} if args else {}
        return {"type": "object", **extra}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        values = [m.value for m in hint]
        kinds = {_SCALARS.get(type(v)) for v in values}
        return {"type": kinds.pop(), "enum": values} if len(kinds) == 1 else {"enum": values}
    if is_typeddict(hint):
        return _typeddict_schema(hint, where, defs)
    if isinstance(hint, type) and hasattr(hint, "model_json_schema"):
        return _pydantic_schema(hint, defs)
    raise TypeError(f"{where}: type {hint!r} cannot be described as JSON. Use str, int, float, "
                    f"bool, None, list[X], dict[str, X], X | None, Literal[...], an Enum, a "
                    f"TypedDict or a pydantic model.")


def _typeddict_schema(td: type, where: str, defs: dict[str, Any]) -> dict[str, Any]:
    hints = typing.get_type_hints(td, include_extras=True)
    properties = {}
    required = []
    for key, hint in hints.items():
        # With string annotations (`from __future__ import annotations`) the class cannot
        # see Required/NotRequired, so __required_keys__ is only right for unwrapped keys.
        wrapper = typing.get_origin(hint)
        if wrapper in (NotRequired, Required):
            hint = typing.get_args(hint)[0]
        if wrapper is Required or (wrapper is not NotRequired and key in td.__required_keys__):
            required.append(key)
        properties[key] = _schema_for(hint, f"{where} field {key!r}", defs)
    return {"type": "object", "properties": properties, "required": required,
            "additionalProperties": False}


def _pydantic_schema(model: type, defs: dict[str, Any]) -> dict[str, Any]:
    # Nested models come back as "#/$defs/Name" refs; they are hoisted to the top of the
    # parameters schema, where the refs resolve.
    schema = model.model_json_schema()
    defs.update(schema.pop("$defs", {}))
    return schema


_ARGS_HEADERS = {"args:", "arguments:", "parameters:", "params:"}
_SECTION_RE = re.compile(r"^[A-Z][A-Za-z ]*:$")  # "Returns:", "Raises:", ...
_GOOGLE_ARG_RE = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_REST_PARAM_RE = re.compile(r"^:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a cleaned docstring into its first paragraph and per-parameter descriptions.

    Parameter descriptions come from a Google-style ``Args:`` section (``name (type): text``
    with indented continuation lines) and from reST ``:param [type] name: text`` fields.
    """
    lines = doc.splitlines()
    summary: list[str] = []
    for line in lines:
        stripped = line.strip()
        if not stripped or stripped.startswith(":") or _SECTION_RE.match(stripped):
            break
        summary.append(stripped)

    params: dict[str, list[str]] = {}
    current: str | None = None
    mode: str | None = None  # "google" inside an Args: section, "rest" after a :param: line
    base = 0  # indent of the Args: header, or of the :param: line
    arg_indent: int | None = None  # indent of the argument lines in an Args: section
    for number, line in enumerate(lines):
        stripped = line.strip()
        if not stripped:
            continue  # blank lines end neither a section nor an argument
        indent = len(line) - len(line.lstrip())
        field = _REST_PARAM_RE.match(stripped)
        if field:
            mode, base, current = "rest", indent, field.group(1)
            params[current] = [field.group(2)]
        elif stripped.lower() in _ARGS_HEADERS:
            mode, current, arg_indent = "google", None, None
            # A header on the docstring's first line lost its indent in cleaning, so the
            # arguments below it may sit at indent 0 too.
            base = indent if number > 0 else -1
        elif mode == "google" and indent <= (base if arg_indent is None else arg_indent) \
                and _SECTION_RE.match(stripped):
            mode, current = None, None  # "Returns:" and the like end the Args: section
        elif mode == "google" and indent > base:
            match = _GOOGLE_ARG_RE.match(stripped)
            if match and (arg_indent is None or indent <= arg_indent):
                current, arg_indent = match.group(1), indent
                params[current] = [match.group(2)]
            elif current is not None:
                params[current].append(stripped)  # a wrapped description line
        elif mode == "rest" and indent > base and current is not None:
            params[current].append(stripped)
        else:
            mode, current = None, None  # another section or field begins
    return " ".join(summary), {k: " ".join(p for p in v if p) for k, v in params.items()}
