"""What a journal holds: run records and step entries, and their JSON wire form.

A step has two numbers. Its **position** is where its entry stands in the run's journal:
0, 1, 2 ... in the order entries were written, always a contiguous prefix. Its **key** is its
identity, stable across replays whatever the timing: ``"3"`` for the fourth step of the
handler, ``"3.0"`` for the first step made inside step 3's function, ``"fetch#1.0"`` for the
first step of the second task running coroutine ``fetch`` (see
:mod:`durable_nb.execution.scope`). Replay finds entries by key; people read them by position.
For a handler that makes its steps one after another, the two are the same.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, field, fields
from enum import Enum
from typing import Any

__all__ = ["LLM_KINDS", "BatchRecord", "RunRecord", "Status", "StepEntry", "entry_cost", "json_text"]

#: Step kinds that are one LLM round each: the run's iterations count them (``model``: a
#: Pydantic AI model request, durable_nb.integrations.pydantic_ai_models).
LLM_KINDS = ("chat", "respond", "model")


class Status(str, Enum):
    """Where a run is. Every status but DONE resumes when the run is executed again
    (unless its deadline passed); DONE replays."""

    RUNNING = "RUNNING"
    WAITING_APPROVAL = "WAITING_APPROVAL"
    DONE = "DONE"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, text: "str | Status") -> "Status":
        """A status from its name in any case (``done``, ``Done``, ``DONE``)."""
        if isinstance(text, Status):
            return text
        try:
            return cls(str(text).strip().upper())
        except ValueError:
            raise ValueError(f"unknown status {text!r}: use one of "
                             f"{', '.join(s.value for s in cls)}") from None


@dataclass
class StepEntry:
    """One completed step: what was asked and what came out.

    ``result`` is encoded JSON data (:mod:`durable_nb.serde`); ``error`` is the encoded
    exception of a failed step (:func:`durable_nb.serde.encode_error`). ``fingerprint`` is a
    digest of the step's inputs, compared on replay; ``request`` the inputs themselves, with
    long parts stored once per run as blobs and referenced here by digest.

    ``spawned`` says when the asyncio tasks the step was made in were created: for each task
    part of its key (``name#N``, outermost first), the journal position that was next when
    that task was created, so every step completed before it is at a lower position (see
    :func:`durable_nb.journal.cut_at_key`). None for a step made outside any task, and in
    entries written before it was journaled.

    ``parent`` is, for a step made inside another step's function, a digest of that step's
    kind, name and input fingerprint: a resumed execution tells the
    step that made it, executing again after it died in flight, from a step moved out of
    it. Empty for other steps and in entries written before it was journaled.
    """

    position: int
    key: str
    name: str
    kind: str
    fingerprint: str = ""
    request: Any = None
    ok: bool = True
    result: Any = None
    error: dict | None = None
    started_at: float = 0.0
    finished_at: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    meta: dict | None = None
    spawned: list[int] | None = None
    parent: str = ""
    #: Set by :meth:`from_json`: ``result`` is plain JSON data that decoding would copy as
    #: it is (no tagged values, shallow enough); not part of the entry's identity.
    plain_result: bool = field(default=False, compare=False, repr=False)

    @property
    def duration(self) -> float:
        return max(0.0, self.finished_at - self.started_at)

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    # Short keys keep the per-step overhead on disk small; empty fields are left out.
    # ("f" held a format-1 fingerprint that was never compared: it is read and ignored.)
    _WIRE = (("key", "id"), ("name", "n"), ("kind", "k"), ("fingerprint", "in"),
             ("request", "q"), ("ok", "ok"), ("result", "r"), ("error", "e"),
             ("started_at", "t0"), ("finished_at", "t1"), ("prompt_tokens", "pt"),
             ("completion_tokens", "ct"), ("meta", "m"), ("spawned", "sp"),
             ("parent", "pa"))

    def to_json(self) -> str:
        wire: dict[str, Any] = {"id": self.key, "n": self.name, "k": self.kind}
        if self.fingerprint:
            wire["in"] = self.fingerprint
        if self.request is not None:
            wire["q"] = self.request
        if not self.ok:
            wire["ok"] = False
            wire["e"] = self.error
        elif self.result is not None:
            wire["r"] = self.result
        wire["t0"] = round(self.started_at, 4)
        wire["t1"] = round(self.finished_at, 4)
        if self.prompt_tokens or self.completion_tokens:
            wire["pt"] = self.prompt_tokens
            wire["ct"] = self.completion_tokens
        if self.meta:
            wire["m"] = self.meta
        if self.spawned:
            wire["sp"] = self.spawned
        if self.parent:
            wire["pa"] = self.parent
        return json_text(wire)

    @classmethod
    def from_json(cls, position: int, text: str) -> "StepEntry":
        """Parse an entry; ValueError (or RecursionError from hostile nesting) if it is not one."""
        wire = json.loads(text)
        if type(wire) is not dict:
            raise ValueError("entry is not a JSON object")
        # Field by field rather than through a generic mapping: replay parses every entry.
        get = wire.get
        key = wire["id"] if "id" in wire else str(position)  # format 1: top-level steps only
        name, kind, fingerprint = get("n"), get("k"), get("in", "")
        ok, result, error, meta = get("ok", True), get("r"), get("e"), get("m")
        started, finished = get("t0", 0.0), get("t1", 0.0)
        prompt, completion = get("pt", 0), get("ct", 0)
        spawned, parent = get("sp"), get("pa", "")
        if not (type(key) is str and type(name) is str and type(kind) is str
                and type(ok) is bool and type(fingerprint) is str
                and (ok or type(error) is dict) and (meta is None or type(meta) is dict)
                and type(started) in _NUMBERS and type(finished) in _NUMBERS
                and type(prompt) in _NUMBERS and type(completion) in _NUMBERS
                and (spawned is None or (type(spawned) is list
                                         and all(type(p) is int for p in spawned)))
                and type(parent) is str):
            raise ValueError("entry fields have the wrong types")
        entry = cls(position, key, name, kind, fingerprint, get("q"), ok, result, error,
                    started, finished, prompt, completion, meta, spawned, parent)
        # The result needs no decoding pass when it can hold no tag and cannot nest past
        # serde.MAX_DEPTH: no "$t" key (nor a \u escape that could spell one) and fewer
        # brackets in the whole entry than that depth. serde.decode would return an equal
        # copy of it.
        entry.plain_result = ok and '"$t"' not in text and "\\u" not in text \
            and text.count("{") + text.count("[") <= PLAIN_MAX_BRACKETS
        return entry


#: serde.MAX_DEPTH (records stay free of serde's imports; a test checks they agree).
PLAIN_MAX_BRACKETS = 200
_NUMBERS = (int, float)


@dataclass
class RunRecord:
    """Everything known about a run but its steps. Timestamps are Unix seconds.

    ``cost`` is US dollars of the LLM calls whose price is known (``meta["cost"]`` of their
    entries). ``step_count`` is the number of journal entries as of the last record write; after a
    crash it may lag behind the journal, and readers correct it
    (:meth:`durable_nb.journal.Journal.count_steps`). ``retried_steps`` are positions of
    failed entries that failed the run and were tried again on resume: replay skips them.
    ``attempts`` are its executions (:mod:`durable_nb.execution.attempts`); ``sources`` the code of
    those whose source differs from ``source``, by hash.
    ``notebook`` and ``cell_id`` say which notebook cell created the run (None elsewhere).
    """

    run_id: str
    title: str = ""
    status: Status = Status.RUNNING
    iteration: int = 0
    max_iterations: int | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    max_tokens: int | None = None
    cost: float = 0.0
    max_cost: float | None = None
    step_count: int = 0
    pending_approval: dict | None = None
    context_summary: str | None = None
    result: Any = None
    error: str | None = None
    failed_step: int | None = None
    retried_steps: list[int] | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    finished_at: float | None = None
    deadline: float | None = None
    owner: dict | None = None
    parent: str | None = None
    forked_from: dict | None = None
    source: str | None = None
    source_hash: str | None = None
    journal_degraded_from: int | None = None
    # Each execution of the run, the last few (:mod:`durable_nb.execution.attempts`); absent from
    # records journaled before attempts were recorded.
    attempts: list[dict] | None = None
    attempts_dropped: int = 0
    sources: dict[str, str] | None = None
    #: Where the run was started from, when a notebook cell started it: the notebook's path
    #: as its kernel knows it (``JPY_SESSION_NAME``) and the cell's id. Shown, never used.
    notebook: str | None = None
    cell_id: str | None = None
    #: Who started the run (:func:`durable_nb.approvals.policy.starter_name` where it was
    #: created: the hub user on a JupyterHub): the four-eyes rule refuses them its approvals.
    #: None in older records.
    started_by: str | None = None

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_json(self, *, complete: bool = False) -> str:
        """The record as JSON text, ``status`` and ``created_at`` first: the disk journal
        reads a record's listing tag from that prefix (its steps rewrite the record).

        Fields at their default (None, 0, "") are left out unless ``complete``: a journal
        holds the record once per run and rewrites it at every step. :meth:`from_json` gives
        a missing field its default, as every version has read the records written before
        that field existed."""
        cls = type(self)
        layout = _RECORD_FIELDS.get(cls)
        if layout is None:  # fields() is slow to ask: once per class
            rest = tuple(f.name for f in fields(cls) if f.name not in _TAG_FIELDS)
            _, defaults = _shape(cls)
            layout = _RECORD_FIELDS[cls] = (_TAG_FIELDS + rest, {
                name: value for name, value in (defaults or {}).items()
                if name not in _TAG_FIELDS
                and (value is None or type(value) in (int, float, str))})
        names, defaults = layout
        data = {}
        for name in names:  # not asdict(): it deep-copies
            value = getattr(self, name)
            if not complete and name in defaults:
                default = defaults[name]
                if value is default or (type(value) is type(default) and value == default):
                    continue
            data[name] = value
        data["status"] = self.status.value
        return json_text(data)

    @classmethod
    def from_json(cls, text: str) -> "RunRecord":
        data = json.loads(text)
        if type(data) is not dict or type(data.get("run_id")) is not str:
            raise ValueError("run record is not a JSON object with a run_id")
        known, defaults = _shape(cls)
        if not data.keys() <= known:
            data = {k: v for k, v in data.items() if k in known}
        if defaults is None:
            record = cls(**data)
        else:
            # Listing 100,000 runs parses 100,000 records: the dataclass __init__ with its
            # 27 keyword arguments cost as much as the JSON parse; the instance's dict is
            # filled directly (every field has a plain default, no __post_init__).
            record = cls.__new__(cls)
            namespace = record.__dict__
            namespace.update(defaults)
            namespace.update(data)
        status = _STATUSES.get(record.status) if type(record.status) is str else None
        record.status = status if status is not None else Status(record.status)
        return record


def _shape(cls: type) -> tuple[frozenset[str], dict[str, Any] | None]:
    """The field names of a record class and, when every field but ``run_id`` has a plain
    default and the class no ``__post_init__``, those defaults (else None); asked once per
    class (fields() is slow to ask)."""
    shape = _SHAPES.get(cls)
    if shape is None:
        names, defaults = [], {}
        for f in fields(cls):
            names.append(f.name)
            if f.default_factory is not MISSING:  # type: ignore[misc]
                defaults = None
            elif defaults is not None and f.default is not MISSING:
                defaults[f.name] = f.default
        if hasattr(cls, "__post_init__"):
            defaults = None
        shape = _SHAPES[cls] = (frozenset(names), defaults)
    return shape


_SHAPES: dict[type, tuple[frozenset[str], dict[str, Any] | None]] = {}
#: The fields a run record's JSON text starts with (see RunRecord.to_json).
_TAG_FIELDS = ("status", "created_at")
#: Per record class: its field names in the order written, and the defaults left out.
_RECORD_FIELDS: dict[type, tuple[tuple[str, ...], dict[str, Any]]] = {}
_STATUSES = {s.value: s for s in Status}


@dataclass
class BatchRecord:
    """A batch (:func:`durable_nb.map`): its items' keys in item order. Each item is the run
    ``BATCH_ID/KEY``; statuses, tokens and results are those runs'. ``removed`` are keys of
    items no longer in the batch's list, whose runs stay in the journal."""

    batch_id: str
    title: str = ""
    keys: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    created_at: float = 0.0
    updated_at: float = 0.0

    def to_json(self) -> str:
        return json_text({f.name: getattr(self, f.name) for f in fields(self)})

    @classmethod
    def from_json(cls, text: str) -> "BatchRecord":
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("batch_id"), str):
            raise ValueError("batch record is not a JSON object with a batch_id")
        record = cls(**{k: v for k, v in data.items() if k in _BATCH_FIELDS})
        if not (isinstance(record.keys, list) and all(isinstance(k, str) for k in record.keys)
                and isinstance(record.removed, list)):
            raise ValueError("batch record fields have the wrong types")
        return record


_BATCH_FIELDS = {"batch_id", "title", "keys", "removed", "created_at", "updated_at"}


def entry_cost(entry: StepEntry) -> float:
    """US dollars an entry's LLM call cost (0 when its price is not known)."""
    value = (entry.meta or {}).get("cost")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def json_text(data: Any) -> str:
    """Compact JSON; plain UTF-8 where possible, ASCII escapes when the data holds strings
    that are not valid Unicode (lone surrogates), which SQLite could not store as text."""
    text = _COMPACT.encode(data)
    if text.isascii():  # O(1) in CPython: nothing to check
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return text


# One encoder, made once: json.dumps() with options builds a JSONEncoder per call. encode()
# keeps no state between calls, so threads share it.
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
