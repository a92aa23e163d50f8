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
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

from ..errors import (
    CorruptEntry,
    DatabaseError,
    IncompatibleJournal,
    JournalError,
    JournalUnavailable,
    RunLeased,
)
from .base import (
    FENCED_ADVICE,
    Journal,
    StatusFilter,
    check_request_kind,
    delivery_text,
    position_taken_advice,
    read_only_error,
    select_runs,
    wanted_statuses,
)
from .records import BatchRecord, RunRecord, Status, StepEntry

__all__ = ["DEFAULT_SCHEMA", "MIGRATIONS", "PostgresJournal",
           "is_postgres_url", "location_of"]

DEFAULT_SCHEMA = "durable_nb"
_SCHEMES = ("postgresql", "postgres")
_SECRET_PARAMS = ("password", "sslpassword")
_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_BATCH = 500  # entries fetched per query when a run's steps are read in order
#: Waiters read their request again at least this often, even without a notification.
_RECHECK = 5.0
#: The LISTEN connection is closed once nobody waited for this long.
_LISTEN_IDLE = 10.0
#: How long a call whose connection was lost is tried again by default (seconds).
RETRY_FOR = 30.0
#: While a call is tried again: the longest wait for a connection from the pool, and for
#: the pool's own reconnection, before the pool is asked again (it grows on being asked).
_RETRY_CHECKOUT = 1.0
#: SQLSTATEs of a server that ended the session or is not accepting connections yet: class 08
#: (connection exception) and admin, crash shutdown and "the database system is starting up".
_SHUTDOWN_STATES = ("57P01", "57P02", "57P03")

_T = TypeVar("_T")


def is_postgres_url(location: Any) -> bool:
    """Whether ``location`` is a ``postgresql://`` or ``postgres://`` URL."""
    return isinstance(location, str) and location.split("://", 1)[0].lower() in _SCHEMES \
        and "://" in location


