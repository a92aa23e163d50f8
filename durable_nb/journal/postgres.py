"""The shared journal: PostgreSQL through psycopg 3 and a ``psycopg_pool`` connection pool.

Chosen by a URL wherever a journal directory is accepted: ``postgresql://USER:PASSWORD@HOST:PORT/DB``
(or ``postgres://``), with ``?schema=NAME`` for the schema (default ``durable_nb``); every
other query parameter goes to libpq. ``pip install 'durable-nb[postgres]'``.

The journal lives in a schema of its own::

    migrations (version, name, applied_at)   schema migrations applied, in order
    meta (key, value)                        'format': the journal format version, as on disk
    runs (run_id, created_at, record, status)  the run records (JSON text), listed by created_at;
                                             status (set from the record) for filtered listings
    steps (run_id, position, entry)          the entries (JSON text), primary key (run_id, position)
    blobs (run_id, digest, value)            inputs stored once per run
    leases (run_id, token, holder, heartbeat_at)    the executor; heartbeat in the database's clock
    requests (run_id, kind, value)           decisions and cancels for the executor
    keyed_values (scope, space, key, value)  keyed values; a run's scope is its id (LangGraph)

**Same guarantees as the disk journal.** A step is one transaction (one statement: the
schema's ``append_step`` function) that checks the lease token with the lease row locked
``FOR SHARE``, inserts the entry only where its position is free (``ON CONFLICT DO
NOTHING``), adds the blobs and writes the record. A fenced or taken position writes
nothing and raises :class:`~durable_nb.errors.RunLeased`, except when the position holds
this very entry, byte for byte: a retry after a reply lost with the connection (the write
was committed) counts as done. A failed query raises :class:`DatabaseError` (an
``OSError``, as a failed disk write), :class:`JournalUnavailable` when the server cannot be
reached. Values are JSON text (``text`` columns, byte for byte what
:meth:`StepEntry.to_json` produced): nothing is ever unpickled.

**A restart of the server is ridden over.** Connections are checked when taken from the pool
(a connection the server ended while idle is replaced, and the pool's other idle ones are
checked at once). A call whose connection is lost (the server restarting or shutting down,
a dropped network connection, no connection to be had) is made again, whole, on a new
connection, for up to ``retry_for`` seconds (30 by default); then it raises
:class:`JournalUnavailable` saying the server could not be reached for that long. Every
call is safe to make twice: inserts are keyed and ``ON CONFLICT DO NOTHING`` (an entry
found at its position byte for byte is this call's own, committed before its reply was
lost), updates set whole values, deletes are by key, the lease is taken again by the token
that holds it, and every write of an executing run checks its lease token in the same
transaction. Errors that are not about the connection (a lock timeout, a full disk on the
server, a constraint) are raised at once.

A rewind (:meth:`PostgresJournal.rewrite_steps`), a delete and the publishing of a copy are
one transaction each; with a token, the first thing they do is read the lease row ``FOR
SHARE`` and stop if the token does not hold it.

**Heartbeats in the database's clock.** ``leases.heartbeat_at`` is the server's ``now()``
when the lease was taken or renewed; the holder dicts this journal hands to
:func:`~durable_nb.execution.lease.holder_alive` carry ``heartbeat_age`` (seconds, by the server's
clock), so hosts with skewed clocks agree on which holder is stale.

**Requests wake waiting runs.** :meth:`PostgresJournal.put_request` sends a ``NOTIFY`` on the
schema's channel (``durable_nb.SCHEMA``) in the request's own transaction, so it is heard only
once the request is there to read. :meth:`PostgresJournal.wait_for_request` waits for it on
one ``LISTEN`` connection per journal and process, opened while something waits (a run
waiting for an approval, a notebook's watcher) and closed a few seconds after: a decision or
cancel given on any machine reaches the waiting run at once, without polling. A notification
can be lost only while that connection is down (it wakes every waiter when it is back), and
waiters read once more every ``max(poll_interval, 5 s)`` in any case (also what happens
behind a pooler that drops ``LISTEN``, such as PgBouncer in transaction mode).

**Migrations.** :data:`MIGRATIONS` is an ordered list; opening the journal applies those not
yet in ``migrations``, all in one transaction under a transaction-level advisory lock
(processes opening a fresh database at once wait for each other; the second finds nothing
to do). A schema migrated by a newer durable_nb, or a newer format version, is refused.

**Grants.** The role needs ``CREATE`` on the database (to create the schema once) or, on a
schema created for it, ``USAGE, CREATE`` on it; then ``SELECT, INSERT, UPDATE, DELETE`` on its
tables. Read-only use needs ``USAGE`` and ``SELECT``. Anyone who can write the schema can
change what replay returns, as anyone who can write a journal directory can.

**Passwords.** The password (in the URL, or ``password=`` in its query) is given to libpq
only: :attr:`location` is the URL without it, and it is cut out of every error message.

**Where each part is.** This module holds the journal's runs, batches, steps and blobs;
:mod:`.pg_connection` the URL, the pool, errors and retries; :mod:`.pg_schema` the migrations,
version checks and statements; :mod:`.pg_coordination` leases, requests and a run's keyed
records (deliveries, history events); :mod:`.pg_listen` the ``LISTEN`` connection;
:mod:`.pg_values` keyed values.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ..errors import CorruptEntry, JournalError, RunLeased
from .base import (
    FENCED_ADVICE,
    Journal,
    StatusFilter,
    check_setting,
    position_taken_advice,
    select_runs,
    wanted_statuses,
)
from .pg_connection import (
    DEFAULT_SCHEMA,
    RETRY_FOR,
    PgConnections,
    PostgresUrl,
    ScrubSecrets,
    is_postgres_url,
    location_of,
    retried,
)
from .pg_coordination import PgRunCoordination
from .pg_values import PgKeyedValues
from .pg_listen import Listener, notify_channel
from .pg_schema import BATCH, FORMAT_VERSION, MIGRATIONS, PgSchema, quoted
from .records import BatchRecord, RunRecord, Status, StepEntry

__all__ = ["DEFAULT_SCHEMA", "FORMAT_VERSION", "MIGRATIONS", "PostgresJournal",
           "is_postgres_url", "location_of"]


def _created_at(record: RunRecord) -> float:
    try:
        return float(record.created_at or 0.0)
    except (TypeError, ValueError):
        return 0.0


#: What deleting a run deletes, in this order: the lease row first, as appends lock it first
#: (no deadlock with a late append); ``scope``: the keyed values that are the run's.
_RUN_ROWS = ("leases", "requests", "deliveries", "steps", "blobs", "scope", "runs")


class PostgresJournal(PgConnections, PgSchema, PgRunCoordination, PgKeyedValues, Journal):
    """The journal in a PostgreSQL schema, shared by every process that reaches the database.

    ``read_only=True``: nothing is created or written (the sessions are read-only too); a
    missing journal is an error and write methods raise. ``pool_size``: connections at most
    (one is used per call, for the call's duration), plus one ``LISTEN`` connection while a
    run waits for a request. ``retry_for``: how long a call whose connection is lost is
    made again (see the module docstring). Safe to share between threads.
    """

    notifies = True
    reclaimed_space_note = ("PostgreSQL keeps the space freed inside its tables, and reuses "
                            "it for new runs")

    def __init__(self, url: str, *, read_only: bool = False, pool_size: int = 8,
                 connect_timeout: float = 10.0, retry_for: float = RETRY_FOR) -> None:
        try:
            import psycopg
            import psycopg_pool
        except ImportError as exc:
            raise JournalError(
                f"a PostgreSQL journal needs psycopg 3 and psycopg_pool ({exc}): "
                f"pip install 'durable-nb[postgres]'") from None
        self._psycopg = psycopg
        self._pool_class = psycopg_pool.ConnectionPool
        self._url = PostgresUrl(url)
        ScrubSecrets.secrets.update(self._url.secrets)
        self.location = self._url.location
        self.schema = self._url.schema
        self.read_only = read_only
        self._pool_size = pool_size
        self._connect_timeout = connect_timeout
        self.retry_for = retry_for
        self._local = threading.local()  # .retrying: a call is being made again
        self._down = False  # the last call gave up: the server is unreachable
        self._kwargs: dict[str, Any] = {"autocommit": True, "client_encoding": "utf8",
                                        "application_name": "durable_nb"}
        if "connect_timeout" not in self._url.conninfo:
            self._kwargs["connect_timeout"] = max(1, int(connect_timeout))
        self._sql = self._statements(quoted(self.schema))
        self._channel = notify_channel(self.schema)
        self._pid = os.getpid()
        self._pool_lock = threading.Lock()
        self._pool: Any = None
        self._listener: Listener | None = None
        #: Database role -> hub user, as the hub's service named them (empty: no hub).
        self._people: dict[str, str] = {}
        with self._errors("open"):
            with psycopg.connect(self._url.conninfo, **self._kwargs) as conn:
                self._configure(conn)
                self._open_schema(conn)
                self._people = self._hub_people(conn)
        self._pool = self._new_pool()

    # -- runs -------------------------------------------------------------------------------

    @retried
    def create_run(self, record: RunRecord) -> bool:
        self._writable("create a run")
        with self._conn("creating a run") as conn:
            cursor = conn.execute(self._sql["create_run"],
                                  (record.run_id, _created_at(record), record.to_json()))
            return cursor.rowcount == 1

    @retried
    def find_run(self, run_id: str) -> RunRecord | None:
        with self._conn("reading a run") as conn:
            row = conn.execute(self._sql["find_run"], (run_id,)).fetchone()
        if row is None:
            return None
        return self._started_as_recorded(_parse_record(f"run:{run_id}", row[0], run_id), row[1])

    @retried
    def put_run(self, record: RunRecord, *, token: str | None = None) -> None:
        self._writable("write a run record")
        record.updated_at = time.time()
        with self._conn("writing a run record") as conn:
            fenced = conn.execute(self._sql["put_run"], (record.run_id, _created_at(record),
                                                         record.to_json(), token)).fetchone()[0]
        if fenced:
            raise RunLeased(record.run_id, self.lease(record.run_id) or {}, advice=FENCED_ADVICE)

    def list_runs(self, prefix: str = "", *, status: StatusFilter = None,
                  limit: int | None = None, newest_first: bool = False) -> list[RunRecord]:
        return self._listing(False, prefix, status, limit, newest_first)

    def list_runs_counted(self, prefix: str = "", *, status: StatusFilter = None,
                          limit: int | None = None,
                          newest_first: bool = False) -> list[RunRecord]:
        """:meth:`list_runs` with each ``step_count`` from the steps table, in one query."""
        return self._listing(True, prefix, status, limit, newest_first)

    @retried
    def count_runs(self, prefix: str = "") -> dict[Status, int]:
        """All runs: the ``run_counts`` row its triggers keep; under a prefix, one query on
        the ``runs_by_status`` index."""
        with self._conn("counting runs") as conn:
            rows = conn.execute(self._sql["count_runs"], _id_range(prefix)).fetchall() \
                if prefix else conn.execute(self._sql["count_all_runs"]).fetchall()
        return {Status(name): count for name, count in rows if name in _STATUS_NAMES}

    @retried
    def _listing(self, counted: bool, prefix: str, status: StatusFilter, limit: int | None,
                 newest_first: bool) -> list[RunRecord]:
        """One query: the status filter and the limit on the ``runs_by_status`` and
        ``runs_by_creation`` indexes (records whose status column is NULL, not JSON, are
        read too and reported as damaged)."""
        wanted = wanted_statuses(status)
        params: list[Any] = list(_id_range(prefix))
        query = self._sql["list_runs_counted" if counted else "list_runs"]
        if wanted is not None:
            query += " AND (r.status = ANY(%s) OR r.status IS NULL)"
            params.append([s.value for s in wanted])
        order = " DESC" if newest_first else ""
        query += f" ORDER BY r.created_at{order}, r.run_id{order}"
        if limit is not None:
            query += " LIMIT %s"
            params.append(max(int(limit), 0))
        with self._conn("listing runs") as conn:
            rows = conn.execute(query, params).fetchall()
        records = []
        for row in rows:
            record = self._started_as_recorded(_parse_record(f"run:{row[0]}", row[1], row[0]),
                                               row[2])
            if counted:
                record.step_count = 0 if row[3] is None else row[3] + 1
            records.append(record)
        # Linear (already in this order); drops rows whose status column was NULL.
        return select_runs(records, wanted, None, newest_first)

    # -- who decides (durable_nb.hub) ---------------------------------------------------------

    @retried
    def decision_authority(self, run_id: str | None = None
                           ) -> tuple[str | None, bool, tuple[str | None, str | None]]:
        """``(decider, is_decider, (created_by, written_by))``: the role an administrator
        named to alone write decisions here (None: any role may, as without a hub), whether
        this journal's login role is a member of it, and the login roles that created run
        ``run_id`` and last wrote its record (as the database recorded them, whatever the
        record says)."""
        with self._conn("reading who decides") as conn:
            row = conn.execute(
                f"SELECT d.role, d.role IS NULL OR pg_has_role(session_user, d.role, "
                f"'MEMBER') FROM (SELECT (SELECT value::json ->> 'role' FROM "
                f"{quoted(self.schema)}.meta WHERE key = 'decider') AS role) AS d").fetchone()
            writers = None
            if run_id is not None:
                writers = conn.execute(f"SELECT created_by, written_by FROM "
                                       f"{quoted(self.schema)}.runs WHERE run_id = %s",
                                       (run_id,)).fetchone()
        return row[0], bool(row[1]), tuple(writers) if writers else (None, None)

    @retried
    def writers_of(self, run_ids: Iterable[str]) -> dict[str, tuple[str | None, str | None]]:
        """One query for all the runs (see :meth:`Journal.writers_of`)."""
        wanted = sorted(set(run_ids))
        with self._conn("reading who wrote runs") as conn:
            rows = conn.execute(f"SELECT run_id, created_by, written_by FROM "
                                f"{quoted(self.schema)}.runs WHERE run_id = ANY(%s)",
                                (wanted,)).fetchall()
        found = {run_id: (created, written) for run_id, created, written in rows}
        return {run_id: found.get(run_id, (None, None)) for run_id in wanted}

    def become_decider(self, user_roles: Iterable[str],
                       people: Mapping[str, str] | None = None) -> None:
        """Make this journal's login role (the hub service's, owning the schema) the one
        that alone writes decisions, and let ``user_roles`` (the hub users' roles) park,
        read, resume and take decisions: read and write the run tables, only read ``meta``,
        ``migrations`` (so that none can name another decider) and ``run_counts`` (kept by
        its triggers). ``people`` maps each
        role to its hub user: every reader then shows the hub user whose role created a run
        as its starter, whatever the record says. Idempotent; run by the service at its
        start."""
        self._writable("name the decider")
        s = quoted(self.schema)
        tables = ", ".join(f"{s}.{t}" for t in ("runs", "steps", "blobs", "leases", "requests",
                                                 "deliveries", "batches", "keyed_values"))
        with self._conn("naming the decider") as conn, conn.transaction():
            for role in user_roles:
                who = self._psycopg.sql.Identifier(role).as_string(conn)
                conn.execute(f"GRANT USAGE ON SCHEMA {s} TO {who}")
                conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {tables} TO {who}")
                conn.execute(f"GRANT SELECT ON {s}.meta, {s}.migrations, {s}.run_counts "
                             f"TO {who}")
            conn.execute(f"INSERT INTO {s}.meta (key, value) VALUES ('decider', "
                         f"json_build_object('role', session_user, 'people', %s::json)::text) "
                         f"ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                         (json.dumps(dict(people or {})),))
        self._people = dict(people or {})

    def _hub_people(self, conn: Any) -> dict[str, str]:
        """The hub users of the database roles, as the hub's service named them
        (:meth:`become_decider`); empty without a hub. Read when the journal opens."""
        row = conn.execute(f"SELECT value::json -> 'people' FROM {quoted(self.schema)}.meta "
                           f"WHERE key = 'decider'").fetchone()
        people = row[0] if row else None
        return {str(k): str(v) for k, v in people.items()} if isinstance(people, dict) else {}

    def _started_as_recorded(self, record: RunRecord, created_by: str | None) -> RunRecord:
        """``record`` with its starter (``started_by``, and its own pending request's) the
        hub user whose database role created the run, on a hub whose service named the
        roles' users: what the starter's kernel wrote there is hers to forge, the database's
        role is not."""
        person = self._people.get(created_by) if created_by else None
        if person is None:
            return record
        record.started_by = person
        pending = record.pending_approval
        if isinstance(pending, dict) and "started_by" in pending \
                and pending.get("run_id", record.run_id) == record.run_id:
            pending["started_by"] = person
        return record

    # -- batches ----------------------------------------------------------------------------

    @retried
    def put_batch(self, record: BatchRecord) -> None:
        self._writable("write a batch record")
        record.updated_at = time.time()
        with self._conn("writing a batch record") as conn:
            conn.execute(self._sql["put_batch"],
                         (record.batch_id, record.created_at or time.time(), record.to_json()))

    @retried
    def find_batch(self, batch_id: str) -> BatchRecord | None:
        with self._conn("reading a batch") as conn:
            row = conn.execute(self._sql["find_batch"], (batch_id,)).fetchone()
        return None if row is None else _parse_batch(batch_id, row[0])

    @retried
    def list_batches(self) -> list[BatchRecord]:
        with self._conn("listing batches") as conn:
            rows = conn.execute(self._sql["list_batches"]).fetchall()
        return [_parse_batch(batch_id, text) for batch_id, text in rows]

    def delete_run(self, run_id: str, *, token: str | None = None,
                   children: Iterable[str] = ()) -> None:
        self._writable("delete a run")
        self.get_run(run_id)
        with self._conn("deleting a run") as conn:
            with conn.transaction():
                fenced = not self._holds(conn, run_id, token)
                for gone in () if fenced else (*children, run_id):
                    for table in _RUN_ROWS:
                        conn.execute(self._sql[f"delete_{table}"], (gone,))
        if fenced:
            raise RunLeased(run_id, self.lease(run_id) or {}, advice=FENCED_ADVICE)

    def delete_batch(self, batch_id: str, items: dict[str, str | None],
                     children: Iterable[str] = ()) -> None:
        self._writable("delete a batch")
        fenced = None
        with self._conn("deleting a batch") as conn:
            with conn.transaction():
                fenced = next((item for item, token in items.items()
                               if not self._holds(conn, item, token)), None)
                for gone in () if fenced is not None else (*children, *items):
                    for table in _RUN_ROWS:
                        conn.execute(self._sql[f"delete_{table}"], (gone,))
                if fenced is None:
                    conn.execute(self._sql["delete_batch"], (batch_id,))
        if fenced is not None:
            raise RunLeased(fenced, self.lease(fenced) or {}, advice=FENCED_ADVICE)

    # -- the journal's own settings and history (rows of ``meta``) ------------------------------

    @retried
    def setting(self, name: str) -> dict | None:
        check_setting(name)
        with self._conn("reading a setting") as conn:
            row = conn.execute(self._sql["get_meta"], (f"setting/{name}",)).fetchone()
        return None if row is None else json.loads(row[0])

    @retried
    def put_setting(self, name: str, value: dict | None) -> None:
        check_setting(name)
        self._writable("write a setting")
        with self._conn("writing a setting") as conn:
            if value is None:
                conn.execute(self._sql["delete_meta"], (f"setting/{name}",))
            else:
                conn.execute(self._sql["put_meta"], (f"setting/{name}", json.dumps(value)))

    @retried
    def add_journal_event(self, event: dict) -> None:
        self._writable("write the journal's history")
        key = f"event/{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
        with self._conn("writing the journal's history") as conn:
            conn.execute(self._sql["add_meta"], (key, json.dumps(event)))

    @retried
    def journal_events(self) -> list[dict]:
        with self._conn("reading the journal's history") as conn:
            rows = conn.execute(self._sql["journal_events"]).fetchall()
        return [json.loads(text) for text, in rows]

    @retried
    def size_on_disk(self) -> int:
        """The schema's tables, with their indexes and TOAST (``pg_total_relation_size``)."""
        with self._conn("measuring the journal") as conn:
            return int(conn.execute(self._sql["size_on_disk"], (self.schema,)).fetchone()[0])

    def reclaim_space(self) -> None:
        """``VACUUM`` of the journal's tables: the deleted rows' space (and their TOAST's)
        is free for new rows, and empty pages at a table's end go back to the system. The
        file of a table keeps pages freed in its middle (``VACUUM FULL`` or pg_repack
        would return them, taking the table's lock). Only the tables' owner can."""
        self._writable("reclaim space")
        with self._conn("vacuuming the journal") as conn:
            conn.execute(self._sql["vacuum"])

    def _holds(self, conn: Any, run_id: str, token: str | None) -> bool:
        """Inside a transaction: whether ``token`` (None: anyone) holds the run's lease, the
        lease row locked until the end of the transaction (a takeover waits for it)."""
        if token is None:
            return True
        row = conn.execute(self._sql["lease_for_share"], (run_id,)).fetchone()
        return row is not None and row[0] == token

    def publish_runs(self, staged: list[tuple[str, RunRecord]]) -> bool:
        self._writable("publish a copy")
        published = True
        with self._conn("publishing a copy") as conn:
            with conn.transaction():
                for staging, record in staged:
                    if conn.execute(self._sql["create_run"], (
                            record.run_id, _created_at(record), record.to_json())).rowcount != 1:
                        published = False
                        raise self._psycopg.Rollback()
                    conn.execute(self._sql["delete_runs"], (staging,))
                    for table in ("steps", "blobs"):
                        conn.execute(self._sql[f"rename_{table}"], (record.run_id, staging))
                    # The copy's values replace those left under its id by no run.
                    conn.execute(self._sql["delete_scope"], (record.run_id,))
                    conn.execute(self._sql["rename_scope"], (record.run_id, staging))
        return published

    # -- steps ------------------------------------------------------------------------------

    @retried
    def get_step(self, run_id: str, position: int) -> StepEntry | None:
        with self._conn("reading a step") as conn:
            row = conn.execute(self._sql["get_step"], (run_id, position)).fetchone()
        return None if row is None else _parse_entry(run_id, position, row[0])

    @retried
    def has_step(self, run_id: str, position: int) -> bool:
        with self._conn("reading a step") as conn:
            return conn.execute(self._sql["has_step"], (run_id, position)).fetchone() is not None

    def steps(self, run_id: str, start: int = 0) -> Iterator[StepEntry]:
        """The run's entries in position order, fetched a batch per query; stops at the
        first missing position, as the interface's own version does."""
        position = start
        while True:
            rows = self._step_rows(run_id, position)
            for stored, text in rows:
                if stored != position:
                    return
                yield _parse_entry(run_id, position, text)
                position += 1
            if len(rows) < BATCH:
                return

    @retried
    def _step_rows(self, run_id: str, start: int) -> list[tuple[int, str]]:
        with self._conn("reading steps") as conn:
            return conn.execute(self._sql["steps"], (run_id, start)).fetchall()

    @retried
    def count_steps(self, run_id: str, hint: int = 0) -> int:
        """One query: entries are a contiguous prefix, so the count is the last position + 1."""
        with self._conn("counting steps") as conn:
            last = conn.execute(self._sql["count_steps"], (run_id,)).fetchone()[0]
        return 0 if last is None else last + 1

    @retried
    def append_step(self, run_id: str, entry: StepEntry, *, record_json: str | None = None,
                    token: str | None = None, blobs: dict[str, str] | None = None) -> None:
        self._writable("append a step")
        digests = values = None
        if blobs:
            digests, values = list(blobs), list(blobs.values())
        text = entry.to_json()
        with self._conn("appending a step") as conn:
            outcome = conn.execute(self._sql["append_step"], (
                run_id, entry.position, text, record_json, token, digests, values,
            )).fetchone()[0]
            if outcome == 2:
                stored = conn.execute(self._sql["get_step"], (run_id, entry.position)).fetchone()
                if stored is not None and stored[0] == text:
                    # This very entry, written by an earlier try whose reply was lost (the
                    # connection dropped after the commit): the write is done.
                    return
        if outcome == 1:
            raise RunLeased(run_id, self.lease(run_id) or {}, advice=FENCED_ADVICE)
        if outcome == 2:
            raise RunLeased(run_id, self.lease(run_id) or {},
                            advice=position_taken_advice(entry.position))

    @retried
    def rewrite_steps(self, run_id: str, from_position: int, entries: list[StepEntry], *,
                      record_json: str | None = None, token: str | None = None,
                      drop_blobs: Iterable[str] = (), drop_requests: bool = False) -> int:
        self._writable("rewrite a run's steps")
        deleted = 0
        with self._conn("rewriting a run's steps") as conn:
            with conn.transaction():
                fenced = not self._holds(conn, run_id, token)
                if not fenced:
                    deleted = conn.execute(self._sql["truncate"], (run_id, from_position)).rowcount
                    if entries:
                        with conn.cursor() as cursor:
                            cursor.executemany(self._sql["insert_step"], [
                                (run_id, from_position + i, e.to_json())
                                for i, e in enumerate(entries)])
                    drop = list(drop_blobs)
                    if drop:
                        conn.execute(self._sql["drop_blobs"], (run_id, drop))
                    if drop_requests:
                        conn.execute(self._sql["delete_requests_rewound"], (run_id,))
                    if record_json is not None:
                        conn.execute(self._sql["update_record"], (record_json, run_id))
        if fenced:
            raise RunLeased(run_id, self.lease(run_id) or {}, advice=FENCED_ADVICE)
        return deleted

    # -- blobs ------------------------------------------------------------------------------

    @retried
    def get_blob(self, run_id: str, digest: str) -> str | None:
        with self._conn("reading a blob") as conn:
            row = conn.execute(self._sql["get_blob"], (run_id, digest)).fetchone()
        return None if row is None else row[0]


_STATUS_NAMES = frozenset(s.value for s in Status)


def _id_range(prefix: str) -> tuple[str, str]:
    """Bounds of the ids that start with ``prefix``: [prefix, its successor) in byte order."""
    return (prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)) if prefix else ("", "\U0010ffff")


def _parse_batch(batch_id: str, text: str) -> BatchRecord:
    try:
        return BatchRecord.from_json(text)
    except (ValueError, TypeError, RecursionError) as exc:
        raise CorruptEntry(f"batch:{batch_id}", str(exc) or type(exc).__name__) from None


def _parse_record(key: str, text: str, run_id: str) -> RunRecord:
    try:
        return RunRecord.from_json(text)
    except (ValueError, TypeError, RecursionError) as exc:
        raise CorruptEntry(key, str(exc) or type(exc).__name__, run_id=run_id) from None


def _parse_entry(run_id: str, position: int, text: str) -> StepEntry:
    try:
        return StepEntry.from_json(position, text)
    except (ValueError, TypeError, RecursionError) as exc:
        raise CorruptEntry(f"step:{run_id}:{position}", str(exc) or type(exc).__name__,
                           run_id=run_id, position=position) from None

