"""Executing a run: lease, deadline, replay-or-run of every step, status transitions.

:func:`execute` is the entry point outside notebooks; the ``%%durable_agent`` magic uses
:class:`Runner` directly. The user's handler sees only a :class:`~durable_nb.context.Context`;
everything durable happens in :meth:`~durable_nb.execution.Execution.step`.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import inspect
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Literal

from . import serde
from .errors import JournalError, RunCancelled, RunExpired, RunLeased, SerializationError
from .execution import Execution, Observer, _Suspend
from .journal import Journal, RunRecord, Status, StepEntry, open_journal, this_host
from .lease import DEFAULT_STALE_AFTER, Lease

__all__ = ["RunOptions", "RunOutcome", "Runner", "execute", "live_execution"]

OnMismatch = Literal["error", "reset"]
OnJournalError = Literal["continue", "stop"]
OnApproval = Literal["wait", "park"]


class _NullObserver:
    def on_step(self, entry: StepEntry, replayed: bool) -> None:
        pass

    def on_record(self, record: RunRecord) -> None:
        pass


@dataclass
class RunOptions:
    """How a run executes. ``timeout`` counts from the run's creation and is fixed then;
    budgets given on a later execution replace the stored ones (raise them to go on)."""

    title: str | None = None
    timeout: float | None = None
    max_iterations: int | None = None
    max_tokens: int | None = None
    on_approval: OnApproval = "wait"
    on_mismatch: OnMismatch = "error"
    on_journal_error: OnJournalError = "continue"
    poll_interval: float = 0.1
    heartbeat_interval: float = 2.0
    stale_after: float = DEFAULT_STALE_AFTER
    source: str | None = None
    model: str | None = None
    client: Any = None
    context_windows: dict[str, int] | None = None


@dataclass
class RunOutcome:
    """How one execution of a run ended: DONE with a result, parked WAITING_APPROVAL, or not."""

    record: RunRecord
    result: Any = None

    @property
    def status(self) -> Status:
        return self.record.status


# Runs executing in this process, so that cancel() and approvals reach them without polling.
_live: dict[str, "Execution"] = {}
_live_lock = threading.Lock()


def live_execution(run_id: str) -> "Execution | None":
    with _live_lock:
        return _live.get(run_id)


class _Heartbeat(threading.Thread):
    """Renews the lease and picks up cancel requests written by other processes."""

    def __init__(self, execution: Execution, lease: Lease) -> None:
        super().__init__(name=f"durable-nb-heartbeat-{execution.run_id}", daemon=True)
        self.execution = execution
        self.lease = lease
        self.stopped = threading.Event()

    def run(self) -> None:
        ex = self.execution
        try:
            while not self.stopped.wait(ex.options.heartbeat_interval):
                try:
                    if not self.lease.renew():
                        ex.lease_lost = True
                        return
                    if ex.journal.read_json(f"cancel:{ex.run_id}") is not None:
                        ex.cancel_event.set()
                        ex.wake_event.set()
                except Exception:  # a transient disk error must not kill the heartbeat
                    continue
        finally:
            ex.journal.close()  # this thread's connection (and its hold on the WAL)


class Runner:
    """Executes one run to an outcome. Create one per execution attempt."""

    def __init__(self, run_id: str, handler: Callable[[Any], Any], *,
                 journal: Journal | str | None = None, options: RunOptions | None = None,
                 observer: Observer | None = None, parent: str | None = None) -> None:
        validate_run_id(run_id)
        self.run_id = run_id
        self.handler = handler
        self.journal = open_journal(journal)
        self.options = options or RunOptions()
        self.observer = observer or _NullObserver()
        self.parent = parent
        self.parent_execution: Execution | None = None
        self.execution: Execution | None = None

    def load_or_create(self) -> RunRecord:
        """The run record, created if new, with this execution's options applied."""
        opts = self.options
        record = self.journal.find_run(self.run_id)
        if record is None:
            now = time.time()
            record = RunRecord(
                run_id=self.run_id, title=opts.title or "", created_at=now, updated_at=now,
                deadline=now + opts.timeout if opts.timeout else None,
                max_iterations=opts.max_iterations, max_tokens=opts.max_tokens,
                parent=self.parent, source=opts.source,
                source_hash=source_hash(opts.source) if opts.source is not None else None)
            if not self.journal.create_run(record):
                record = self.journal.get_run(self.run_id)
        if opts.max_iterations is not None:
            record.max_iterations = opts.max_iterations
        if opts.max_tokens is not None:
            record.max_tokens = opts.max_tokens
        if opts.title:
            record.title = opts.title
        return record

    def run(self) -> RunOutcome:
        """Execute (resume, or replay a DONE run) until DONE, parked, or failed.

        Raises what the handler raised (the run is then FAILED, CANCELLED or left DONE), and
        :class:`RunExpired` / :class:`RunLeased` before anything runs.
        """
        record = self.load_or_create()
        if record.status is not Status.DONE and record.deadline is not None \
                and time.time() > record.deadline:
            record.status = Status.FAILED
            record.error = (f"expired on resume: the deadline {time.ctime(record.deadline)} "
                            f"passed before the run finished")
            self.journal.put_run(record)
            raise RunExpired(f"run {self.run_id!r} {record.error}; it is marked FAILED and will "
                             f"not resume. Start a new run id for a new attempt.")
        lease = Lease.acquire(self.journal, self.run_id, self.options.stale_after)
        execution = Execution(self.journal, record, self.options, self.observer)
        execution.parent_execution = self.parent_execution
        self.execution = execution
        heartbeat = _Heartbeat(execution, lease)
        with _live_lock:
            _live[self.run_id] = execution
        try:
            self._prepare(execution)
            heartbeat.start()
            return self._drive(execution)
        finally:
            heartbeat.stopped.set()
            with _live_lock:
                _live.pop(self.run_id, None)
            try:
                lease.release()
            except (OSError, sqlite3.Error, JournalError):
                pass  # a dead lease is taken over by the next executor anyway

    def _prepare(self, execution: Execution) -> None:
        record = execution.record
        self.journal.delete_key(f"cancel:{self.run_id}")
        # A step whose unhandled failure failed the run is tried again on resume, unless the
        # step declared it terminal.
        if record.status is Status.FAILED and record.failed_step is not None:
            entry = self.journal.get_step(self.run_id, record.failed_step)
            if entry is not None and not entry.ok and not (entry.error or {}).get("terminal") \
                    and self.journal.get_step(self.run_id, record.failed_step + 1) is None:
                self.journal.truncate(self.run_id, record.failed_step)
        if record.status is not Status.DONE:
            record.status = Status.WAITING_APPROVAL if record.pending_approval else Status.RUNNING
            record.error = None
            record.failed_step = None
        record.owner = {"pid": os.getpid(), "host": this_host()}
        execution.save_record()

    def _drive(self, execution: Execution) -> RunOutcome:
        from .context import Context

        record = execution.record
        try:
            value = self.handler(Context(execution))
            if inspect.iscoroutine(value):
                value = _run_coroutine(value, execution)
        except _Suspend:
            record.status = Status.WAITING_APPROVAL
            execution.save_record()
            if self.parent is not None:
                raise
            return RunOutcome(record)
        except BaseException as exc:
            if record.status is not Status.DONE:  # a failed replay leaves a DONE run DONE
                self._fail(execution, exc)
            raise
        if record.status is Status.DONE:
            return RunOutcome(record, value)
        if execution.cancel_event.is_set():
            exc = RunCancelled(f"run {self.run_id!r} was cancelled; its journal is intact.")
            self._fail(execution, exc)
            raise exc
        if execution.budget_failure is not None:
            self._fail(execution, execution.budget_failure)
            raise execution.budget_failure
        try:
            record.result = serde.encode(value)
        except SerializationError as exc:
            err = SerializationError(f"run {self.run_id!r} finished, but its result cannot be "
                                     f"journaled: {exc}. Return JSON data or a pydantic model.")
            self._fail(execution, err)
            raise err from None
        record.status = Status.DONE
        record.pending_approval = None
        record.step_count = execution.position
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
                record.error = (f"interrupted at step {execution.position}; execute the run "
                                f"again to resume")
            else:
                record.error = f"{type(exc).__name__}: {exc}"
            failure = execution.last_failure
            record.failed_step = failure[0] if failure and failure[1] is exc else None
        record.step_count = execution.position
        execution.save_record()


