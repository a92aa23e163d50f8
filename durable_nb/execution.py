"""The step cursor of one execution: replay a step from the journal or run it and journal it.

An :class:`Execution` walks a run's steps by position. While the journal has an entry for the
next position it *replays* it (checked against the step's kind and name); at the first
position without one it goes *live*: it runs the step's function and journals the outcome
before handing it back. Entries are journaled strictly in position order, so the journal of a
run is always a contiguous prefix. :class:`~durable_nb.context.Context` is its public face;
:class:`~durable_nb.runner.Runner` creates it, and owns the lease and the run's status.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import sqlite3
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol

from . import serde
from .errors import (
    BudgetExhausted,
    CorruptEntry,
    DurableError,
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
from .journal import Journal, RunRecord, Status, StepEntry
from .retry import NO_RETRY, RetryPolicy

if TYPE_CHECKING:
    from .runner import RunOptions

__all__ = ["Execution", "Observer", "current_step", "fingerprint"]


class Observer(Protocol):
    """Receives what happens in a run, for a live view. Called on the executing thread;
    must be quick and must not raise."""

    def on_step(self, entry: StepEntry, replayed: bool) -> None: ...

    def on_record(self, record: RunRecord) -> None: ...


class _Suspend(BaseException):
    """Unwinds the handler when the run parks to wait for an approval (never caught by
    ``except Exception`` in user code)."""


#: The position of the step whose function is running (for ``ctx.step_id``); a context
#: variable so that concurrent steps (threads, asyncio tasks) each see their own.
current_step: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "durable_nb_current_step", default=None)


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
                       fingerprint_: str = "", *, position: int) -> None:
        """Journal the failure of the step at (reserved) ``position``."""
        self.commit(StepEntry(position, name, kind, fingerprint_, ok=False,
                              error=_error_of(exc, isinstance(exc, TerminalError)),
                              started_at=started, finished_at=time.time()))
        self.last_failure = (position, exc)

    def record_result(self, kind: str, name: str, started: float, value: Any,
                      fingerprint_: str = "",
                      usage: Callable[[Any], tuple[int, int]] | None = None,
                      meta: Callable[[Any], dict | None] | None = None, *,
                      position: int) -> Any:
        """Journal the result of the step at (reserved) ``position`` and return it."""
        try:
            encoded = serde.encode(value)
        except SerializationError as exc:
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
            self.check_live()  # cancelled, past the deadline, lease lost
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
        from .runner import RunOptions, Runner

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
