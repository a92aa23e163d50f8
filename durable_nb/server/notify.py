"""The server extension as a sender of notifications: every :data:`PERIOD` seconds, each
journal the server shows is swept for parked runs whose requests no process notified (the
kernel that parked one died, or exited before its delivery finished), with that journal's
configuration (:func:`durable_nb.notify.start.for_directory`); a journal without channels is
not opened. A delivery claimed elsewhere is
left to its claimant (:mod:`durable_nb.notify.delivery`)."""

from __future__ import annotations

import logging
import threading

from ..errors import DurableError
from ..notify.delivery import sweep
from ..notify.start import for_directory
from .journals import allowed_journals

__all__ = ["PERIOD", "start_sweeper", "sweep_allowed"]

#: Seconds between two sweeps of the server's journals.
PERIOD = 10.0

_log = logging.getLogger("durable_nb.server")


def sweep_allowed(server_url: str | None = None) -> dict[str, dict]:
    """One sweep of every journal the server shows: what was sent, by journal, with decision
    links to ``server_url`` (this server) when no base URL is configured. A journal that
    cannot be opened or whose configuration is wrong is logged and skipped."""
    done = {}
    for known in allowed_journals():
        try:
            config = for_directory(known.location if known.kind == "disk" else None)
            if not config.channels():
                continue  # nothing to send: the journal is not even opened
            sent = sweep(known.open(write=True), config, server_url=server_url)
            if sent:
                done[known.display] = sent
        except DurableError as exc:
            _log.warning("durable_nb: notifications for %s: %s", known.display, exc)
    return done


def start_sweeper(period: float = PERIOD, server_url: str | None = None) -> threading.Thread:
    """Sweep every ``period`` seconds on a daemon thread, for the server's lifetime (links
    to ``server_url``: see :func:`sweep_allowed`)."""
    def loop() -> None:
        while True:
            try:
                sweep_allowed(server_url)
            except Exception:  # never let one bad sweep end the loop
                _log.exception("durable_nb: a notification sweep failed")
            stop.wait(period)

    stop = threading.Event()
    thread = threading.Thread(target=loop, name="durable-nb-notify-sweeper", daemon=True)
    thread.start()
    return thread
