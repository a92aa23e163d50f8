"""The journal: where runs and their steps are stored, and how a journal is chosen.

:class:`Journal` is the interface; :class:`DiskJournal` (diskcache, one directory) is the
default backend. :func:`open_journal` turns what a user passes (a Journal, a directory, or
nothing: ``$DURABLE_NB_JOURNAL``, ``$DURABLE_NB_DIR`` or ``./.durable_nb``) into one Journal
object per location and process, shared by everything in the process.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Union

from .base import Journal
from .local import FORMAT_VERSION, DiskJournal, Durability
from .edits import copy_run, fork_run, recount, rewind
from .records import LLM_KINDS, RunRecord, Status, StepEntry, entry_cost, json_text

__all__ = ["FORMAT_VERSION", "LLM_KINDS", "DiskJournal", "Durability", "Journal", "JournalSpec",
           "RunRecord", "Status", "StepEntry", "copy_run", "default_location", "entry_cost", "fork_run",
           "json_text", "open_journal", "recount", "rewind", "this_host"]

#: What a user may pass as ``journal=``: a Journal, a directory, or None (the default).
JournalSpec = Union[Journal, str, os.PathLike, None]


def default_location() -> str:
    """``$DURABLE_NB_JOURNAL`` or ``$DURABLE_NB_DIR`` if set, else ``./.durable_nb``."""
    return os.environ.get("DURABLE_NB_JOURNAL") or os.environ.get("DURABLE_NB_DIR") or ".durable_nb"


_opened: dict[tuple[str, str], Journal] = {}
_opened_lock = threading.Lock()


def open_journal(journal: JournalSpec = None, *,
                 durability: Durability | None = None) -> Journal:
    """``journal`` itself if it is a Journal, else the journal at that location (default:
    :func:`default_location`), opened once per process and shared.

    ``durability`` (default ``$DURABLE_NB_DURABILITY`` or ``"process"``): see
    :mod:`durable_nb.journal.local`.
    """
    if isinstance(journal, Journal):
        return journal
    durability = durability or os.environ.get("DURABLE_NB_DURABILITY") or "process"  # type: ignore[assignment]
    location = os.fspath(journal if journal is not None else default_location())
    key = (str(Path(location).expanduser().resolve()), durability)
    with _opened_lock:
        if key not in _opened:
            _opened[key] = DiskJournal(key[0], durability=durability)  # type: ignore[arg-type]
        return _opened[key]


def this_host() -> str:
    return socket.gethostname()
