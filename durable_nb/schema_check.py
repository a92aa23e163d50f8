"""Check a JSON value against a JSON schema, in words a model or a person can act on.

The subset durable_nb's tools and MCP's questions (elicitation) use: types, ``enum``,
``const``, ``anyOf``/``oneOf``, ``allOf``, ``items`` (with ``minItems``/``maxItems``),
``properties``/``required``/``additionalProperties``, local ``$defs`` references, and the
constraints of MCP's elicitation fields: ``minimum``/``maximum`` (and the exclusive ones),
``minLength``/``maxLength``, ``pattern`` and ``format`` (``email``, ``uri``, ``date``,
``date-time``; other formats are annotations, as JSON Schema says). :func:`schema_problems`
lists every way a value breaks a schema; :func:`schema_defect` says why a schema cannot
check anything (a ``$ref`` that names nothing, a pattern that is not a regular expression),
so that a caller refuses in words instead of failing. A leaf module: the approvals room
checks edits and answers with it, the tools layer a model's arguments.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["json_type", "schema_defect", "schema_problems", "shown_json"]


def schema_problems(value: Any, schema: Mapping[str, Any], noun: str = "argument"
                    ) -> list[str]:
    """One message per way ``value`` breaks ``schema`` (empty when it fits), each naming
    the ``noun`` (``argument``, ``field``) and what is expected. Never raises: a part of the
    schema that cannot be used (see :func:`schema_defect`) is one of the messages."""
    problems: list[str] = []
    _Checker(schema.get("$defs", {}), noun).check(value, schema, "", problems)
    return problems


def schema_defect(schema: Any) -> str | None:
    """Why ``schema`` cannot check a value (``its $ref '#/$defs/Gone' names nothing in
    $defs``), or None when it can. Checked before :func:`schema_problems` by a caller that
    must tell a bad value from a bad schema (an answer is refused either way, in words)."""
    if not isinstance(schema, Mapping):
        return f"it is {_json_type(schema)}, not a JSON object"
    return _defect(schema, schema.get("$defs", {}), 0)


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
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:[^\s]*$")


def _is_date(text: str) -> bool:
    try:
        datetime.date.fromisoformat(text)
    except ValueError:
        return False
    return len(text) == 10


def _is_date_time(text: str) -> bool:
    if not re.match(r"^\d{4}-\d\d-\d\d[Tt ]\d\d:\d\d:\d\d(\.\d+)?([Zz]|[+-]\d\d:\d\d)$", text):
        return False
    try:
        datetime.datetime.fromisoformat(text.replace("z", "Z").replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


#: The formats checked, with what a value must be.
_FORMATS: dict[str, tuple[Callable[[str], bool], str]] = {
    "email": (lambda s: bool(_EMAIL.match(s)), "an e-mail address (name@example.org)"),
    "uri": (lambda s: bool(_URI.match(s)), "a URI (https://example.org/...)"),
    "date": (_is_date, "a date (YYYY-MM-DD)"),
    "date-time": (_is_date_time, "a date and time (YYYY-MM-DDTHH:MM:SSZ)"),
}


def _json_type(value: Any) -> str:
    for name, test in _JSON_TYPES.items():
        if name != "number" and test(value):
            return name
    return "number" if _JSON_TYPES["number"](value) else type(value).__name__


def _ref_target(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any] | str:
    """What ``schema``'s ``$ref`` names, or why it names nothing."""
    ref = schema["$ref"]
    if not isinstance(ref, str) or not ref.startswith("#/$defs/"):
        return f"its $ref {ref!r} is not a local '#/$defs/NAME' reference"
    name = ref[len("#/$defs/"):]
    target = defs.get(name) if isinstance(defs, Mapping) else None
    if not isinstance(target, Mapping):
        return f"its $ref {ref!r} names nothing in $defs"
    return target


_MAX_DEPTH = 64  # a $ref cycle is walked no deeper


