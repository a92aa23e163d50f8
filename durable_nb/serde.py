"""JSON encoding of step results and step errors: data in, data out, never code.

Plain JSON values (dict with str keys, list, str, int, float, bool, None) are stored as they
are. Other values are wrapped in a tagged object ``{"$t": TAG, "v": ...}``:

- ``tuple``, ``set``, ``frozenset``, ``bytes``, ``datetime``, ``date``, ``Decimal``;
- pydantic models (openai's response types among them), stored with ``model_dump(mode="json")``
  and the class's name, rebuilt with ``model_validate`` of the class of that name when it is
  loaded in the process that reads (see below); openai's types are rebuilt the way the openai
  client builds a reply, without validation (``construct``), so a reply replays as it was
  received whatever the installed openai requires. :func:`encode` refuses a model that would not
  come back equal: one whose class cannot be found by its name (defined inside a function,
  redefined since), or whose dump does not validate back to an equal model; register such a
  class with :func:`register_type`;
- types registered with :func:`register_type`.

A dict that has a ``"$t"`` key of its own is escaped, so user data never passes for a tag.

Guarantees of the decoding side (:func:`decode`, :func:`loads`, :func:`decode_error`):

- it never unpickles, never imports a module named by the journal and never calls a module's
  ``__getattr__``: classes named by a journal are looked up only in modules already in
  ``sys.modules``, by reading their ``__dict__``. The one import it may make is ``openai``
  itself (a hard dependency, named here, not by the journal), when a value names an
  ``openai.`` class and openai is not imported yet: importing openai loads every
  ``openai.types`` module, so its response types resolve. The code it may run is a loaded
  pydantic model's validation (openai's ``construct`` for its types), or a loaded exception
  class's constructor;
- any bad input (unknown tags, wrong shapes, nesting deeper than :data:`MAX_DEPTH`, values a
  registered decoder or pydantic refuses) raises :class:`DecodeError` and nothing else.

:func:`encode` refuses what :func:`decode` would refuse (nesting deeper than
:data:`MAX_DEPTH`), so whatever it accepts reads back.
"""

from __future__ import annotations

import base64
import datetime as _dt
import json
import re
import sys
import types
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Callable

# Neither openai nor pydantic is imported here: a process that reads a journal without
# openai's types in it (every command, every kernel until its first model call) does not pay
# for them. See _import_openai_for(), _register_openai_codecs() and _pydantic_model_base().
from .errors import SerializationError, StepFailed

__all__ = [
    "MAX_DEPTH",
    "DecodeError",
    "codec_of",
    "decode",
    "decode_error",
    "dumps",
    "encode",
    "encode_error",
    "loads",
    "register_type",
]

_TAG = "$t"
# openai's response types: they round-trip by construction (and are big), so encode() does not
# validate them back to check.
_TRUSTED_MODEL_PREFIX = "openai.types."

#: Most containers (JSON objects and arrays, tags included) that may be nested in one value.
#: Deeper data is refused by both :func:`encode` and :func:`decode`, so a hostile entry cannot
#: exhaust the stack and every value that was journaled can be read back.
MAX_DEPTH = 200


class DecodeError(ValueError):
    """Journal data cannot be turned back into a value: it is damaged, hostile, or names a
    type this process does not know. The only error the decoding functions raise."""


@dataclass(frozen=True)
class _Codec:
    cls: type
    tag: str
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]


_codecs_by_tag: dict[str, _Codec] = {}
_codecs_by_type: dict[type, _Codec] = {}


