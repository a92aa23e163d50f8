"""The journal: where runs and their steps are stored, and how a journal is chosen.

:class:`Journal` is the interface; :class:`DiskJournal` (diskcache, one directory) is the
default backend, :class:`~durable_nb.journal.postgres.PostgresJournal` (a PostgreSQL schema,
shared between machines) the other. :func:`open_journal` turns what a user passes (a Journal,
a directory, a ``postgresql://`` URL, or nothing: ``$DURABLE_NB_JOURNAL``, ``$DURABLE_NB_DIR``
or ``./.durable_nb``) into one Journal object per location and process, shared by everything
in the process.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Union

from .base import Journal
from .index import record_opened
from .local import FORMAT_VERSION, DiskJournal, Durability
from .edits import (copy_run, cut_at_key, dropped_by_change, recount, rerun, rewind,
                    staged_copies)
from .postgres import PostgresJournal, is_postgres_url
from .records import LLM_KINDS, BatchRecord, RunRecord, Status, StepEntry, entry_cost, json_text

__all__ = ["FORMAT_VERSION", "LLM_KINDS", "BatchRecord", "DiskJournal", "Durability", "Journal", "JournalSpec",
           "PostgresJournal", "RunRecord", "Status", "StepEntry", "copy_run", "cut_at_key",
           "default_location", "dropped_by_change", "entry_cost", "is_postgres_url", "json_text",
           "open_journal", "recount", "rerun", "rewind", "staged_copies", "this_host"]

#: What a user may pass as ``journal=``: a Journal, a directory, a ``postgresql://`` URL, or
#: None (the default).
JournalSpec = Union[Journal, str, os.PathLike, None]


def default_location() -> str:
    """``$DURABLE_NB_JOURNAL`` or ``$DURABLE_NB_DIR`` if set, else ``./.durable_nb``."""
    return os.environ.get("DURABLE_NB_JOURNAL") or os.environ.get("DURABLE_NB_DIR") or ".durable_nb"


_opened: dict[tuple[str, str, bool], Journal] = {}
_opened_lock = threading.Lock()


def open_journal(journal: JournalSpec = None, *, durability: Durability | None = None,
                 read_only: bool = False) -> Journal:
    """``journal`` itself if it is a Journal, else the journal at that location (default:
    :func:`default_location`), opened once per process and shared.

    A location starting with ``postgresql://`` or ``postgres://`` is a
    :class:`~durable_nb.journal.postgres.PostgresJournal` (``?schema=NAME`` picks the schema);
    anything else a directory. ``durability`` (default ``$DURABLE_NB_DURABILITY`` or
    ``"process"``): see :mod:`durable_nb.journal.local` (PostgreSQL has its own settings).
    ``read_only=True``: a journal that never creates or writes anything; a missing one is a
    :class:`~durable_nb.errors.JournalError`.

    The first open of a location in a process notes it in the user's journal index
    (:mod:`~durable_nb.journal.index`: one small file, never an error), so that the user's
    Jupyter Server lists its runs.
    """
    if isinstance(journal, Journal):
        return journal
    durability = durability or os.environ.get("DURABLE_NB_DURABILITY") or "process"  # type: ignore[assignment]
    location = os.fspath(journal if journal is not None else default_location())
    if is_postgres_url(location):
        key = (location, "", read_only)
    else:
        key = (str(Path(location).expanduser().resolve()), durability, read_only)
    with _opened_lock:
        if key not in _opened:
            if is_postgres_url(location):
                _opened[key] = PostgresJournal(location, read_only=read_only)
            else:
                _opened[key] = DiskJournal(key[0], durability=durability,  # type: ignore[arg-type]
                                           read_only=read_only)
            record_opened(key[0])
        return _opened[key]


def this_host() -> str:
    return socket.gethostname()
