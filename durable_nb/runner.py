"""Executing a run: lease, deadline, replay-or-run of every step, status transitions.

:func:`execute` is the entry point outside notebooks; the ``%%durable_agent`` magic uses
:class:`Runner` directly. The user's handler sees only a :class:`~durable_nb.context.Context`;
everything durable happens in :meth:`Execution.step`.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import inspect
import json
import os
import sqlite3
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Literal, Protocol

from . import serde
from .errors import (
    BudgetExhausted,
    CorruptEntry,
    DurableError,
    JournalError,
    JournalMismatch,
    JournalWriteError,
    RunCancelled,
    RunExpired,
    RunLeased,
    SerializationError,
    StepFailed,
    TerminalError,
    UnserializableResult,
)
from .journal import Journal, RunRecord, Status, StepEntry, open_journal, this_host
from .lease import DEFAULT_STALE_AFTER, Lease
from .retry import NO_RETRY, RetryPolicy

__all__ = ["Execution", "Observer", "RunOptions", "RunOutcome", "Runner", "execute"]

OnMismatch = Literal["error", "reset"]
OnJournalError = Literal["continue", "stop"]
OnApproval = Literal["wait", "park"]


class Observer(Protocol):
    """Receives what happens in a run, for a live view. Called on the executing thread;
    must be quick and must not raise."""

    def on_step(self, entry: StepEntry, replayed: bool) -> None: ...

    def on_record(self, record: RunRecord) -> None: ...


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


class _Suspend(BaseException):
    """Unwinds the handler when the run parks to wait for an approval (never caught by
    ``except Exception`` in user code)."""


#: The position of the step whose function is running (for ``ctx.step_id``); a context
#: variable so that concurrent steps (threads, asyncio tasks) each see their own.
current_step: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "durable_nb_current_step", default=None)

# Runs executing in this process, so that cancel() and approvals reach them without polling.
_live: dict[str, "Execution"] = {}
_live_lock = threading.Lock()


def live_execution(run_id: str) -> "Execution | None":
    with _live_lock:
        return _live.get(run_id)


def fingerprint(*parts: Any) -> str:
    """A short stable hash of a step's inputs (values that are not JSON count by type only)."""
    if not any(parts):
        return ""
    try:
        text = json.dumps(parts, sort_keys=True, default=lambda o: type(o).__qualname__)
    except (TypeError, ValueError):  # keys of mixed types cannot be sorted, NaN ...
        text = repr([type(p).__qualname__ for p in parts])
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _error_of(exc: BaseException, terminal: bool) -> dict:
    t = type(exc)
    return {"type": f"{t.__module__}.{t.__qualname__}", "message": str(exc), "terminal": terminal}


