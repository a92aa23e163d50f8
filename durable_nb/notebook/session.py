"""Running a cell's run inside a kernel, with its panel and the watcher that resumes it.

The cell runs on the kernel's main thread, so prints, the stop button (KeyboardInterrupt) and
headless execution behave as in any cell; a widget click does not reach it there on every
ipykernel, so its panel shows what stops it instead of a Cancel button. When the run reaches an
approval nobody has decided yet, it *parks*: the run is left WAITING_APPROVAL, the cell ends,
and the panel shows the buttons. The kernel is then idle, so a click reaches it on every
ipykernel version (6.x has no subshells, 7.4 routes widget messages to the main shell). A
watcher thread waits for the decision (a click, ``durable-nb approve`` or another notebook: all
go through the journal) and resumes the run on that thread by executing it again: completed
steps replay from the journal in microseconds and the loop goes on after the approval, with the
same panel live. The watcher never ends unseen: while the journal cannot be read it says so in
the panel and keeps trying; any other error that ends it is shown there with what to do.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

from .. import registry
from ..journal import Journal, JournalSpec, RunRecord, Status, open_journal, this_host
from ..errors import DecisionNeeded, JournalError, RunLeased
from ..approvals.request import applies, decision_kind, find_decision
from ..approvals.policy import deadline_of
from ..approvals.tick import apply_deadline, write_escalation
from .extensions import missing_extensions
from .panel import RunPanel
from ..execution.live import live_execution
from ..runner import RunOptions, RunOutcome, Runner
from .output import CellDisplays, route_output
from .watchers import RUN_WATCHERS

__all__ = ["NotebookRun", "active_run", "stop_for_decision"]

# RUN_WATCHERS.lock is re-entrant (fix): start() holds it while stopping the cell's previous
# NotebookRun, whose stop() takes it too; a plain Lock deadlocked every re-run of a cell.


def active_run(run_id: str) -> "NotebookRun | None":
    return RUN_WATCHERS.get(run_id)


class NotebookRun:
    """One ``%%durable_agent`` cell's run in this kernel: its panel, and the watcher that
    resumes it after an approval."""

    def __init__(self, run_id: str, handler: Callable[[Any], Any], options: RunOptions,
                 journal: Journal) -> None:
        self.run_id = run_id
        self.handler = handler
        self.options = options
        self.journal = journal
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._watcher: threading.Thread | None = None
        self._waiting_for: tuple[str, dict, float | None] = (run_id, {}, None)
        self._displays: CellDisplays | None = None
        self.executing = False
        record = journal.find_run(run_id) or RunRecord(run_id=run_id, title=options.title or "")
        missing = missing_extensions()
        self.panel = RunPanel(record, on_decide=self.decide, on_cancel=self.cancel, answers=True,
                              journal=journal, starting=True,
                              setup_html=missing.html() if missing else "")

    def show(self) -> None:
        """Display the panel under the cell, and its saved view (:class:`CellDisplays`)."""
        self._displays = CellDisplays(self.panel)

    def refresh_display(self) -> None:
        """Send the panel's display and its saved view again: its text/plain summary (what
        nbclient, papermill and nbconvert keep) and the saved view (what a reopened notebook
        shows) then tell the run's latest state."""
        if self._displays is not None:
            self._displays.update()

    # -- the cell ----------------------------------------------------------------------

    def start(self) -> RunOutcome:
        """Execute in the calling (main) thread; park and watch if an approval is pending."""
        self._wait_for_ending(active_run(self.run_id))
        with RUN_WATCHERS.lock:
            previous = RUN_WATCHERS.get(self.run_id)
            if previous is not None and previous.executing:
                raise RunLeased(
                    self.run_id, {"pid": os.getpid(), "host": this_host()},
                    advice=(f"this kernel resumed it in the background after an approval. "
                            f"Wait for it with `%durable wait {self.run_id}` or stop it with "
                            f"the panel's Cancel button, then re-run the cell."))
            if previous is not None:
                previous.stop()
            RUN_WATCHERS.put(self.run_id, self)
        try:
            outcome = self._execute(foreground=True)
        finally:
            self.refresh_display()
        if outcome.status is Status.WAITING_APPROVAL:
            self._watch()
        return outcome

    def _wait_for_ending(self, previous: "NotebookRun | None") -> None:
        """Wait (up to ``stale_after`` seconds) for this kernel's background execution of the run
        when the journal says it finished: the panel shows DONE as soon as the journal does, and
        the execution ends a moment later (its lease released, its replay checked), so a cell
        run again in that moment (Run All right after a click) follows it instead of failing.
        One still running is not waited for: :meth:`start` says how to wait for it or stop it."""
        if previous is None or not previous.executing:
            return
        record = self.journal.find_run(self.run_id)
        if record is None or record.status not in (Status.DONE, Status.FAILED, Status.CANCELLED):
            return
        print(f"run {self.run_id!r} finished in the background after its approval; waiting for "
              f"that execution to end", flush=True)
        previous.wait(self.options.stale_after)

    def _execute(self, foreground: bool = False) -> RunOutcome:
        # In the foreground the prints go to the cell's output, as in any cell; in the
        # background (after an approval) there is no cell to print to: the panel's log has them.
        restore = None if foreground else route_output(self.panel.append_log)
        self.executing = True
        # A click cannot reach a busy cell's kernel on every ipykernel: the panel says what
        # stops the run rather than showing a Cancel button that might do nothing.
        self.panel.executing_in_cell(foreground)
        try:
            outcome = Runner(self.run_id, self.handler, journal=self.journal,
                             options=self.options, observer=self.panel).run()
        except BaseException as exc:
            try:
                record = self.journal.find_run(self.run_id)
            except (JournalError, OSError):
                record = self.panel.record  # the journal is what failed: the panel keeps it
            # In the foreground the cell shows the error right below the panel.
            if record is None:  # refused before it started: there is no run to show
                self.panel.show_refusal(exc, shown_below=foreground)
                raise
            self.panel.on_record(record)
            self.panel.show_result(error=exc, shown_below=foreground)
            raise
        finally:
            self.executing = False
            self.panel.executing_in_cell(False)
            if restore is not None:
                restore()
        self.panel.on_record(outcome.record)
        if outcome.status is Status.DONE:
            # In the foreground the result is the cell's value, shown right below.
            self.panel.show_result(outcome.result, shown_below=foreground)
        return outcome

    # -- after the cell: the watcher ---------------------------------------------------

    def _watch(self) -> None:
        self._watcher = threading.Thread(target=self._watch_loop, daemon=True,
                                         name=f"durable-nb-watch-{self.run_id}")
        self._watcher.start()

    def _decided(self) -> bool | None:
        """True when the pending approval has a decision, False while it waits, None when
        the run no longer waits (cancelled, or resumed elsewhere)."""
        record = self.journal.find_run(self.run_id)
        if record is None or record.status is not Status.WAITING_APPROVAL \
                or not record.pending_approval:
            return None
        pending = record.pending_approval
        target = pending.get("run_id", self.run_id)
        # Its deadline's policy decides here like anywhere else; the run resumes and takes it.
        applied = apply_deadline(self.journal, target, pending)
        if applied is not None and applied[0] == "decided":
            return True
        if applied is not None:
            pending = applied[1]
            write_escalation(self.journal, record, pending)
        self._waiting_for = (target, pending, deadline_of(pending))
        return find_decision(self.journal, target, pending) is not None

    def _wait_for_decision(self) -> None:
        """Wait until the pending approval may have a decision, or the run changed: the
        journal tells of a decision or cancel given anywhere
        (:meth:`~durable_nb.journal.Journal.wait_for_request`: PostgreSQL's NOTIFY; the disk
        journal is read every ``2 x poll_interval``); a click here sets ``_wake``. A journal
        that notifies is read again at least every ``max(2 x poll_interval, stale_after)``
        seconds (a run resumed elsewhere sends no notification)."""
        target, pending, timeout_at = self._waiting_for
        poll = self.options.poll_interval * 2
        wait = max(poll, self.options.stale_after) if self.journal.notifies else poll
        if timeout_at is not None:
            wait = max(0.0, min(wait, timeout_at - time.time()))
        self.journal.wait_for_request(decision_kind(pending), target, wait,
                                      accept=lambda decision: applies(decision, pending),
                                      wake=self._wake, poll_interval=poll)
        self._wake.clear()

    def _watch_loop(self) -> None:
        unreachable = False
        while not self._stopped.is_set():
            try:
                decided = self._decided()
                if decided is None:  # cancelled, or resumed elsewhere: the saved view says so
                    self.panel.on_record(self.journal.get_run(self.run_id))
                    self.refresh_display()
                    return
                if not decided:
                    self._wait_for_decision()
            except OSError as exc:  # the journal cannot be read now (DatabaseError is one)
                unreachable = True
                self.panel.on_note(
                    f"Watching for a decision: the journal cannot be read ({exc}). Trying "
                    f"again; the run resumes once a decision can be read.")
                self._stopped.wait(max(1.0, self.options.poll_interval * 2))
                continue
            except BaseException as exc:
                self.panel.on_note(
                    f"Stopped watching for a decision: {type(exc).__name__}: {exc}. Re-run the "
                    f"cell to resume the run (it is parked in the journal).")
                self.refresh_display()
                return
            if unreachable:
                unreachable = False
                self.panel.on_note("")
            if not decided:
                continue
            try:
                outcome = self._execute()
            except BaseException:  # shown in the panel (badge, error) by _execute
                self.refresh_display()
                return
            if outcome.status is not Status.WAITING_APPROVAL:
                self.refresh_display()
                return

    def wake(self) -> None:
        """Look for a decision now rather than at the next poll."""
        self._wake.set()

    def stop(self) -> None:
        """Stop watching (the run stays parked in the journal)."""
        self._stopped.set()
        self._wake.set()
        RUN_WATCHERS.forget(self.run_id, self)

    # -- buttons -----------------------------------------------------------------------

    def decide(self, approved: bool, note: str, digest: str | None,
               request_id: str | None = None, **content: Any) -> None:
        """The panel's Approve / Reject of the request it shows (``digest``, ``request_id``):
        written once (DecisionExists, shown by the panel, when the request was decided
        already); ``content``: the edited ``args``, the ``message`` for the model, or the
        ``answer`` to a server's question."""
        decide = registry.approve if approved else registry.reject
        decide(self.run_id, note or None, by=f"{registry.approver_name(host=False)} (notebook)",
               expect=digest, request_id=request_id, via="panel", journal=self.journal,
               **content)
        self._wake.set()

    def cancel(self) -> None:
        registry.cancel(self.run_id, journal=self.journal)
        self._wake.set()
        if live_execution(self.run_id) is None:
            self.panel.on_record(self.journal.get_run(self.run_id))

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the watcher (a resumed run) to finish; False on timeout."""
        if self._watcher is None:
            return True
        self._watcher.join(timeout)
        return not self._watcher.is_alive()




def stop_for_decision(run_id: str, *, journal: JournalSpec = None) -> None:
    """Stop the notebook here (Run All halts) while ``run_id`` waits for a decision nobody
    gave yet, with one line saying what to do; return at once otherwise (decided, or the
    run waits for nothing: a second Run All goes through)."""
    journal = open_journal(journal)
    record = journal.find_run(run_id)
    pending = record.pending_approval if record is not None else None
    if record is None or record.status is not Status.WAITING_APPROVAL or not pending:
        return
    if find_decision(journal, pending.get("run_id", run_id), pending) is not None:
        return  # decided; the run resumes in the background
    raise DecisionNeeded(
        f"run {run_id!r} waits for your decision on {pending.get('name')!r}: click Approve or "
        f"Reject above, then run the next cell (or decide from a terminal: durable-nb "
        f"approve {run_id})")
