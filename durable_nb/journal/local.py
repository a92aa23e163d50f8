"""The default journal: one directory on local disk, a diskcache ``Cache`` (SQLite in WAL mode,
values over 32 KiB in files beside it).

Keys are strings::

    format               the journal format version, checked on open
    run:ID               the run record
    batch:ID             a batch record (its items' keys)
    step:ID:N            the entry at position N of the run
    blob:ID:DIGEST       an input part stored once per run (chat messages, tool schemas)
    lease:ID             who executes the run now (token, pid, host, heartbeat)
    setting:NAME         a journal-wide setting (the retention policy)
    journal-event:T-R    the journal's own history (runs pruned), by time
    decision.A:ID        a decision on the run's approval A, waiting for the executor
    decision:ID          the same, as durable_nb wrote it before approvals had ids
    cancel:ID            a cancel request waiting for the executor
    value:SCOPE<US>SPACE<US>KEY   a keyed value (:meth:`Journal.put_values`); a run's scope
                         is its id

Values are JSON text only: the cache refuses to store or load pickles, so opening a journal
never runs code from it. Nothing is ever evicted. The directory is created ``0700`` and every
file in it ``0600``, value files and their folders included.

**Durability.** ``durability="process"`` (the default): SQLite ``synchronous=NORMAL`` in WAL
mode; a killed process loses nothing that was journaled, a power cut may lose the last
steps. ``durability="power"``: ``synchronous=FULL`` and every value file fsynced before its
row is committed; a step journaled before a power cut is still there after it.

**Read-only.** ``read_only=True`` opens an existing journal without diskcache (whose
constructor writes its settings): SQLite opened with ``mode=ro`` and the cache table's rows
read here, values inline or from their files, pickles refused. Nothing is created or
written: a missing journal is an error, write methods raise, and a read-only copy (files
without write permission) is read as it is. In a writable directory SQLite may add its
``-wal``/``-shm`` companion files to read alongside live writers; they hold no data.

**Where each part is.** This module holds the journal's runs, batches, steps and blobs;
:mod:`.disk_cache` the diskcache that stores JSON text only and the read-only reader;
:mod:`.disk_layout` the keys, the statements on the Cache table and the run index;
:mod:`.disk_coordination` leases, requests and a run's keyed records (deliveries, history
events); :mod:`.disk_values` keyed values.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from diskcache.core import MODE_RAW

from ..errors import CorruptEntry, IncompatibleJournal, JournalNotWritable, RunLeased
from .base import (
    FENCED_ADVICE,
    REQUEST_KINDS,
    Journal,
    StatusFilter,
    check_setting,
    position_taken_advice,
    read_only_error,
    select_runs,
    wanted_statuses,
)
from .disk_cache import (
    DIR_MODE,
    JournalCache,
    JsonOnlyDisk,
    ReadOnlyCache,
    not_writable,
    retry_locked,
)
from .disk_coordination import DiskRunCoordination
from .disk_values import DiskKeyedValues, value_key
from .disk_layout import (
    IN_RUNS,
    INSERT_IF_ABSENT,
    INSERT_IF_LEASED,
    READ_AHEAD,
    RUNS_INDEX,
    SELECT_STEPS,
    SELECT_VALUE,
    UPDATE_INLINE,
    prefix_end,
    record_tag,
    request_key,
    run_tag,
    step_key,
)
from .records import BatchRecord, RunRecord, Status, StepEntry

__all__ = ["DiskJournal", "Durability", "FORMAT_VERSION"]

#: 2 added step keys, input fingerprints and blobs; format 1 journals are read as they are.
FORMAT_VERSION = 2
Durability = Literal["process", "power"]
_SYNCHRONOUS = {"process": 1, "power": 2}  # SQLite NORMAL, FULL


#: reclaim_space VACUUMs when at least 1/VACUUM_FREE_SHARE of the database's pages are free.
VACUUM_FREE_SHARE = 4

#: Runs whose verified lease text a DiskJournal keeps (see DiskJournal._fenced).
_HELD_KEPT = 1024


class DiskJournal(DiskRunCoordination, DiskKeyedValues, Journal):
    """The journal in one directory (default ``./.durable_nb``) on this machine.

    Safe to share between threads and processes: every write is a SQLite transaction.
    ``read_only=True``: see the module docstring.
    """

    def __init__(self, directory: str | os.PathLike, *, durability: Durability = "process",
                 read_only: bool = False) -> None:
        if durability not in _SYNCHRONOUS:
            raise ValueError(f"durability must be 'process' or 'power', not {durability!r}")
        #: Per run, (token, lease text) last found to be that token's lease: the same text
        #: read again at the next write needs no parsing (a renewal changes the text).
        self._held: dict[str, tuple[str, str]] = {}
        self.directory = Path(directory).expanduser().resolve()
        self.location = str(self.directory)
        self.durability = durability
        self.read_only = read_only
        if read_only:
            try:
                self._cache = ReadOnlyCache(self.directory)
            except (OSError, sqlite3.Error) as exc:
                raise IncompatibleJournal(
                    f"cannot open the journal at {self.directory} read-only: {exc}. Check that "
                    f"its directory and files are readable by you.") from exc
            self._check_format()
            return
        try:
            self.directory.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            old_umask = os.umask(0o077)
            try:
                self._cache = retry_locked(lambda: JournalCache(
                    str(self.directory), disk=JsonOnlyDisk, eviction_policy="none",
                    size_limit=2**62, cull_limit=0, statistics=False, tag_index=False,
                    # A replay reads each entry once, in order: SQLite's default 64 MiB map
                    # and 32 MiB page cache would only grow the kernel's memory with the
                    # journal. (diskcache stores settings in the database: always pass them.)
                    sqlite_mmap_size=0, sqlite_cache_size=2**10,
                ))
            finally:
                os.umask(old_umask)
        except (OSError, sqlite3.Error) as exc:
            reason = not_writable(self.directory, exc)
            if reason is not None:
                raise JournalNotWritable(str(self.directory), reason) from exc
            raise IncompatibleJournal(
                f"cannot open the journal at {self.directory}: {exc}. Check that the directory is "
                f"readable and writable by you, or point DURABLE_NB_DIR at another directory."
            ) from exc
        self._cache.synchronous = _SYNCHRONOUS[durability]
        self._cache._disk.fsync = durability == "power"
        self._check_format()
        self._index_runs()

    def _index_runs(self) -> None:
        """Create the index of run records by status and creation time (once per journal),
        and tag the records an older durable_nb wrote without one."""
        retry_locked(lambda: self._cache._sql(RUNS_INDEX))
        query = f"SELECT key, mode, filename, value FROM Cache WHERE {IN_RUNS} AND tag IS NULL"
        if self._cache._sql(query + " LIMIT 1").fetchone() is None:
            return
        fetch = self._cache._disk.fetch
        with self._cache.transact(retry=True):
            for key, mode, filename, value in self._cache._sql(query).fetchall():
                try:
                    tag = record_tag(fetch(mode, filename, value, False))
                except (OSError, CorruptEntry):
                    continue  # unreadable: listed (and reported) as it is
                if tag is not None:
                    self._cache._sql("UPDATE Cache SET tag = ? WHERE key = ? AND raw = 1",
                                     (tag, key))

    def _check_format(self) -> None:
        stored = self._get("format")
        if stored is None:
            if not self.read_only:
                self._cache.add("format", json.dumps({"version": FORMAT_VERSION}), retry=True)
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
        if version < FORMAT_VERSION and not self.read_only:
            # Format 1 entries read as format 2 ones (their keys are their positions);
            # marking the journal stops an older durable_nb from misreading new entries.
            self._cache.set("format", json.dumps({"version": FORMAT_VERSION}), retry=True)

    def close(self) -> None:
        self._cache.close()

    # -- primitives ------------------------------------------------------------------------

    def _get(self, key: str) -> str | None:
        return self._cache.get(key, retry=True)

    def _read_json(self, key: str) -> Any:
        text = self._get(key)
        if text is None:
            return None
        try:
            return json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise CorruptEntry(key, f"not JSON ({exc})") from None

    def _set_json(self, key: str, value: Any) -> None:
        self._cache.set(key, json.dumps(value, separators=(",", ":")), retry=True)

    def _range(self, prefix: str) -> list[tuple[str, str]]:
        """(key, value) of every key starting with ``prefix``, in key order: one indexed
        range query (diskcache has no public prefix scan)."""
        rows = self._cache._sql(
            "SELECT key, mode, filename, value FROM Cache WHERE key >= ? AND key < ? AND raw = 1",
            (prefix, prefix_end(prefix))).fetchall()
        fetch = self._cache._disk.fetch
        return [(key, fetch(mode, filename, value, False)) for key, mode, filename, value in rows]

    def _fenced(self, run_id: str, token: str | None, sql: Callable | None = None) -> None:
        """Inside a transaction (whose ``sql``, diskcache's ``execute``, may be passed):
        refuse to write for an executor that lost the lease."""
        if token is None:
            return
        # One indexed SELECT on the transaction's own connection (diskcache's get() would
        # add its expiry and statistics bookkeeping to every step).
        row = (sql or self._cache._sql)(SELECT_VALUE, (f"lease:{run_id}",)).fetchone()
        if row is not None and row[0] == MODE_RAW and self._held.get(run_id) == (token, row[2]):
            return  # the very lease text found to be this token's at an earlier write
        holder = None
        if row is not None:
            mode, filename, value = row
            try:
                text = value if mode == MODE_RAW and type(value) is str else \
                    self._cache._disk.fetch(mode, filename, value, False)
                holder = json.loads(text)
            except (OSError, ValueError, RecursionError):
                holder = None  # a lease that cannot be read is not this executor's
        if not isinstance(holder, dict) or holder.get("token") != token:
            raise RunLeased(run_id, holder if isinstance(holder, dict) else {},
                            advice=FENCED_ADVICE)
        if row[0] == MODE_RAW and type(row[2]) is str:
            if len(self._held) >= _HELD_KEPT:
                self._held.clear()
            self._held[run_id] = (token, row[2])

    def _columns(self, key: str, text: str) -> tuple:
        """The (size, mode, filename, value) columns of ``text`` as diskcache stores it:
        inline under its ``min_file_size`` (32 KiB), else in a value file written now (owner
        only, fsynced at durability="power"), before the transaction takes the write lock."""
        disk = self._cache._disk
        if len(text) < disk.min_file_size:
            return 0, MODE_RAW, None, text
        return disk.store(text, False, key=key)

    @staticmethod
    def _insert_if_absent(sql: Callable, key: str, columns: tuple, now: float) -> bool:
        """Inside a transaction (``sql``: its ``execute``): add the row ``key`` unless it
        exists; whether it was added.

        One statement where diskcache's ``add`` takes two (a SELECT, then the INSERT): the
        Cache table's UNIQUE (key, raw) index refuses a second row, ``OR IGNORE`` turns that
        into "nothing written", and diskcache's count and size triggers fire only for a row
        really inserted. Journal rows never expire, so add()'s replacing of an expired row
        does not apply.
        """
        size, mode, filename, value = columns
        return sql(INSERT_IF_ABSENT, (key, now, now, size, mode, filename, value)).rowcount == 1

    def _insert_under_held_lease(self, sql: Callable, run_id: str, token: str | None,
                                 key: str, columns: tuple, now: float) -> bool:
        """Inside a transaction: the fenced insert of an executor's next entry in one
        statement, where the run's lease row still holds the very text found to be this
        token's at an earlier write (see :meth:`_fenced`); whether it was inserted. When not
        (no such text, a renewed or lost lease, a taken position), the caller checks and
        inserts step by step, and raises what applies."""
        held = self._held.get(run_id) if token is not None else None
        if held is None or held[0] != token:
            return False
        size, mode, filename, value = columns
        return sql(INSERT_IF_LEASED, (key, now, now, size, mode, filename, value,
                                       f"lease:{run_id}", MODE_RAW, held[1])).rowcount == 1

    # -- runs -----------------------------------------------------------------------------

    def create_run(self, record: RunRecord) -> bool:
        return bool(self._cache.add(f"run:{record.run_id}", record.to_json(),
                                    tag=run_tag(record.status, record.created_at), retry=True))

    def find_run(self, run_id: str) -> RunRecord | None:
        text = self._get(f"run:{run_id}")
        if text is None:
            return None
        return _parse_record(f"run:{run_id}", text, run_id)

    def put_run(self, record: RunRecord, *, token: str | None = None) -> None:
        record.updated_at = time.time()
        text = record.to_json()
        with self._cache.transact(retry=True):
            self._fenced(record.run_id, token)
            self._cache.set(f"run:{record.run_id}", text,
                            tag=run_tag(record.status, record.created_at), retry=True)

    def list_runs(self, prefix: str = "", *, status: StatusFilter = None,
                  limit: int | None = None, newest_first: bool = False) -> list[RunRecord]:
        wanted = wanted_statuses(status)
        if wanted is None and limit is None:
            rows = self._range("run:" + prefix)  # every record: one range scan
        else:
            rows = self._indexed_runs(prefix, wanted, limit, newest_first)
        return select_runs((_parse_record(key, text, key[4:]) for key, text in rows), wanted,
                           limit, newest_first)

    def _indexed_runs(self, prefix: str, wanted: tuple[Status, ...] | None,
                      limit: int | None, newest_first: bool) -> list[tuple[str, str]]:
        """(key, text) of the candidate records for a filtered or limited listing, read
        through the ``durable_nb_runs`` index: per status, its records in the id range (the
        first ``limit`` of them in the order asked for), and the records written without a
        tag (by an older durable_nb), which only parsing can place."""
        low = "run:" + prefix
        bounds = (low, prefix_end(low))
        order = "DESC" if newest_first else "ASC"
        cut = "" if limit is None else f" LIMIT {max(int(limit), 0)}"
        queries = [(f"SELECT key, mode, filename, value FROM Cache WHERE {IN_RUNS} AND tag >= ? "
                    f"AND tag < ? AND key >= ? AND key < ? ORDER BY tag {order}, key {order}{cut}",
                    (f"{s.value}|", f"{s.value}}}", *bounds)) for s in (wanted or Status)]
        queries.append((f"SELECT key, mode, filename, value FROM Cache WHERE {IN_RUNS} "
                        f"AND tag IS NULL AND key >= ? AND key < ?", bounds))
        fetch = self._cache._disk.fetch
        rows = []
        for query, params in queries:
            for key, mode, filename, value in self._cache._sql(query, params).fetchall():
                rows.append((key, fetch(mode, filename, value, False)))
        return rows

    def count_runs(self, prefix: str = "") -> dict[Status, int]:
        """Counted on the ``durable_nb_runs`` index (records written without a tag, by an
        older durable_nb, are parsed)."""
        low = "run:" + prefix
        bounds = (low, prefix_end(low))
        counts: dict[Status, int] = {}
        # A count per status over its range of the index: no tag is cut apart (a GROUP BY
        # on the status part of the tag took 3 x as long at 100,000 runs).
        query = (f"SELECT count(*) FROM Cache WHERE {IN_RUNS} AND tag >= ? AND tag < ? "
                 f"AND key >= ? AND key < ?")
        for status in Status:
            count = self._cache._sql(query, (f"{status.value}|", f"{status.value}}}",
                                             *bounds)).fetchone()[0]
            if count:
                counts[status] = count
        fetch = self._cache._disk.fetch
        untagged = (f"SELECT key, mode, filename, value FROM Cache WHERE {IN_RUNS} "
                    f"AND tag IS NULL AND key >= ? AND key < ?")
        for key, mode, filename, value in self._cache._sql(untagged, bounds).fetchall():
            status = _parse_record(key, fetch(mode, filename, value, False), key[4:]).status
            counts[status] = counts.get(status, 0) + 1
        return counts

    def list_runs_counted(self, prefix: str = "", *, status: StatusFilter = None,
                          limit: int | None = None,
                          newest_first: bool = False) -> list[RunRecord]:
        """:meth:`list_runs`, each ``step_count`` checked against the journal with two keys
        per run looked up 256 a query (the record's count and one past it); only a record
        that lags (after a crash) is counted step by step."""
        records = self.list_runs(prefix, status=status, limit=limit, newest_first=newest_first)
        probes = []
        for record in records:
            hint = max(int(record.step_count or 0), 0)
            probes.append(step_key(record.run_id, hint))
            if hint:
                probes.append(step_key(record.run_id, hint - 1))
        present = self._present(probes)
        for record in records:
            hint = max(int(record.step_count or 0), 0)
            if step_key(record.run_id, hint) in present or \
                    (hint and step_key(record.run_id, hint - 1) not in present):
                record.step_count = self.count_steps(record.run_id, hint)
        return records

    def _present(self, keys: list[str]) -> set[str]:
        """Which of ``keys`` the journal holds, 256 a query."""
        present: set[str] = set()
        for start in range(0, len(keys), READ_AHEAD):
            chunk = keys[start:start + READ_AHEAD]
            query = f"SELECT key FROM Cache WHERE raw = 1 AND key IN ({', '.join('?' * len(chunk))})"
            present.update(key for key, in self._cache._sql(query, chunk).fetchall())
        return present

    def _values(self, keys: list[str]) -> list[tuple[str, str]]:
        """(key, value) of those of ``keys`` the journal holds, 256 a query."""
        fetch = self._cache._disk.fetch
        found = []
        for start in range(0, len(keys), READ_AHEAD):
            chunk = keys[start:start + READ_AHEAD]
            query = (f"SELECT key, mode, filename, value FROM Cache WHERE raw = 1 "
                     f"AND key IN ({', '.join('?' * len(chunk))})")
            found += [(key, fetch(mode, filename, value, False))
                      for key, mode, filename, value in self._cache._sql(query, chunk).fetchall()]
        return found

    # -- batches --------------------------------------------------------------------------

    def put_batch(self, record: BatchRecord) -> None:
        record.updated_at = time.time()
        self._cache.set(f"batch:{record.batch_id}", record.to_json(), retry=True)

    def find_batch(self, batch_id: str) -> BatchRecord | None:
        text = self._get(f"batch:{batch_id}")
        return None if text is None else _parse_batch(f"batch:{batch_id}", text)

    def list_batches(self) -> list[BatchRecord]:
        records = [_parse_batch(key, text) for key, text in self._range("batch:")]
        records.sort(key=lambda r: (r.created_at, r.batch_id))
        return records

    def delete_run(self, run_id: str, *, token: str | None = None,
                   children: Iterable[str] = ()) -> None:
        if self.read_only:
            raise read_only_error(self.location, "be written")
        self.get_run(run_id)
        with self._cache._transact(retry=True) as (sql, cleanup):
            self._fenced(run_id, token, sql)
            for gone in (*children, run_id):
                self._delete_rows(sql, cleanup, self._run_keys(sql, gone))

    def delete_batch(self, batch_id: str, items: dict[str, str | None],
                     children: Iterable[str] = ()) -> None:
        if self.read_only:
            raise read_only_error(self.location, "be written")
        with self._cache._transact(retry=True) as (sql, cleanup):
            for item, token in items.items():
                self._fenced(item, token, sql)
            for gone in (*children, *items):
                self._delete_rows(sql, cleanup, self._run_keys(sql, gone))
            self._delete_rows(sql, cleanup, [f"batch:{batch_id}"])

    def _run_keys(self, sql: Callable, run_id: str) -> list[str]:
        """Inside a transaction: every key of the run (record, steps, blobs, lease,
        requests, decisions, deliveries, history and keyed values)."""
        return [*self._step_keys(sql, run_id, 0), *self._blob_keys(sql, run_id),
                f"run:{run_id}", f"lease:{run_id}",
                *(request_key(kind, run_id) for kind in REQUEST_KINDS),
                *self._decision_keys(sql, run_id), *self._delivery_keys(sql, run_id),
                *self._scope_keys(sql, run_id)]

    # -- the journal's own settings and history ----------------------------------------------

    def setting(self, name: str) -> dict | None:
        check_setting(name)
        return self._read_json(f"setting:{name}")

    def put_setting(self, name: str, value: dict | None) -> None:
        check_setting(name)
        if self.read_only:
            raise read_only_error(self.location, "be written")
        if value is None:
            self._cache.delete(f"setting:{name}", retry=True)
        else:
            self._set_json(f"setting:{name}", value)

    def add_journal_event(self, event: dict) -> None:
        if self.read_only:
            raise read_only_error(self.location, "be written")
        self._cache.add(f"journal-event:{time.time_ns():020d}-{uuid.uuid4().hex[:8]}",
                        json.dumps(event, separators=(",", ":")), retry=True)

    def journal_events(self) -> list[dict]:
        return [json.loads(text) for _, text in self._range("journal-event:")]

    def size_on_disk(self) -> int:
        return sum(p.stat().st_size for p in self.directory.rglob("*") if p.is_file())

    def reclaim_space(self) -> None:
        """Value files of deleted entries went with their rows. The SQLite database is
        ``VACUUM``ed (rewritten without its free pages) when a quarter or more of its pages
        are free; fewer are left for new rows to reuse (a ``VACUUM`` rewrites the whole
        file, which a large journal should not pay for a few runs). Then a checkpoint
        empties the write-ahead log."""
        if self.read_only:
            raise read_only_error(self.location, "be written")
        sql = self._cache._sql
        free, pages = (sql(f"PRAGMA {name}").fetchone()[0]
                       for name in ("freelist_count", "page_count"))
        if free * VACUUM_FREE_SHARE >= pages:
            retry_locked(lambda: sql("VACUUM"))
        retry_locked(lambda: sql("PRAGMA wal_checkpoint(TRUNCATE)").fetchall())

    def publish_runs(self, staged: list[tuple[str, RunRecord]]) -> bool:
        if self.read_only:
            raise read_only_error(self.location, "be written")
        with self._cache._transact(retry=True) as (sql, cleanup):
            if any(sql("SELECT 1 FROM Cache WHERE key = ? AND raw = 1",
                       (f"run:{record.run_id}",)).fetchone() for _, record in staged):
                return False
            for staging, record in staged:
                self._delete_rows(sql, cleanup, [f"run:{staging}"])
                renames = [(key, step_key(record.run_id, int(key.rsplit(":", 1)[1])))
                           for key in self._step_keys(sql, staging, 0)]
                renames += [(key, f"blob:{record.run_id}:{key.rsplit(':', 1)[1]}")
                            for key in self._blob_keys(sql, staging)]
                # The copy's values replace those left under its id by no run.
                self._delete_rows(sql, cleanup, self._scope_keys(sql, record.run_id))
                renames += [(key, value_key(record.run_id) + key[len(value_key(staging)):])
                            for key in self._scope_keys(sql, staging)]
                for old, new in renames:
                    sql("UPDATE Cache SET key = ? WHERE key = ? AND raw = 1", (new, old))
                self._cache.add(f"run:{record.run_id}", record.to_json(),
                                tag=run_tag(record.status, record.created_at), retry=True)
        return True

    @staticmethod
    def _step_keys(sql: Callable, run_id: str, start: int) -> list[str]:
        """Inside a transaction: the keys of the run's entries from ``start`` on (a
        contiguous run of positions)."""
        keys = []
        while True:
            chunk = [step_key(run_id, p) for p in range(start, start + READ_AHEAD)]
            found = {key for key, in sql("SELECT key FROM Cache WHERE raw = 1 AND key IN ("
                                         + ", ".join("?" * len(chunk)) + ")", chunk)}
            for key in chunk:
                if key not in found:
                    return keys
                keys.append(key)
            start += READ_AHEAD

    @staticmethod
    def _blob_keys(sql: Callable, run_id: str) -> list[str]:
        """Inside a transaction: the keys of the run's blobs, exactly (``blob:RUN:DIGEST``
        also starts the keys of run ``RUN:2``'s blobs: a digest has no colon)."""
        prefix = f"blob:{run_id}:"
        rows = sql("SELECT key FROM Cache WHERE key >= ? AND key < ? AND raw = 1",
                   (prefix, prefix_end(prefix))).fetchall()
        return [key for key, in rows if ":" not in key[len(prefix):]]

    @staticmethod
    def _decision_keys(sql: Callable, run_id: str) -> list[str]:
        """Inside a transaction: the keys ``decision.ID:RUN`` of the decisions left for the
        run's approvals (ID is hex: the first ':' ends it)."""
        rows = sql("SELECT key FROM Cache WHERE key >= ? AND key < ? AND raw = 1",
                   ("decision.", prefix_end("decision."))).fetchall()
        return [key for key, in rows if key.split(":", 1)[1] == run_id]

    @staticmethod
    def _delete_rows(sql: Callable, cleanup: Callable, keys: list[str]) -> int:
        """Inside a transaction: delete the rows of ``keys``, their value files once it is
        committed (diskcache's triggers keep its count and size); how many existed."""
        deleted = 0
        for key in keys:
            row = sql("SELECT filename FROM Cache WHERE key = ? AND raw = 1", (key,)).fetchone()
            if row is None:
                continue
            sql("DELETE FROM Cache WHERE key = ? AND raw = 1", (key,))
            cleanup(row[0])
            deleted += 1
        return deleted

    # -- steps ----------------------------------------------------------------------------

    def get_step(self, run_id: str, position: int) -> StepEntry | None:
        key = step_key(run_id, position)
        text = self._get(key)
        if text is None:
            if key in self._cache:  # the row exists but its value file is gone
                raise CorruptEntry(key, "its value file is missing", run_id=run_id,
                                   position=position)
            return None
        return _parse_entry(key, run_id, position, text)

    def has_step(self, run_id: str, position: int) -> bool:
        return step_key(run_id, position) in self._cache

    def steps(self, run_id: str, start: int = 0) -> Iterator[StepEntry]:
        """The run's entries in position order, read :data:`READ_AHEAD` positions a query
        (one indexed ``key IN (...)`` lookup instead of a query per entry: keys sort as
        text, ``step:R:10`` before ``step:R:2``, so a range scan would not do); stops at the
        first missing position, as the interface's own version does."""
        fetch = self._cache._disk.fetch
        position = start
        while True:
            keys = [step_key(run_id, p) for p in range(position, position + READ_AHEAD)]
            rows = self._cache._sql(SELECT_STEPS, keys).fetchall()
            found = {key: (mode, filename, value) for key, mode, filename, value in rows}
            for key in keys:
                row = found.get(key)
                if row is None:
                    return
                mode, filename, value = row
                try:
                    text = value if mode == MODE_RAW and type(value) is str else \
                        fetch(mode, filename, value, False)
                except FileNotFoundError:  # the row exists but its value file is gone
                    raise CorruptEntry(key, "its value file is missing", run_id=run_id,
                                       position=position) from None
                yield _parse_entry(key, run_id, position, text)
                position += 1
            if len(rows) < READ_AHEAD:
                return

    @contextmanager
    def _value_files_of(self, rows: list[tuple[str, tuple]]) -> Iterator[None]:
        """Around a transaction that inserts ``rows``: their value files (written before it,
        outside the lock) are removed if it is refused or fails, since nothing references
        them then."""
        written = False
        try:
            yield
            written = True
        finally:
            if not written:
                for _, columns in rows:
                    if columns[2] is not None:
                        self._cache._disk.remove(columns[2])

    def append_step(self, run_id: str, entry: StepEntry, *, record_json: str | None = None,
                    token: str | None = None, blobs: dict[str, str] | None = None) -> None:
        if self.read_only:
            raise read_only_error(self.location, "be written")
        cache = self._cache
        key = step_key(run_id, entry.position)
        rows = [(key, self._columns(key, entry.to_json()))]
        for digest, blob in (blobs or {}).items():
            blob_key = f"blob:{run_id}:{digest}"
            rows.append((blob_key, self._columns(blob_key, blob)))
        # One SQLite transaction (BEGIN IMMEDIATE; retried while another writer holds the
        # lock, as diskcache's transact(retry=True)): the lease check, the entry written
        # only where its position is free (both in one statement while the lease is the one
        # this executor last wrote under), its blobs unless present, the record.
        with self._value_files_of(rows), cache._transact(retry=True) as (sql, cleanup):
            now = time.time()
            if not self._insert_under_held_lease(sql, run_id, token, key, rows[0][1], now):
                self._fenced(run_id, token, sql)
                if not self._insert_if_absent(sql, key, rows[0][1], now):
                    raise RunLeased(run_id, self._read_json(f"lease:{run_id}") or {},
                                    advice=position_taken_advice(entry.position))
            for blob_key, columns in rows[1:]:
                if not self._insert_if_absent(sql, blob_key, columns, now):
                    cleanup(columns[2])  # the run has this blob: its new file goes
            if record_json is not None:
                self._update_record(sql, run_id, record_json, now)

    def _update_record(self, sql: Callable, run_id: str, text: str, now: float) -> None:
        """Inside a transaction: write the run record ``text``. One UPDATE where the stored
        record and ``text`` are inline (always but for a record over 32 KiB) and its tag
        (status) is the same, with the columns diskcache's ``set`` writes; ``set`` itself
        otherwise."""
        key, tag = f"run:{run_id}", record_tag(text)
        if len(text) < self._cache._disk.min_file_size and sql(
                UPDATE_INLINE, (now, now, MODE_RAW, text, key, tag)).rowcount == 1:
            return
        self._cache.set(key, text, tag=tag, retry=True)

    def rewrite_steps(self, run_id: str, from_position: int, entries: list[StepEntry], *,
                      record_json: str | None = None, token: str | None = None,
                      drop_blobs: Iterable[str] = (), drop_requests: bool = False) -> int:
        if self.read_only:
            raise read_only_error(self.location, "be written")
        cache = self._cache
        rows = [(key, self._columns(key, entry.to_json())) for key, entry in
                ((step_key(run_id, from_position + i), e) for i, e in enumerate(entries))]
        with self._value_files_of(rows), cache._transact(retry=True) as (sql, cleanup):
            self._fenced(run_id, token, sql)
            deleted = self._delete_rows(sql, cleanup,
                                        self._step_keys(sql, run_id, from_position))
            self._delete_rows(sql, cleanup, [
                *(f"blob:{run_id}:{digest}" for digest in drop_blobs),
                *((*(request_key(kind, run_id) for kind in REQUEST_KINDS),
                   *self._decision_keys(sql, run_id)) if drop_requests else ())])
            now = time.time()
            for key, columns in rows:
                self._insert_if_absent(sql, key, columns, now)
            if record_json is not None:
                self._update_record(sql, run_id, record_json, now)
        return deleted

    # -- blobs ----------------------------------------------------------------------------

    def get_blob(self, run_id: str, digest: str) -> str | None:
        return self._get(f"blob:{run_id}:{digest}")


def _parse_entry(key: str, run_id: str, position: int, text: str) -> StepEntry:
    try:
        return StepEntry.from_json(position, text)
    except (ValueError, TypeError, RecursionError) as exc:
        raise CorruptEntry(key, str(exc) or type(exc).__name__, run_id=run_id,
                           position=position) from None


def _parse_record(key: str, text: str, run_id: str) -> RunRecord:
    try:
        return RunRecord.from_json(text)
    except (ValueError, TypeError, RecursionError) as exc:
        raise CorruptEntry(key, str(exc) or type(exc).__name__, run_id=run_id) from None


def _parse_batch(key: str, text: str) -> BatchRecord:
    try:
        return BatchRecord.from_json(text)
    except (ValueError, TypeError, RecursionError) as exc:
        raise CorruptEntry(key, str(exc) or type(exc).__name__) from None