class _Url:
    """A journal URL taken apart: what libpq gets, the schema, and what may be shown."""

    def __init__(self, url: str) -> None:
        if not is_postgres_url(url):
            raise ValueError("a PostgreSQL journal URL starts with postgresql:// or postgres://")
        self.url = url
        parts = urlsplit(url)
        secrets: list[str] = []
        userinfo, at, hostport = parts.netloc.rpartition("@")
        user, colon, password = userinfo.partition(":")
        if colon and password:
            secrets += [password, unquote(password)]
        schema = DEFAULT_SCHEMA
        # The query's pieces are passed on as they were written (libpq decodes them itself):
        # ``schema`` is ours and removed; password pieces are not shown.
        libpq, shown = [], []
        for piece in parts.query.split("&") if parts.query else []:
            raw_key, _, raw_value = piece.partition("=")
            key, value = unquote(raw_key), unquote(raw_value)
            if key == "schema":
                schema = value
                continue
            libpq.append(piece)
            if key in _SECRET_PARAMS:
                secrets += [raw_value, value]
            else:
                shown.append(piece)
        if not _SCHEMA_NAME.fullmatch(schema):
            raise ValueError(f"invalid schema name {schema!r} in the journal URL: use letters, "
                             f"digits and _ (at most 63), not starting with a digit")
        self.schema = schema
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)
        self.conninfo = _join(parts.scheme, parts.netloc, parts.path, libpq)
        if schema != DEFAULT_SCHEMA:
            shown.append(f"schema={schema}")
        netloc = f"{user}{at}{hostport}" if at else hostport
        self.location = _join(parts.scheme, netloc, parts.path, shown)

    def scrub(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text


def _join(scheme: str, netloc: str, path: str, query: list[str]) -> str:
    # (urlunsplit would drop the "//" of a URL without a host, which libpq needs)
    return f"{scheme}://{netloc}{path}" + (f"?{'&'.join(query)}" if query else "")


def location_of(url: str) -> str:
    """The URL as durable_nb shows it: without its password."""
    return _Url(url).location


def _q(schema: str) -> str:
    return f'"{schema}"'


def _migrations(s: str) -> list[tuple[str, list[str]]]:
    """The schema's migrations, in order: (name, statements). Append only; never edit one
    that was released (a journal records which it applied by number)."""
    return [
        ("tables", [
            f"CREATE TABLE {s}.meta (key text PRIMARY KEY, value text NOT NULL)",
            f"""INSERT INTO {s}.meta (key, value) VALUES ('format', '{{"version": 2}}')""",
            f"""CREATE TABLE {s}.runs (run_id text COLLATE "C" PRIMARY KEY,
                created_at double precision NOT NULL, record text NOT NULL)""",
            f"CREATE INDEX runs_by_creation ON {s}.runs (created_at, run_id)",
            f"""CREATE TABLE {s}.steps (run_id text COLLATE "C" NOT NULL,
                position integer NOT NULL, entry text NOT NULL,
                PRIMARY KEY (run_id, position))""",
            f"""CREATE TABLE {s}.blobs (run_id text COLLATE "C" NOT NULL, digest text NOT NULL,
                value text NOT NULL, PRIMARY KEY (run_id, digest))""",
            f"""CREATE TABLE {s}.leases (run_id text COLLATE "C" PRIMARY KEY,
                token text NOT NULL, holder text NOT NULL,
                heartbeat_at timestamptz NOT NULL DEFAULT now())""",
            f"""CREATE TABLE {s}.requests (run_id text COLLATE "C" NOT NULL, kind text NOT NULL,
                value text NOT NULL, PRIMARY KEY (run_id, kind))""",
        ]),
        ("append_step and put_run in one statement each", [
            # 0: written; 1: fenced (the lease is not held by p_token); 2: position taken.
            f"""CREATE FUNCTION {s}.append_step(p_run text, p_position integer, p_entry text,
                    p_record text, p_token text, p_digests text[], p_blobs text[])
                RETURNS integer LANGUAGE plpgsql AS $fn$
                DECLARE
                    held text;
                    created double precision;
                BEGIN
                    IF p_token IS NOT NULL THEN
                        SELECT token INTO held FROM {s}.leases WHERE run_id = p_run FOR SHARE;
                        IF held IS DISTINCT FROM p_token THEN
                            RETURN 1;
                        END IF;
                    END IF;
                    INSERT INTO {s}.steps (run_id, position, entry)
                        VALUES (p_run, p_position, p_entry) ON CONFLICT DO NOTHING;
                    IF NOT FOUND THEN
                        RETURN 2;
                    END IF;
                    IF p_digests IS NOT NULL THEN
                        INSERT INTO {s}.blobs (run_id, digest, value)
                            SELECT p_run, b.digest, b.value
                            FROM unnest(p_digests, p_blobs) AS b(digest, value)
                            ON CONFLICT DO NOTHING;
                    END IF;
                    IF p_record IS NOT NULL THEN
                        UPDATE {s}.runs SET record = p_record WHERE run_id = p_run;
                        IF NOT FOUND THEN
                            BEGIN
                                created := (p_record::json ->> 'created_at')::double precision;
                            EXCEPTION WHEN others THEN
                                created := 0;
                            END;
                            INSERT INTO {s}.runs (run_id, created_at, record)
                                VALUES (p_run, coalesce(created, 0), p_record)
                                ON CONFLICT (run_id) DO UPDATE SET record = EXCLUDED.record;
                        END IF;
                    END IF;
                    RETURN 0;
                END
                $fn$""",
            # 0: written; 1: fenced.
            f"""CREATE FUNCTION {s}.put_run(p_run text, p_created double precision,
                    p_record text, p_token text)
                RETURNS integer LANGUAGE plpgsql AS $fn$
                DECLARE
                    held text;
                BEGIN
                    IF p_token IS NOT NULL THEN
                        SELECT token INTO held FROM {s}.leases WHERE run_id = p_run FOR SHARE;
                        IF held IS DISTINCT FROM p_token THEN
                            RETURN 1;
                        END IF;
                    END IF;
                    INSERT INTO {s}.runs (run_id, created_at, record)
                        VALUES (p_run, p_created, p_record)
                        ON CONFLICT (run_id) DO UPDATE
                        SET created_at = EXCLUDED.created_at, record = EXCLUDED.record;
                    RETURN 0;
                END
                $fn$""",
        ]),
        ("batches", [
            f"""CREATE TABLE {s}.batches (batch_id text COLLATE "C" PRIMARY KEY,
                created_at double precision NOT NULL, record text NOT NULL)""",
        ]),
        ("runs listed by status", [
            # The record's status in a column of its own, set by a trigger from the record
            # text whoever writes it (create_run, put_run, append_step), so that listings
            # filter and page on an index; a record that is not JSON gets NULL (listings
            # read it, and report it as damaged). An update that keeps the status stays a
            # HOT update.
            f"ALTER TABLE {s}.runs ADD COLUMN status text",
            f"""CREATE FUNCTION {s}.run_status() RETURNS trigger LANGUAGE plpgsql AS $fn$
                BEGIN
                    BEGIN
                        NEW.status := coalesce(NEW.record::json ->> 'status', 'RUNNING');
                    EXCEPTION WHEN others THEN
                        NEW.status := NULL;
                    END;
                    RETURN NEW;
                END
                $fn$""",
            f"""CREATE TRIGGER runs_status BEFORE INSERT OR UPDATE OF record ON {s}.runs
                FOR EACH ROW EXECUTE PROCEDURE {s}.run_status()""",
            f"UPDATE {s}.runs SET record = record",
            f"CREATE INDEX runs_by_status ON {s}.runs (status, created_at, run_id)",
        ]),
        ("notification deliveries", [
            # One row per (run, request, channel): claimed by INSERT ... ON CONFLICT DO
            # NOTHING, its outcome written by a compare-and-swap on the text.
            f"""CREATE TABLE {s}.deliveries (run_id text COLLATE "C" NOT NULL,
                key text NOT NULL, value text NOT NULL, PRIMARY KEY (run_id, key))""",
        ]),
    ]


#: The names of the schema migrations, in order (version N is ``MIGRATIONS[N - 1]``).
MIGRATIONS = [name for name, _ in _migrations(_q(DEFAULT_SCHEMA))]
#: The format version of the entries and records; the same wire format as the disk journal.
FORMAT_VERSION = 2

# Pools left behind by a fork: the child must neither use nor close the parent's connections
# (closing one would end the parent's session), so they are kept referenced, unused.
_inherited: list[Any] = []


def _lock_key(schema: str) -> int:
    digest = hashlib.sha256(f"durable_nb migrations {schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _channel(schema: str) -> str:
    """The NOTIFY channel of a schema's requests (a channel name has at most 63 bytes)."""
    name = f"durable_nb.{schema}"
    if len(name.encode()) > 63:
        name = f"durable_nb.{hashlib.sha256(schema.encode()).hexdigest()[:32]}"
    return name


def _created_at(record: RunRecord) -> float:
    try:
        return float(record.created_at or 0.0)
    except (TypeError, ValueError):
        return 0.0


class _ConnectionLost(JournalUnavailable):
    """A call's connection was lost or could not be had: :func:`_retried` makes it again,
    and says ``gave_up`` once it stops trying."""

    def __init__(self, message: str, where: str, action: str, text: str) -> None:
        super().__init__(message)
        self._where, self._action, self._text = where, action, text

    def gave_up(self, seconds: float) -> JournalUnavailable:
        return JournalUnavailable(
            f"{self._where}: {self._action} failed: the server could not be reached for "
            f"{seconds:g} s (last error: {self._text}). Check that it is running and "
            f"reachable; a run stopped by this resumes from its journal when executed again.")


def _retried(method: Callable[..., _T]) -> Callable[..., _T]:
    """``method`` made again, whole, on a new connection, while its connection is lost (see
    the module docstring), for up to the journal's ``retry_for`` seconds; then a short
    :class:`JournalUnavailable`. Once a call gave up, the next ones are tried once each
    until one succeeds: a run stopped by an outage does not wait ``retry_for`` again for
    each write on its way out (its record, its lease). Only for methods that are safe to
    make twice."""
    @functools.wraps(method)
    def again(self: "PostgresJournal", *args: Any, **kwargs: Any) -> _T:
        until = time.monotonic() + (0.0 if self._down else self.retry_for)
        delay = 0.05
        outer = not getattr(self._local, "retrying", False)
        try:
            while True:
                try:
                    result = method(self, *args, **kwargs)
                    self._down = False
                    return result
                except _ConnectionLost as lost:
                    left = until - time.monotonic()
                    if left <= 0:
                        self._down = True
                        raise lost.gave_up(self.retry_for) from None
                    self._local.retrying = True
                    time.sleep(min(delay, left))
                    delay = min(delay * 2, _RETRY_CHECKOUT)
        finally:
            if outer:
                self._local.retrying = False
    return again


class PostgresJournal(Journal):
    """The journal in a PostgreSQL schema, shared by every process that reaches the database.

    ``read_only=True``: nothing is created or written (the sessions are read-only too); a
    missing journal is an error and write methods raise. ``pool_size``: connections at most
    (one is used per call, for the call's duration), plus one ``LISTEN`` connection while a
    run waits for a request. ``retry_for``: how long a call whose connection is lost is
    made again (see the module docstring). Safe to share between threads.
    """

    notifies = True

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
        self._url = _Url(url)
        _ScrubSecrets.secrets.update(self._url.secrets)
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
        self._sql = self._statements(_q(self.schema))
        self._channel = _channel(self.schema)
        self._pid = os.getpid()
        self._pool_lock = threading.Lock()
        self._pool: Any = None
        self._listener: _Listener | None = None
        with self._errors("open"):
            with psycopg.connect(self._url.conninfo, **self._kwargs) as conn:
                self._configure(conn)
                self._open_schema(conn)
        self._pool = self._new_pool()

    # -- connections ------------------------------------------------------------------------

    def _configure(self, conn: Any) -> None:
        if self.read_only:
            conn.execute("SET default_transaction_read_only = on")

    def _new_pool(self) -> Any:
        # reconnect_timeout: a connection the pool could not make again is given up soon, so
        # that the next call asks for a new one at once rather than at the pool's back-off
        # (1, 2, 4 ... s: up to twice an outage's length after the server is back).
        pool = self._pool_class(self._url.conninfo, kwargs=self._kwargs, min_size=1,
                                max_size=self._pool_size, open=False, name="durable_nb",
                                configure=self._configure if self.read_only else None,
                                check=self._check, reconnect_timeout=_RETRY_CHECKOUT,
                                timeout=self._connect_timeout)
        pool.open(wait=False)
        return pool

    def _check(self, conn: Any) -> None:
        """On checkout: a round trip on the connection. When the server ended it (a
        restart), the pool's other idle connections are checked too, now: else each would
        fail its own checkout, with the pool's back-off sleep (1, 2, 4 ... s) after each."""
        try:
            self._pool_class.check_connection(conn)
        except self._psycopg.Error:
            pool = self._pool
            if pool is not None:
                pool.check()
            raise

    def _current_pool(self) -> Any:
        if self._pid != os.getpid():  # a forked child: new connections of its own
            with self._pool_lock:
                if self._pid != os.getpid():
                    _inherited.append(self._pool)
                    _inherited.append(self._listener)
                    self._listener = None
                    self._pool = self._new_pool()
                    self._pid = os.getpid()
        if self._pool is None:
            raise JournalError(f"the journal at {self.location} was disposed of")
        return self._pool

    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        """psycopg errors as JournalErrors, with the password cut out of their text."""
        try:
            yield
        except self._psycopg.Error as exc:
            raise self._translate(exc, action) from None

    def _translate(self, exc: BaseException, action: str) -> DatabaseError:
        text = self._url.scrub(str(exc).strip() or type(exc).__name__)
        where = f"the PostgreSQL journal at {self.location}"
        if isinstance(exc, (self._psycopg.OperationalError, self._psycopg.InterfaceError)):
            message = (f"{where}: {action} failed: {text}. Check that the server is running "
                       f"and reachable, and the URL's user, password and database "
                       f"(DURABLE_NB_JOURNAL or --journal).")
            if self._lost(exc):
                return _ConnectionLost(message, where, action, text)
            return JournalUnavailable(message)
        return DatabaseError(f"{where}: {action} failed ({type(exc).__name__}): {text}")

    def _lost(self, exc: BaseException) -> bool:
        """Whether ``exc`` says the connection was lost or could not be had (the server
        restarting, down, or unreachable; the pool out of connections), not that the
        statement failed."""
        state = getattr(exc, "sqlstate", None)
        if state is None:  # raised by the client: libpq lost or could not make the connection
            return True
        return state.startswith("08") or state in _SHUTDOWN_STATES

    @contextmanager
    def _conn(self, action: str = "a query") -> Iterator[Any]:
        """A checked connection from the pool for one call; its errors as JournalErrors
        (a lost connection as one that :func:`_retried` makes again)."""
        retrying = self._down or getattr(self._local, "retrying", False)
        timeout = _RETRY_CHECKOUT if retrying else None
        try:
            with self._current_pool().connection(timeout=timeout) as conn:
                yield conn
        except self._psycopg.Error as exc:
            raise self._translate(exc, action) from None

    def _writable(self, action: str) -> None:
        if self.read_only:
            raise read_only_error(self.location, action)

    def close(self) -> None:
        """Nothing to release per thread: connections return to the pool after each call."""

    def connection_url(self) -> str:
        """The URL this journal was opened with, password included: for opening the same
        journal in another process (a Dask worker). Never print, log or journal it; messages
        use :attr:`location`."""
        return self._url.url

    def dispose(self) -> None:
        """Close the pool's connections; the journal cannot be used after this."""
        listener, self._listener = self._listener, None
        if listener is not None and self._pid == os.getpid():
            listener.stop()
        pool, self._pool = self._pool, None
        if pool is not None and self._pid == os.getpid():
            pool.close()

    # -- schema -----------------------------------------------------------------------------

    @staticmethod
    def _statements(s: str) -> dict[str, str]:
        return {
            "find_run": f"SELECT record FROM {s}.runs WHERE run_id = %s",
            "create_run": f"INSERT INTO {s}.runs (run_id, created_at, record) VALUES (%s, %s, %s) "
                          f"ON CONFLICT DO NOTHING",
            "put_run": f"SELECT {s}.put_run(%s, %s, %s, %s)",
            # Ids from a prefix to the end of its range (prefix_end): byte order, COLLATE "C".
            # The start of a listing: _listing adds the status filter, order and limit.
            "list_runs": f"SELECT r.run_id, r.record FROM {s}.runs AS r "
                         f"WHERE r.run_id >= %s AND r.run_id < %s",
            "list_runs_counted": f"SELECT r.run_id, r.record, (SELECT max(position) FROM {s}.steps "
                                 f"WHERE run_id = r.run_id) FROM {s}.runs AS r "
                                 f"WHERE r.run_id >= %s AND r.run_id < %s",
            "count_runs": f"SELECT status, count(*) FROM {s}.runs WHERE run_id >= %s "
                          f"AND run_id < %s GROUP BY status",
            "put_batch": f"INSERT INTO {s}.batches (batch_id, created_at, record) VALUES (%s, %s, %s) "
                         f"ON CONFLICT (batch_id) DO UPDATE SET record = EXCLUDED.record",
            "find_batch": f"SELECT record FROM {s}.batches WHERE batch_id = %s",
            "list_batches": f"SELECT batch_id, record FROM {s}.batches ORDER BY created_at, batch_id",
            "get_step": f"SELECT entry FROM {s}.steps WHERE run_id = %s AND position = %s",
            "has_step": f"SELECT 1 FROM {s}.steps WHERE run_id = %s AND position = %s",
            "steps": f"SELECT position, entry FROM {s}.steps WHERE run_id = %s AND position >= %s "
                     f"ORDER BY position LIMIT {_BATCH}",
            "count_steps": f"SELECT max(position) FROM {s}.steps WHERE run_id = %s",
            "append_step": f"SELECT {s}.append_step(%s, %s, %s, %s, %s, %s, %s)",
            "truncate": f"DELETE FROM {s}.steps WHERE run_id = %s AND position >= %s",
            "insert_step": f"INSERT INTO {s}.steps (run_id, position, entry) VALUES (%s, %s, %s)",
            "drop_blobs": f"DELETE FROM {s}.blobs WHERE run_id = %s AND digest = ANY(%s)",
            "update_record": f"UPDATE {s}.runs SET record = %s WHERE run_id = %s",
            **{f"rename_{table}": f"UPDATE {s}.{table} SET run_id = %s WHERE run_id = %s"
               for table in ("steps", "blobs")},
            "get_blob": f"SELECT value FROM {s}.blobs WHERE run_id = %s AND digest = %s",
            "lease": f"SELECT holder, extract(epoch FROM now() - heartbeat_at)::float8 "
                     f"FROM {s}.leases WHERE run_id = %s",
            "lease_for_share": f"SELECT token FROM {s}.leases WHERE run_id = %s FOR SHARE",
            "lease_for_update": f"SELECT holder, extract(epoch FROM now() - heartbeat_at)::float8 "
                                f"FROM {s}.leases WHERE run_id = %s FOR UPDATE",
            "insert_lease": f"INSERT INTO {s}.leases (run_id, token, holder, heartbeat_at) "
                            f"VALUES (%s, %s, %s, now()) ON CONFLICT DO NOTHING",
            "replace_lease": f"UPDATE {s}.leases SET token = %s, holder = %s, heartbeat_at = now() "
                             f"WHERE run_id = %s",
            "renew_lease": f"UPDATE {s}.leases SET heartbeat_at = now() "
                           f"WHERE run_id = %s AND token = %s",
            "release_lease": f"DELETE FROM {s}.leases WHERE run_id = %s AND token = %s",
            # One statement, one transaction: the NOTIFY is delivered when the request is
            # committed, never before it can be read.
            "put_request": f"WITH written AS (INSERT INTO {s}.requests (run_id, kind, value) "
                           f"VALUES (%s, %s, %s) ON CONFLICT (run_id, kind) DO UPDATE "
                           f"SET value = EXCLUDED.value RETURNING run_id, kind) "
                           f"SELECT pg_notify(%s, json_build_object('run_id', run_id, "
                           f"'kind', kind)::text) FROM written",
            # Write-once: of writers racing, exactly one inserts (the others wait for its
            # commit and then do nothing); the NOTIFY goes with the one insert.
            "add_request": f"WITH written AS (INSERT INTO {s}.requests (run_id, kind, value) "
                           f"VALUES (%s, %s, %s) ON CONFLICT (run_id, kind) DO NOTHING "
                           f"RETURNING run_id, kind) "
                           f"SELECT pg_notify(%s, json_build_object('run_id', run_id, "
                           f"'kind', kind)::text) FROM written",
            # Compare and set, in one statement: the row is locked while it is compared.
            "swap_request": f"WITH written AS (UPDATE {s}.requests SET value = %s "
                            f"WHERE run_id = %s AND kind = %s AND value::jsonb = %s::jsonb "
                            f"RETURNING run_id, kind) "
                            f"SELECT pg_notify(%s, json_build_object('run_id', run_id, "
                            f"'kind', kind)::text) FROM written",
            "get_request": f"SELECT value FROM {s}.requests WHERE run_id = %s AND kind = %s",
            "delete_request": f"DELETE FROM {s}.requests WHERE run_id = %s AND kind = %s",
            "add_delivery": f"INSERT INTO {s}.deliveries (run_id, key, value) VALUES (%s, %s, %s) "
                            f"ON CONFLICT DO NOTHING",
            "swap_delivery": f"UPDATE {s}.deliveries SET value = %s "
                             f"WHERE run_id = %s AND key = %s AND value = %s",
            "deliveries": f"SELECT key, value FROM {s}.deliveries WHERE run_id = %s ORDER BY key",
            **{f"delete_{table}": f"DELETE FROM {s}.{table} WHERE run_id = %s"
               for table in ("steps", "blobs", "leases", "requests", "deliveries", "runs")},
        }

    def _schema_version(self, conn: Any) -> int | None:
        """How many migrations the schema has, or None if it has no journal."""
        found = conn.execute("SELECT to_regclass(%s)", (f"{_q(self.schema)}.migrations",)).fetchone()
        if found[0] is None:
            return None
        return conn.execute(f"SELECT coalesce(max(version), 0) FROM {_q(self.schema)}.migrations"
                            ).fetchone()[0]

    def _refuse_newer(self, version: int) -> None:
        if version > len(MIGRATIONS):
            raise IncompatibleJournal(
                f"the journal at {self.location} has schema version {version}, newer than this "
                f"durable_nb understands ({len(MIGRATIONS)}). Upgrade durable_nb "
                f"(pip install -U 'durable-nb[postgres]') or use another schema (?schema=...).")

    def _open_schema(self, conn: Any) -> None:
        """Check the server, apply pending migrations (not when read-only), check the format."""
        encoding = conn.execute("SHOW server_encoding").fetchone()[0]
        if encoding.upper() not in ("UTF8", "SQL_ASCII"):
            raise JournalError(
                f"the database of the journal at {self.location} has encoding {encoding}; the "
                f"journal stores UTF-8 text. Use a database created with ENCODING 'UTF8'.")
        version = self._schema_version(conn)
        if version is None and self.read_only:
            raise JournalError(
                f"there is no journal at {self.location} (no schema {self.schema!r} with a "
                f"migrations table). Check the URL's database and ?schema=; a read-only journal "
                f"is never created.")
        if version is not None:
            self._refuse_newer(version)
        if version != len(MIGRATIONS):
            if self.read_only:
                raise JournalError(
                    f"the journal at {self.location} has schema version {version}, older than "
                    f"this durable_nb's {len(MIGRATIONS)}; open it once without read_only=True "
                    f"to migrate it.")
            self._migrate(conn)
        self._check_format(conn)

    def _migrate(self, conn: Any) -> None:
        s = _q(self.schema)
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(self.schema),))
            # CREATE SCHEMA IF NOT EXISTS needs CREATE on the database even when the schema
            # is there: a role given only a schema of its own must not be asked for it.
            if conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s",
                            (self.schema,)).fetchone() is None:
                conn.execute(f"CREATE SCHEMA {s}")
            conn.execute(f"""CREATE TABLE IF NOT EXISTS {s}.migrations (
                version integer PRIMARY KEY, name text NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now())""")
            applied = conn.execute(f"SELECT coalesce(max(version), 0) FROM {s}.migrations"
                                   ).fetchone()[0]
            self._refuse_newer(applied)
            for version, (name, statements) in enumerate(_migrations(s), start=1):
                if version <= applied:
                    continue
                for statement in statements:
                    conn.execute(statement)
                conn.execute(f"INSERT INTO {s}.migrations (version, name) VALUES (%s, %s)",
                             (version, name))

    def _check_format(self, conn: Any) -> None:
        row = conn.execute(f"SELECT value FROM {_q(self.schema)}.meta WHERE key = 'format'"
                           ).fetchone()
        try:
            version = json.loads(row[0])["version"] if row else None
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptEntry("format", f"unreadable format marker ({exc})") from None
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise IncompatibleJournal(
                f"the journal at {self.location} has format version {version!r}, newer than "
                f"this durable_nb understands ({FORMAT_VERSION}). Upgrade durable_nb "
                f"(pip install -U 'durable-nb[postgres]') or use another schema (?schema=...).")

    # -- runs -------------------------------------------------------------------------------

    @_retried
    def create_run(self, record: RunRecord) -> bool:
        self._writable("create a run")
        with self._conn("creating a run") as conn:
            cursor = conn.execute(self._sql["create_run"],
                                  (record.run_id, _created_at(record), record.to_json()))
            return cursor.rowcount == 1

    @_retried
    def find_run(self, run_id: str) -> RunRecord | None:
        with self._conn("reading a run") as conn:
            row = conn.execute(self._sql["find_run"], (run_id,)).fetchone()
        return None if row is None else _parse_record(f"run:{run_id}", row[0], run_id)

    @_retried
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

    @_retried
    def count_runs(self, prefix: str = "") -> dict[Status, int]:
        """One query on the ``runs_by_status`` index."""
        with self._conn("counting runs") as conn:
            rows = conn.execute(self._sql["count_runs"], _id_range(prefix)).fetchall()
        return {Status(name): count for name, count in rows if name in _STATUS_NAMES}

    @_retried
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
            record = _parse_record(f"run:{row[0]}", row[1], row[0])
            if counted:
                record.step_count = 0 if row[2] is None else row[2] + 1
            records.append(record)
        # Linear (already in this order); drops rows whose status column was NULL.
        return select_runs(records, wanted, None, newest_first)

    # -- batches ----------------------------------------------------------------------------

    @_retried
    def put_batch(self, record: BatchRecord) -> None:
        self._writable("write a batch record")
        record.updated_at = time.time()
        with self._conn("writing a batch record") as conn:
            conn.execute(self._sql["put_batch"],
                         (record.batch_id, record.created_at or time.time(), record.to_json()))

    @_retried
    def find_batch(self, batch_id: str) -> BatchRecord | None:
        with self._conn("reading a batch") as conn:
            row = conn.execute(self._sql["find_batch"], (batch_id,)).fetchone()
        return None if row is None else _parse_batch(batch_id, row[0])

    @_retried
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
                    # The lease row first, as appends lock it first: no deadlock with a
                    # late append.
                    for table in ("leases", "requests", "deliveries", "steps", "blobs", "runs"):
                        conn.execute(self._sql[f"delete_{table}"], (gone,))
        if fenced:
            raise RunLeased(run_id, self.lease(run_id) or {}, advice=FENCED_ADVICE)

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
        return published

    # -- steps ------------------------------------------------------------------------------

    @_retried
    def get_step(self, run_id: str, position: int) -> StepEntry | None:
        with self._conn("reading a step") as conn:
            row = conn.execute(self._sql["get_step"], (run_id, position)).fetchone()
        return None if row is None else _parse_entry(run_id, position, row[0])

    @_retried
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
            if len(rows) < _BATCH:
                return

    @_retried
    def _step_rows(self, run_id: str, start: int) -> list[tuple[int, str]]:
        with self._conn("reading steps") as conn:
            return conn.execute(self._sql["steps"], (run_id, start)).fetchall()

    @_retried
    def count_steps(self, run_id: str, hint: int = 0) -> int:
        """One query: entries are a contiguous prefix, so the count is the last position + 1."""
        with self._conn("counting steps") as conn:
            last = conn.execute(self._sql["count_steps"], (run_id,)).fetchone()[0]
        return 0 if last is None else last + 1

    @_retried
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

    @_retried
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
                        conn.execute(self._sql["delete_requests"], (run_id,))
                    if record_json is not None:
                        conn.execute(self._sql["update_record"], (record_json, run_id))
        if fenced:
            raise RunLeased(run_id, self.lease(run_id) or {}, advice=FENCED_ADVICE)
        return deleted

    # -- blobs ------------------------------------------------------------------------------

    @_retried
    def get_blob(self, run_id: str, digest: str) -> str | None:
        with self._conn("reading a blob") as conn:
            row = conn.execute(self._sql["get_blob"], (run_id, digest)).fetchone()
        return None if row is None else row[0]

    # -- leases -----------------------------------------------------------------------------

    def _holder(self, run_id: str, row: tuple) -> dict:
        text, age = row
        try:
            holder = json.loads(text)
        except (ValueError, RecursionError):
            holder = None
        if not isinstance(holder, dict):
            raise CorruptEntry(f"lease:{run_id}", "the lease is not a JSON object", run_id=run_id)
        holder["heartbeat_age"] = max(0.0, float(age))
        holder["heartbeat"] = time.time() - holder["heartbeat_age"]
        return holder

    @_retried
    def acquire_lease(self, run_id: str, holder: dict,
                      holder_alive: Callable[[dict], bool]) -> None:
        self._writable("take a lease")
        stored = {k: v for k, v in holder.items() if k not in ("heartbeat", "heartbeat_age")}
        text = json.dumps(stored, separators=(",", ":"))
        token = holder["token"]
        with self._conn("taking a lease") as conn:
            while True:
                with conn.transaction():
                    row = conn.execute(self._sql["lease_for_update"], (run_id,)).fetchone()
                    if row is None:
                        # Two executors may find no lease at once: one insert wins, the
                        # other sees its lease on the next round.
                        if conn.execute(self._sql["insert_lease"],
                                        (run_id, token, text)).rowcount == 1:
                            return
                        continue
                    current = self._holder(run_id, row)
                    if current.get("token") == token:
                        return  # taken by this very call, whose reply was lost: made again
                    if holder_alive(current):
                        raise RunLeased(run_id, current)
                    conn.execute(self._sql["replace_lease"], (token, text, run_id))
                    return

    @_retried
    def renew_lease(self, run_id: str, token: str, heartbeat: float) -> bool:
        """Stamp the heartbeat with the database's ``now()`` (``heartbeat`` is not used)."""
        self._writable("renew a lease")
        with self._conn("renewing a lease") as conn:
            return conn.execute(self._sql["renew_lease"], (run_id, token)).rowcount == 1

    @_retried
    def release_lease(self, run_id: str, token: str) -> None:
        self._writable("release a lease")
        with self._conn("releasing a lease") as conn:
            conn.execute(self._sql["release_lease"], (run_id, token))

    @_retried
    def lease(self, run_id: str) -> dict | None:
        with self._conn("reading a lease") as conn:
            row = conn.execute(self._sql["lease"], (run_id,)).fetchone()
        return None if row is None else self._holder(run_id, row)

    # -- requests ---------------------------------------------------------------------------

    @_retried
    def put_request(self, kind: str, run_id: str, value: dict) -> None:
        check_request_kind(kind)
        self._writable("leave a request")
        with self._conn("leaving a request") as conn:
            conn.execute(self._sql["put_request"],
                         (run_id, kind, json.dumps(value, separators=(",", ":")), self._channel))

    @_retried
    def add_request(self, kind: str, run_id: str, value: dict) -> dict | None:
        check_request_kind(kind)
        self._writable("leave a request")
        text = json.dumps(value, separators=(",", ":"))
        while True:
            with self._conn("leaving a request") as conn:
                added = conn.execute(self._sql["add_request"],
                                     (run_id, kind, text, self._channel)).fetchone()
            if added is not None:
                return None
            # Read in a statement of its own: under READ COMMITTED it sees the row that won,
            # which the insert's snapshot may not.
            there = self.get_request(kind, run_id)
            if there is not None:
                return None if there == value else there
            # deleted between the insert and the read (its run reset): add again

    @_retried
    def swap_request(self, kind: str, run_id: str, old: dict, new: dict) -> bool:
        check_request_kind(kind)
        self._writable("replace a request")
        with self._conn("replacing a request") as conn:
            swapped = conn.execute(self._sql["swap_request"], (
                json.dumps(new, separators=(",", ":")), run_id, kind,
                json.dumps(old, separators=(",", ":")), self._channel)).fetchone()
        return swapped is not None or self.get_request(kind, run_id) == new

    @_retried
    def get_request(self, kind: str, run_id: str) -> dict | None:
        check_request_kind(kind)
        with self._conn("reading a request") as conn:
            row = conn.execute(self._sql["get_request"], (run_id, kind)).fetchone()
        if row is None:
            return None
        try:
            value = json.loads(row[0])
        except (ValueError, RecursionError):
            raise CorruptEntry(f"{kind}:{run_id}", "not JSON", run_id=run_id) from None
        return value if isinstance(value, dict) else None

    @_retried
    def delete_request(self, kind: str, run_id: str) -> None:
        check_request_kind(kind)
        self._writable("delete a request")
        with self._conn("deleting a request") as conn:
            conn.execute(self._sql["delete_request"], (run_id, kind))

    # -- deliveries ---------------------------------------------------------------------------

    @_retried
    def add_delivery(self, run_id: str, key: str, value: dict) -> bool:
        self._writable("record a delivery")
        with self._conn("recording a delivery") as conn:
            return conn.execute(self._sql["add_delivery"],
                                (run_id, key, delivery_text(value))).rowcount == 1

    @_retried
    def swap_delivery(self, run_id: str, key: str, expected: dict, value: dict) -> bool:
        self._writable("record a delivery")
        with self._conn("recording a delivery") as conn:
            return conn.execute(self._sql["swap_delivery"],
                                (delivery_text(value), run_id, key,
                                 delivery_text(expected))).rowcount == 1

    @_retried
    def _run_records(self, run_id: str) -> dict[str, dict]:
        with self._conn("reading deliveries") as conn:
            rows = conn.execute(self._sql["deliveries"], (run_id,)).fetchall()
        found = {}
        for key, text in rows:
            try:
                found[key] = json.loads(text)
            except (ValueError, RecursionError):
                raise CorruptEntry(f"delivery:{run_id}:{key}", "not JSON", run_id=run_id) from None
        return found

    def wait_for_request(self, kind: str, run_id: str, timeout: float | None, *,
                         accept: Callable[[dict], bool] | None = None,
                         wake: threading.Event | None = None,
                         poll_interval: float = 0.1) -> dict | None:
        """Wait for the request's NOTIFY (see the module docstring), reading the request when
        one for the run arrives (any kind: a cancel also ends the wait of a run waiting for
        a decision, with None), when ``wake`` is set, and at least every ``max(poll_interval,
        5 s)``."""
        check_request_kind(kind)
        until = None if timeout is None else time.monotonic() + timeout
        recheck = max(poll_interval, _RECHECK)
        event = wake if wake is not None else threading.Event()
        with self._current_listener().watching(run_id, event):
            return self._await_request(kind, run_id, until, accept, wake, event, recheck)

    @contextmanager
    def watch_changes(self, wake: Any) -> Iterator[None]:
        """While in the block, ``wake.set()`` is called (from the listener's thread) on
        every notification of this schema (a request put) and whenever the ``LISTEN``
        connection is (re)established, since what was sent while it was down is lost: a
        watcher of the whole journal (the server's summary) reads again then."""
        with self._current_listener().watching(None, wake):
            yield

    def _current_listener(self) -> "_Listener":
        self._current_pool()  # a forked child drops the parent's listener there
        with self._pool_lock:
            if self._listener is None:
                self._listener = _Listener(self._psycopg, self._url.conninfo,
                                           dict(self._kwargs, application_name="durable_nb listen"),
                                           self._channel)
            return self._listener