def _rebuild_error(error: dict) -> BaseException:
    """The journaled exception again: same type when it is an exception class already loaded
    in this process (nothing is imported), else :class:`StepFailed`."""
    type_name = str(error.get("type", "Exception"))
    message = str(error.get("message", ""))
    module_name, _, qualname = type_name.rpartition(".")
    cls: Any = sys.modules.get(module_name)
    for part in qualname.split("."):
        cls = getattr(cls, part, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            exc = cls(message)
        except Exception:
            exc = None
        if exc is not None and str(exc) == message:
            return exc
    return StepFailed(type_name, message)


class Execution:
    """One attempt at executing a run in this process: the step cursor over its journal.

    Owned by one thread. :class:`~durable_nb.context.Context` is its public face.
    """

    def __init__(self, journal: Journal, record: RunRecord, options: RunOptions,
                 observer: Observer) -> None:
        self.journal = journal
        self.record = record
        self.options = options
        self.observer = observer
        self.run_id = record.run_id
        self.position = 0  # the next position to hand out
        self._committed = 0  # the next position to journal
        self._ready: dict[int, tuple[StepEntry, bool]] = {}
        self.broken: str | None = None
        self.interrupted = False
        self.replaying = True
        self.iteration = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.state: dict[str, Any] = {}
        self.cancel_event = threading.Event()
        self.wake_event = threading.Event()
        self.lease_lost = False
        self.budget_failure: BudgetExhausted | None = None
        self.last_failure: tuple[int, BaseException] | None = None
        self._unwritten: list[tuple[StepEntry, bool]] = []
        self.parent_execution: Execution | None = None

    # -- checks at every step boundary ----------------------------------------------------

    def check_live(self) -> None:
        """Raise if the run must stop before its next step: cancelled, expired, lease lost."""
        if self.cancel_event.is_set():
            raise RunCancelled(f"run {self.run_id!r} was cancelled before step {self.position}; "
                               f"its journal is intact. Execute it again to resume.")
        deadline = self.record.deadline
        if deadline is not None and time.time() > deadline and not self.replaying:
            raise RunExpired(f"run {self.run_id!r} passed its deadline "
                             f"({time.ctime(deadline)}) before step {self.position}; it is marked "
                             f"FAILED and will not resume. Start a new run id for a new attempt.")
        if self.lease_lost:
            raise RunLeased(self.run_id, self.journal.read_json(f"lease:{self.run_id}") or {})
        if self.broken:
            raise DurableError(f"run {self.run_id!r} stopped: {self.broken}. Its journal is "
                               f"intact up to that step; execute it again to resume.")

    # -- the durable step ---------------------------------------------------------------

    def replay(self, kind: str, name: str) -> StepEntry | None:
        """The journaled entry for the next step if replaying, checked against (kind, name);
        None when the step must really execute."""
        self.check_live()
        if not self.replaying:
            return None
        position = self.position
        entry = self.journal.get_step(self.run_id, position)
        if entry is None:
            self.replaying = False
            if self.record.status is Status.DONE and not self._reopen():
                raise JournalMismatch(
                    self.run_id, position, "the end of the journal", f"{kind} {name!r}",
                    reason=(f"the run is DONE with {position} steps, but the code now asks for "
                            f"a new step {kind} {name!r} at position {position}"))
            return None
        if entry.kind != kind or entry.name != name:
            if self._reopen():
                self.journal.truncate(self.run_id, position)
                self._recount_after_truncate()
                self.replaying = False
                return None
            raise JournalMismatch(self.run_id, position, f"{entry.kind} {entry.name!r}",
                                  f"{kind} {name!r}")
        self.position += 1
        self._committed += 1
        self._count(entry)
        self.observer.on_step(entry, True)
        return entry

    def _reopen(self) -> bool:
        """With on_mismatch="reset", let the run go on past a divergence (a DONE run too)."""
        if self.options.on_mismatch != "reset":
            return False
        if self.record.status is Status.DONE:
            self.record.status = Status.RUNNING
            self.record.result = None
            self.save_record()
        return True

    def _count(self, entry: StepEntry) -> None:
        self.prompt_tokens += entry.prompt_tokens
        self.completion_tokens += entry.completion_tokens
        if entry.kind == "chat":
            self.iteration += 1

    def _recount_after_truncate(self) -> None:
        self.record.prompt_tokens = self.prompt_tokens
        self.record.completion_tokens = self.completion_tokens
        self.record.iteration = self.iteration
        self.journal.put_run(self.record)

    def outcome(self, entry: StepEntry) -> Any:
        """The journaled result of a step, or its journaled exception raised again."""
        if not entry.ok:
            raise _rebuild_error(entry.error or {})
        try:
            return serde.decode(entry.result)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise CorruptEntry(f"step:{self.run_id}:{entry.position}",
                               f"its result cannot be decoded ({exc})", run_id=self.run_id,
                               position=entry.position) from None

    def step(self, kind: str, name: str, fn: Callable[..., Any], args: tuple = (),
             kwargs: dict | None = None, *, retry: RetryPolicy | None = None,
             fingerprint_: str = "", usage: Callable[[Any], tuple[int, int]] | None = None,
             meta: Callable[[Any], dict | None] | None = None) -> Any:
        """Replay the next step from the journal, or run ``fn`` and journal its outcome.

        ``usage(result)`` gives (prompt, completion) tokens to account; ``meta(result)`` extra
        data for the entry (shown in the timeline and exports).
        """
        entry = self.replay(kind, name)
        if entry is not None:
            return self.outcome(entry)
        return self.perform(kind, name, fn, args, kwargs, retry=retry, fingerprint_=fingerprint_,
                            usage=usage, meta=meta)

    def reserve(self) -> int:
        """Hand out the next step position (steps are journaled in position order)."""
        position = self.position
        self.position += 1
        return position

    def _unreserve(self, position: int) -> None:
        # A step that ends without an entry (interrupt, unserialisable result) gives its
        # position back; if later positions were handed out meanwhile (concurrent steps),
        # the journal could not stay contiguous, so the run must stop.
        if self.position == position + 1:
            self.position = position
        else:
            self.broken = (f"step {position} ended without a journal entry while later steps "
                           f"were running concurrently")

    @contextmanager
    def _live_step(self, kind: str, name: str, fingerprint_: str) -> Iterator[tuple[int, float]]:
        """Around a step's function: take its position, make it ``ctx.step_id``, journal an
        exception as the step's failure, give the position back on an interrupt."""
        position = self.reserve()
        started = time.time()
        token = current_step.set(position)
        try:
            yield position, started
        except Exception as exc:
            self.record_failure(kind, name, started, exc, fingerprint_, position=position)
            raise
        except BaseException:
            self._unreserve(position)
            raise
        finally:
            current_step.reset(token)

    def perform(self, kind: str, name: str, fn: Callable[..., Any], args: tuple = (),
                kwargs: dict | None = None, *, retry: RetryPolicy | None = None,
                fingerprint_: str = "", usage: Callable[[Any], tuple[int, int]] | None = None,
                meta: Callable[[Any], dict | None] | None = None) -> Any:
        """Run ``fn`` as the next step and journal its outcome (after :meth:`replay` found
        nothing to replay)."""
        with self._live_step(kind, name, fingerprint_) as (position, started):
            value = (retry or NO_RETRY).call(fn, *args, **(kwargs or {}))
        return self.record_result(kind, name, started, value, fingerprint_, usage, meta,
                                  position=position)

    async def perform_async(self, kind: str, name: str, fn: Callable[..., Any],
                            args: tuple = (), kwargs: dict | None = None, *,
                            retry: RetryPolicy | None = None, fingerprint_: str = "",
                            usage: Callable[[Any], tuple[int, int]] | None = None) -> Any:
        """:meth:`perform` for a coroutine function. The position is taken when the step
        starts, so steps started together (``asyncio.gather``) keep their call order."""
        with self._live_step(kind, name, fingerprint_) as (position, started):
            value = await (retry or NO_RETRY).call_async(fn, *args, **(kwargs or {}))
        return self.record_result(kind, name, started, value, fingerprint_, usage,
                                  position=position)

    def record_failure(self, kind: str, name: str, started: float, exc: Exception,
                       fingerprint_: str = "", *, position: int | None = None) -> None:
        """Journal the failure of the step at ``position`` (default: the next one)."""
        position = self.reserve() if position is None else position
        self.commit(StepEntry(position, name, kind, fingerprint_, ok=False,
                              error=_error_of(exc, isinstance(exc, TerminalError)),
                              started_at=started, finished_at=time.time()))
        self.last_failure = (position, exc)

    def record_result(self, kind: str, name: str, started: float, value: Any,
                      fingerprint_: str = "",
                      usage: Callable[[Any], tuple[int, int]] | None = None,
                      meta: Callable[[Any], dict | None] | None = None, *,
                      position: int | None = None) -> Any:
        """Journal the result of the step at ``position`` (default: the next one) and
        return it."""
        reserved_here = position is None
        position = self.reserve() if position is None else position
        try:
            encoded = serde.encode(value)
        except SerializationError as exc:
            if not reserved_here or self.position == position + 1:
                self._unreserve(position)
            raise UnserializableResult(self.run_id, position, name, str(exc)) from None
        prompt, completion = usage(value) if usage else (0, 0)
        self.commit(StepEntry(position, name, kind, fingerprint_, result=encoded,
                              started_at=started, finished_at=time.time(), prompt_tokens=prompt,
                              completion_tokens=completion, meta=meta(value) if meta else None))
        return value

    def steps_in_order(self, kind: str, steps: list[tuple[str, Callable[[], Any]]], *,
                       parallel: bool = False) -> list[tuple[bool, Any]]:
        """Several steps at consecutive positions, in list order: each replayed or run.

        Returns ``(True, result)`` or ``(False, exception)`` per step; durable_nb's own
        errors are raised. With ``parallel``, the functions that must run are called
        concurrently on threads and journaled in list order.
        """
        outcomes: list[tuple[bool, Any] | None] = [None] * len(steps)
        live = []
        for i, (name, _) in enumerate(steps):
            entry = self.replay(kind, name) if self.replaying else None
            if entry is None:
                live.append(i)
                continue
            try:
                outcomes[i] = (True, self.outcome(entry))
            except Exception as exc:
                outcomes[i] = (False, exc)
        if parallel and len(live) > 1:
            positions = {i: self.reserve() for i in live}
            with ThreadPoolExecutor(max_workers=min(8, len(live))) as pool:
                futures = {}
                for i in live:
                    context = contextvars.copy_context()
                    context.run(current_step.set, positions[i])
                    futures[i] = (time.time(), pool.submit(context.run, steps[i][1]))
                for i in live:
                    started, future = futures[i]
                    exc = future.exception()
                    if exc is not None and not isinstance(exc, Exception):
                        raise exc
                    if exc is None:
                        outcomes[i] = (True, self.record_result(
                            kind, steps[i][0], started, future.result(), position=positions[i]))
                    else:
                        self.record_failure(kind, steps[i][0], started, exc,
                                            position=positions[i])
                        outcomes[i] = (False, exc)
        else:
            for i in live:
                try:
                    outcomes[i] = (True, self.step(kind, steps[i][0], steps[i][1]))
                except DurableError:
                    raise
                except Exception as exc:
                    outcomes[i] = (False, exc)
        return outcomes  # type: ignore[return-value]

    def commit(self, entry: StepEntry, record_changed: bool = False) -> None:
        """Journal a completed step (and the run record, when the step changed it). Steps
        that complete out of order wait until the ones before them are journaled. Write
        failures follow ``on_journal_error``."""
        self._count(entry)
        if entry.prompt_tokens or entry.completion_tokens or entry.kind == "chat":
            self.record.prompt_tokens = self.prompt_tokens
            self.record.completion_tokens = self.completion_tokens
            self.record.iteration = self.iteration
            record_changed = True
        self._ready[entry.position] = (entry, record_changed)
        while self._committed in self._ready:
            self._unwritten.append(self._ready.pop(self._committed))
            self._committed += 1
        self.record.step_count = self._committed
        self._flush()
        self.observer.on_step(entry, False)
        if record_changed:
            self.observer.on_record(self.record)

    def _flush(self) -> None:
        # Entries are written strictly in order so the journal stays a contiguous prefix:
        # after a failed write, later entries wait in memory until the disk takes them again.
        try:
            while self._unwritten:
                entry, with_record = self._unwritten[0]
                if with_record or any(w for _, w in self._unwritten[1:]):
                    self.journal.put_step(self.run_id, entry, self.record)
                else:
                    self.journal.put_step(self.run_id, entry)
                self._unwritten.pop(0)
        except (OSError, sqlite3.Error, TimeoutError) as exc:
            first = self._unwritten[0][0].position
            if self.options.on_journal_error == "stop":
                raise JournalWriteError(
                    f"run {self.run_id!r}: writing step {first} to the journal failed ({exc}); "
                    f"the run stopped before going past the unrecorded step, as "
                    f"on_journal_error='stop' asks. Free disk space and execute again: step "
                    f"{first} will run again.") from exc
            if self.record.journal_degraded_from is None:
                self.record.journal_degraded_from = first
                warnings.warn(
                    f"durable_nb: the journal of run {self.run_id!r} is DEGRADED from step "
                    f"{first}: writing it failed ({exc}). The run goes on and the writes are "
                    f"retried at every step; until they succeed, a crash would run these steps "
                    f"again. Use on_journal_error='stop' to stop instead.",
                    RuntimeWarning, stacklevel=4)
                self.observer.on_record(self.record)
        else:
            if self.record.journal_degraded_from is not None:
                self.record.journal_degraded_from = None
                self.observer.on_record(self.record)

    @property
    def unwritten_steps(self) -> int:
        return len(self._unwritten)

    def save_record(self) -> None:
        """Write the run record (status changes); tolerant of a degraded journal."""
        try:
            self._flush()
            self.journal.put_run(self.record)
        except (OSError, sqlite3.Error, TimeoutError):
            if self.options.on_journal_error == "stop":
                raise
        self.observer.on_record(self.record)

    # -- approvals ---------------------------------------------------------------------

    def wait_for_decision(self, position: int, timeout_at: float | None) -> dict | None:
        """Poll the journal for a decision on the approval at ``position``.

        Returns the decision; None when ``timeout_at`` passed; raises :class:`_Suspend` when
        the run parks instead of waiting (``on_approval="park"``).
        """
        key = f"decision:{self.run_id}"
        while True:
            decision = self.journal.read_json(key)
            if isinstance(decision, dict) and decision.get("position") == position:
                return decision
            now = time.time()
            if timeout_at is not None and now >= timeout_at:
                return None
            if self.options.on_approval == "park":
                raise _Suspend()
            self.check_live()
            if self.record.deadline is not None and now > self.record.deadline:
                self.replaying = False
                self.check_live()
            self.wake_event.wait(self.options.poll_interval)
            self.wake_event.clear()


    def approval(self, name: str, details: Any, timeout: float | None) -> dict:
        """Journaled approval: record it pending, wait for (or park until) a decision."""
        entry = self.replay("approval", name)
        if entry is not None:
            return self.outcome(entry)
        position = self.position
        pending = self.record.pending_approval
        if not (pending and pending.get("position") == position):
            # On resume the pending request keeps its first timestamps, so its timeout runs on.
            now = time.time()
            pending = {"position": position, "name": name, "details": details,
                       "requested_at": now, "timeout_at": now + timeout if timeout else None}
        self._set_pending(pending)
        decision = self.wait_for_decision(position, pending["timeout_at"])
        if decision is None:
            decision = {"approved": False, "note": f"no decision within {timeout:g} s",
                        "by": "timeout"}
        result = {"approved": bool(decision.get("approved")), "note": decision.get("note"),
                  "by": decision.get("by"), "at": decision.get("at", time.time())}
        self._set_pending(None, save=False)
        self.commit(StepEntry(self.reserve(), name, "approval", result=result,
                              started_at=pending["requested_at"], finished_at=time.time(),
                              meta={"details": details}), record_changed=True)
        self.journal.delete_key(f"decision:{self.run_id}")
        return result

    def _set_pending(self, pending: dict | None, save: bool = True) -> None:
        # A child's pending approval is shown (and approved) through its ancestors too.
        execution: Execution | None = self
        run_id = self.run_id
        while execution is not None:
            execution.record.pending_approval = (
                None if pending is None else dict(pending, run_id=run_id))
            execution.record.status = (Status.RUNNING if pending is None
                                       else Status.WAITING_APPROVAL)
            if save or execution is not self:
                execution.save_record()
            execution = execution.parent_execution

    def sleep(self, seconds: float) -> None:
        """Durable sleep: the wake-up time is journaled before sleeping."""
        entry = self.replay("sleep", "sleep")
        if entry is not None:
            until = float(self.outcome(entry)["until"])
        else:
            now = time.time()
            until = now + seconds
            self.commit(StepEntry(self.reserve(), "sleep", "sleep", result={"until": until},
                                  started_at=now, finished_at=now))
        while (remaining := until - time.time()) > 0:
            self.check_live()
            self.wake_event.wait(min(remaining, 0.5))
            self.wake_event.clear()

    def child(self, name: str, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """Run a sub-agent as its own run; journal its result as one step here."""
        from .context import child_run_id

        entry = self.replay("child", name)
        if entry is not None:
            return self.outcome(entry)
        child_id = child_run_id(self.run_id, name, self.position)
        remaining = None if self.record.deadline is None else self.record.deadline - time.time()
        options = RunOptions(**{**self.options.__dict__, "title": name, "timeout": remaining,
                                "source": None, "max_iterations": None})
        runner = Runner(child_id, lambda child_ctx: fn(child_ctx, *args, **kwargs),
                        journal=self.journal, options=options, observer=self.observer,
                        parent=self.run_id)
        runner.parent_execution = self
        child_record: list[RunRecord] = []

        def run_child() -> Any:
            outcome = runner.run()
            child_record.append(outcome.record)
            return outcome.result

        return self.step("child", name, run_child, meta=lambda _: {"run_id": child_id},
                         usage=lambda _: (child_record[0].prompt_tokens,
                                          child_record[0].completion_tokens))


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
    route = getattr(sys.stdout, "routes", {}).get(threading.get_ident())

    def run() -> None:
        if route is not None:  # prints of the run go where the cell's went
            sys.stdout.routes[threading.get_ident()] = route
        try:
            box["value"] = context.run(asyncio.run, coroutine)
        except BaseException as exc:
            box["error"] = exc
        finally:
            getattr(sys.stdout, "routes", {}).pop(threading.get_ident(), None)

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
