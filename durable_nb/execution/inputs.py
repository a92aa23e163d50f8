"""What a step was asked: canonical inputs, their fingerprint, how they are stored, and how
two of them differ.

A step's inputs (a chat request's model, messages and tools; a ``ctx.run`` function's
arguments) are turned into canonical JSON data (:func:`canonical`): every value by its value,
pydantic models by ``model_dump`` without ``None`` fields, tuples as lists, Decimal, dates,
UUIDs, paths, enums, dataclasses and the other types the journal encodes as tagged data.
Values that are not data (functions, open files, clients, data frames) are refused with a
:class:`~durable_nb.errors.SerializationError` before the step runs: compared by their type
only, an edited value would replay a stale result. The fingerprint is a digest of that data;
replay compares it with the journaled one and stops before returning a stale result when they
differ.

The inputs themselves are journaled too, so that a person can see what a step was asked and
what changed. Large parts are stored once per run as *blobs*, by digest: each chat message
once, however many later requests repeat it, and the list of a request's messages as a chain
that extends the list of an earlier request (:mod:`durable_nb.journal.blobs`), so the journal
grows with new content only.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import json
import sys
from collections.abc import Mapping
from decimal import Decimal
from enum import Enum
from pathlib import PurePath
from typing import Any, Callable
from uuid import UUID

from .. import serde
from ..errors import SerializationError
from ..journal.blobs import blob_digest, expand_list

__all__ = ["canonical", "first_difference", "fingerprint", "load_request", "step_identity",
           "store_request"]


def _not_given_types() -> tuple[type, ...]:
    """openai's markers for an argument left out (they have no value but their type); none
    while openai is not imported, when no such marker can exist."""
    openai = sys.modules.get("openai")
    return tuple(t for t in (getattr(openai, "NotGiven", None), getattr(openai, "Omit", None))
                 if isinstance(t, type))

#: Top-level input fields that hold lists of large items, stored one blob per item.
_PER_ITEM = ("messages", "input")
#: A field whose JSON is longer than this is stored as a blob.
_INLINE_LIMIT = 512


def canonical(value: Any) -> Any:
    """``value`` as JSON data that is the same for equal inputs across processes, and differs
    for inputs that differ.

    JSON data stays as it is (tuples as lists, sets sorted, bytes as base64); pydantic models
    become their ``model_dump`` without ``None`` fields, a durable_nb Tool its schema; values
    of the other types the journal can encode or compare become ``{"$t": TYPE, "v": DATA}``
    (Decimal, datetime, date, time, UUID, paths, enums, dataclasses, numpy scalars when numpy
    is loaded, types registered with :func:`durable_nb.register_type`). Anything else cannot be
    compared by value and raises :class:`~durable_nb.errors.SerializationError` naming the
    part and what to pass instead.
    """
    try:
        return _canonical(value, 0)
    except _Refused as refused:
        raise _refusal(refused) from None


class _Refused(Exception):
    """A value of no comparable type; ``path`` is filled in as it unwinds."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self.type_name = _qualified(type(value))
        self.path: list[str] = []


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _refusal(refused: _Refused) -> SerializationError:
    where = "".join(reversed(refused.path)).lstrip(".")
    what = f"the step input {where}" if where else "the step input"
    return SerializationError(
        f"{what} is a {refused.type_name}, which durable_nb cannot compare by value, so an "
        f"edited value would replay the old result. Pass its data instead (JSON data, a "
        f"dataclass, a pydantic model, or a type registered with durable_nb.register_type); "
        f"an object the step only uses (a client, a connection, a data frame) goes to the "
        f"function through a closure, e.g. ctx.run(name, lambda: fn(obj)).")


