"""The summary pushed: ``GET durable-nb/api/events`` (server-sent events) from ONE watcher per
server process, shared by every open sidebar.

The watcher runs only while at least one stream is open: no stream, no task, no journal
read. Every :data:`PERIOD` it builds the summary as ``GET summary`` does (:func:`.views.summary`:
a directory journal is read again only when its files' size or time changed, or every
``SUMMARY_REUSE`` seconds while it has RUNNING runs, so an unchanged one costs two ``stat``
calls) and wakes every stream when the summary's version changed. A PostgreSQL journal has no
such marker and is read each period, once for all the streams; its ``NOTIFY`` (a decision or
a cancel put by any process, :meth:`~durable_nb.journal.PostgresJournal.watch_changes`) wakes
the watcher at once, without waiting for the period.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from typing import Any

from ..journal import Journal

__all__ = ["PERIOD", "Watcher", "event"]

#: Seconds between two looks at the journals while a stream is open (the issue's "a poll of
#: at most a second or two", made once per server instead of once per sidebar).
PERIOD = 1.0

_log = logging.getLogger(__name__)

#: What the watcher calls each period: the summary (``GET summary``'s answer) and the
#: journals it read (those that notify are watched).
Check = Callable[[], Awaitable[tuple[dict, list[Journal]]]]


class _ThreadWake:
    """``set()`` from any thread (a PostgreSQL journal's listener) wakes the watcher."""

    def __init__(self, loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
        self._loop, self._event = loop, event

    def set(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._event.set)
        except RuntimeError:  # the loop closed (the server stopping)
            pass


class Watcher:
    """The one watcher of a server process. :meth:`subscribe` a stream (an
    :class:`asyncio.Event`, set when :attr:`latest` changed), :meth:`unsubscribe` it when its
    connection ends; the watcher's task runs while any stream is subscribed."""

    def __init__(self, check: Check) -> None:
        self._check = check
        self._streams: set[asyncio.Event] = set()
        self._task: asyncio.Task | None = None
        self._wake = asyncio.Event()
        #: The last summary built (None while no stream is open).
        self.latest: dict | None = None
        #: How many times the journals were looked at (tests: no stream, no look).
        self.checks = 0

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def subscribe(self) -> asyncio.Event:
        stream = asyncio.Event()
        if self.latest is not None:
            stream.set()  # a new stream starts with the current summary
        self._streams.add(stream)
        if not self.running:
            self._wake = asyncio.Event()
            self._task = asyncio.ensure_future(self._run())
        return stream

    def unsubscribe(self, stream: asyncio.Event) -> None:
        self._streams.discard(stream)
        if not self._streams:
            self._wake.set()  # the task ends now, not at the end of its period

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        watched: list[Journal] = []  # the journal handles are the server's, kept open
        with ExitStack() as watches:
            while self._streams:
                self._wake.clear()
                journals = await self._look()
                for journal in journals:
                    if journal.notifies and not any(journal is w for w in watched):
                        watched.append(journal)
                        watches.enter_context(journal.watch_changes(  # type: ignore[attr-defined]
                            _ThreadWake(loop, self._wake)))
                try:
                    await asyncio.wait_for(self._wake.wait(), PERIOD)
                except asyncio.TimeoutError:
                    pass
            # No await from the loop's test to here: a stream subscribing now finds the
            # task done and starts another.
            self.latest = None

    async def _look(self) -> list[Journal]:
        """Build the summary once; wake the streams when its version changed."""
        self.checks += 1
        try:
            answer, journals = await self._check()
        except Exception:  # a journal's error is in the answer; anything else is a bug
            _log.exception("durable_nb: the summary watcher failed to build the summary")
            return []
        if self.latest is None or answer.get("version") != self.latest.get("version"):
            self.latest = answer
            for stream in self._streams:
                stream.set()
        return journals


def event(name: str, data: Any) -> str:
    """One server-sent event (``data`` is JSON on one line: no newline to escape)."""
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"
