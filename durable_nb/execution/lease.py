"""One executor per run: a lease in the journal naming the process that executes it.

A lease is ``{"token", "executor", "pid", "host", "boot", "pidns", "started", "heartbeat"}``:
``executor`` is a random id of the process, ``boot`` the kernel's boot id and ``pidns`` the
process's PID namespace (Linux; None elsewhere). It can be taken when there is none, when its
holder's heartbeat is older than ``stale_after`` seconds (a holder on another machine, a
stalled process), or at once when the holder is *provably* gone:

- a lease of this process (its executor id) that no execution holds any more;
- a process of this host name, this boot and this PID namespace whose pid is dead, or reused
  by another process (told apart by its start time).

A pid means something only in its PID namespace: executors in containers that share a host
name (host networking, some JupyterHub spawners) see each other's pids as dead or as someone
else, so a holder in another namespace, of another boot, or of an older durable_nb that did
not record them, is judged by its heartbeat only. Every write of an executor carries its
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

from ..journal import Journal, this_host

__all__ = ["DEFAULT_STALE_AFTER", "Lease", "holder_alive", "this_place"]

DEFAULT_STALE_AFTER = 30.0

# Leases this process holds now. A lease naming this process but not listed here was left by
# an execution that ended without deleting it (say, the disk was full): it is dead.
_held_here: set[str] = set()

# This process's executor id, and its boot id and PID namespace (read once); a forked child
# gets its own (it may be in a namespace its parent made for it).
_executor = uuid.uuid4().hex
_kernel: tuple[str | None, str | None] | None = None


def _new_executor() -> None:
    global _executor, _kernel
    _executor, _kernel = uuid.uuid4().hex, None
    _held_here.clear()  # the parent's leases are the parent's


if hasattr(os, "register_at_fork"):  # POSIX; elsewhere there is no fork
    os.register_at_fork(after_in_child=_new_executor)


def _boot_and_pid_namespace() -> tuple[str | None, str | None]:
    global _kernel
    if _kernel is None:
        try:
            with open("/proc/sys/kernel/random/boot_id") as f:
                boot: str | None = f.read().strip() or None
        except OSError:
            boot = None
        try:
            namespace: str | None = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
        except OSError:
            namespace = None
        _kernel = (boot, namespace)
    return _kernel


def this_place() -> dict:
    """Where the pids of this process mean something: ``{"host", "boot", "pidns"}``
    (``boot`` and ``pidns`` None where the system does not tell them)."""
    boot, namespace = _boot_and_pid_namespace()
    return {"host": this_host(), "boot": boot, "pidns": namespace}


def _process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), to tell reused pids apart."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]


def holder_alive(holder: dict, stale_after: float = DEFAULT_STALE_AFTER) -> bool:
    """Whether the lease holder may still be executing: False once its heartbeat is stale,
    or when it is provably gone (see the module docstring)."""
    try:
        age = holder.get("heartbeat_age")
        age = float(age) if age is not None else time.time() - float(holder.get("heartbeat", 0))
    except (TypeError, ValueError):
        return False
    if age >= stale_after:
        return False  # on any host: a stalled or paused executor loses its run
    if holder.get("executor") == _executor:
        return holder.get("token") in _held_here
    place = this_place()
    if any(holder.get(name) != place[name] for name in place):
        return True  # another machine, boot or PID namespace: its pid tells nothing here
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid == os.getpid():
        return False  # not this process (another executor id): the pid was reused by us
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
        mine = {"token": uuid.uuid4().hex, "executor": _executor, "pid": os.getpid(),
                **this_place(), "started": _process_start(os.getpid()),
                "heartbeat": time.time()}
        journal.acquire_lease(run_id, mine, lambda holder: holder_alive(holder, stale_after))
        _held_here.add(mine["token"])
        return cls(journal, run_id, mine["token"])

    def renew(self) -> bool:
        """Refresh the heartbeat; False if another executor took the lease over."""
        return self.journal.renew_lease(self.run_id, self.token, time.time())

    def release(self) -> None:
        _held_here.discard(self.token)
        self.journal.release_lease(self.run_id, self.token)