def _defect(schema: Any, defs: Mapping[str, Any], depth: int) -> str | None:
    if not isinstance(schema, Mapping) or depth > _MAX_DEPTH:
        return None if isinstance(schema, (Mapping, bool)) else \
            f"a part of it is {_json_type(schema)}, not a schema"
    if "$ref" in schema:
        target = _ref_target(schema, defs)
        if isinstance(target, str):
            return target
        found = _defect(target, defs, depth + 1)
        if found:
            return found
    pattern = schema.get("pattern")
    if pattern is not None:
        try:
            re.compile(str(pattern))
        except re.error as exc:
            return f"its pattern {pattern!r} is not a regular expression ({exc})"
    for bound in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                  "minLength", "maxLength", "minItems", "maxItems"):
        if bound in schema and not _JSON_TYPES["number"](schema[bound]):
            return f"its {bound} is {shown_json(schema[bound])}, not a number"
    subs: list[Any] = [*schema.get("allOf", ()), *(schema.get("anyOf") or ()),
                       *(schema.get("oneOf") or ())]
    if isinstance(schema.get("items"), Mapping):
        subs.append(schema["items"])
    properties = schema.get("properties")
    if isinstance(properties, Mapping):
        subs += list(properties.values())
    if isinstance(schema.get("additionalProperties"), Mapping):
        subs.append(schema["additionalProperties"])
    for sub in subs:
        found = _defect(sub, defs, depth + 1)
        if found:
            return found
    return None


def shown_json(value: Any) -> str:
    """``value`` as JSON for an error message, cut to 80 characters."""
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= 80 else text[:77] + "..."