def register_type(cls: type, encode: Callable[[Any], Any] | None = None,
                  decode: Callable[[Any], Any] | None = None, *, name: str | None = None) -> None:
    """Let values of ``cls`` be journaled.

    ``encode(value)`` must return JSON data (it may contain other encodable values);
    ``decode(data)`` gets that data back and returns the value; whatever it raises reaches
    the caller as :class:`DecodeError`. For a pydantic model class both may be left out
    (``model_dump(mode="json")`` and ``model_validate``): ``register_type(MyModel)`` lets a
    model class defined in a function, or redefined in a notebook, be journaled and read
    back. ``name`` (default: the class's qualified name) is stored in the journal and must
    stay the same across versions of your code.
    """
    if encode is None or decode is None:
        model_base = _pydantic_model_base()
        if not (isinstance(cls, type) and model_base is not None and issubclass(cls, model_base)):
            raise TypeError(f"register_type({cls!r}) needs encode and decode functions: "
                            f"only a pydantic model class has default ones")
        encode = encode or (lambda value: value.model_dump(mode="json"))
        decode = decode or cls.model_validate
    tag = name or f"{cls.__module__}.{cls.__qualname__}"
    codec = _Codec(cls, tag, encode, decode)
    _codecs_by_tag[tag] = codec
    _codecs_by_type[cls] = codec


def codec_of(cls: type) -> _Codec | None:
    """How values of exactly ``cls`` are journaled (its tag and encoder), if it is registered
    (the built-in tuple, set, bytes, datetime, date and Decimal among them)."""
    return _codecs_by_type.get(cls)


