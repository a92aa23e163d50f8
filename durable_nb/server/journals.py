"""Which journals the server shows, and how a request names one.

The allowed journals are ``$DURABLE_NB_JOURNAL`` and ``$DURABLE_NB_DIR`` (of the server's
environment) and those in the user's journal index (:mod:`durable_nb.journal.index`: every
journal a process of this user opened). This server's own (:func:`server_journals`, what a
listing shows unless asked for all) are the configured ones and those under its root
directory; the others are another folder's or another program's. A request names a journal
by its id (:func:`~durable_nb.journal.index.journal_id`) or by its location; a location that
is not one of the allowed ones is refused (:class:`NotAllowed`), so a request can never make
the server open, create or write a journal anywhere else.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import JournalError, NoJournal
from ..journal import Journal, open_journal
from ..journal.index import journal_id, known_locations
from ..journal.postgres import is_postgres_url, location_of

__all__ = ["KnownJournal", "NotAllowed", "UnknownJournal", "allowed_journals", "is_news",
           "resolve", "server_journals"]


#: Seconds a PostgreSQL journal that could not be opened is reported unavailable untried.
RETRY_OPEN_AFTER = 30.0
_open_failures: dict[str, tuple[float, str]] = {}
#: The journals opened, by location and read-only: a listing of hundreds of journals looks
#: each up here instead of resolving its path again (open_journal's own cache key).
_handles: dict[tuple[str, bool], Journal] = {}
#: What the server's log was last told of each journal that failed, by location.
_reported: dict[str, str] = {}


class NotAllowed(Exception):
    """A journal location that is not one of the allowed ones (HTTP 403)."""


class UnknownJournal(Exception):
    """A journal id that names no allowed journal (HTTP 404)."""


@dataclass(frozen=True)
class KnownJournal:
    """An allowed journal. ``location`` is what opens it (a PostgreSQL URL with its
    password: never shown); ``display`` what is shown."""

    id: str
    location: str
    kind: str
    #: Named by the server's environment (``$DURABLE_NB_JOURNAL``, ``$DURABLE_NB_DIR``).
    configured: bool = False

    @property
    def display(self) -> str:
        return location_of(self.location) if self.kind == "postgres" else self.location

    def open(self, *, write: bool = False) -> Journal:
        """The journal, shared by the process. A directory is opened read-only unless
        ``write``: listing never creates or changes one. A database that could not be
        reached is not tried again for :data:`RETRY_OPEN_AFTER` seconds (each try waits for
        its connect timeout, and a listing tries every allowed journal)."""
        read_only = self.kind == "disk" and not write
        if self.kind == "disk" and not os.path.isdir(self.location):
            _handles.pop((self.location, read_only), None)
            raise NoJournal(self.location)
        handle = _handles.get((self.location, read_only))
        if handle is not None:
            return handle
        failed = _open_failures.get(self.location)
        if failed is not None and time.monotonic() < failed[0]:
            raise JournalError(failed[1])
        try:
            handle = open_journal(self.location, read_only=read_only)
        except JournalError as exc:
            if self.kind == "postgres":
                _open_failures[self.location] = (time.monotonic() + RETRY_OPEN_AFTER, str(exc))
            raise
        _handles[(self.location, read_only)] = handle
        _reported.pop(self.location, None)  # a later failure is news again
        return handle

    def release(self) -> None:
        """Close this thread's connections to the journal (its shared handles stay open for
        the other threads): a thread that lives for one sweep leaves nothing open."""
        for read_only in (True, False):
            handle = _handles.get((self.location, read_only))
            if handle is not None:
                handle.close()

    def is_here(self, root_dir: str | None) -> bool:
        """Whether this is the server's own journal: configured, or a directory under the
        server's root directory ``root_dir``."""
        return self.configured or (self.kind == "disk" and _under(self.location, root_dir))

    def name(self, root_dir: str | None) -> str:
        """Where the journal is, as a person tells it apart: its path relative to the
        server's root directory when under it, else its absolute path, or its PostgreSQL URL
        without password."""
        if self.kind == "disk" and _under(self.location, root_dir):
            return os.path.relpath(self.location, _root(str(root_dir)))
        return self.display

    def to_json(self, root_dir: str | None = None) -> dict:
        return {"id": self.id, "name": self.name(root_dir), "location": self.display,
                "kind": self.kind, "here": self.is_here(root_dir)}


def is_news(known: KnownJournal, error: Exception) -> bool:
    """Whether ``error`` about ``known`` is news for the server's log: the first time the
    journal failed so since it last opened. A journal the server cannot use (a PostgreSQL
    journal without psycopg installed, a database down) is reported once, and again only when
    it fails otherwise or after it opened, not at every sweep."""
    said = str(error)
    if _reported.get(known.location) == said:
        return False
    _reported[known.location] = said
    return True


def _normal(location: str) -> str:
    """A location as the index and ids spell it: a directory absolute and resolved."""
    if is_postgres_url(location):
        return location
    return str(Path(location).expanduser().resolve())


def _under(location: str, root_dir: str | None) -> bool:
    if not root_dir:
        return False
    root = _root(root_dir)
    return location == root or location.startswith(root.rstrip(os.sep) + os.sep)


@functools.lru_cache(maxsize=8)
def _root(root_dir: str) -> str:
    """The server's root directory as journal locations spell it (resolved once)."""
    return _normal(root_dir)


#: The last answer of :func:`allowed_journals`, with the locations it was built from.
_allowed: tuple[tuple[str, ...], list[KnownJournal]] = ((), [])


def allowed_journals() -> list[KnownJournal]:
    """The journals this server shows, the environment's first, each once (built again only
    when the locations changed: a summary of hundreds of journals asks every second)."""
    global _allowed
    environment = [os.environ.get(name) for name in ("DURABLE_NB_JOURNAL", "DURABLE_NB_DIR")]
    configured = [_normal(v) for v in environment if v]
    locations = tuple(configured + known_locations())
    if locations == _allowed[0]:
        return list(_allowed[1])
    found: dict[str, KnownJournal] = {}
    for location in locations:
        key = journal_id(location)
        if key not in found:
            found[key] = KnownJournal(key, location,
                                      "postgres" if is_postgres_url(location) else "disk",
                                      configured=location in configured)
    _allowed = (locations, list(found.values()))
    return list(found.values())


def server_journals(root_dir: str | None, *, every: bool = False) -> list[KnownJournal]:
    """The journals a listing shows: this server's own (configured, or under ``root_dir``),
    or with ``every`` all the allowed ones."""
    journals = allowed_journals()
    return journals if every else [known for known in journals if known.is_here(root_dir)]


def resolve(name: str) -> KnownJournal:
    """The allowed journal ``name`` names: its id, or its location (a directory or URL);
    :class:`NotAllowed` for a location that is not allowed, :class:`UnknownJournal` for an
    unknown id."""
    journals = allowed_journals()
    for known in journals:
        if name == known.id:
            return known
    if not (is_postgres_url(name) or os.sep in name or "/" in name or name.startswith(".")):
        raise UnknownJournal(f"no journal with id {name!r} is known to this server: "
                             f"GET durable-nb/api/journals lists them")
    wanted = _normal(name)
    for known in journals:
        if wanted == known.location or (known.kind == "postgres"
                                        and wanted == known.display):
            return known
    raise NotAllowed(f"the journal {location_of(name) if is_postgres_url(name) else name} is "
                     f"not one this server shows: only $DURABLE_NB_JOURNAL, $DURABLE_NB_DIR and "
                     f"journals opened by this user's kernels are")