class _Checker:
    """One check of a value: the schema's ``$defs`` and the word for what is checked."""

    def __init__(self, defs: Mapping[str, Any], noun: str) -> None:
        self.defs, self.noun = defs, noun

    def label(self, path: str) -> str:
        return f"{self.noun} {path!r}" if path else f"the {self.noun}s"

    def describe(self, schema: Mapping[str, Any], depth: int = 0) -> str:
        """A short phrase for what a schema accepts, such as 'a string or null'."""
        if "$ref" in schema:
            target = _ref_target(schema, self.defs)
            return "any JSON value" if isinstance(target, str) or depth > _MAX_DEPTH \
                else self.describe(target, depth + 1)
        if "enum" in schema:
            return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
        if "const" in schema:
            return json.dumps(schema["const"])
        branches = schema.get("anyOf") or schema.get("oneOf")
        if branches:
            return " or ".join(self.describe(b, depth + 1) for b in branches)
        kind = schema.get("type")
        if isinstance(kind, list):
            return " or ".join(_ARTICLE.get(k, k) for k in kind)
        if kind == "array" and "items" in schema:
            return f"an array of ({self.describe(schema['items'], depth + 1)})"
        return _ARTICLE.get(kind, "any JSON value") if kind else "any JSON value"

    def check(self, value: Any, schema: Mapping[str, Any], path: str,
              problems: list[str], depth: int = 0) -> None:
        """Append to ``problems`` one message per way ``value`` breaks ``schema``."""
        if "$ref" in schema:
            target = _ref_target(schema, self.defs)
            if isinstance(target, str):
                problems.append(f"{self.label(path)} cannot be checked: the schema's "
                                f"{target[4:]}")
                return
            if depth <= _MAX_DEPTH:
                self.check(value, target, path, problems, depth + 1)
        for sub in schema.get("allOf", ()):
            self.check(value, sub, path, problems, depth + 1)
        branches = schema.get("anyOf") or schema.get("oneOf")
        if branches:
            if not any(self.fits(value, b, path, depth + 1) for b in branches):
                problems.append(f"{self.label(path)} must be {self.describe(schema)}, "
                                f"got {shown_json(value)}")
            return
        if "enum" in schema and value not in schema["enum"]:
            problems.append(f"{self.label(path)} must be {self.describe(schema)}, "
                            f"got {shown_json(value)}")
            return
        if "const" in schema and value != schema["const"]:
            problems.append(f"{self.label(path)} must be {json.dumps(schema['const'])}, "
                            f"got {shown_json(value)}")
            return
        kind = schema.get("type")
        if kind is not None:
            kinds = kind if isinstance(kind, list) else [kind]
            if not any(_JSON_TYPES[k](value) for k in kinds if k in _JSON_TYPES):
                problems.append(f"{self.label(path)} must be {self.describe(schema)}, "
                                f"got {_json_type(value)} {shown_json(value)}")
                return
        self.check_bounds(value, schema, path, problems)
        if isinstance(value, list) and "items" in schema:
            for i, item in enumerate(value):
                self.check(item, schema["items"], f"{path}[{i}]", problems, depth + 1)
        if isinstance(value, dict):
            self.check_object(value, schema, path, problems, depth)

    def check_bounds(self, value: Any, schema: Mapping[str, Any], path: str,
                     problems: list[str]) -> None:
        """The constraints beyond the type: numbers' range, strings' length, pattern and
        format, arrays' length."""
        label = self.label(path)
        if _JSON_TYPES["number"](value):
            for key, fails, words in (("minimum", lambda b: value < b, "at least"),
                                      ("maximum", lambda b: value > b, "at most"),
                                      ("exclusiveMinimum", lambda b: value <= b, "more than"),
                                      ("exclusiveMaximum", lambda b: value >= b, "less than")):
                bound = schema.get(key)
                if _JSON_TYPES["number"](bound) and fails(bound):
                    problems.append(f"{label} must be {words} {shown_json(bound)}, "
                                    f"got {shown_json(value)}")
        if isinstance(value, str):
            length = len(value)
            low, high = schema.get("minLength"), schema.get("maxLength")
            if _JSON_TYPES["number"](low) and length < low:
                problems.append(f"{label} must have at least {low} characters, got {length}")
            if _JSON_TYPES["number"](high) and length > high:
                problems.append(f"{label} must have at most {high} characters, got {length}")
            pattern = schema.get("pattern")
            if isinstance(pattern, str):
                try:
                    matched = re.search(pattern, value) is not None
                except re.error as exc:
                    problems.append(f"{label} cannot be checked: the schema's pattern "
                                    f"{pattern!r} is not a regular expression ({exc})")
                else:
                    if not matched:
                        problems.append(f"{label} must match the pattern {pattern!r}, "
                                        f"got {shown_json(value)}")
            known = _FORMATS.get(str(schema.get("format")))
            if known is not None and not known[0](value):
                problems.append(f"{label} must be {known[1]}, got {shown_json(value)}")
        if isinstance(value, list):
            low, high = schema.get("minItems"), schema.get("maxItems")
            if _JSON_TYPES["number"](low) and len(value) < low:
                problems.append(f"{label} must have at least {low} items, got {len(value)}")
            if _JSON_TYPES["number"](high) and len(value) > high:
                problems.append(f"{label} must have at most {high} items, got {len(value)}")

    def check_object(self, value: dict[str, Any], schema: Mapping[str, Any], path: str,
                     problems: list[str], depth: int) -> None:
        properties = schema.get("properties", {})
        for key in schema.get("required", ()):
            if key not in value:
                sub = f"{path}.{key}" if path else key
                problems.append(f"missing required {self.noun} {sub!r} "
                                f"({self.describe(properties.get(key, {}))})")
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            sub = f"{path}.{key}" if path else key
            if key in properties:
                self.check(item, properties[key], sub, problems, depth + 1)
            elif extra is False:
                allowed = ", ".join(properties) or "none"
                problems.append(f"unknown {self.noun} {sub!r}; the accepted {self.noun}s "
                                f"are: {allowed}")
            elif isinstance(extra, Mapping):
                self.check(item, extra, sub, problems, depth + 1)

    def fits(self, value: Any, schema: Mapping[str, Any], path: str, depth: int) -> bool:
        found: list[str] = []
        self.check(value, schema, path, found, depth)
        return not found