class _Listener:
    """One ``LISTEN`` connection of a journal in this process, open while runs wait.

    Waiters register an Event under their run id (None: every run); a NOTIFY for that run
    sets it. When the
    connection is (re)established every waiter is woken, since what was sent while nobody
    listened is lost: each reads its request once more."""

    def __init__(self, psycopg: Any, conninfo: str, kwargs: dict, channel: str) -> None:
        self._psycopg = psycopg
        self._conninfo = conninfo
        self._kwargs = kwargs
        self._channel = channel
        self._lock = threading.Lock()
        self._waiters: dict[str | None, list[threading.Event]] = {}
        self._thread: threading.Thread | None = None
        self._stopped = False
        #: Set while the LISTEN is in place (for tests and benchmarks).
        self.listening = threading.Event()

    @contextmanager
    def watching(self, run_id: str | None, event: threading.Event) -> Iterator[None]:
        with self._lock:
            self._waiters.setdefault(run_id, []).append(event)
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(target=self._loop, daemon=True,
                                                name="durable-nb-listen")
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                events = self._waiters.get(run_id, [])
                for i, e in enumerate(events):
                    if e is event:
                        del events[i]
                        break
                if not events:
                    self._waiters.pop(run_id, None)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True

    def _wake(self, run_id: str | None = None) -> None:
        with self._lock:
            if run_id is None:
                events = [e for waiting in self._waiters.values() for e in waiting]
            else:
                events = [*self._waiters.get(run_id, ()), *self._waiters.get(None, ())]
        for event in events:
            event.set()

    def _done(self, idle_since: float | None) -> bool:
        """Under the lock: whether the thread ends now (stopped, or idle long enough)."""
        if self._stopped or (not self._waiters and idle_since is not None
                             and time.monotonic() - idle_since >= _LISTEN_IDLE):
            self._thread = None
            return True
        return False

    def _loop(self) -> None:
        idle_since: float | None = None
        while True:
            with self._lock:
                if self._done(idle_since):
                    return
            try:
                conn = self._psycopg.connect(self._conninfo, **self._kwargs)
            except self._psycopg.Error:
                # Nothing can be heard: waiters fall back on reading every few seconds.
                self._wake()
                time.sleep(1.0)
                continue
            try:
                conn.execute(f'LISTEN "{self._channel}"')
                self.listening.set()
                self._wake()  # anything sent before the LISTEN was missed: look again
                while True:
                    for notify in conn.notifies(timeout=1.0):
                        self._dispatch(notify.payload)
                    with self._lock:
                        idle_since = None if self._waiters else (idle_since or time.monotonic())
                        if self._done(idle_since):
                            return
            except self._psycopg.Error:
                self._wake()
                time.sleep(0.5)
            finally:
                self.listening.clear()
                try:
                    conn.close()
                except self._psycopg.Error:
                    pass

    def _dispatch(self, payload: str) -> None:
        try:
            run_id = json.loads(payload)["run_id"]
        except (ValueError, KeyError, TypeError):
            self._wake()
            return
        self._wake(run_id)


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


class _ScrubSecrets(logging.Filter):
    """Cuts the passwords of every journal URL opened in this process out of psycopg's log
    records (the pool logs connection failures with libpq's message)."""

    secrets: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            text = record.getMessage()
            scrubbed = text
            for secret in sorted(self.secrets, key=len, reverse=True):
                scrubbed = scrubbed.replace(secret, "***")
            if scrubbed != text:
                record.msg, record.args = scrubbed, None
        return True


_scrub_filter = _ScrubSecrets()
for _name in ("psycopg", "psycopg.pool"):
    logging.getLogger(_name).addFilter(_scrub_filter)
