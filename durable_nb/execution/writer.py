"""The ordered, fenced writer of one execution's journal entries.

Entries get their positions here, in the order steps complete, and are written in that
order, each in one transaction with the run record when the step changed it (tokens, an
approval) and with the blobs its inputs need; every write carries the execution's lease
token, so a fenced-out executor writes nothing. The run record is written only after every
entry before it: the journal never holds a record ahead of its steps.

When a write fails (a full or read-only disk; a database still unreachable after its
retries), ``on_journal_error="stop"`` (the default) raises
:class:`~durable_nb.errors.JournalWriteError` from the step whose entry it was, and again
before any later step: the run stops with the step in flight done, nothing past it runs, and
a record (DONE above all) that cannot be written raises too, so nothing is reported DONE
that the journal does not hold (each write returns once committed). ``"continue"`` keeps the
entries in memory, says loudly that the run is not durable (a ``RuntimeWarning``, and
``journal_degraded_from`` in the record the panel shows), and retries them in order at every
step; a run that finishes with entries still unwritten is not recorded DONE and says so.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import warnings
from collections import deque
from typing import Callable, Literal

from ..errors import JournalWriteError
from ..journal import Journal, RunRecord, Status, StepEntry
from ..journal.blobs import list_node

__all__ = ["JournalWriter", "OnJournalError"]

OnJournalError = Literal["continue", "stop"]
_WRITE_ERRORS = (OSError, sqlite3.Error, TimeoutError)
#: How many lists of earlier requests the writer remembers, to find the one a new request's
#: list extends (a few: concurrent conversations interleave).
_RECENT_LISTS = 8


class JournalWriter:
    """Appends one execution's entries to a run's journal. Thread-safe."""

    def __init__(self, journal: Journal, record: RunRecord, token: str, next_position: int,
                 on_error: OnJournalError, on_degraded: Callable[[RunRecord], None]) -> None:
        self.journal = journal
        self.record = record
        self.token = token
        self.next_position = next_position
        self.on_error = on_error
        self._on_degraded = on_degraded
        self._queue: deque[tuple[StepEntry, str | None, dict[str, str] | None]] = deque()
        self._blobs_written: set[str] = set()
        self._lists: deque[tuple[tuple[str, ...], str]] = deque(maxlen=_RECENT_LISTS)
        self.lock = threading.RLock()
        #: Under ``"stop"``: the failed write that stops the run (raised again by
        #: :meth:`check` before every later step).
        self.failure: JournalWriteError | None = None

    def append(self, entry: StepEntry, *, record_changed: bool = False,
               blobs: dict[str, str] | None = None) -> StepEntry:
        """Give ``entry`` the next position and journal it (with the record as it is now,
        if ``record_changed``). Raises :class:`~durable_nb.errors.RunLeased` when fenced."""
        with self.lock:
            entry.position = self.next_position
            self.next_position += 1
            self.record.step_count = self.next_position
            blobs = self._chain_lists(entry, blobs)
            new_blobs = None
            if blobs:
                new_blobs = {d: t for d, t in blobs.items() if d not in self._blobs_written}
                self._blobs_written.update(new_blobs)
            snapshot = self._snapshot() if record_changed else None
            self._queue.append((entry, snapshot, new_blobs or None))
            self.flush()
        return entry

    def _chain_lists(self, entry: StepEntry, blobs: dict[str, str] | None
                     ) -> dict[str, str] | None:
        """Each ``$blobs`` list of the entry's request as a ``$list`` node extending the
        longest list of a recent request it starts with (see :mod:`durable_nb.journal.blobs`):
        a chat entry then costs the journal its new messages, not the whole conversation.
        Here, under the writer's lock, so a node only ever extends one queued before it."""
        request = entry.request
        if not isinstance(request, dict):
            return blobs
        for field, value in list(request.items()):
            if not (isinstance(value, dict) and isinstance(value.get("$blobs"), list)):
                continue
            items = tuple(str(d) for d in value["$blobs"])
            prev, start = None, 0
            for known, node in self._lists:
                if start < len(known) <= len(items) and items[:len(known)] == known:
                    prev, start = node, len(known)
            digest, text = list_node(prev, items[start:])
            request[field] = {"$list": digest}
            blobs = {**(blobs or {}), digest: text}
            self._lists.append((items, digest))
        return blobs

    def _snapshot(self) -> str:
        # Taken now: an entry still queued when a later one changes the record again must
        # be written with the record as it was at its own step.
        self.record.updated_at = time.time()
        return self.record.to_json()

    def flush(self) -> None:
        """Write queued entries in order; see the module docstring for failures."""
        with self.lock:
            try:
                while self._queue:
                    entry, record_json, blobs = self._queue[0]
                    self.journal.append_step(self.record.run_id, entry, record_json=record_json,
                                             token=self.token, blobs=blobs)
                    self._queue.popleft()
            except _WRITE_ERRORS as exc:
                self._degrade(exc)
            else:
                if self.record.journal_degraded_from is not None:
                    self.record.journal_degraded_from = None
                    self._on_degraded(self.record)

    def save_record(self) -> None:
        """Write the run record (a status change), fenced, after the queued entries; returns
        once it is committed. On failure: see the module docstring."""
        with self.lock:
            self.flush()
            if self._queue:  # "continue", entries still unwritten: the record waits for them
                self._not_durable(None)
                return
            try:
                self.journal.put_run(self.record, token=self.token)
            except _WRITE_ERRORS as exc:
                if self.on_error == "stop":
                    self.failure = JournalWriteError(
                        f"run {self.record.run_id!r}: writing its record "
                        f"({self.record.status}) to the journal failed ({exc}); the run is "
                        f"not recorded {self.record.status}. Fix the journal (free disk space, "
                        f"bring the database back) and execute the run again: its steps "
                        f"replay from the journal and it ends the same way.")
                    raise self.failure from exc
                self._not_durable(exc)

    def check(self) -> None:
        """Raise the failed write that stopped the run, if one did (``"stop"``)."""
        if self.failure is not None:
            raise JournalWriteError(str(self.failure))

    def _degrade(self, exc: BaseException) -> None:
        first = self._queue[0][0].position
        run_id = self.record.run_id
        if self.on_error == "stop":
            self.failure = JournalWriteError(
                f"run {run_id!r}: writing step {first} to the journal failed ({exc}). The run "
                f"stopped there, as on_journal_error='stop' (the default) asks: no later step "
                f"ran. Fix the journal (free disk space, bring the database back) and execute "
                f"the run again: it resumes from its journal, step {first} executed again if "
                f"its entry is still not there.")
            raise self.failure from exc
        if self.record.journal_degraded_from is None:
            self.record.journal_degraded_from = first
            warnings.warn(
                f"durable_nb: the journal of run {run_id!r} is DEGRADED from step {first}: "
                f"writing it failed ({exc}). As on_journal_error='continue' asks, the run goes "
                f"on NOT durable: the writes are retried at every step, and until they "
                f"succeed a crash would run these steps again.", RuntimeWarning, stacklevel=5)
            self._on_degraded(self.record)

    def _not_durable(self, exc: BaseException | None) -> None:
        """``"continue"``: the record could not be written (``exc``), or waits for entries
        that could not; say so, loudly when the run finished."""
        record = self.record
        if record.journal_degraded_from is None:
            record.journal_degraded_from = self.next_position
        if record.status is Status.DONE:
            why = f"writing its record failed ({exc})" if exc is not None else (
                f"{len(self._queue)} of its steps could not be written, from step "
                f"{self._queue[0][0].position}")
            warnings.warn(
                f"durable_nb: run {record.run_id!r} finished, but it is NOT durable and not "
                f"recorded DONE: {why}. Executing it again executes the unjournaled steps "
                f"again.", RuntimeWarning, stacklevel=5)
        elif exc is not None:
            warnings.warn(
                f"durable_nb: the record of run {record.run_id!r} ({record.status}) could not "
                f"be written ({exc}); the run is not durable.", RuntimeWarning, stacklevel=5)
        self._on_degraded(record)
