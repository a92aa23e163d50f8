"""The journal of a run as it was when an execution began, answered by step key."""

from __future__ import annotations

import threading

from ..errors import CorruptEntry
from ..journal import Journal, StepEntry

__all__ = ["ReplayLog", "enclosing_step"]


class ReplayLog:
    """Entries ``0 .. size-1`` of a run, taken by key.

    Entries are read in position order and only as far as needed: steps made one after
    another take each entry as it is read; entries read ahead for a concurrent step are held
    until their own step asks (memory grows with the skew between concurrent steps, not with
    the journal). Positions in ``skip`` (failed entries retried later) are passed over.
    Entries this execution writes (positions ``size`` on) are never read back as replay.

    Taking a step's entry also drops the entries of the steps made inside it: replay skips
    its function, so they are answered with it. What is left held at any moment is what this
    execution has not answered yet, indexed by what each entry did (kind, name, inputs) so
    that a step about to execute can find the same work journaled under another key.
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
        self._alike: dict[tuple[str, str, str], dict[str, StepEntry]] = {}
        self._inside: dict[str, list[str]] = {}  # held keys by the step they were made in
        self._lock = threading.Lock()
        #: One past the highest position a step has taken: every entry this execution has
        #: answered a step with is below it.
        self.reached = 0

    @property
    def drained(self) -> bool:
        """Whether every entry was read and taken (or dropped): nothing is left to replay,
        for the rest of the execution."""
        return self._next >= self.size and not self._held

    def take(self, key: str) -> StepEntry | None:
        """The journaled entry of step ``key``, or None if the journal has none (then every
        entry was read: the ones not taken are held)."""
        with self._lock:
            entry = self._unhold(key)
            if entry is None:
                while (entry := self._read_next()) is not None:
                    if entry.key == key:
                        break
                    self._hold(entry)
            if entry is not None:
                self.reached = max(self.reached, entry.position + 1)
                if self._inside:
                    self._drop_inside(key)
            return entry

    def alike(self, kind: str, name: str, fingerprint: str) -> list[StepEntry]:
        """The held entries of steps with this kind, name and input fingerprint."""
        with self._lock:
            return list(self._alike.get((kind, name, fingerprint), {}).values())

    @property
    def taken(self) -> int:
        """How many entries steps have taken (replayed) so far."""
        with self._lock:
            return self._next - len(self._held) - sum(1 for p in self._skip if p < self._next)

    def pending(self) -> bool:
        """Whether entries remain that no step has taken yet."""
        with self._lock:
            return not self.drained

    def rest(self) -> list[StepEntry]:
        """Every entry no step has taken, in position order (they are taken now)."""
        with self._lock:
            while (entry := self._read_next()) is not None:
                self._hold(entry)
            rest = sorted(self._held.values(), key=lambda e: e.position)
            self._held.clear()
            self._alike.clear()
            self._inside.clear()
            return rest

    def made_in(self, key: str, parent: str) -> bool:
        """Whether a held entry was made inside step ``key`` by a step whose identity
        (``StepEntry.parent``) is ``parent``."""
        with self._lock:
            return any(self._held[inner].parent == parent
                       for inner in self._inside.get(key, ()) if inner in self._held)

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
        self._alike.setdefault((entry.kind, entry.name, entry.fingerprint), {})[entry.key] = entry
        enclosing = enclosing_step(entry.key)
        if enclosing is not None:
            self._inside.setdefault(enclosing, []).append(entry.key)

    def _unhold(self, key: str) -> StepEntry | None:
        entry = self._held.pop(key, None)
        if entry is not None:
            identity = (entry.kind, entry.name, entry.fingerprint)
            alike = self._alike[identity]
            del alike[key]
            if not alike:
                del self._alike[identity]
        return entry

    def _drop_inside(self, key: str) -> None:
        """Drop the held entries of steps made inside step ``key`` (at any depth)."""
        for inner in self._inside.pop(key, ()):
            if self._unhold(inner) is not None:
                self._drop_inside(inner)


def enclosing_step(key: str) -> str | None:
    """The key of the step that step ``key`` was made in (``3`` for ``3.fetch#0.1``), or
    None for a step of the run's root scope or of a task created there."""
    parts = key.split(".")
    for depth in range(len(parts) - 1, 0, -1):
        if "#" not in parts[depth - 1]:
            return ".".join(parts[:depth])
    return None
