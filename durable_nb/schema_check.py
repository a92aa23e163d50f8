"""Check a JSON value against a JSON schema, in words a model or a person can act on.

The subset durable_nb's tools use (types, ``enum``, ``const``, ``anyOf``/``oneOf``,
``allOf``, ``items``, ``properties``/``required``/``additionalProperties``, local
``$defs`` references): :func:`schema_problems` lists every way a value breaks a schema.
A leaf module: the approvals room checks edited arguments with it, the tools layer a
model's arguments.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["json_type", "schema_problems"]


def schema_problems(value: Any, schema: Mapping[str, Any]) -> list[str]:
    """One message per way ``value`` breaks ``schema`` (empty when it fits), each naming
    the argument and what is expected."""
    problems: list[str] = []
    _check(value, schema, "", schema.get("$defs", {}), problems)
    return problems


def json_type(value: Any) -> str:
    """The JSON type name of ``value`` (``string``, ``integer``, ``object``, ...)."""
    return _json_type(value)


_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}
_ARTICLE = {"string": "a string", "integer": "an integer", "number": "a number",
            "boolean": "a boolean", "null": "null", "array": "an array", "object": "an object"}


def _json_type(value: Any) -> str:
    for name, test in _JSON_TYPES.items():
        if name != "number" and test(value):
            return name
    return "number" if _JSON_TYPES["number"](value) else type(value).__name__


def _describe(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> str:
    """A short phrase for what a schema accepts, such as 'a string or null'."""
    if "$ref" in schema:
        return _describe(_resolve(schema, defs), defs)
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    if "const" in schema:
        return json.dumps(schema["const"])
    branches = schema.get("anyOf") or schema.get("oneOf")
    if branches:
        return " or ".join(_describe(b, defs) for b in branches)
    kind = schema.get("type")
    if isinstance(kind, list):
        return " or ".join(_ARTICLE.get(k, k) for k in kind)
    if kind == "array" and "items" in schema:
        return f"an array of ({_describe(schema['items'], defs)})"
    return _ARTICLE.get(kind, "any JSON value") if kind else "any JSON value"


def _resolve(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = schema["$ref"]
    name = ref.rsplit("/", 1)[-1]
    if not ref.startswith("#/$defs/") or name not in defs:
        raise ValueError(f"the tool schema has a $ref that cannot be resolved: {ref}")
    return defs[name]


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= 80 else text[:77] + "..."


def _label(path: str) -> str:
    return f"argument {path!r}" if path else "the arguments"


def _check(value: Any, schema: Mapping[str, Any], path: str, defs: Mapping[str, Any],
           problems: list[str]) -> None:
    """Append to ``problems`` one message per way ``value`` breaks ``schema``."""
    if "$ref" in schema:
        _check(value, _resolve(schema, defs), path, defs, problems)
    for sub in schema.get("allOf", ()):
        _check(value, sub, path, defs, problems)
    branches = schema.get("anyOf") or schema.get("oneOf")
    if branches:
        if not any(_fits(value, b, path, defs) for b in branches):
            problems.append(f"{_label(path)} must be {_describe(schema, defs)}, "
                            f"got {_show(value)}")
        return
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{_label(path)} must be {_describe(schema, defs)}, "
                        f"got {_show(value)}")
        return
    if "const" in schema and value != schema["const"]:
        problems.append(f"{_label(path)} must be {json.dumps(schema['const'])}, "
                        f"got {_show(value)}")
        return
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        if not any(_JSON_TYPES[k](value) for k in kinds if k in _JSON_TYPES):
            problems.append(f"{_label(path)} must be {_describe(schema, defs)}, "
                            f"got {_json_type(value)} {_show(value)}")
            return
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            _check(item, schema["items"], f"{path}[{i}]", defs, problems)
    if isinstance(value, dict):
        _check_object(value, schema, path, defs, problems)


def _check_object(value: dict[str, Any], schema: Mapping[str, Any], path: str,
                  defs: Mapping[str, Any], problems: list[str]) -> None:
    properties = schema.get("properties", {})
    for key in schema.get("required", ()):
        if key not in value:
            sub = f"{path}.{key}" if path else key
            problems.append(f"missing required argument {sub!r} "
                            f"({_describe(properties.get(key, {}), defs)})")
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        sub = f"{path}.{key}" if path else key
        if key in properties:
            _check(item, properties[key], sub, defs, problems)
        elif extra is False:
            allowed = ", ".join(properties) or "none"
            problems.append(f"unknown argument {sub!r}; the accepted arguments are: {allowed}")
        elif isinstance(extra, Mapping):
            _check(item, extra, sub, defs, problems)


def _fits(value: Any, schema: Mapping[str, Any], path: str, defs: Mapping[str, Any]) -> bool:
    found: list[str] = []
    _check(value, schema, path, defs, found)
    return not found
