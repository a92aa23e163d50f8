"""Leases that know their executor (issue 17, item 11): a lease is taken at once only from a
holder that is provably gone (this host, this boot, this PID namespace, its pid dead or
reused); a holder whose pids mean something else (another PID namespace sharing the host
name) keeps its lease until its heartbeat is ``stale_after`` old."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import durable_nb as dn
from durable_nb.execution.lease import DEFAULT_STALE_AFTER, holder_alive, this_place

REPO = Path(__file__).resolve().parents[1]

# Takes the lease of run "r" in the journal argv[1] and says so; then holds it (argv[2] ==
# "hold") or exits at once without releasing it, as a process that died would.
HOLDER = """
import os, sys, time
from durable_nb.journal import open_journal
from durable_nb.execution.lease import Lease
Lease.acquire(open_journal(sys.argv[1]), "r")
print("held", flush=True)
if sys.argv[2] == "hold":
    time.sleep(600)
os._exit(0)
"""


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _holder(**fields) -> dict:
    return {"token": "t", "executor": "another", "pid": _dead_pid(), **this_place(),
            "started": None, "heartbeat": time.time(), **fields}


def test_a_holder_in_another_pid_namespace_is_judged_by_its_heartbeat_only():
    other = _holder(pidns="pid:[4026532999]")
    assert this_place()["pidns"] != other["pidns"]
    assert holder_alive(other)  # its pid, dead here, may be alive there
    assert not holder_alive({**other, "heartbeat_age": DEFAULT_STALE_AFTER})
    # The same for another boot, or a lease of a durable_nb that did not record them.
    assert holder_alive(_holder(boot="0d3c2b1a-another-boot"))
    assert holder_alive({k: v for k, v in _holder().items() if k not in ("boot", "pidns")})
    # In this namespace, this boot: a dead pid is a dead holder.
    assert not holder_alive(_holder())


def test_a_lease_in_another_pid_namespace_is_not_taken_before_stale_after(journal):
    journal.acquire_lease("r", _holder(pidns="pid:[4026532999]"), lambda holder: False)
    with pytest.raises(dn.RunLeased):
        dn.execute("r", lambda ctx: "mine", journal=journal)
    assert journal.renew_lease("r", "t", time.time() - DEFAULT_STALE_AFTER)
    assert dn.execute("r", lambda ctx: "mine", journal=journal) == "mine"


def _start_holder(journal, mode: str, prefix: list[str] = ()) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen([*prefix, sys.executable, "-c", HOLDER, str(journal.directory),
                                mode], stdout=subprocess.PIPE, text=True, env=env,
                               start_new_session=True)
    assert process.stdout.readline() == "held\n"
    return process


def test_the_lease_of_a_process_that_died_here_is_taken_at_once(journal):
    _start_holder(journal, "exit").wait()
    holder = journal.lease("r")
    assert holder["pidns"] == this_place()["pidns"] and holder["executor"]
    assert dn.execute("r", lambda ctx: "mine", journal=journal) == "mine"


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="a second PID namespace needs root and unshare")
def test_a_live_executor_in_another_pid_namespace_keeps_its_lease(journal):
    # The holder is pid 1 of a namespace of its own, on this host name: here pid 1 is
    # another process (its start time differs), which made it look dead and lose its lease.
    process = _start_holder(journal, "hold", ["unshare", "--pid", "--fork", "--mount-proc"])
    try:
        holder = journal.lease("r")
        assert holder["pid"] == 1 and holder["host"] == this_place()["host"]
        assert holder["pidns"] != this_place()["pidns"]
        assert holder_alive(holder)
        with pytest.raises(dn.RunLeased):
            dn.execute("r", lambda ctx: "mine", journal=journal)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    # Gone now, but nothing here can prove it: its heartbeat has to go stale first.
    with pytest.raises(dn.RunLeased):
        dn.execute("r", lambda ctx: "mine", journal=journal)
    assert journal.renew_lease("r", holder["token"], time.time() - DEFAULT_STALE_AFTER)
    assert dn.execute("r", lambda ctx: "mine", journal=journal) == "mine"
