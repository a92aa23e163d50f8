"""The server extension as a sweeper: each journal the server shows is ticked
(:func:`durable_nb.approvals.tick.tick`: parked runs past their approval's deadline decided
or escalated by their policy, whether or not a kernel is alive), and swept for requests,
reminders and escalations no process notified (the kernel that parked one died, or exited
before its delivery finished), with that journal's configuration
(:func:`durable_nb.notify.start.for_directory`). A delivery claimed elsewhere is left to its
claimant (:mod:`durable_nb.notify.delivery`). A journal without channels is only read
through the handle the server's listing shares, and opened for writing only when something
is due: a deadline, or its retention policy where this server's role applies it
(:func:`durable_nb.retention.sweep.policy_due_here`; never a hub user's server).

The next sweep comes when something next falls due (a deadline, a reminder), and at the
latest :data:`PERIOD` seconds after the last one: a deadline is applied within moments of
passing, not up to a period later."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..approvals.tick import tick
from ..errors import DurableError
from ..notify.start import for_directory
from ..notify.sweeper import sweep_journal
from ..retention.sweep import apply_policy, policy_due_here
from .journals import allowed_journals, is_news

__all__ = ["PERIOD", "start_sweeper", "sweep_allowed"]

#: The longest time between two sweeps of the server's journals, in seconds.
PERIOD = 10.0
#: The shortest: a deadline due sooner waits this long (deadlines are not that precise).
_SOONEST = 0.05

_log = logging.getLogger("durable_nb.server")


def sweep_allowed(server_url: str | None = None) -> tuple[dict[str, dict], float | None]:
    """One sweep of every journal the server shows: what was sent, by journal, with decision
    links to ``server_url`` (this server) when no base URL is configured; and when something
    next falls due in them (None: nothing). A journal that cannot be opened or whose
    configuration is wrong is skipped, and logged once (until it fails otherwise or opens
    again), not at every sweep."""
    done: dict[str, dict] = {}
    dues: list[float] = []
    for known in allowed_journals():
        try:
            config = for_directory(known.location if known.kind == "disk" else None)
            sent: dict = {}
            if config.channels():
                ticked, sent, _ = sweep_journal(known.open(write=True), config,
                                                server_url=server_url)
            else:
                # Read through the handle the listing shares; opened for writing only when
                # a deadline is due (a journal this server only reads is left alone).
                ticked = tick(known.open())
                if ticked.overdue:
                    ticked = tick(known.open(write=True))
                if policy_due_here(known.open()):
                    apply_policy(known.open(write=True))
            if ticked.next_due is not None:
                dues.append(ticked.next_due)
            if sent:
                done[known.display] = sent
        except DurableError as exc:
            if is_news(known, exc):  # once, not at every sweep
                _log.warning("durable_nb: notifications for %s: %s", known.display, exc)
        finally:
            known.release()
    return done, (min(dues) if dues else None)


def start_sweeper(period: float = PERIOD, server_url: str | None = None,
                  running: Callable[[], bool] = lambda: True) -> threading.Thread:
    """Sweep on a daemon thread (links to ``server_url``: see :func:`sweep_allowed`) while
    ``running()`` (the server's event loop is open: a server that stopped, or a test's server
    torn down, sweeps no more): again when something next falls due, at most ``period``
    seconds later."""
    def loop() -> None:
        while running():
            next_due = None
            try:
                _, next_due = sweep_allowed(server_url)
            except Exception:  # never let one bad sweep end the loop
                _log.exception("durable_nb: a notification sweep failed")
            wait = period if next_due is None else min(period, next_due - time.time())
            stop.wait(max(_SOONEST, wait))

    stop = threading.Event()
    thread = threading.Thread(target=loop, name="durable-nb-notify-sweeper", daemon=True)
    thread.start()
    return thread
