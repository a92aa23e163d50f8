"""Requests wake waiting runs: one ``LISTEN`` connection per PostgreSQL journal and process,
open while something waits (see :mod:`durable_nb.journal.postgres`)."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: Waiters read their request again at least this often, even without a notification.
RECHECK = 5.0
#: The LISTEN connection is closed once nobody waited for this long.
_LISTEN_IDLE = 10.0


def notify_channel(schema: str) -> str:
    """The NOTIFY channel of a schema's requests (a channel name has at most 63 bytes)."""
    name = f"durable_nb.{schema}"
    if len(name.encode()) > 63:
        name = f"durable_nb.{hashlib.sha256(schema.encode()).hexdigest()[:32]}"
    return name


class Listener:
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