def _run_coroutine(coroutine: Any, execution: Execution) -> Any:
    """Run an async handler to completion: here if no event loop runs in this thread, else
    (a notebook cell: the kernel's loop is running) on a thread of its own, while this one
    waits; an interrupt while waiting stops the run at its next step."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    box: dict[str, Any] = {}
    context = contextvars.copy_context()

    def run() -> None:
        try:
            box["value"] = context.run(asyncio.run, coroutine)
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
            max_tokens: int | None = None, journal: Journal | str | None = None,
            **options: Any) -> Any:
    """Execute ``handler(ctx)`` as the durable run ``run_id`` and return its result.

    The first call runs it; a later call with the same id resumes it (completed steps are
    answered from the journal, execution goes on at the first step that never finished) or,
    for a DONE run, replays it without executing any step. Approvals wait for a decision
    from any process. Raises what the handler raised; the run is then FAILED (resumable by
    calling again, unless it expired) or CANCELLED.

    Further keyword options are those of :class:`RunOptions` (``on_mismatch="reset"``,
    ``on_journal_error="stop"``, ``client=``, ``model=`` ...).
    """
    opts = RunOptions(title=title, timeout=timeout, max_iterations=max_iterations,
                      max_tokens=max_tokens, **options)
    outcome = Runner(run_id, handler, journal=journal, options=opts).run()
    return outcome.result
