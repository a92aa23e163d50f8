"""The journal: runs and their ordered step entries, stored as JSON text in a diskcache.

One :class:`Journal` is one directory (default ``./.durable_nb``, or ``$DURABLE_NB_DIR``) holding
a diskcache ``Cache`` (SQLite in WAL mode, values over 32 KiB in files beside it). Keys are
strings:

====================  =====================================================
``format``            the journal format version, checked on open
``runs``              the list of run ids, in creation order
``run:ID``            the run record (:class:`RunRecord`)
``step:ID:N``         step entry N of the run (:class:`StepEntry`)
``lease:ID``          who executes the run now (pid, host, heartbeat)
``decision:ID``       an approval decision waiting to be picked up by the executor
``cancel:ID``         a cancel request waiting to be picked up by the executor
====================  =====================================================

The step entries of a run are always a contiguous prefix 0..n-1: an entry is written only after
the one before it. Each write is one SQLite transaction, so a crash leaves an entry either
whole or absent. Values are JSON text only: the cache refuses to store or load pickles, so
opening a journal never runs code from it. Nothing is ever evicted.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, fields
from enum import Enum
from pathlib import Path
from typing import Any, Iterator

import diskcache
from diskcache.core import MODE_PICKLE

from .errors import CorruptEntry, IncompatibleJournal, UnknownRun

__all__ = ["FORMAT_VERSION", "Journal", "RunRecord", "Status", "StepEntry", "default_directory",
           "open_journal"]

FORMAT_VERSION = 1
_DIR_MODE = 0o700
_FILE_MODE = 0o600


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


@dataclass
class StepEntry:
    """One completed step: what was asked (name, kind, input fingerprint) and what came out.

    ``result`` is the encoded JSON data (see :mod:`durable_nb.serde`); ``error`` is
    ``{"type": "module.Name", "message": str, "terminal": bool}`` for a failed step.
    """

    position: int
    name: str
    kind: str
    fingerprint: str = ""
    ok: bool = True
    result: Any = None
    error: dict | None = None
    started_at: float = 0.0
    finished_at: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    meta: dict | None = None

    @property
    def duration(self) -> float:
        return max(0.0, self.finished_at - self.started_at)

    # Short keys keep the per-step overhead on disk small; empty fields are left out.
    _WIRE = (("name", "n"), ("kind", "k"), ("fingerprint", "f"), ("ok", "ok"), ("result", "r"),
             ("error", "e"), ("started_at", "t0"), ("finished_at", "t1"),
             ("prompt_tokens", "pt"), ("completion_tokens", "ct"), ("meta", "m"))

    def to_json(self) -> str:
        wire: dict[str, Any] = {"n": self.name, "k": self.kind}
        if self.fingerprint:
            wire["f"] = self.fingerprint
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
        return _json_text(wire)

    @classmethod
    def from_json(cls, position: int, text: str) -> "StepEntry":
        wire = json.loads(text)
        if not isinstance(wire, dict):
            raise ValueError("entry is not a JSON object")
        entry = cls(position=position, **{attr: wire[key] for attr, key in cls._WIRE if key in wire})
        if not (isinstance(entry.name, str) and isinstance(entry.kind, str)
                and isinstance(entry.ok, bool)
                and (entry.ok or isinstance(entry.error, dict))
                and all(isinstance(v, (int, float)) for v in
                        (entry.started_at, entry.finished_at, entry.prompt_tokens,
                         entry.completion_tokens))):
            raise ValueError("entry fields have the wrong types")
        return entry


@dataclass
class RunRecord:
    """Everything known about a run but its steps. Timestamps are Unix seconds."""

    run_id: str
    title: str = ""
    status: Status = Status.RUNNING
    iteration: int = 0
    max_iterations: int | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    max_tokens: int | None = None
    step_count: int = 0
    pending_approval: dict | None = None
    context_summary: str | None = None
    result: Any = None
    error: str | None = None
    failed_step: int | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    deadline: float | None = None
    owner: dict | None = None
    parent: str | None = None
    source: str | None = None
    source_hash: str | None = None
    journal_degraded_from: int | None = None

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_json(self) -> str:
        data = {f.name: getattr(self, f.name) for f in fields(self)}  # asdict deep-copies
        data["status"] = self.status.value
        return _json_text(data)

    @classmethod
    def from_json(cls, text: str) -> "RunRecord":
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("run_id"), str):
            raise ValueError("run record is not a JSON object with a run_id")
        known = {f.name for f in fields(cls)}
        record = cls(**{k: v for k, v in data.items() if k in known})
        record.status = Status(record.status)
        return record


class _JsonOnlyDisk(diskcache.Disk):
    """A diskcache Disk that stores and loads str keys and str values only: never pickle."""

    def put(self, key: Any) -> tuple:
        if type(key) is not str:
            raise TypeError(f"journal keys are str, not {type(key).__name__}")
        return super().put(key)

    def get(self, key: Any, raw: bool) -> Any:
        if not raw:
            raise CorruptEntry("<pickled key>", "the journal holds a pickled key; refusing to load it")
        return super().get(key, raw)

    def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> tuple:
        if type(value) is not str:
            raise TypeError(f"journal values are JSON text, not {type(value).__name__}")
        return super().store(value, read, key)

    def fetch(self, mode: int, filename: str | None, value: Any, read: bool) -> Any:
        if mode == MODE_PICKLE:
            raise CorruptEntry("<pickled value>", "the journal holds a pickled value; refusing to load it")
        return super().fetch(mode, filename, value, read)


def _json_text(data: Any) -> str:
    """Compact JSON; plain UTF-8 where possible, ASCII escapes when the data holds strings
    that are not valid Unicode (lone surrogates), which SQLite could not store as text."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return text


