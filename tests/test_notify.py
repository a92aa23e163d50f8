"""Waiting for a request (a decision, a cancel): ``Journal.wait_for_request`` on both backends,
and on PostgreSQL a run, and a notebook's watcher, woken by LISTEN/NOTIFY when another process
decides, not by polling.

The PostgreSQL tests make polling visible: the waiting side's poll interval is 60 s or more,
and the journal's reads are counted. A decision from another process that arrives in seconds
and is seen after a handful of reads was heard, not polled for.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

import durable_nb as dn
from durable_nb import RunOptions, Status
from durable_nb.errors import RunCancelled
from durable_nb.journal import Journal, PostgresJournal
from tests.harness.kernel import wait_until
from tests.conftest import run_python
from tests.test_journal_conformance import Backend, backend, pg_backend  # noqa: F401 (fixtures)

REPO = Path(__file__).resolve().parents[1]
SLOW_POLL = 60.0  # seconds: what a poll would take; a notification takes well under that


def _waiting_since(journal: Journal, run_id: str) -> float:
    """When the run was left waiting (its record's last write, wall clock): a waiter that
    polls reads again no sooner than its poll interval after this."""
    wait_until(lambda: (r := journal.find_run(run_id)) is not None
               and r.status is Status.WAITING_APPROVAL, what=f"run {run_id} to wait", timeout=60)
    return journal.get_run(run_id).updated_at


def _count_reads(journal: Journal) -> Counter:
    """Count the journal's get_request reads by kind (an instance attribute wraps the method;
    ``decision.ID``, a decision on one approval, counts as ``decision``)."""
    reads: Counter = Counter()
    original = journal.get_request

    def counted(kind: str, run_id: str) -> dict | None:
        reads[kind.split(".")[0]] += 1
        return original(kind, run_id)

    journal.get_request = counted  # type: ignore[method-assign]
    return reads


def _cli(location: str, *args: str) -> subprocess.CompletedProcess:
    """``durable-nb --journal LOCATION ARGS`` in another process."""
    proc = subprocess.run([sys.executable, "-m", "durable_nb.cli", "--journal", location, *args],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


# --- the interface, on both backends ---------------------------------------------------------

def test_wait_for_request_returns_a_request_there_at_once(backend: Backend):
    journal = backend.open()
    journal.put_request("decision", "r", {"key": "3", "approved": True})
    assert journal.wait_for_request("decision", "r", 30, poll_interval=SLOW_POLL) == \
        {"key": "3", "approved": True}
    # accept= leaves a request that is not the awaited one (a decision on another approval)
    assert journal.wait_for_request("decision", "r", 0.2, poll_interval=0.05,
                                    accept=lambda d: d["key"] == "4") is None


def test_wait_for_request_ends_with_none_when_woken_or_timed_out(backend: Backend):
    journal = backend.open()
    wake = threading.Event()
    wake.set()  # set by this process (an approval given here, an interrupt): look again
    assert journal.wait_for_request("cancel", "r", 30, wake=wake, poll_interval=SLOW_POLL) is None
    assert journal.wait_for_request("cancel", "r", 0.1, poll_interval=0.05) is None


def test_wait_for_request_sees_a_request_left_while_it_waits(backend: Backend):
    journal = backend.open()
    box: dict = {}
    waiter = threading.Thread(target=lambda: box.update(
        value=journal.wait_for_request("decision", "r", 60, poll_interval=0.05)))
    waiter.start()
    time.sleep(0.2)
    backend.open().put_request("decision", "r", {"key": "0"})
    waiter.join(60)
    assert box["value"] == {"key": "0"}


# --- PostgreSQL: heard, not polled for ------------------------------------------------------

@pytest.mark.postgres
def test_postgres_a_request_from_another_process_wakes_a_waiter_without_polling(
        pg_backend: Backend):
    journal = pg_backend.open()
    assert journal.notifies
    reads = _count_reads(journal)
    box: dict = {}

    def wait() -> None:
        began = time.monotonic()
        box["value"] = journal.wait_for_request("decision", "r", 300, poll_interval=SLOW_POLL)
        box["waited"] = time.monotonic() - began

    waiter = threading.Thread(target=wait)
    waiter.start()
    wait_until(lambda: journal._listener is not None and journal._listener.listening.is_set(),
               what="the LISTEN connection", timeout=60)
    run_python("import sys; from durable_nb.journal import PostgresJournal; "
               "PostgresJournal(sys.argv[1]).put_request('decision', 'r', {'key': '0'})",
               pg_backend.location)
    waiter.join(SLOW_POLL * 2)
    assert box["value"] == {"key": "0"}
    assert box["waited"] < SLOW_POLL  # a poll would have come after SLOW_POLL seconds
    # one read on entry, one when the LISTEN was in place, one on the notification
    assert reads["decision"] <= 3


def _approval_agent(effects: list):
    def agent(ctx):
        decision = ctx.approval("send", {"to": "team@example.com"})
        if decision.approved:
            ctx.run("send", lambda: effects.append(decision.note) or "sent")
        return {"approved": decision.approved, "by": decision.by}
    return agent


@pytest.mark.postgres
def test_postgres_a_waiting_run_resumes_on_a_decision_from_another_process(
        pg_backend: Backend, postgres_server):
    url = f"{postgres_server.password_url}?schema={pg_backend.schema}"
    journal = PostgresJournal(url)
    reads = _count_reads(journal)
    effects: list = []
    box: dict = {}

    def run() -> None:
        box["result"] = dn.execute("mail", _approval_agent(effects), journal=journal,
                                   poll_interval=SLOW_POLL, stale_after=SLOW_POLL * 5)
        box["finished"] = time.time()

    runner = threading.Thread(target=run)
    runner.start()
    try:
        waiting_since = _waiting_since(journal, "mail")
        waiting_reads = reads["decision"]
        approve = _cli(url, "approve", "mail", "looks right", "--by", "ops")
        runner.join(SLOW_POLL * 2)
    finally:
        journal.dispose()
    assert box["result"] == {"approved": True, "by": "ops"} and effects == ["looks right"]
    assert box["finished"] - waiting_since < SLOW_POLL  # before its first poll could come
    assert reads["decision"] - waiting_reads <= 4  # woken, not polling: a few reads in all
    password = postgres_server.password_url.split(":")[2].split("@")[0]
    assert password not in approve.stdout + approve.stderr


@pytest.mark.postgres
def test_postgres_a_waiting_run_is_cancelled_from_another_process_at_once(pg_backend: Backend):
    journal = pg_backend.open()
    box: dict = {}

    def run() -> None:
        try:
            # The heartbeat also looks for cancels, every heartbeat_interval: an hour here.
            dn.execute("mail", _approval_agent([]), journal=journal, poll_interval=SLOW_POLL,
                       heartbeat_interval=3600, stale_after=SLOW_POLL * 5)
        except RunCancelled as exc:
            box["error"] = exc
        box["finished"] = time.time()

    runner = threading.Thread(target=run)
    runner.start()
    waiting_since = _waiting_since(journal, "mail")
    _cli(pg_backend.location, "cancel", "mail")
    runner.join(SLOW_POLL * 2)
    assert isinstance(box.get("error"), RunCancelled)
    assert box["finished"] - waiting_since < SLOW_POLL
    assert journal.get_run("mail").status is Status.CANCELLED


@pytest.mark.postgres
def test_postgres_a_notebook_watcher_resumes_a_parked_run_on_a_decision_from_another_process(
        pg_backend: Backend):
    from durable_nb.notebook.session import NotebookRun

    journal = pg_backend.open()
    reads = _count_reads(journal)
    effects: list = []
    options = RunOptions(title="mail", on_approval="park", poll_interval=SLOW_POLL,
                         stale_after=SLOW_POLL * 5)
    session = NotebookRun("mail", _approval_agent(effects), options, journal)
    try:
        parked = session.start()  # the cell ends; the watcher thread waits for a decision
        assert parked.status is Status.WAITING_APPROVAL
        wait_until(lambda: journal._listener is not None and journal._listener.listening.is_set(),
                   what="the watcher's LISTEN connection", timeout=60)
        waiting_reads = reads["decision"]
        waiting_since = journal.get_run("mail").updated_at
        _cli(pg_backend.location, "approve", "mail", "go", "--by", "ana")
        assert session.wait(SLOW_POLL * 3)
        resumed = time.time()
    finally:
        session.stop()
    record = journal.get_run("mail")
    assert record.status is Status.DONE and effects == ["go"]
    # the watcher polls every 2 x poll_interval: it would read again after 2 x SLOW_POLL
    assert resumed - waiting_since < SLOW_POLL
    assert reads["decision"] - waiting_reads <= 6
