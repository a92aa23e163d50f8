"""Executing a run: lease, deadline, replay-or-run of every step, status transitions.

:func:`execute` is the entry point outside notebooks; the ``%%durable_agent`` magic uses
:class:`Runner` directly. The user's handler sees only a :class:`~durable_nb.context.Context`;
everything durable happens in :class:`~durable_nb.execution.Execution`.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import hashlib
import inspect
import json
import os
import sqlite3
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from . import serde
from .execution import attempts
from .context import Context
from .errors import (
    JournalError,
    JournalMismatch,
    JournalWriteError,
    ReplayDiverged,
    RunCancelled,
    RunExpired,
    RunLeased,
    SerializationError,
)
from .execution import (
    Execution,
    NullObserver,
    Observer,
    Restart,
    Suspend,
    enter,
    run_coroutine_here,
)
from .journal import (
    JournalSpec,
    RunRecord,
    Status,
    dropped_by_change,
    open_journal,
    rerun,
    rewind,
    staged_copies,
    this_host,
)
from .approvals.policy import starter_name
from .execution.lease import Lease
from .execution.live import forget_live, register_live
from .execution.events import RunFailed, snapshot
from .notify.notifier import Notifier
from .notify.start import for_run, sweep_once_in_background
from .options import RunOptions
from .redact import redact_source
from .telemetry import attempt_begun, traced
from .timestamps import format_time

__all__ = ["RunOptions", "RunOutcome", "Runner", "call_handler", "execute", "source_hash",
           "validate_run_id"]


@dataclass
class RunOutcome:
    """How one execution of a run ended: DONE with a result, parked WAITING_APPROVAL, or not."""

    record: RunRecord
    result: Any = None

    @property
    def status(self) -> Status:
        return self.record.status



class _Heartbeats:
    """One thread for the whole process: renews the lease of every run executing here (each
    at its own ``heartbeat_interval``) and picks up cancel requests other processes wrote. A
    batch of a hundred runs costs one thread, not a hundred."""

    def __init__(self) -> None:
        self._due: dict[Runner, tuple[Lease, float]] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None

    def add(self, runner: "Runner", lease: Lease) -> None:
        with self._lock:
            self._due[runner] = (lease, time.monotonic() + runner.options.heartbeat_interval)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True,
                                                name="durable-nb-heartbeat")
                self._thread.start()
            self._changed.notify()

    def remove(self, runner: "Runner") -> None:
        with self._lock:
            self._due.pop(runner, None)

    def _loop(self) -> None:
        while True:
            with self._lock:
                if not self._due:
                    self._thread = None
                    return
                now = time.monotonic()
                ready = [(r, lease) for r, (lease, due) in self._due.items() if due <= now]
                for runner, lease in ready:
                    self._due[runner] = (lease, now + runner.options.heartbeat_interval)
                if not ready:
                    self._changed.wait(min(due for _, due in self._due.values()) - now)
                    continue
            for runner, lease in ready:
                if not self._beat(runner, lease):
                    self.remove(runner)

    @staticmethod
    def _beat(runner: "Runner", lease: Lease) -> bool:
        """Renew one lease; False once it is lost (the run's next step stops it). A failure
        to reach the journal is tried again at the next beat, and said (see
        :meth:`Runner._heartbeat_failing`)."""
        execution = runner.execution
        try:
            if not lease.renew():
                if execution is not None:
                    execution.lease_lost = True
                return False
            if execution is not None and \
                    runner.journal.get_request("cancel", runner.run_id) is not None:
                execution.cancel_event.set()
                execution.wake_event.set()
        except Exception as exc:  # noqa: BLE001 - a transient error must not stop the heartbeat
            runner._heartbeat_failing(exc)
        else:
            runner._heartbeat_failing(None)
        return True


_heartbeats = _Heartbeats()


class Runner:
    """Executes one run to an outcome. Create one per execution attempt."""

    def __init__(self, run_id: str, handler: Callable[[Any], Any], *,
                 journal: JournalSpec = None, options: RunOptions | None = None,
                 observer: Observer | None = None, parent: Execution | None = None) -> None:
        validate_run_id(run_id)
        self.run_id = run_id
        self.handler = handler
        self.options = options or RunOptions()
        self.journal = open_journal(journal, durability=self.options.durability)
        # Traced (durable_nb.telemetry) here, so that every execution is, children too.
        self.observer = traced(observer or NullObserver(), run_id, self.journal)
        self.parent = parent
        # Where a request for approval is sent (a wrong configuration is refused here,
        # before the run starts).
        self._notify, self._notify_skip = for_run(self.journal, self.options.notify)
        self._notifier = Notifier(self.journal, self._notify, self._notify_skip)
        self.execution: Execution | None = None
        self._heartbeat_error: BaseException | None = None
        self._attempt: dict | None = None  # this execution's, in the record's attempts
        self._taken: RunRecord | None = None

    def load_or_create(self) -> RunRecord:
        """The run record, created if new, with this execution's options applied."""
        opts = self.options
        record = self.journal.find_run(self.run_id)
        if record is None:
            self._refuse_cut_short_copy()
            now = time.time()
            record = RunRecord(
                run_id=self.run_id, title=opts.title or "", created_at=now, updated_at=now,
                deadline=now + opts.timeout if opts.timeout else None,
                max_iterations=opts.max_iterations, max_tokens=opts.max_tokens,
                max_cost=opts.max_cost,
                parent=self.parent.run_id if self.parent else None,
                # Journaled, copied and exported: without the secrets written in the cell.
                # The hash is of the cell as written, to tell an edited cell.
                source=redact_source(opts.source) if opts.source is not None else None,
                source_hash=source_hash(opts.source) if opts.source is not None else None,
                notebook=opts.notebook, cell_id=opts.cell_id,
                started_by=(self.parent.record.started_by if self.parent else None)
                or starter_name())
            if not self.journal.create_run(record):
                record = self.journal.get_run(self.run_id)
        if opts.max_iterations is not None:
            record.max_iterations = opts.max_iterations
        if opts.max_tokens is not None:
            record.max_tokens = opts.max_tokens
        if opts.max_cost is not None:
            record.max_cost = opts.max_cost
        if opts.title:
            record.title = opts.title
        return record

    def _refuse_cut_short_copy(self) -> None:
        """A new run where a copy of it was cut short would execute every step again (the
        emails the copied run sent, sent twice): refused, with how to finish the copy."""
        cut_short = staged_copies(self.journal, self.run_id)
        if cut_short:
            staged = cut_short[0]
            raise JournalError(
                f"run {self.run_id!r} is not in the journal at {self.journal.location}, but "
                f"a copy of it to here was cut short: executing it would start it anew and "
                f"execute every step again. Copy it again (durable-nb copy {self.run_id} "
                f"--from SOURCE --to {self.journal.location}; the new copy replaces what the "
                f"cut-short one left), or delete the staged run to start a new run "
                f"(durable-nb delete '{staged.run_id}'). The staged run: {staged.error}")

    def run(self) -> RunOutcome:
        """Execute (resume, or replay a DONE run) until DONE, parked, or failed.

        Raises what the handler raised (the run is then FAILED, CANCELLED or left DONE), and
        :class:`RunExpired` / :class:`RunLeased` before anything runs.
        """
        record = self.load_or_create()
        if record.status is not Status.DONE and record.deadline is not None \
                and time.time() > record.deadline:
            record.status = Status.FAILED
            record.error = (f"expired on resume: the deadline {format_time(record.deadline)} "
                            f"passed before the run finished")
            self.journal.put_run(record)
            raise RunExpired(f"run {self.run_id!r} {record.error}; it is marked FAILED and will "
                             f"not resume. Start a new run id for a new attempt.")
        lease = Lease.acquire(self.journal, self.run_id, self.options.stale_after)
        try:
            # The run as this execution takes it: what a fork keeps if a step changed.
            self._taken = (RunRecord.from_json(record.to_json())
                           if self.options.on_change == "rerun" else None)
            self._prepare(record, lease.token)
            _heartbeats.add(self, lease)
            fork_id: str | None = None
            while True:
                execution = self._start(record, lease.token)
                try:
                    outcome = self._drive(execution)
                except Restart:
                    self._note_rerun(execution)
                    fork_id = self._rerun_from(execution, fork_id)
                    continue
                if outcome.status is Status.DONE and execution.live_steps \
                        and self.options.verify_replay \
                        and outcome.record.journal_degraded_from is None:
                    self._verify(outcome, lease.token)
                return outcome
        finally:
            _heartbeats.remove(self)
            forget_live(self.run_id, self.execution)
            try:
                lease.release()
            except (OSError, sqlite3.Error, JournalError):
                pass  # a dead lease is taken over by the next executor anyway

    def _prepare(self, record: RunRecord, token: str) -> None:
        self.journal.delete_request("cancel", self.run_id)
        self._retry_failed_steps(record, token)
        if record.status is not Status.DONE:
            record.status = Status.WAITING_APPROVAL if record.pending_approval else Status.RUNNING
            record.error = None
            record.failed_step = None
        record.owner = {"pid": os.getpid(), "host": this_host()}
        self._begin_attempt(record)
        self.journal.put_run(record, token=token)
        # The view shows this execution from now on, not the status an earlier one left.
        self.observer.on_record(record)

    # -- attempts (durable_nb.execution.attempts) ---------------------------------------------------

    def _begin_attempt(self, record: RunRecord) -> None:
        """Open this execution's attempt on the record (not for a DONE run, which only
        replays; one reopened by a changed step gets its attempt then)."""
        self._attempt = None
        if record.status is Status.DONE:
            return
        source = self.options.source
        # The record's step count lags behind the journal after a crash.
        size = self.journal.count_steps(self.run_id, record.step_count)
        # The code an attempt keeps is journaled redacted, as the record's own source is.
        self._attempt = attempts.begin(
            record, size, redact_source(source) if source is not None else None,
            source_hash(source) if source is not None else None, journal_size=size)
        # Its span's ids go in it; the spans of an attempt that died are sent again.
        attempt_begun(self.observer, record, self._attempt, self.journal)

    def _note_rerun(self, execution: Execution) -> None:
        position = execution.restart_from or 0
        with execution.lock:
            if self._attempt is None:  # a DONE run reopened: this execution is an attempt
                execution.record.status = Status.RUNNING
                self._begin_attempt(execution.record)
            attempts.note_rerun(self._attempt, position, execution.live_steps)

    def _end_attempt(self, execution: Execution, error: BaseException | None) -> None:
        """Close this execution's attempt on the record, which the caller writes with the
        run's new status (if that write fails, the next attempt closes it as died)."""
        attempt = self._attempt
        if attempt is None or attempt.get("end") is not None:
            return
        record = execution.record
        end = attempts.end_of(record.status, error, execution.interrupted)
        with execution.lock:
            attempts.finish(attempt, end, execution.writer.next_position,
                            execution.replay_log.taken, execution.live_steps,
                            record.error if error is not None else None)
        if end == "interrupted":
            attempts.note_interrupted(self.journal, self.run_id, attempt["n"])

    def _retry_failed_steps(self, record: RunRecord, token: str) -> None:
        """The steps a resume tries again (:func:`attempts.steps_to_retry`): entries at the
        end of the journal are removed; earlier ones (concurrent steps finished after them)
        are marked for replay to skip."""
        retry = attempts.steps_to_retry(self.journal, record)
        if not retry:
            return
        count = self.journal.count_steps(self.run_id, record.step_count)
        while retry and retry[-1] == count - 1:
            count -= 1
            self.journal.truncate(self.run_id, retry.pop(), token=token)
        record.step_count = count
        if retry:
            record.retried_steps = sorted({*(record.retried_steps or ()), *retry})

    def _start(self, record: RunRecord, token: str, *, strict: bool = False) -> Execution:
        execution = Execution(self.journal, record, self.options,
                              NullObserver() if strict else self.observer, token=token,
                              start_child=self._start_child, parent=self.parent, strict=strict)
        if not strict:
            self.execution = execution
            register_live(self.run_id, execution)
            if self._notifier.listens:
                execution.listener = self._notifier
                execution.notify_choice = self._notifier.choice
            # Once per journal and process: the journal's channels, not this run's own
            # choice (``notify=``), send other runs' requests; deadlines due are applied.
            sweep_once_in_background(self.journal, exclude=self.run_id)
        return execution

    def _call_handler(self, execution: Execution) -> Any:
        return call_handler(self.handler, execution)

    def _drive(self, execution: Execution) -> RunOutcome:
        record = execution.record
        try:
            value = self._call_handler(execution)
        except Suspend:
            record.status = Status.WAITING_APPROVAL
            self._end_attempt(execution, None)
            execution.save_record()
            if self.parent is not None:
                raise
            return RunOutcome(record)
        except Restart:
            raise
        except BaseException as exc:
            if record.status is not Status.DONE:  # a failed replay leaves a DONE run DONE
                self._fail(execution, exc)
            raise
        if record.status is Status.DONE:
            execution.check_all_replayed()  # a DONE run stays DONE if it raises
            return RunOutcome(record, value)
        if execution.cancel_event.is_set():
            exc = RunCancelled(f"run {self.run_id!r} was cancelled; its journal is intact.")
            self._fail(execution, exc)
            raise exc
        if execution.budget_failure is not None:
            self._fail(execution, execution.budget_failure)
            raise execution.budget_failure
        if execution.writer.failure is not None:  # the handler caught it and returned
            self._fail(execution, execution.writer.failure)
            raise execution.writer.failure
        if not execution.parking:  # a run that parks took fewer steps on purpose
            try:
                execution.check_all_replayed()
            except JournalMismatch as exc:
                self._fail(execution, exc)
                raise
        try:
            record.result = serde.encode(value)
        except SerializationError as exc:
            err = SerializationError(f"run {self.run_id!r} finished, but its result cannot be "
                                     f"journaled: {exc}. Return JSON data or a pydantic model.")
            self._fail(execution, err)
            raise err from None
        record.status = Status.DONE
        record.pending_approval = None
        record.finished_at = time.time()
        self._end_attempt(execution, None)
        execution.save_record()
        return RunOutcome(record, value)

    def _fail(self, execution: Execution, exc: BaseException) -> None:
        record = execution.record
        if isinstance(exc, RunLeased):
            return  # someone else owns the record now
        if execution.interrupted:
            exc = KeyboardInterrupt()
        if not isinstance(exc, KeyboardInterrupt) and (
                isinstance(exc, RunCancelled) or execution.cancel_event.is_set()):
            record.status = Status.CANCELLED
            record.error = str(exc) if isinstance(exc, RunCancelled) else "cancelled"
        else:
            record.status = Status.FAILED
            if isinstance(exc, KeyboardInterrupt):
                record.error = (f"interrupted at step {execution.writer.next_position}; "
                                f"execute the run again to resume")
            else:
                record.error = f"{type(exc).__name__}: {exc}"
            record.failed_step = _failed_step(execution, exc)
        self._end_attempt(execution, exc)
        try:
            execution.save_record()
            if record.status is Status.FAILED and execution.listener is not None:
                execution.listener.on_event(RunFailed(snapshot(record)))
        except RunLeased:
            pass
        except JournalWriteError as failed:
            # What stopped the run is raised, not this: the run stays as the journal last
            # held it (not DONE), and resumes from there when executed again.
            if not isinstance(exc, JournalWriteError):  # else the error raised says it all
                warnings.warn(f"durable_nb: run {self.run_id!r} stopped ({record.error}); "
                              f"marking it {record.status} in the journal failed too, so it "
                              f"resumes from the journal as it was: {failed}",
                              RuntimeWarning, stacklevel=4)

    def _heartbeat_failing(self, exc: BaseException | None) -> None:
        """Say when renewing the lease starts failing (``exc``), in the panel and as a
        warning, and clear the panel's note when it works again."""
        if (exc is None) == (self._heartbeat_error is None):
            return
        self._heartbeat_error = exc
        note = getattr(self.observer, "on_note", None)
        if exc is None:
            if note is not None:
                note("")
            return
        text = (f"Renewing the lease of run {self.run_id!r} failed ({exc}); it is tried again "
                f"every {self.options.heartbeat_interval:g} s. Should it fail for "
                f"{self.options.stale_after:g} s, another executor may take the run over, and "
                f"this one stops at its next step.")
        warnings.warn(f"durable_nb: {text}", RuntimeWarning, stacklevel=2)
        if note is not None:
            note(text)

    def _rerun_from(self, execution: Execution, fork_id: str | None) -> str:
        """After a step changed (``on_change="rerun"``): keep the run as this execution took
        it as a fork (unless this execution kept one already: ``fork_id``), drop the entries
        the changed step invalidates (by key and scope,
        :func:`~durable_nb.journal.dropped_by_change`: the unchanged steps of tasks that
        existed before it stay and replay), and go on from there - all under this
        execution's lease token. Returns the fork's id."""
        record = execution.record
        position = execution.restart_from or 0
        execution.writer.flush()
        entries = list(self.journal.steps(self.run_id))
        dropped = None
        if position < execution.replay_log.size:  # a journaled step changed
            dropped = dropped_by_change(entries, entries[position],
                                        live_from=execution.replay_log.size)
            kept = [e for e in entries if not dropped(e.key, e.position)]
        else:  # a new step after the end of a DONE run: every step stays, the run reopens
            kept = entries
        token = execution.writer.token
        if fork_id is None:  # the first execution: the fork is the run as it took it
            fork_id = rerun(self.journal, record, kept, position, token=token,
                            child_dropped=dropped, as_taken=self._taken,
                            taken_steps=execution.replay_log.size)
        else:  # a second change in this execution: the run as it was is in the fork already
            rewind(self.journal, record, kept, token=token, child_dropped=dropped)
        note = getattr(self.observer, "on_note", None)
        if note is not None:
            replayed = ("no step is replayed" if not kept else
                        "1 step it does not affect is replayed" if len(kept) == 1 else
                        f"{len(kept)} steps it does not affect are replayed")
            note(f"Executing again from step {position}; {replayed}. The run as it was is "
                 f"kept as {fork_id!r}.")
        return fork_id

    def _verify(self, outcome: RunOutcome, token: str) -> None:
        """Execute the handler once more in pure replay; ReplayDiverged on any difference."""
        record = RunRecord.from_json(outcome.record.to_json())
        verifier = self._start(record, token, strict=True)
        value = self._call_handler(verifier)
        verifier.check_all_replayed()
        if _canonical_json(serde.encode(value)) != _canonical_json(outcome.record.result):
            raise ReplayDiverged(
                f"run {self.run_id!r}: a pure replay returned another result than the first "
                f"execution: the code computes its result from something outside ctx.")

    def _start_child(self, child_id: str, title: str, fn: Callable[..., Any], args: tuple,
                     kwargs: dict, parent: Execution) -> tuple[Any, RunRecord]:
        deadline = parent.record.deadline
        options = dataclasses.replace(
            self.options, title=title, source=None, max_iterations=None,
            timeout=None if deadline is None else deadline - time.time())
        runner = Runner(child_id, lambda child_ctx: fn(child_ctx, *args, **kwargs),
                        journal=self.journal, options=options, observer=self.observer,
                        parent=parent)
        outcome = runner.run()
        return outcome.result, outcome.record


def _failed_step(execution: Execution, exc: BaseException) -> int | None:
    """The position of the innermost step whose failure failed the run with ``exc``; the
    steps around it that it failed on their way out are tried again with it on resume.

    Found along the chain of causes of ``exc`` (``raise AppError(...) from err``, or raised
    while handling ``err``), not by identity alone: the first step failure in the chain, then
    failures deeper in it as long as they come from steps nested in that one (an outer step
    that wrapped its inner step's failure). A deeper failure of a step outside it was handled
    before (the failing step ran in its ``except``): not a cause to try again."""
    found: tuple[int, str] | None = None
    seen = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        steps = [(position, key) for position, key, error in execution.failures
                 if error is link]
        if steps:
            position, key = min(steps)  # the same exception re-raised by enclosing steps
            if found is not None and not key.startswith(found[1] + "."):
                break
            found = (position, key)
        link = link.__cause__ or link.__context__
    return found[0] if found is not None else None


def _canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True)


