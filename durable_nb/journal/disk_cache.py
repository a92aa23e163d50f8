"""The storage under the disk journal: a diskcache ``Cache`` that stores and loads JSON text
only (never a pickle), with owner-only folders and files fsynced when asked, its SQLite
connection retried while the database is locked, and the reader of a read-only journal (SQLite
opened ``mode=ro``, nothing written). See :mod:`durable_nb.journal.local`."""

from __future__ import annotations

import errno
import os
import os.path as op
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import diskcache
from diskcache.core import MODE_PICKLE, MODE_RAW, MODE_TEXT

from ..errors import CorruptEntry, NoJournal
from .base import read_only_error

DIR_MODE = 0o700
_FILE_MODE = 0o600


class JsonOnlyDisk(diskcache.Disk):
    """A diskcache Disk that stores and loads str keys and str values only (never pickle),
    and writes value files owner-only, fsynced when ``fsync`` is set."""

    fsync = False

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

    def _write(self, full_path: str, iterator: Any, mode: str, encoding: str | None = None) -> int:
        # diskcache's own _write creates folders and files with the process umask (0755/0644).
        full_dir = op.dirname(full_path)
        for attempt in range(10):
            # makedirs gives `mode` to the leaf only: make the outer folder first.
            os.makedirs(op.dirname(full_dir), mode=DIR_MODE, exist_ok=True)
            os.makedirs(full_dir, mode=DIR_MODE, exist_ok=True)
            try:
                fd = os.open(full_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
                break
            except FileNotFoundError:  # another process removed the folder meanwhile
                if attempt == 9:
                    raise
        with open(fd, "wb" if "b" in mode else "w", encoding=encoding) as writer:
            size = 0
            for chunk in iterator:
                size += len(chunk)
                writer.write(chunk)
            if self.fsync:
                writer.flush()
                os.fsync(fd)
        if self.fsync:
            _fsync_directory(full_dir)
        return size


def _fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class JournalCache(diskcache.Cache):
    """A diskcache Cache whose SQLite connections (one per thread) use this object's
    ``synchronous`` level: diskcache keeps pragmas in the shared database, where another
    process opening the same journal with another durability would change them."""

    synchronous: int | None = None  # set once diskcache's own set-up is done

    @property
    def _con(self) -> sqlite3.Connection:
        con = super()._con
        if self.synchronous is not None and \
                getattr(self._local, "synchronous", None) != self.synchronous:
            retry_locked(lambda: con.execute(f"PRAGMA synchronous = {self.synchronous}"))
            self._local.synchronous = self.synchronous
        return con


def retry_locked(action: Callable[[], Any], seconds: float = 60.0) -> Any:
    """``action()``, tried again while SQLite says the database is locked: another process
    opening the same journal at the same moment holds it for a few milliseconds."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return action()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() > deadline:
                raise
        time.sleep(0.005)


class ReadOnlyCache:
    """The reads DiskJournal makes of a diskcache Cache, done on a SQLite connection opened
    read-only (one per thread), never writing; the write methods raise."""

    def __init__(self, directory: Path) -> None:
        self._directory = str(directory)
        self._location = str(directory)
        self._disk = self  # DiskJournal._range calls self._cache._disk.fetch
        self._local = threading.local()
        database = directory / "cache.db"
        if not database.is_file():
            raise NoJournal(str(directory))
        self._uri = database.as_uri() + "?mode=ro"
        if not op.exists(f"{database}-wal"):
            # No write-ahead log to read: a WAL database in a directory SQLite may not write
            # (a read-only copy) opens only as immutable, and nothing is lost by it.
            try:
                self._connect().close()
            except sqlite3.OperationalError:
                self._uri = database.as_uri() + "?mode=ro&immutable=1"
        self._con  # fail now, not at the first read

    def _connect(self) -> sqlite3.Connection:
        con = sqlite3.connect(self._uri, uri=True, isolation_level=None,
                              check_same_thread=False)
        try:
            con.execute("SELECT 1 FROM Cache LIMIT 1").fetchall()
        except sqlite3.Error:
            con.close()
            raise
        return con

    @property
    def _con(self) -> sqlite3.Connection:
        con = getattr(self._local, "con", None)
        if con is None:
            con = self._local.con = retry_locked(self._connect)
        return con

    def _sql(self, query: str, params: tuple = ()) -> sqlite3.Cursor:
        return retry_locked(lambda: self._con.execute(query, params))

    def _row(self, key: str) -> tuple | None:
        return self._sql("SELECT mode, filename, value FROM Cache WHERE key = ? AND raw = 1 "
                         "AND (expire_time IS NULL OR expire_time > ?)",
                         (key, time.time())).fetchone()

    def get(self, key: str, retry: bool = True) -> str | None:
        row = self._row(key)
        if row is None:
            return None
        try:
            return self.fetch(*row, False)
        except FileNotFoundError:  # as diskcache: a row whose value file is gone reads as absent
            return None

    def __contains__(self, key: str) -> bool:
        return self._row(key) is not None

    def fetch(self, mode: int, filename: str | None, value: Any, read: bool) -> str:
        if mode == MODE_RAW and type(value) is str:
            return value
        if mode == MODE_TEXT and filename:
            with open(op.join(self._directory, filename), encoding="UTF-8") as reader:
                return reader.read()
        if mode == MODE_PICKLE:
            raise CorruptEntry("<pickled value>", "the journal holds a pickled value; refusing to load it")
        raise CorruptEntry("<value>", f"the journal holds a value of storage mode {mode} that is "
                                      f"not JSON text; refusing to load it")

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise read_only_error(self._location, "be written")

    add = set = delete = transact = _refuse

    def close(self) -> None:
        con = getattr(self._local, "con", None)
        if con is not None:
            self._local.con = None
            con.close()


def not_writable(directory: Path, exc: BaseException) -> str | None:
    """Why opening the journal for writing failed when the cause is that it can be read but
    not written (a read-only file system, mount or copy); None for other failures."""
    if isinstance(exc, OSError) and exc.errno == errno.EROFS:
        return exc.strerror or str(exc)
    if "readonly" in str(exc) or "read-only" in str(exc):
        return str(exc)
    try:
        path = directory
        while not path.exists() and path != path.parent:
            path = path.parent
        for candidate in (path, directory / "cache.db"):
            if candidate.exists() and os.access(candidate, os.R_OK) \
                    and not os.access(candidate, os.W_OK):
                return f"{candidate} is read-only"
    except OSError:  # the path cannot even be looked at: not a matter of writing
        pass
    return None
