"""The journal of a run as it was when an execution began, answered by step key."""

from __future__ import annotations

import threading

from ..errors import CorruptEntry
from ..journal import Journal, StepEntry

__all__ = ["ReplayLog"]


class ReplayLog:
    """Entries ``0 .. size-1`` of a run, taken by key.

    Entries are read in position order and only as far as needed: steps made one after
    another take each entry as it is read; entries read ahead for a concurrent step are held
    until their own step asks (memory grows with the skew between concurrent steps, not with
    the journal). Positions in ``skip`` (failed entries retried later) are passed over.
    Entries this execution writes (positions ``size`` on) are never read back as replay.
    """

    def __init__(self, journal: Journal, run_id: str, size: int,
                 skip: "list[int] | None" = None) -> None:
        self._journal = journal
        self._run_id = run_id
        self.size = size
        self._skip = set(skip or ())
        self._next = 0
        # The backend reads ahead as it likes (PostgreSQL: hundreds of entries a query).
        self._entries = journal.steps(run_id) if size else iter(())
        self._held: dict[str, StepEntry] = {}
        self._lock = threading.Lock()

    def take(self, key: str) -> StepEntry | None:
        """The journaled entry of step ``key``, or None if the journal has none."""
        with self._lock:
            entry = self._held.pop(key, None)
            if entry is not None:
                return entry
            while (entry := self._read_next()) is not None:
                if entry.key == key:
                    return entry
                self._hold(entry)
            return None

    @property
    def taken(self) -> int:
        """How many entries steps have taken (replayed) so far."""
        with self._lock:
            return self._next - len(self._held) - sum(1 for p in self._skip if p < self._next)

    def pending(self) -> bool:
        """Whether entries remain that no step has taken yet."""
        with self._lock:
            return bool(self._held) or self._next < self.size

    def rest(self) -> list[StepEntry]:
        """Every entry no step has taken, in position order (they are taken now)."""
        with self._lock:
            while (entry := self._read_next()) is not None:
                self._hold(entry)
            rest = sorted(self._held.values(), key=lambda e: e.position)
            self._held.clear()
            return rest

    def _read_next(self) -> StepEntry | None:
        while self._next < self.size:
            position = self._next
            self._next += 1
            entry = next(self._entries, None)
            if entry is None or entry.position != position:
                raise CorruptEntry(f"step:{self._run_id}:{position}",
                                   "the entry vanished while the run was being replayed",
                                   run_id=self._run_id, position=position)
            if position not in self._skip:
                return entry
        return None

    def _hold(self, entry: StepEntry) -> None:
        if entry.key in self._held:
            raise CorruptEntry(f"step:{self._run_id}:{entry.position}",
                               f"it is a second entry for step key {entry.key!r} (the first is "
                               f"at position {self._held[entry.key].position})",
                               run_id=self._run_id, position=entry.position)
        self._held[entry.key] = entry