def _canonical(value: Any, depth: int) -> Any:
    if depth > 100:
        return "<deeply nested>"
    t = type(value)
    if t is str or t is int or t is bool or value is None:
        return value
    if t is dict:  # JSON containers first, without the Mapping check (an ABC's, slow)
        return _mapping(value, depth)
    if t is list:
        return _items(value, depth)
    if isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else repr(value)
    if isinstance(value, Mapping):
        return _mapping(value, depth)
    if isinstance(value, (list, tuple)):
        return _items(value, depth)
    if isinstance(value, (set, frozenset)):
        return sorted(_items(value, depth), key=repr)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, _not_given_types()):  # openai's "argument left out" markers
        return f"<{_qualified(type(value))}>"
    same_for_all = getattr(type(value), "__durable_input__", None)
    if isinstance(same_for_all, str):  # ctx handed to a step: the same input on every replay
        return same_for_all
    dump = getattr(value, "model_dump", None)
    if callable(dump) and hasattr(type(value), "model_validate"):
        try:
            data = dump(mode="json", exclude_none=True)
        except Exception:  # noqa: BLE001 - a model that cannot dump cannot be compared
            raise _Refused(value) from None
        return _canonical(data, depth + 1)
    schema = getattr(value, "schema", None)  # a durable_nb Tool: the model sees its schema
    if isinstance(schema, Mapping):
        return _canonical(schema, depth + 1)
    return {"$t": _type_tag(value), "v": _canonical(_value_data(value), depth + 1)}


def _mapping(value: Mapping, depth: int) -> dict:
    out = {}
    for k, v in value.items():
        try:
            out[str(k)] = _canonical(v, depth + 1)
        except _Refused as refused:
            refused.path.append(f".{k}" if isinstance(k, str) else f"[{k!r}]")
            raise
    return out


def _items(values: Any, depth: int) -> list:
    out = []
    for i, v in enumerate(values):
        try:
            out.append(_canonical(v, depth + 1))
        except _Refused as refused:
            refused.path.append(f"[{i}]")
            raise
    return out


def _type_tag(value: Any) -> str:
    codec = serde.codec_of(type(value))
    return codec.tag if codec is not None else _qualified(type(value))


def _value_data(value: Any) -> Any:
    """The data that tells values of a comparable non-JSON type apart; _Refused otherwise."""
    codec = serde.codec_of(type(value))
    if codec is not None:  # Decimal, datetime, date and registered types: as journaled
        return codec.encode(value)
    if isinstance(value, (_dt.time, _dt.date)):  # and their subclasses
        return value.isoformat()
    if isinstance(value, (Decimal, UUID, PurePath)):
        return str(value)
    if isinstance(value, Enum):
        return value.name
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.compare}
    numpy = sys.modules.get("numpy")  # never imported here: its scalars exist only if it is
    if numpy is not None and isinstance(value, numpy.generic):
        return value.item()
    raise _Refused(value)


def _dumps(data: Any) -> str:
    return _SORTED.encode(data)


def fingerprint(data: Any) -> str:
    """A short digest of input data, as :func:`canonical` would make it (computed without
    building the canonical copy: on replay it is the only work a step's inputs cost)."""
    try:
        text = _SORTED_ANY.encode(data)
    except (TypeError, ValueError):  # keys of mixed types cannot be sorted, or a refused value
        text = _dumps(canonical(data))  # raises SerializationError naming the refused part
    return blob_digest(text)


def step_identity(kind: str, name: str, fp: str) -> str:
    """A short digest of what a step is: its kind, name and input fingerprint (the
    ``parent`` journaled with the steps made inside it)."""
    return blob_digest(f"{kind}\n{name}\n{fp}")


def _canonical_default(value: Any) -> Any:
    return canonical(value)


# Encoders made once (json.dumps with options builds one per call); encode() keeps no state
# between calls, so threads share them.
_SORTED = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
_SORTED_ANY = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                               default=_canonical_default)


