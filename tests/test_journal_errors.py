"""No run goes on unjournaled: a failed journal write stops the run (``on_journal_error="stop"``,
the default) or says loudly that it is not durable ("continue"); nothing is reported DONE that
the journal does not hold; a PostgreSQL server restarted mid-run is ridden over by every path
(steps, waits for a decision, listings, the notebook's watcher), and one that stays down gives
a short error in bounded time.

The PostgreSQL tests restart and stop a server of their own (not the session's), for real:
``pg_ctl restart -m fast`` ends every session the journal's pool holds.
"""

from __future__ import annotations

import threading
import time
import uuid
import warnings

import pytest

import durable_nb as dn
from durable_nb import DiskJournal, RunOptions, RunRecord, Status
from durable_nb.errors import JournalUnavailable, JournalWriteError
from durable_nb.journal import PostgresJournal
from durable_nb.runner import Runner
from tests.harness.kernel import wait_until


# --- the disk journal: a write that fails ------------------------------------------------


class _FailingJournal(DiskJournal):
    """A real journal whose step writes, or DONE record writes, fail while told to (an
    injected ENOSPC, as a full disk raises)."""

    fail_steps = False
    fail_done = False
    fail_renew = False

    def append_step(self, run_id, entry, **kwargs):
        if self.fail_steps:
            raise OSError(28, "No space left on device (injected)")
        super().append_step(run_id, entry, **kwargs)

    def put_run(self, record, **kwargs):
        if self.fail_done and record.status is Status.DONE:
            raise OSError(28, "No space left on device (injected)")
        super().put_run(record, **kwargs)

    def renew_lease(self, run_id, token, heartbeat):
        if self.fail_renew:
            raise OSError(28, "No space left on device (injected)")
        return super().renew_lease(run_id, token, heartbeat)


def _steps_agent(journal: _FailingJournal, calls: list, *, swallow: bool = False,
                 fail_at: str = "b"):
    """Steps a, b, c; the journal starts failing while ``fail_at`` executes. ``swallow``:
    the handler catches every exception of a step and goes on (as agent loops do)."""
    def handler(ctx):
        for name in "abc":
            def work(name=name):
                calls.append(name)
                if name == fail_at:
                    journal.fail_steps = True
                return name
            try:
                ctx.run(name, work)
            except Exception:
                if not swallow:
                    raise
        return "done"
    return handler


def test_a_failed_step_write_stops_the_run_by_default_and_a_resume_goes_on(tmp_path):
    journal = _FailingJournal(tmp_path / "j")
    calls: list = []
    with pytest.raises(JournalWriteError, match="writing step 1 to the journal failed") as err:
        dn.execute("r", _steps_agent(journal, calls), journal=journal)
    assert "on_journal_error='stop' (the default)" in str(err.value)
    assert calls == ["a", "b"]  # the step in flight finished; nothing after it ran
    assert [s.name for s in journal.steps("r")] == ["a"]
    assert journal.get_run("r").status is not Status.DONE
    journal.fail_steps = False
    assert dn.execute("r", _steps_agent(journal, calls, fail_at=""), journal=journal) == "done"
    assert calls == ["a", "b", "b", "c"]  # b was not journaled: executed again, a once
    assert journal.get_run("r").status is Status.DONE


def test_a_handler_that_catches_the_journal_error_is_stopped_all_the_same(tmp_path):
    journal = _FailingJournal(tmp_path / "j")
    calls: list = []
    with pytest.raises(JournalWriteError, match="step 1"):
        dn.execute("r", _steps_agent(journal, calls, swallow=True), journal=journal)
    assert calls == ["a", "b"]  # c never ran although the handler went on
    assert journal.get_run("r").status is not Status.DONE