def call_handler(handler: Callable[[Any], Any], execution: Execution) -> Any:
    """``handler(ctx)``'s value for ``execution``, run in a context where the execution's
    root scope is current (an async handler on an event loop of its own)."""
    context = contextvars.copy_context()
    context.run(enter, execution.root)
    try:
        value = context.run(handler, Context(execution))
        if inspect.iscoroutine(value):
            value = _await_handler(value, execution, context)
        return value
    finally:
        execution.finished = True


def _await_handler(coroutine: Any, execution: Execution, context: contextvars.Context) -> Any:
    """Run an async handler to completion: here if no event loop runs in this thread, else
    (a notebook cell: the kernel's loop is running) on a thread of its own, while this one
    waits; an interrupt while waiting stops the run at its next step."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return context.run(run_coroutine_here, coroutine, execution.root)
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = context.run(run_coroutine_here, coroutine, execution.root)
        except BaseException as exc:
            box["error"] = exc

    worker = threading.Thread(target=run, name=f"durable-nb-async-{execution.run_id}")
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.1)
    except KeyboardInterrupt:
        execution.interrupted = True
        execution.cancel_event.set()
        execution.wake_event.set()
        worker.join()
        raise
    if "error" in box:
        raise box["error"]
    return box["value"]


def validate_run_id(run_id: str) -> None:
    """Run ids are 1-200 printable characters without whitespace."""
    if not isinstance(run_id, str) or not run_id or len(run_id) > 200 \
            or any(c.isspace() or not c.isprintable() for c in run_id):
        raise ValueError(f"invalid run id {run_id!r}: use 1-200 printable characters without "
                         f"spaces, e.g. 'sales-report-1'")


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def execute(run_id: str, handler: Callable[[Any], Any], *, title: str | None = None,
            timeout: float | None = None, max_iterations: int | None = None,
            max_tokens: int | None = None, journal: JournalSpec = None,
            **options: Any) -> Any:
    """Execute ``handler(ctx)`` as the durable run ``run_id`` and return its result.

    The first call runs it; a later call with the same id resumes it (completed steps are
    answered from the journal, execution goes on at the first step that never finished) or,
    for a DONE run, replays it without executing any step. Approvals wait for a decision
    from any process. Raises what the handler raised; the run is then FAILED (resumable by
    calling again, unless it expired) or CANCELLED. The result is returned once the journal
    holds the run DONE; a journal write that fails raises
    :class:`~durable_nb.errors.JournalWriteError` (with ``on_journal_error="continue"`` the
    result comes back all the same, with a warning that the run is not durable).

    Further keyword options are those of :class:`RunOptions` (``on_change="rerun"``,
    ``on_journal_error="continue"``, ``client=``, ``model=``, ``verify_replay=``, who may
    decide its approvals: ``approvers=["ana"]``, ``four_eyes=True`` ...).
    """
    opts = RunOptions(title=title, timeout=timeout, max_iterations=max_iterations,
                      max_tokens=max_tokens, **options)
    outcome = Runner(run_id, handler, journal=journal, options=opts).run()
    return outcome.result