def _expect(kind: type, what: str, build: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A decoder that refuses data of another JSON type than ``kind`` before building."""
    def decode_checked(data: Any) -> Any:
        if type(data) is not kind:
            raise DecodeError(f"a {what} must be stored as a JSON {kind.__name__}, "
                              f"not {type(data).__name__}")
        return build(data)
    return decode_checked


for _cls, _tag, _enc, _dec in (
    (tuple, "tuple", list, _expect(list, "tuple", tuple)),
    (set, "set", list, _expect(list, "set", set)),
    (frozenset, "frozenset", list, _expect(list, "frozenset", frozenset)),
    (bytes, "bytes", lambda v: base64.b64encode(v).decode("ascii"),
     _expect(str, "bytes value", lambda s: base64.b64decode(s.encode("ascii"), validate=True))),
    (_dt.datetime, "datetime", _dt.datetime.isoformat,
     _expect(str, "datetime", _dt.datetime.fromisoformat)),
    (_dt.date, "date", _dt.date.isoformat, _expect(str, "date", _dt.date.fromisoformat)),
    (Decimal, "decimal", str, _expect(str, "Decimal", Decimal)),
):
    register_type(_cls, _enc, _dec, name=_tag)


# --- encoding ------------------------------------------------------------------------------

def _path_text(where: tuple | None) -> str:
    """``result['rows'][3]`` from the chain of (parent, key) links :func:`_encode` passes
    down: built only when a value fails, so that encoding pays for a tuple, not a string."""
    parts = []
    while where is not None:
        where, key = where
        parts.append(key)
    path = "result"
    for key in reversed(parts):
        path += " key" if key is _KEY else f"[{key!r}]"
    return path


_KEY = object()  # marks "the key of a dict item" in a path


def _too_deep(where: tuple | None) -> SerializationError:
    return SerializationError(
        f"{_path_text(where)} is nested more than {MAX_DEPTH} containers deep, which the "
        f"journal does not store (it could not be read back safely); flatten it or store it "
        f"as a string")


def encode(value: Any) -> Any:
    """Turn ``value`` into JSON data; raise :class:`SerializationError` naming the part that fails.

    Everything this returns is read back by :func:`decode` as an equal value.
    """
    return _encode(value, None, 0)


def _encode(value: Any, where: tuple | None, _depth: int) -> Any:
    t = type(value)
    if value is None or t is str or t is int or t is bool:
        return value
    if t is float and value == value and value not in (float("inf"), float("-inf")):
        return value
    depth = _depth + 1  # from here on, the value becomes a container at this depth
    if depth > MAX_DEPTH:
        raise _too_deep(where)
    if t is float:  # NaN and the infinities, which JSON has no literal for
        return {_TAG: "float", "v": repr(value)}
    if t is dict:
        if _TAG not in value:
            out = {}
            for k, v in value.items():
                if type(k) is not str:
                    break
                out[k] = _encode(v, (where, k), depth)
            else:
                return out
        # Non-string keys would silently become strings in JSON, and a "$t" key would pass
        # for a tag: store the items as [key, value] pairs.
        if depth + 2 > MAX_DEPTH:
            raise _too_deep(where)
        return {_TAG: "dict", "v": [[_encode(k, (where, _KEY), depth + 2),
                                     _encode(v, (where, k), depth + 2)]
                                    for k, v in value.items()]}
    if t is list:
        return [_encode(v, (where, i), depth) for i, v in enumerate(value)]
    codec = _codecs_by_type.get(t)
    if codec is None and t.__module__.startswith("openai.") and _register_openai_codecs():
        codec = _codecs_by_type.get(t)
    if codec is not None:
        return {_TAG: codec.tag, "v": _encode(codec.encode(value), where, depth)}
    dump = getattr(value, "model_dump", None)
    if callable(dump) and hasattr(t, "model_validate"):
        data = dump(mode="json")
        if _depth_exceeds(data, depth):
            raise _too_deep(where)
        name = f"{t.__module__}.{t.__qualname__}"
        _check_model_round_trip(value, name, data, where)
        return {_TAG: "model", "cls": name, "v": data}
    raise SerializationError(
        f"{_path_text(where)} is a {t.__module__}.{t.__qualname__}, which cannot be stored "
        f"as JSON")


def _check_model_round_trip(value: Any, name: str, data: Any, where: tuple | None) -> None:
    """Refuse a pydantic model that :func:`decode` would not give back equal."""
    t = type(value)
    problem = None
    if _loaded_class(name) is not t:
        problem = (f"its class cannot be found by that name when the journal is read "
                   f"(defined inside a function, or redefined since)")
    elif not name.startswith(_TRUSTED_MODEL_PREFIX):
        try:
            same = t.model_validate(data) == value
        except Exception as exc:  # noqa: BLE001 - a dump that does not validate back
            same, problem = False, f"its dump does not validate back ({type(exc).__name__})"
        if not same and problem is None:
            problem = "its dump validates back to a model that is not equal to it"
    if problem is not None:
        raise SerializationError(
            f"{_path_text(where)} is a pydantic model {name}, which the journal could not "
            f"read back as it is: {problem}. Register the class with "
            f"durable_nb.register_type({t.__qualname__}) (give encode and decode functions "
            f"if its dump is not enough to rebuild it), or return its data "
            f"(model_dump()).")


def dumps(data: Any) -> str:
    """Compact JSON text of already-encoded data (no NaN: encode() tags it)."""
    return _COMPACT.encode(data)


# Made once: json.dumps() with options builds an encoder per call (encode() is stateless).
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


# --- decoding ------------------------------------------------------------------------------

def loads(text: str | bytes) -> Any:
    """Parse JSON text written by :func:`dumps`; raise :class:`DecodeError` for anything else.

    Returns JSON data (pass it to :func:`decode` for the value). Text nested too deeply for
    the parser is refused the same way, not with a ``RecursionError``.
    """
    try:
        return json.loads(text)
    except RecursionError:
        raise DecodeError("the JSON text is nested too deeply to be parsed") from None
    except Exception as exc:  # noqa: BLE001 - every failure is the text's fault
        raise DecodeError(f"the journal text is not valid JSON ({type(exc).__name__}: "
                          f"{str(exc)[:200]})") from None


def decode(data: Any) -> Any:
    """Rebuild a value from :func:`encode`'s output.

    Raises :class:`DecodeError`, and only that, for data :func:`encode` cannot have written.
    Imports nothing (see the module's docstring).
    """
    try:
        return _decode(data, 0)
    except DecodeError:
        raise
    except RecursionError:
        # MAX_DEPTH keeps the decoder's own recursion shallow; a registered decoder may recurse.
        raise DecodeError("the data is nested too deeply to be decoded") from None
    except Exception as exc:  # noqa: BLE001 - a registered decoder or pydantic refused the data
        raise DecodeError(f"cannot decode the data: {type(exc).__name__}: "
                          f"{str(exc)[:300]}") from None


def _brief(value: Any, limit: int = 120) -> str:
    """A short description of journal data for an error message (never a huge or deep repr)."""
    if type(value) is str:
        return repr(value[:limit]) + ("..." if len(value) > limit else "")
    if value is None or type(value) is bool:
        return repr(value)
    # Not even numbers: repr() of a huge int raises.
    return f"a {type(value).__name__}"


def _decode(data: Any, depth: int) -> Any:
    t = type(data)
    if data is None or t is str or t is int or t is float or t is bool:
        return data
    depth += 1
    if depth > MAX_DEPTH:
        raise DecodeError(f"the data is nested more than MAX_DEPTH={MAX_DEPTH} containers deep")
    if t is list:
        # Loops rather than comprehensions: a comprehension is one more stack frame per level.
        out_list = []
        for item in data:
            out_list.append(_decode(item, depth))
        return out_list
    if t is dict:
        if _TAG in data:
            return _decode_tagged(data, depth)
        out = {}
        for key, item in data.items():
            if type(key) is not str:
                raise DecodeError(f"an object key must be a str, not {type(key).__name__}")
            out[key] = _decode(item, depth)
        return out
    raise DecodeError(f"{t.__module__}.{t.__qualname__} is not JSON data")


def _decode_tagged(data: dict, depth: int) -> Any:
    tag = data[_TAG]
    if "v" not in data:
        raise DecodeError(f"the tagged value {_brief(tag)} has no 'v'")
    payload = data["v"]
    if tag == "dict":
        if type(payload) is not list:
            raise DecodeError("a 'dict' tag must hold a list of [key, value] pairs")
        out = {}
        for pair in payload:
            if type(pair) is not list or len(pair) != 2:
                raise DecodeError("a 'dict' tag must hold a list of [key, value] pairs")
            # The tag object is at `depth`, the list of pairs at depth + 1, each pair at + 2.
            if depth + 2 > MAX_DEPTH:
                raise DecodeError(
                    f"the data is nested more than MAX_DEPTH={MAX_DEPTH} containers deep")
            out[_decode(pair[0], depth + 2)] = _decode(pair[1], depth + 2)
        return out
    if tag == "float":
        if type(payload) is not str:
            raise DecodeError("a 'float' tag must hold a str such as 'nan' or '-inf'")
        return float(payload)
    if tag == "model":
        cls = _model_class(data.get("cls"))
        if _depth_exceeds(payload, depth):
            raise DecodeError(f"the data is nested more than MAX_DEPTH={MAX_DEPTH} containers deep")
        if _is_openai_model(cls):
            return _constructed(cls, payload)
        return cls.model_validate(payload)
    codec = _codecs_by_tag.get(tag) if type(tag) is str else None
    if codec is None and tag in _OPENAI_TAGS and _register_openai_codecs():
        codec = _codecs_by_tag.get(tag)
    if codec is None:
        raise DecodeError(f"unknown type tag {_brief(tag)}: register the type with "
                          f"durable_nb.register_type before reading this journal")
    value = _decode(payload, depth)
    try:
        return codec.decode(value)
    except DecodeError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the decoder raises is the data's fault
        raise DecodeError(f"cannot rebuild a {tag!r} from {_brief(payload)}: "
                          f"{type(exc).__name__}: {exc}") from None


def _depth_exceeds(data: Any, depth: int) -> bool:
    """Whether JSON ``data`` inside ``depth`` containers nests past MAX_DEPTH (no recursion)."""
    t = type(data)
    if t is not dict and t is not list:
        return False
    stack = [(data, depth)]  # containers only: a step's result is mostly scalars
    pop, push = stack.pop, stack.append
    while stack:
        item, level = pop()
        level += 1
        if level > MAX_DEPTH:
            return True
        for child in (item.values() if type(item) is dict else item):
            t = type(child)
            if t is dict or t is list:
                push((child, level))
    return False


def _is_openai_model(cls: type) -> bool:
    openai = sys.modules.get("openai")
    return openai is not None and type.__subclasscheck__(openai.BaseModel, cls)


def _import_openai_for(name: str) -> None:
    """Import openai (and with it every ``openai.types`` module) when journal data names an
    ``openai.`` class and openai is not imported yet, so the class resolves as it did when
    openai was imported with this module. The module imported is always ``openai``, never
    one the journal names."""
    if name.startswith("openai.") and "openai" not in sys.modules:
        import openai  # noqa: F401 - its import registers the types in sys.modules


def _pydantic_model_base() -> type | None:
    """pydantic's ``BaseModel`` if pydantic's models are loaded, else None: then no class
    can be a pydantic model, and nothing needs importing to say so."""
    models = sys.modules.get("pydantic.main")
    return None if models is None else _module_namespace(models).get("BaseModel")


#: Tags of the openai types journaled by a codec of their own, registered when first needed.
_OPENAI_TAGS = ("openai.Response",)


def _register_openai_codecs() -> bool:
    """Register the codecs of openai's types (tags :data:`_OPENAI_TAGS`), importing openai
    (a hard dependency) on first use; True when they were not registered before.

    A ``Response`` is journaled as the server sent it (its fields that were set) and rebuilt
    the way the openai client builds it, without validation: llama.cpp's server, for one,
    leaves out fields the model class requires, and the replayed object must equal the live
    one."""
    if all(tag in _codecs_by_tag for tag in _OPENAI_TAGS):
        return False
    from openai.types.responses import Response

    def decode_response(data: Any) -> Any:
        if not isinstance(data, dict):
            raise TypeError(f"a Response must be stored as a JSON object, not "
                            f"{type(data).__name__}")
        return Response.model_construct(**data)

    register_type(Response, lambda response: response.model_dump(mode="json", exclude_unset=True),
                  decode_response, name="openai.Response")
    return True


def _constructed(cls: type, payload: Any) -> Any:
    """An openai response type rebuilt from its dump as the openai client builds a reply
    (``construct``, recursive, without validation): a server's reply that leaves out fields
    the installed openai requires, or holds values it does not list, comes back as it was
    received instead of failing every replay."""
    if type(payload) is not dict:
        raise DecodeError(f"an openai model must be stored as a JSON object, not "
                          f"{_brief(payload)}")
    return cls.construct(**payload)


def _model_class(qualified: Any) -> type:
    if type(qualified) is not str:
        raise DecodeError(f"a 'model' tag must name its class as a str, not {_brief(qualified)}")
    registered = _codecs_by_tag.get(qualified)
    if registered is not None:
        return registered.cls
    _import_openai_for(qualified)
    cls = _loaded_class(qualified)
    model_base = _pydantic_model_base()
    # type.__subclasscheck__ reads the real MRO (BaseModel's ABC metaclass would run hooks).
    if cls is None or model_base is None or not type.__subclasscheck__(model_base, cls):
        raise DecodeError(f"{_brief(qualified)} is not a pydantic model loaded in this process: "
                          f"import (or define) its class before reading this journal, or "
                          f"register it with durable_nb.register_type")
    return cls


# Read through the descriptors themselves: a module subclass or a metaclass cannot substitute
# code for the plain namespace.
_module_namespace = types.ModuleType.__dict__["__dict__"].__get__
_class_namespace = type.__dict__["__dict__"].__get__


def _loaded_class(qualified: str) -> type | None:
    """The class named ``module.QualName`` if its module is already in ``sys.modules``.

    Reads ``__dict__`` namespaces only, through the builtin descriptors: never imports, never
    calls ``getattr`` on a module (a module-level ``__getattr__`` may import), runs no code of
    the modules or classes it passes through.
    """
    parts = qualified.split(".")
    # The module is the longest dotted prefix that is loaded; the rest is the qualname.
    for split in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:split]))
        if module is None or not issubclass(type(module), types.ModuleType):
            continue
        namespace: Mapping[str, Any] = _module_namespace(module)
        found: Any = None
        for name in parts[split:]:
            found = namespace.get(name)
            if not issubclass(type(found), type):
                found = None
                break
            namespace = _class_namespace(found)
        if found is not None:
            return found
    return None


# --- exceptions ----------------------------------------------------------------------------

# Exception attributes that may hold credentials (request headers, API keys) are never
# journaled, whatever their type.
_SECRET_ATTR = re.compile(r"auth|api_?key|secret|passw|token|header|cookie|credential", re.I)


def _safe_str(exc: BaseException) -> str | None:
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not break journaling
        return None


def encode_error(exc: BaseException, *, terminal: bool) -> dict[str, Any]:
    """JSON data describing ``exc``, for :func:`decode_error` to raise it again on replay.

    ``{"type": "module.QualName", "mro": [...], "message": str(exc), "args": [...],
    "attrs": {...}, "terminal": terminal}``. ``mro`` names the class's bases that are more
    specific than ``Exception``, nearest first (left out when there are none). ``args`` is
    left out when an argument cannot be encoded; ``attrs`` holds the entries of ``exc.__dict__`` that can be encoded, except names that
    may hold credentials (headers, keys, tokens), and is left out when empty. Never raises
    for an exception instance, however broken its ``__str__`` or attributes.
    """
    t = type(exc)
    message = _safe_str(exc)
    data: dict[str, Any] = {
        "type": f"{t.__module__}.{t.__qualname__}",
        "message": message if message is not None else f"<unprintable {t.__qualname__}>",
    }
    bases = [f"{b.__module__}.{b.__qualname__}" for b in t.__mro__[1:]
             if issubclass(b, Exception) and b is not Exception]
    if bases:
        data["mro"] = bases
    try:
        data["args"] = [encode(arg) for arg in exc.args]
    except Exception:  # noqa: BLE001 - replay then rebuilds from the message
        pass
    attrs = {}
    try:
        items = list(vars(exc).items())
    except Exception:  # noqa: BLE001 - no instance dict: nothing more to keep
        items = []
    for name, value in items:
        if type(name) is not str or _SECRET_ATTR.search(name):
            continue
        try:
            attrs[name] = encode(value)
        except Exception:  # noqa: BLE001 - objects such as an httpx.Response are not kept
            continue
    if attrs:
        data["attrs"] = attrs
    data["terminal"] = bool(terminal)
    return data


def decode_error(data: Any) -> BaseException:
    """The exception :func:`encode_error` described, to be raised again on replay.

    Returns an instance of the same class when that class is an ``Exception`` subclass already
    loaded in this process (found as :func:`decode` finds classes: nothing is imported), with
    the journaled ``args`` and attributes, so ``str(e)``, ``e.args`` and ``except Cls:`` behave
    as on the first run. It is built by calling the class with the journaled args when that
    gives the same args and message, else with ``cls.__new__`` and the args and attributes set
    directly (for classes such as ``openai.APIStatusError`` whose constructor needs objects
    that were not journaled). When the class is not loaded, it is an instance of a stand-in
    class of the same name built on the nearest journaled base (``mro``) that is loaded and
    more specific than ``Exception``, and on :class:`~durable_nb.errors.StepFailed`, so
    ``except OSError`` catches on replay what it caught live. Otherwise (no such base, not an
    ``Exception`` subclass such as ``KeyboardInterrupt``, or not constructible) returns
    :class:`~durable_nb.errors.StepFailed` with the type's name and the message. Raises
    :class:`DecodeError` only when ``data`` is not such a description at all.
    """
    if type(data) is not dict or type(data.get("type")) is not str:
        raise DecodeError(f"a journaled error must be an object with a 'type' str, "
                          f"not {_brief(data)}")
    type_name: str = data["type"]
    message = data.get("message", "")
    if type(message) is not str:
        raise DecodeError(f"a journaled error's 'message' must be a str, not {_brief(message)}")

    args: tuple[Any, ...] | None = None
    if "args" in data:
        try:
            decoded = decode(data["args"])
        except DecodeError:
            decoded = None  # e.g. a registered type no longer registered: keep the message
        if type(decoded) is list:
            args = tuple(decoded)
    attrs = {}
    raw_attrs = data.get("attrs")
    if type(raw_attrs) is dict:
        for name, value in raw_attrs.items():
            if type(name) is not str:
                continue
            try:
                attrs[name] = decode(value)
            except DecodeError:
                continue

    mro = data.get("mro")
    for name in [type_name] + (mro if type(mro) is list else []):
        if type(name) is str:
            _import_openai_for(name)
    cls = _loaded_class(type_name)
    if cls is None or not issubclass(cls, Exception):
        cls = _stand_in(type_name, mro)
    if cls is not None:
        rebuilt = _rebuild(cls, args, message, attrs)
        if rebuilt is not None:
            if isinstance(rebuilt, StepFailed):  # a stand-in: say what it stands for
                rebuilt.type_name, rebuilt.message = type_name, message
            return rebuilt
    return StepFailed(type_name, message)


# Stand-in classes made so far, by (journaled type name, base): the same failure replays as
# the same class every time.
_stand_ins: dict[tuple[str, type], type] = {}


def _stand_in(type_name: str, mro: Any) -> type[Exception] | None:
    """A class named ``type_name``, built on the nearest of its journaled bases ``mro`` that
    is loaded here and more specific than ``Exception``, and on :class:`StepFailed`: replayed
    in a process that never imported ``smtplib``, ``SMTPRecipientsRefused`` is still caught by
    ``except OSError``. None when no such base is loaded."""
    if type(mro) is not list:
        return None
    base = None
    for name in mro:
        found = _loaded_class(name) if type(name) is str else None
        if found is not None and issubclass(found, Exception) and found is not Exception:
            base = found
            break
    if base is None:
        return None
    key = (type_name, base)
    if key not in _stand_ins:
        module, _, qualname = type_name.rpartition(".")
        try:
            _stand_ins[key] = type(qualname, (base, StepFailed),
                                   {"__module__": module, "__qualname__": qualname,
                                    "__doc__": f"Stands in for {type_name}, not loaded here."})
        except TypeError:  # a base whose layout does not combine with StepFailed
            return None
    return _stand_ins[key]


def _rebuild(cls: type[Exception], args: tuple[Any, ...] | None, message: str,
             attrs: dict[str, Any]) -> Exception | None:
    known_args = args is not None
    if args is None:
        # Journals without args (older ones, or arguments that could not be encoded).
        args = (message,) if message else ()
    try:
        exc = cls(*args)
        vars(exc).update(attrs)
        # Compare args too: str() alone is ambiguous (KeyError quotes its argument).
        if type(exc) is cls and (exc.args == args or not known_args) and _safe_str(exc) == message:
            return exc
    except Exception:  # noqa: BLE001 - the constructor wants more than the args: build below
        pass
    try:
        exc = cls.__new__(cls)
        exc.args = args
        vars(exc).update(attrs)
    except Exception:  # noqa: BLE001 - the class cannot be built without its constructor
        return None
    if type(exc) is not cls or _safe_str(exc) is None:
        return None
    return exc