def default_directory() -> Path:
    """``$DURABLE_NB_DIR`` if set, else ``./.durable_nb``."""
    return Path(os.environ.get("DURABLE_NB_DIR") or ".durable_nb")


def _step_key(run_id: str, position: int) -> str:
    return f"step:{run_id}:{position}"


class Journal:
    """The durable store of runs and steps in one directory.

    Safe to share between threads and processes: every write is a SQLite transaction.
    """

    def __init__(self, directory: str | os.PathLike | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_directory()
        self.directory = self.directory.expanduser().resolve()
        try:
            self.directory.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
            old_umask = os.umask(0o077)
            try:
                self._cache = diskcache.Cache(
                    str(self.directory), disk=_JsonOnlyDisk, eviction_policy="none",
                    size_limit=2**62, cull_limit=0, statistics=False, tag_index=False,
                    # A replay reads each entry once, in order: SQLite's default 64 MiB map
                    # and 32 MiB page cache would only grow the kernel's memory with the
                    # journal. (diskcache stores settings in the database: always pass them.)
                    sqlite_mmap_size=0, sqlite_cache_size=2**10,
                )
            finally:
                os.umask(old_umask)
        except (OSError, diskcache.core.sqlite3.Error) as exc:
            raise IncompatibleJournal(
                f"cannot open the journal at {self.directory}: {exc}. Check that the directory is "
                f"readable and writable by you, or point DURABLE_NB_DIR at another directory."
            ) from exc
        self._check_format()

    def _check_format(self) -> None:
        stored = self._cache.get("format")
        if stored is None:
            self._cache.add("format", json.dumps({"version": FORMAT_VERSION}))
            return
        try:
            version = json.loads(stored)["version"]
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptEntry("format", f"unreadable format marker ({exc})") from exc
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise IncompatibleJournal(
                f"the journal at {self.directory} has format version {version!r}, newer than this "
                f"durable_nb understands ({FORMAT_VERSION}). Upgrade durable_nb "
                f"(pip install -U durable-nb) or use another directory."
            )

    def close(self) -> None:
        """Close this thread's connection to the journal (each thread has its own)."""
        self._cache.close()

    def __repr__(self) -> str:
        return f"Journal({str(self.directory)!r})"

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Group writes into one atomic SQLite transaction."""
        with self._cache.transact(retry=True):
            yield

    # -- runs ---------------------------------------------------------------------------

    def run_ids(self) -> list[str]:
        """Every run id, in creation order."""
        text = self._cache.get("runs")
        if text is None:
            return []
        try:
            ids = json.loads(text)
            if not (isinstance(ids, list) and all(isinstance(i, str) for i in ids)):
                raise ValueError("not a list of run ids")
        except ValueError as exc:
            raise CorruptEntry("runs", str(exc)) from exc
        return ids

    def create_run(self, record: RunRecord) -> bool:
        """Store a new run; False (and nothing written) if the id exists already."""
        with self.transaction():
            if not self._cache.add(f"run:{record.run_id}", record.to_json(), retry=True):
                return False
            ids = self.run_ids()
            ids.append(record.run_id)
            self._cache.set("runs", json.dumps(ids), retry=True)
        return True

    def find_run(self, run_id: str) -> RunRecord | None:
        """The run record, or None if there is no such run."""
        text = self._cache.get(f"run:{run_id}", retry=True)
        if text is None:
            return None
        try:
            return RunRecord.from_json(text)
        except (ValueError, TypeError) as exc:
            raise CorruptEntry(f"run:{run_id}", str(exc), run_id=run_id) from exc

    def get_run(self, run_id: str) -> RunRecord:
        """The run record; :class:`UnknownRun` if there is none."""
        record = self.find_run(run_id)
        if record is None:
            raise UnknownRun(run_id, str(self.directory))
        return record

    def put_run(self, record: RunRecord) -> None:
        record.updated_at = time.time()
        self._cache.set(f"run:{record.run_id}", record.to_json(), retry=True)

    def delete_run(self, run_id: str) -> None:
        """Remove the run, its steps, lease and pending requests."""
        self.get_run(run_id)
        with self.transaction():
            self.truncate(run_id, 0)
            for key in (f"run:{run_id}", f"lease:{run_id}", f"decision:{run_id}", f"cancel:{run_id}"):
                self._cache.delete(key, retry=True)
            self._cache.set("runs", json.dumps([i for i in self.run_ids() if i != run_id]),
                            retry=True)

    # -- steps --------------------------------------------------------------------------

    def get_step(self, run_id: str, position: int) -> StepEntry | None:
        """Step ``position`` of the run, or None if it was never completed."""
        key = _step_key(run_id, position)
        text = self._cache.get(key, retry=True)
        if text is None:
            if key in self._cache:  # the row exists but its value file is gone
                raise CorruptEntry(key, "its value file is missing", run_id=run_id, position=position)
            return None
        try:
            return StepEntry.from_json(position, text)
        except (ValueError, TypeError) as exc:
            raise CorruptEntry(key, str(exc), run_id=run_id, position=position) from exc

    def put_step(self, run_id: str, entry: StepEntry, record: RunRecord | None = None) -> None:
        """Store a completed step, and the run record with it in the same transaction."""
        text = entry.to_json()
        if record is None:
            self._cache.set(_step_key(run_id, entry.position), text, retry=True)
            return
        record.updated_at = time.time()
        record_text = record.to_json()
        with self.transaction():
            self._cache.set(_step_key(run_id, entry.position), text, retry=True)
            self._cache.set(f"run:{run_id}", record_text, retry=True)

    def steps(self, run_id: str) -> Iterator[StepEntry]:
        """The run's step entries in order."""
        position = 0
        while (entry := self.get_step(run_id, position)) is not None:
            yield entry
            position += 1

    def count_steps(self, run_id: str) -> int:
        position = 0
        while _step_key(run_id, position) in self._cache:
            position += 1
        return position

    def truncate(self, run_id: str, from_position: int) -> int:
        """Delete step entries from ``from_position`` on; returns how many were deleted."""
        deleted = 0
        position = from_position
        with self.transaction():
            while self._cache.delete(_step_key(run_id, position), retry=True):
                deleted += 1
                position += 1
        return deleted

    # -- leases and requests from other processes ----------------------------------------

    def read_json(self, key: str) -> Any:
        """The JSON value at ``key`` (None if absent); for leases and requests."""
        text = self._cache.get(key, retry=True)
        if text is None:
            return None
        try:
            return json.loads(text)
        except ValueError as exc:
            raise CorruptEntry(key, str(exc)) from exc

    def write_json(self, key: str, value: Any) -> None:
        self._cache.set(key, json.dumps(value, separators=(",", ":")), retry=True)

    def delete_key(self, key: str) -> bool:
        return bool(self._cache.delete(key, retry=True))


_opened: dict[Path, Journal] = {}
_opened_lock = threading.Lock()


def open_journal(journal: "Journal | str | os.PathLike | None" = None) -> Journal:
    """``journal`` itself if it is a Journal, else the Journal of that directory (default:
    :func:`default_directory`), opened once per process and shared."""
    if isinstance(journal, Journal):
        return journal
    directory = Path(journal if journal is not None else default_directory())
    key = directory.expanduser().resolve()
    with _opened_lock:
        if key not in _opened:
            _opened[key] = Journal(key)
        return _opened[key]


def this_host() -> str:
    return socket.gethostname()