def store_request(data: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Split canonical inputs into what the step entry holds and the blobs it references.

    Items of ``messages`` / ``input`` lists, and any other field longer than a few hundred
    characters of JSON, become blobs ``{digest: json}``; the entry holds
    ``{"$blobs": [digest, ...]}`` or ``{"$blob": digest}`` in their place (the journal's
    writer turns each ``$blobs`` list into a ``$list`` chain when it appends the entry).
    """
    if not any(f in data for f in _PER_ITEM) and len(_dumps(data)) <= _INLINE_LIMIT:
        return dict(data), {}  # the common case: a few small arguments, kept inline
    stored: dict[str, Any] = {}
    blobs: dict[str, str] = {}

    def blob(value: Any) -> str:
        text = _dumps(value)
        digest = blob_digest(text)
        blobs[digest] = text
        return digest

    for field, value in data.items():
        if field in _PER_ITEM and isinstance(value, list):
            stored[field] = {"$blobs": [blob(item) for item in value]}
        elif len(_dumps(value)) > _INLINE_LIMIT:
            stored[field] = {"$blob": blob(value)}
        else:
            stored[field] = value
    return stored, blobs


def load_request(stored: Any, get_blob: Callable[[str], str | None]) -> Any:
    """The inputs :func:`store_request` split, whole again; a missing blob reads as a
    ``"<missing blob ...>"`` marker (inputs are for people and diffs, not for replay)."""
    if not isinstance(stored, dict):
        return stored

    def load(digest: Any) -> Any:
        text = get_blob(str(digest))
        if text is None:
            return f"<missing blob {digest}>"
        try:
            return json.loads(text)
        except (ValueError, RecursionError):
            return f"<unreadable blob {digest}>"

    whole: dict[str, Any] = {}
    for field, value in stored.items():
        if isinstance(value, dict) and set(value) == {"$blobs"} and isinstance(value["$blobs"], list):
            whole[field] = [load(d) for d in value["$blobs"]]
        elif isinstance(value, dict) and set(value) == {"$list"}:
            digests = expand_list(str(value["$list"]), get_blob)
            whole[field] = [load(d) for d in digests] if digests is not None else \
                f"<missing blob {value['$list']}>"
        elif isinstance(value, dict) and set(value) == {"$blob"}:
            whole[field] = load(value["$blob"])
        else:
            whole[field] = value
    return whole


def first_difference(old: Any, new: Any, path: str = "") -> str | None:
    """Where two canonical values first differ, as a path (``messages[1].content``), with
    the old and the new value shortened; None if they are equal."""
    here = path or "the inputs"
    if type(old) is not type(new):
        return _changed(here, old, new)
    if isinstance(old, dict):
        if "$t" in old and old.get("$t") == new.get("$t") and old != new:
            return f"{here} changed"  # a tagged value (a Decimal, a dataclass) as a whole
        for key in sorted(set(old) | set(new)):
            sub = f"{path}.{key}" if path else str(key)
            if key not in old:
                return f"{sub} was added: {_shown(new[key])}"
            if key not in new:
                return f"{sub} was removed (it was {_shown(old[key])})"
            found = first_difference(old[key], new[key], sub)
            if found:
                return found
        return None
    if isinstance(old, list):
        for i, (a, b) in enumerate(zip(old, new)):
            found = first_difference(a, b, f"{path}[{i}]")
            if found:
                return found
        if len(old) != len(new):
            return f"{here} has {len(new)} items instead of {len(old)}"
        return None
    return None if old == new else _changed(here, old, new)


#: Characters of a value an InputChanged message shows (each of the old and the new one).
_SHOWN = 60


def _changed(here: str, old: Any, new: Any) -> str:
    """``args[0] changed from 'draft the report' to 'draft the report in French'``: two
    strings from a little before where they first differ, any value shortened."""
    if isinstance(old, str) and isinstance(new, str):
        same = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b),
                    min(len(old), len(new)))
        start = max(0, same - 20)
        return f"{here} changed from {_shown(old, start)} to {_shown(new, start)}"
    return f"{here} changed from {_shown(old)} to {_shown(new)}"


def _shown(value: Any, start: int = 0) -> str:
    """A value for a message: a string quoted from ``start`` ("..." where cut), anything
    else as compact JSON, at most :data:`_SHOWN` characters of it."""
    if isinstance(value, str):
        part = value[start:start + _SHOWN]
        return (("..." if start else "") + repr(part)
                + ("..." if start + _SHOWN < len(value) else ""))
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."
