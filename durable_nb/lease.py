"""One executor per run: a lease in the journal naming the process that executes it.

A lease is ``{"token", "pid", "host", "started", "heartbeat"}``. It can be taken when there is
none, when its holder is dead: a pid gone from this host (or reused by another process, told
apart by its start time), a lease of this process that no execution holds any more, or a
heartbeat older than ``stale_after`` seconds (the only test possible for a holder on another
host, and the one that catches a stalled process). Every write of an executor carries its
token, so an executor that lost its lease is fenced out (:mod:`durable_nb.journal.base`).

Heartbeat age: a journal with a clock of its own (PostgreSQL) stamps heartbeats with it and
hands out holders with ``heartbeat_age``, the seconds since the last heartbeat by that clock;
it is used when present, so executors on hosts whose clocks disagree still agree on who is
stale. Otherwise (the disk journal, one machine) the age is this host's ``time.time()`` minus
``heartbeat``.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass

from .journal import Journal, this_host

__all__ = ["DEFAULT_STALE_AFTER", "Lease", "holder_alive"]

DEFAULT_STALE_AFTER = 30.0

# Leases this process holds now. A lease naming this process but not listed here was left by
# an execution that ended without deleting it (say, the disk was full): it is dead.
_held_here: set[str] = set()


def _process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), to tell reused pids apart."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]


def holder_alive(holder: dict, stale_after: float = DEFAULT_STALE_AFTER) -> bool:
    """Whether the lease holder may still be executing."""
    try:
        age = holder.get("heartbeat_age")
        age = float(age) if age is not None else time.time() - float(holder.get("heartbeat", 0))
    except (TypeError, ValueError):
        return False
    if age >= stale_after:
        return False  # on any host: a stalled or paused executor loses its run
    if holder.get("host") != this_host():
        return True
    pid = holder.get("pid")
    if not isinstance(pid, int):
        return False
    if pid == os.getpid():
        return holder.get("token") in _held_here
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by someone else
    started = holder.get("started")
    return started is None or _process_start(pid) in (None, started)


@dataclass
class Lease:
    """A held lease; renew it at least every ``stale_after / 3`` seconds."""

    journal: Journal
    run_id: str
    token: str

    @classmethod
    def acquire(cls, journal: Journal, run_id: str,
                stale_after: float = DEFAULT_STALE_AFTER) -> "Lease":
        """Take the run's lease or raise :class:`~durable_nb.errors.RunLeased` naming the
        live holder."""
        mine = {"token": uuid.uuid4().hex, "pid": os.getpid(), "host": this_host(),
                "started": _process_start(os.getpid()), "heartbeat": time.time()}
        journal.acquire_lease(run_id, mine, lambda holder: holder_alive(holder, stale_after))
        _held_here.add(mine["token"])
        return cls(journal, run_id, mine["token"])

    def renew(self) -> bool:
        """Refresh the heartbeat; False if another executor took the lease over."""
        return self.journal.renew_lease(self.run_id, self.token, time.time())

    def release(self) -> None:
        _held_here.discard(self.token)
        self.journal.release_lease(self.run_id, self.token)
