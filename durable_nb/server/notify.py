"""The server extension as a sender of notifications and keeper of deadlines: every
:data:`PERIOD` seconds, each journal the server shows is swept for parked runs past their
approval's deadline (decided or escalated by its policy, :mod:`durable_nb.execution.deadlines`,
whether or not a kernel is alive), and for requests, reminders and escalations no process
notified (the kernel that parked one died, or exited before its delivery finished), with that
journal's configuration (:func:`durable_nb.notify.start.for_directory`). A journal without
channels is only read through the handle the server's listing shares (its waiting runs, from
the index), and opened for writing only when a deadline is due. A delivery claimed elsewhere
is left to its claimant (:mod:`durable_nb.notify.delivery`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ..errors import DurableError
from ..execution.deadlines import apply_due_deadlines
from ..journal import Status
from ..notify.delivery import sweep
from ..notify.start import for_directory
from .journals import KnownJournal, allowed_journals, is_news

__all__ = ["PERIOD", "start_sweeper", "sweep_allowed"]

#: Seconds between two sweeps of the server's journals.
PERIOD = 10.0

_log = logging.getLogger("durable_nb.server")


def sweep_allowed(server_url: str | None = None) -> dict[str, dict]:
    """One sweep of every journal the server shows: what was sent, by journal, with decision
    links to ``server_url`` (this server) when no base URL is configured. A journal that
    cannot be opened or whose configuration is wrong is skipped, and logged once (until it
    fails otherwise or opens again), not at every sweep."""
    done = {}
    for known in allowed_journals():
        try:
            config = for_directory(known.location if known.kind == "disk" else None)
            if not config.channels():
                _apply_due_deadlines(known)  # nothing to send
                continue
            sent = sweep(known.open(write=True), config, server_url=server_url)
            if sent:
                done[known.display] = sent
        except DurableError as exc:
            if is_news(known, exc):  # once, not at every sweep
                _log.warning("durable_nb: notifications for %s: %s", known.display, exc)
        finally:
            known.release()
    return done


def _apply_due_deadlines(known: KnownJournal) -> None:
    """The deadlines due in ``known`` applied, read through the shared read-only handle
    first: a journal whose waiting runs have no deadline due is not opened for writing."""
    apply_due_deadlines(known.open().list_runs(status=Status.WAITING_APPROVAL),
                        lambda: known.open(write=True))


def start_sweeper(period: float = PERIOD, server_url: str | None = None,
                  running: Callable[[], bool] = lambda: True) -> threading.Thread:
    """Sweep every ``period`` seconds on a daemon thread (links to ``server_url``: see
    :func:`sweep_allowed`) while ``running()`` (the server's event loop is open: a server
    that stopped, or a test's server torn down, sweeps no more)."""
    def loop() -> None:
        while running():
            try:
                sweep_allowed(server_url)
            except Exception:  # never let one bad sweep end the loop
                _log.exception("durable_nb: a notification sweep failed")
            stop.wait(period)

    stop = threading.Event()
    thread = threading.Thread(target=loop, name="durable-nb-notify-sweeper", daemon=True)
    thread.start()
    return thread