def test_a_done_record_that_cannot_be_written_raises_and_the_run_ends_on_resume(tmp_path):
    journal = _FailingJournal(tmp_path / "j")
    journal.fail_done = True
    calls: list = []
    with pytest.raises(JournalWriteError, match=r"writing its record \(DONE\)"):
        dn.execute("r", _steps_agent(journal, calls, fail_at=""), journal=journal)
    assert journal.get_run("r").status is Status.RUNNING  # not reported DONE
    journal.fail_done = False
    assert dn.execute("r", _steps_agent(journal, calls, fail_at=""), journal=journal) == "done"
    assert calls == ["a", "b", "c"]  # every step replayed from the journal
    assert journal.get_run("r").status is Status.DONE


def test_continue_says_a_run_that_finished_unjournaled_is_not_durable_nor_done(tmp_path):
    from durable_nb.notebook.panel import RunPanel

    journal = _FailingJournal(tmp_path / "j")
    calls: list = []
    options = RunOptions(on_journal_error="continue")
    panel = RunPanel(RunRecord(run_id="r"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcome = Runner("r", _steps_agent(journal, calls), journal=journal,
                         options=options, observer=panel).run()
    messages = [str(w.message) for w in caught]
    assert outcome.result == "done" and outcome.record.journal_degraded_from == 1
    assert "NOT DURABLE: journal degraded from step 1: the run finished, but the journal " \
           "does not hold it all and it is not recorded DONE" in panel.summary()
    assert any("DEGRADED from step 1" in m for m in messages), messages
    assert any("finished, but it is NOT durable and not recorded DONE: 2 of its steps "
               "could not be written, from step 1" in m for m in messages), messages
    assert journal.get_run("r").status is Status.RUNNING
    assert [s.name for s in journal.steps("r")] == ["a"]
    journal.fail_steps = False
    assert dn.execute("r", _steps_agent(journal, calls, fail_at=""), journal=journal) == "done"
    assert calls == ["a", "b", "c", "b", "c"]  # as the warning said


class _Notes:
    """An observer that keeps the runner's notes (what the panel shows above the steps)."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def on_step(self, entry, replayed) -> None:
        pass

    def on_record(self, record) -> None:
        pass

    def on_note(self, text: str) -> None:
        self.notes.append(text)


def test_a_heartbeat_that_cannot_renew_the_lease_says_so_and_goes_on(tmp_path):
    journal = _FailingJournal(tmp_path / "j")
    observer = _Notes()

    def handler(ctx):
        journal.fail_renew = True
        ctx.run("a", lambda: wait_until(lambda: observer.notes, what="a note", timeout=60))
        journal.fail_renew = False
        ctx.run("b", lambda: wait_until(lambda: observer.notes[-1] == "",
                                        what="the note cleared", timeout=60))
        return "ok"

    with pytest.warns(RuntimeWarning, match="Renewing the lease of run 'r' failed"):
        outcome = Runner("r", handler, journal=journal, observer=observer,
                         options=RunOptions(heartbeat_interval=0.05)).run()
    assert outcome.result == "ok"
    assert "No space left on device" in observer.notes[0] and observer.notes[-1] == ""


def test_a_notebook_watcher_that_must_stop_says_why_in_the_panel(tmp_path):
    from durable_nb.notebook.session import NotebookRun

    journal = DiskJournal(tmp_path / "j")
    agent = lambda ctx: ctx.approval("send", {"to": "team@example.com"}).approved  # noqa: E731
    session = NotebookRun("mail", agent, RunOptions(on_approval="park"), journal)
    try:
        assert session.start().status is Status.WAITING_APPROVAL
        journal._cache.set("run:mail", "{not json")  # the record, damaged under the watcher
        session.wake()
        assert session.wait(60)  # the watcher ended ...
    finally:
        session.stop()
    note = session.panel._note  # ... and said why, and what to do
    assert note.startswith("Stopped watching for a decision: CorruptEntry:"), note
    assert "Re-run the cell to resume the run" in note


# --- PostgreSQL: restarts and outages ------------------------------------------------------


@pytest.fixture(scope="module")
def own_server():
    """A PostgreSQL server of this module's own, to restart and stop."""
    from tests.postgres import PostgresServer, require_postgres

    server = PostgresServer(require_postgres()).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(own_server):
    return f"{own_server.url}?schema=t_{uuid.uuid4().hex[:12]}"


def _open(url: str, **kwargs) -> PostgresJournal:
    return PostgresJournal(url, **kwargs)


def _sessions(journal: PostgresJournal, count: int) -> None:
    """Make the journal's pool hold ``count`` connections (calls from threads at once)."""
    barrier = threading.Barrier(count)

    def hold() -> None:
        with journal._conn() as conn:
            conn.execute("SELECT 1")
            barrier.wait(30)

    threads = [threading.Thread(target=hold) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)


@pytest.mark.postgres
def test_postgres_a_run_with_steps_across_a_restart_executes_each_once(own_server, pg_url):
    journal = _open(pg_url)
    _sessions(journal, 3)  # idle pooled connections, all ended by the restart
    calls: list = []

    def handler(ctx):
        for i in range(6):
            def work(i=i):
                calls.append(i)
                if i == 2:
                    own_server.restart()
                return i
            ctx.run(f"step {i}", work)
        return "done"

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no degradation, no failed heartbeat
            assert dn.execute("r", handler, journal=journal) == "done"
        assert calls == [0, 1, 2, 3, 4, 5]
        record = journal.get_run("r")
        assert record.status is Status.DONE and record.journal_degraded_from is None
        assert [s.name for s in journal.steps("r")] == [f"step {i}" for i in range(6)]
    finally:
        journal.dispose()


@pytest.mark.postgres
def test_postgres_a_done_record_written_on_a_connection_the_server_ended_is_journaled(
        own_server, pg_url):
    journal = _open(pg_url)

    def handler(ctx):
        ctx.run("a", lambda: 1)
        with own_server.connect() as admin:  # the server ends the journal's idle sessions
            ended = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = 'durable_nb' AND pid <> pg_backend_pid()").fetchone()
        assert ended[0] >= 1
        return "done"  # the DONE record is the next write

    try:
        assert dn.execute("r", handler, journal=journal) == "done"
        assert journal.get_run("r").status is Status.DONE
    finally:
        journal.dispose()


@pytest.mark.postgres
def test_postgres_a_run_waiting_at_approval_gets_a_decision_given_after_a_restart(
        own_server, pg_url):
    journal = _open(pg_url)
    effects: list = []
    box: dict = {}

    def agent(ctx):
        decision = ctx.approval("send", {"to": "team@example.com"})
        if decision.approved:
            ctx.run("send", lambda: effects.append(decision.note) or "sent")
        return decision.approved

    def run() -> None:
        try:
            box["result"] = dn.execute("mail", agent, journal=journal)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            box["error"] = exc

    runner = threading.Thread(target=run)
    runner.start()
    other = _open(pg_url)
    try:
        wait_until(lambda: (r := other.find_run("mail")) is not None
                   and r.status is Status.WAITING_APPROVAL, what="the run to wait", timeout=60)
        wait_until(lambda: journal._listener is not None
                   and journal._listener.listening.is_set(),
                   what="the LISTEN connection", timeout=60)
        own_server.restart()
        dn.approve("mail", "after the restart", journal=other)
        runner.join(120)
    finally:
        other.dispose()
        journal.dispose()
    assert "error" not in box, box.get("error")
    assert box["result"] is True and effects == ["after the restart"]


@pytest.mark.postgres
def test_postgres_runs_works_on_the_first_try_after_a_restart(own_server, pg_url):
    journal = _open(pg_url)
    try:
        dn.execute("r", lambda ctx: ctx.run("a", lambda: 1), journal=journal)
        _sessions(journal, 4)
        own_server.restart()
        assert [info.run_id for info in dn.runs(journal=journal)] == ["r"]
        assert dn.get_run("r", journal=journal).status is Status.DONE
    finally:
        journal.dispose()


@pytest.mark.postgres
@pytest.mark.filterwarnings("ignore:durable_nb. Renewing the lease:RuntimeWarning")  # may beat
def test_postgres_a_server_that_stays_down_gives_a_short_error_in_bounded_time(
        own_server, pg_url):
    journal = _open(pg_url, retry_for=2.0, connect_timeout=1.0)
    calls: list = []

    def handler(ctx):
        ctx.run("a", lambda: calls.append("a"))

        def halt() -> None:
            calls.append("halt")
            if calls.count("halt") == 1:
                own_server.halt()

        ctx.run("halt", halt)
        ctx.run("b", lambda: calls.append("b"))
        return "done"

    try:
        began = time.monotonic()
        with pytest.raises(JournalWriteError) as stopped:
            dn.execute("r", handler, journal=journal)
        took = time.monotonic() - began
        cause = stopped.value.__cause__
        assert isinstance(cause, JournalUnavailable)
        assert "could not be reached for 2 s" in str(cause)
        assert cause.__cause__ is None and cause.__suppress_context__  # no psycopg chain
        # retry_for and a last wait for a connection (connect_timeout) for the step's write;
        # then one try each (the journal knows the server is down) for the FAILED record and
        # the lease's release, each at most connect_timeout; 1 s for everything else
        assert took < 2.0 + 3 * 1.0 + 1.0
        assert calls == ["a", "halt"]
        with pytest.raises(JournalUnavailable, match="could not be reached for 2 s"):
            journal.find_run("r")
    finally:
        own_server.resume()
    assert dn.execute("r", handler, journal=journal) == "done"
    assert calls == ["a", "halt", "halt", "b"]  # the step in flight again, a once
    journal.dispose()


@pytest.mark.postgres
def test_postgres_a_notebook_watcher_rides_over_a_restart_and_an_outage(own_server, pg_url):
    from durable_nb.notebook.session import NotebookRun

    journal = _open(pg_url, retry_for=1.0, connect_timeout=1.0)
    effects: list = []

    def agent(ctx):
        decision = ctx.approval("send", {"to": "team@example.com"})
        ctx.run("send", lambda: effects.append(decision.note) or "sent")
        return decision.approved

    options = RunOptions(title="mail", on_approval="park")
    session = NotebookRun("mail", agent, options, journal)
    other = _open(pg_url)
    try:
        assert session.start().status is Status.WAITING_APPROVAL
        own_server.restart()
        own_server.halt()  # down for longer than the journal's retry_for
        try:
            wait_until(lambda: "the journal cannot be read" in (session.panel._note or ""),
                       what="the watcher to say it cannot read the journal", timeout=60)
            assert session._watcher.is_alive()  # it goes on trying
        finally:
            own_server.resume()
        dn.approve("mail", "after the outage", journal=other)
        assert session.wait(120)
    finally:
        session.stop()
        other.dispose()
    assert journal.get_run("mail").status is Status.DONE and effects == ["after the outage"]
    assert session.panel._note == ""  # the outage note is gone
    journal.dispose()


@pytest.mark.postgres
def test_postgres_every_call_made_again_after_a_lost_reply_finds_its_own_work(pg_url):
    """What a retry after a reply lost with the connection does: the first call was
    committed, the second must neither fail nor write twice (the claim _retried rests on)."""
    from durable_nb.journal import StepEntry

    journal = _open(pg_url)
    try:
        holder = {"token": "t1", "pid": 1, "host": "h"}
        assert journal.create_run(RunRecord(run_id="r", created_at=1.0))
        assert not journal.create_run(RunRecord(run_id="r", created_at=1.0))  # re-read after
        for _ in range(2):  # a live holder's lease, taken again by its own token
            journal.acquire_lease("r", holder, holder_alive=lambda current: True)
        entry = StepEntry(position=0, key="0", name="a", kind="run", result=1)
        record = journal.get_run("r")
        for _ in range(2):
            journal.append_step("r", entry, record_json=record.to_json(), token="t1",
                                blobs={"d": "v"})
            journal.put_run(record, token="t1")
            journal.put_request("decision", "r", {"key": "0"})
            assert journal.renew_lease("r", "t1", 0.0)
        assert [e.name for e in journal.steps("r")] == ["a"]
        assert journal.get_request("decision", "r") == {"key": "0"}
        for _ in range(2):
            journal.delete_request("decision", "r")
            journal.release_lease("r", "t1")
        assert journal.lease("r") is None
    finally:
        journal.dispose()
