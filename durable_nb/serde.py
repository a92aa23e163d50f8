"""JSON encoding of step results: data in, data out, never code.

Plain JSON values (dict with str keys, list, str, int, float, bool, None) are stored as they
are. Other values are wrapped in a tagged object ``{"$t": TAG, "v": ...}``:

- ``tuple``, ``set``, ``frozenset``, ``bytes``, ``datetime``, ``date``, ``Decimal``;
- pydantic models (openai's response types among them), stored with ``model_dump(mode="json")``
  and rebuilt with ``model_validate``. Only classes from allowed modules (``openai.types``) or
  registered ones are rebuilt; a journal cannot make decoding import anything else;
- types registered with :func:`register_type`.

A dict that has a ``"$t"`` key of its own is escaped, so user data never passes for a tag.
Decoding never unpickles and never imports a module named by the journal outside the
allow-list: loading a journal cannot run code.
"""

from __future__ import annotations

import base64
import datetime as _dt
import importlib
import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Callable

from .errors import SerializationError

__all__ = ["decode", "dumps", "encode", "loads", "register_type"]

_TAG = "$t"
# Modules whose pydantic models may be rebuilt from a journal (importing them runs only openai's code).
_ALLOWED_MODEL_PREFIXES = ("openai.types.",)


@dataclass(frozen=True)
class _Codec:
    cls: type
    tag: str
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]


_codecs_by_tag: dict[str, _Codec] = {}
_codecs_by_type: dict[type, _Codec] = {}


def register_type(cls: type, encode: Callable[[Any], Any], decode: Callable[[Any], Any], *,
                  name: str | None = None) -> None:
    """Let values of ``cls`` be journaled.

    ``encode(value)`` must return JSON data (it may contain other encodable values);
    ``decode(data)`` gets that data back and returns the value. ``name`` (default: the class's
    qualified name) is stored in the journal and must stay the same across versions of your code.
    """
    tag = name or f"{cls.__module__}.{cls.__qualname__}"
    codec = _Codec(cls, tag, encode, decode)
    _codecs_by_tag[tag] = codec
    _codecs_by_type[cls] = codec


def _encode_datetime(v: _dt.datetime) -> str:
    return v.isoformat()


for _cls, _tag, _enc, _dec in (
    (tuple, "tuple", None, tuple),
    (set, "set", None, set),
    (frozenset, "frozenset", None, frozenset),
    (bytes, "bytes", lambda v: base64.b64encode(v).decode("ascii"),
     lambda s: base64.b64decode(s.encode("ascii"))),
    (_dt.datetime, "datetime", _encode_datetime, _dt.datetime.fromisoformat),
    (_dt.date, "date", lambda v: v.isoformat(), _dt.date.fromisoformat),
    (Decimal, "decimal", str, Decimal),
):
    register_type(_cls, _enc or list, _dec, name=_tag)


def encode(value: Any, _path: str = "result") -> Any:
    """Turn ``value`` into JSON data; raise :class:`SerializationError` naming the part that fails."""
    t = type(value)
    if value is None or t is str or t is int or t is bool:
        return value
    if t is float:
        if value != value or value in (float("inf"), float("-inf")):
            return {_TAG: "float", "v": repr(value)}
        return value
    if t is dict:
        out = {}
        for k, v in value.items():
            if type(k) is not str:
                # Non-string keys would silently become strings in JSON: keep them as pairs.
                return {_TAG: "dict", "v": [[encode(k, f"{_path} key"), encode(v, f"{_path}[{k!r}]")]
                                            for k, v in value.items()]}
            out[k] = encode(v, f"{_path}[{k!r}]")
        if _TAG in out:
            return {_TAG: "dict", "v": [[k, v] for k, v in out.items()]}
        return out
    if t is list:
        return [encode(v, f"{_path}[{i}]") for i, v in enumerate(value)]
    codec = _codecs_by_type.get(t)
    if codec is not None:
        return {_TAG: codec.tag, "v": encode(codec.encode(value), _path)}
    dump = getattr(value, "model_dump", None)
    if callable(dump) and hasattr(t, "model_validate"):
        return {_TAG: "model", "cls": f"{t.__module__}.{t.__qualname__}",
                "v": dump(mode="json")}
    raise SerializationError(
        f"{_path} is a {t.__module__}.{t.__qualname__}, which cannot be stored as JSON"
    )


def decode(data: Any) -> Any:
    """Rebuild a value from :func:`encode`'s output. Never imports beyond the allow-list."""
    t = type(data)
    if t is dict:
        tag = data.get(_TAG)
        if tag is None:
            return {k: decode(v) for k, v in data.items()}
        return _decode_tagged(tag, data)
    if t is list:
        return [decode(v) for v in data]
    return data


def _decode_tagged(tag: Any, data: dict) -> Any:
    if tag == "dict":
        return {decode(k): decode(v) for k, v in data["v"]}
    if tag == "float":
        return float(data["v"])
    if tag == "model":
        return _model_class(data["cls"]).model_validate(data["v"])
    codec = _codecs_by_tag.get(tag) if isinstance(tag, str) else None
    if codec is None:
        raise ValueError(f"unknown type tag {tag!r} (register it with durable_nb.register_type)")
    try:
        return codec.decode(decode(data["v"]))
    except (ArithmeticError, TypeError, ValueError) as exc:
        raise ValueError(f"cannot rebuild a {tag!r} from {data['v']!r:.80}: {exc}") from None


def _model_class(qualified: Any) -> type:
    if not isinstance(qualified, str) or not qualified.startswith(_ALLOWED_MODEL_PREFIXES):
        registered = _codecs_by_tag.get(qualified) if isinstance(qualified, str) else None
        if registered is not None:
            return registered.cls
        raise ValueError(f"model class {qualified!r} is not in the allow-list "
                         f"{_ALLOWED_MODEL_PREFIXES}; register it with durable_nb.register_type")
    module_name, _, name = qualified.rpartition(".")
    cls = getattr(importlib.import_module(module_name), name, None)
    if not (isinstance(cls, type) and hasattr(cls, "model_validate")):
        raise ValueError(f"{qualified!r} is not a pydantic model")
    return cls


def dumps(data: Any) -> str:
    """Compact JSON text of already-encoded data (no NaN: encode() tags it)."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def loads(text: str) -> Any:
    """Parse JSON text written by :func:`dumps`."""
    return json.loads(text)
