"""Connections to the PostgreSQL journal: its URL (the password given to libpq only, cut out
of every text and of psycopg's log records), the connection pool (replaced in a forked child),
psycopg errors as :class:`~durable_nb.errors.JournalError`, and calls made again, whole, while
their connection is lost (:func:`retried`; see :mod:`durable_nb.journal.postgres`)."""

from __future__ import annotations

import functools
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import unquote, urlsplit

from ..errors import DatabaseError, JournalError, JournalUnavailable
from .base import read_only_error

if TYPE_CHECKING:
    from .postgres import PostgresJournal

__all__ = ["DEFAULT_SCHEMA", "RETRY_FOR", "is_postgres_url", "location_of"]

DEFAULT_SCHEMA = "durable_nb"
_SCHEMES = ("postgresql", "postgres")
_SECRET_PARAMS = ("password", "sslpassword")
_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
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


class PostgresUrl:
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
    return PostgresUrl(url).location


# Pools left behind by a fork: the child must neither use nor close the parent's connections
# (closing one would end the parent's session), so they are kept referenced, unused.
_inherited: list[Any] = []


class _ConnectionLost(JournalUnavailable):
    """A call's connection was lost or could not be had: :func:`retried` makes it again,
    and says ``gave_up`` once it stops trying."""

    def __init__(self, message: str, where: str, action: str, text: str) -> None:
        super().__init__(message)
        self._where, self._action, self._text = where, action, text

    def gave_up(self, seconds: float) -> JournalUnavailable:
        return JournalUnavailable(
            f"{self._where}: {self._action} failed: the server could not be reached for "
            f"{seconds:g} s (last error: {self._text}). Check that it is running and "
            f"reachable; a run stopped by this resumes from its journal when executed again.")


def retried(method: Callable[..., _T]) -> Callable[..., _T]:
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


class PgConnections:
    """The connection part of :class:`~durable_nb.journal.postgres.PostgresJournal`: its
    pool, and a connection per call with psycopg errors translated."""

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
        if getattr(exc, "sqlstate", None) == "42501":
            # Refused by the grants or by a hub's rule (pg_schema's triggers): the reason is
            # the primary message, on one line, without the server's CONTEXT lines.
            primary = getattr(getattr(exc, "diag", None), "message_primary", None) or text
            return DatabaseError(f"{where}: {action} refused: {self._url.scrub(primary)}")
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
        (a lost connection as one that :func:`retried` makes again)."""
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


class ScrubSecrets(logging.Filter):
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


_scrub_filter = ScrubSecrets()
for _name in ("psycopg", "psycopg.pool"):
    logging.getLogger(_name).addFilter(_scrub_filter)
