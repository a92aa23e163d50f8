"""What processes tell each other about a run through the PostgreSQL journal: who executes
it (leases, heartbeats in the database's clock), requests for its executor (decisions and
cancels, each with the ``NOTIFY`` that wakes a waiting run) and the run's keyed records
(notification deliveries, history events)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from ..errors import CorruptEntry, RunLeased
from .base import check_request_kind, delivery_text, only_deliveries
from .pg_connection import retried
from .pg_listen import RECHECK, Listener


class PgRunCoordination:
    """Leases, requests and a run's keyed records of
    :class:`~durable_nb.journal.postgres.PostgresJournal`."""

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

    @retried
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

    @retried
    def renew_lease(self, run_id: str, token: str, heartbeat: float) -> bool:
        """Stamp the heartbeat with the database's ``now()`` (``heartbeat`` is not used)."""
        self._writable("renew a lease")
        with self._conn("renewing a lease") as conn:
            return conn.execute(self._sql["renew_lease"], (run_id, token)).rowcount == 1

    @retried
    def release_lease(self, run_id: str, token: str) -> None:
        self._writable("release a lease")
        with self._conn("releasing a lease") as conn:
            conn.execute(self._sql["release_lease"], (run_id, token))

    @retried
    def lease(self, run_id: str) -> dict | None:
        with self._conn("reading a lease") as conn:
            row = conn.execute(self._sql["lease"], (run_id,)).fetchone()
        return None if row is None else self._holder(run_id, row)

    # -- requests ---------------------------------------------------------------------------

    @retried
    def put_request(self, kind: str, run_id: str, value: dict) -> None:
        check_request_kind(kind)
        self._writable("leave a request")
        with self._conn("leaving a request") as conn:
            conn.execute(self._sql["put_request"],
                         (run_id, kind, json.dumps(value, separators=(",", ":")), self._channel))

    @retried
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

    @retried
    def swap_request(self, kind: str, run_id: str, old: dict, new: dict) -> bool:
        check_request_kind(kind)
        self._writable("replace a request")
        with self._conn("replacing a request") as conn:
            swapped = conn.execute(self._sql["swap_request"], (
                json.dumps(new, separators=(",", ":")), run_id, kind,
                json.dumps(old, separators=(",", ":")), self._channel)).fetchone()
        return swapped is not None or self.get_request(kind, run_id) == new

    @retried
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

    @retried
    def requests_of(self, wanted: Iterable[tuple[str, str]]) -> dict[tuple[str, str], dict]:
        """One query for all the runs (see :meth:`Journal.requests_of`)."""
        wanted = set(wanted)
        for kind, _ in wanted:
            check_request_kind(kind)
        with self._conn("reading requests") as conn:
            rows = conn.execute(self._sql["requests_of"],
                                (sorted({run_id for _, run_id in wanted}),)).fetchall()
        found = {}
        for run_id, kind, text in rows:
            if (kind, run_id) not in wanted:
                continue
            try:
                value = json.loads(text)
            except (ValueError, RecursionError):
                raise CorruptEntry(f"{kind}:{run_id}", "not JSON", run_id=run_id) from None
            if isinstance(value, dict):
                found[(kind, run_id)] = value
        return found

    @retried
    def leases_of(self, run_ids: Iterable[str]) -> dict[str, dict]:
        """One query for all the runs (see :meth:`Journal.leases_of`)."""
        with self._conn("reading leases") as conn:
            rows = conn.execute(self._sql["leases_of"], (sorted(set(run_ids)),)).fetchall()
        return {run_id: self._holder(run_id, (text, age)) for run_id, text, age in rows}

    @retried
    def deliveries_of(self, run_ids: Iterable[str]) -> dict[str, dict[str, dict]]:
        """One query for all the runs (see :meth:`Journal.deliveries_of`)."""
        wanted = sorted(set(run_ids))
        with self._conn("reading deliveries") as conn:
            rows = conn.execute(self._sql["deliveries_of"], (wanted,)).fetchall()
        records: dict[str, dict[str, dict]] = {run_id: {} for run_id in wanted}
        for run_id, key, text in rows:
            try:
                records[run_id][key] = json.loads(text)
            except (ValueError, RecursionError):
                raise CorruptEntry(f"delivery:{run_id}:{key}", "not JSON", run_id=run_id) from None
        return {run_id: only_deliveries(found) for run_id, found in records.items()}

    @retried
    def delete_request(self, kind: str, run_id: str) -> None:
        check_request_kind(kind)
        self._writable("delete a request")
        with self._conn("deleting a request") as conn:
            conn.execute(self._sql["delete_request"], (run_id, kind))

    # -- deliveries ---------------------------------------------------------------------------

    @retried
    def add_delivery(self, run_id: str, key: str, value: dict) -> bool:
        self._writable("record a delivery")
        with self._conn("recording a delivery") as conn:
            return conn.execute(self._sql["add_delivery"],
                                (run_id, key, delivery_text(value))).rowcount == 1

    @retried
    def swap_delivery(self, run_id: str, key: str, expected: dict, value: dict) -> bool:
        self._writable("record a delivery")
        with self._conn("recording a delivery") as conn:
            return conn.execute(self._sql["swap_delivery"],
                                (delivery_text(value), run_id, key,
                                 delivery_text(expected))).rowcount == 1

    @retried
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
        recheck = max(poll_interval, RECHECK)
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

    def _current_listener(self) -> "Listener":
        self._current_pool()  # a forked child drops the parent's listener there
        with self._pool_lock:
            if self._listener is None:
                self._listener = Listener(self._psycopg, self._url.conninfo,
                                           dict(self._kwargs, application_name="durable_nb listen"),
                                           self._channel)
            return self._listener

