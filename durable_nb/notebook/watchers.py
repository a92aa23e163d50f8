"""The cells of this kernel that execute or watch a run or a batch, by its id: where a
decision given in this kernel (the inbox, ``%durable approve``) finds the cell to wake, so
that a parked run resumes at once instead of at its next poll of the journal.

It sits below the session, the batch cell and the inbox, so that none of them imports
another to find a cell."""

from __future__ import annotations

import threading
from typing import Generic, Protocol, TypeVar

__all__ = ["BATCH_WATCHERS", "RUN_WATCHERS", "Watchers", "batch_id_of", "wake_watchers"]


class Watcher(Protocol):
    def wake(self) -> None:
        """Look at the journal now (a decision was given)."""


W = TypeVar("W", bound=Watcher)


class Watchers(Generic[W]):
    """One cell of this kernel at most per id. ``lock`` (re-entrant) is held by a cell
    that replaces another: it stops the previous one under it."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._by_id: dict[str, W] = {}

    def get(self, key: str) -> W | None:
        """The cell of this kernel for ``key``, if any."""
        with self.lock:
            return self._by_id.get(key)

    def put(self, key: str, cell: W) -> None:
        """``cell`` is the one for ``key`` now."""
        with self.lock:
            self._by_id[key] = cell

    def forget(self, key: str, cell: W) -> None:
        """``cell`` stopped: forgotten, unless another took its place."""
        with self.lock:
            if self._by_id.get(key) is cell:
                del self._by_id[key]


#: The ``%%durable_agent`` cells, by run id (:class:`~durable_nb.notebook.session.NotebookRun`).
RUN_WATCHERS: Watchers = Watchers()
#: The batch cells, by batch id (:class:`~durable_nb.notebook.batch.NotebookBatch`).
BATCH_WATCHERS: Watchers = Watchers()


def wake_watchers(run_id: str) -> None:
    """Wake the cell of this kernel that watches run ``run_id``, and the batch cell whose
    item it is (``BATCH/KEY``), if there are."""
    batch_id = batch_id_of(run_id)
    for cell in (RUN_WATCHERS.get(run_id), BATCH_WATCHERS.get(batch_id) if batch_id else None):
        if cell is not None:
            cell.wake()


def batch_id_of(run_id: str) -> str:
    """The id of the batch whose item run ``run_id`` is (``BATCH/KEY``), "" for a run of
    no batch."""
    return run_id.rpartition("/")[0]
