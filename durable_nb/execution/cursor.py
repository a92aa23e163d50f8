"""The step cursor of one execution: replay a step from the journal or run it and journal it.

For each step the code asks for, :class:`Execution` takes the step's key from the current
scope (:mod:`~durable_nb.execution.scope`) and looks the key up in the journal. If it is
there, the entry is checked (same kind and name, same input fingerprint) and its outcome
returned or raised again, without running anything: the step is *replayed*. If not, the
step's function runs, in a scope of its own, and its outcome is journaled before it is
handed back: the step is *executed*. Entries get journal positions in the order they
complete (:class:`~durable_nb.execution.writer.JournalWriter`).

:class:`~durable_nb.context.Context` is the public face of an Execution;
:class:`~durable_nb.runner.Runner` creates it, and owns the lease and the run's status.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Callable, Protocol

from .. import serde
from ..errors import (
    BudgetExhausted,
    ContextNotActive,
    CorruptEntry,
    DurableError,
    InputChanged,
    JournalMismatch,
    ReplayDiverged,
    RunCancelled,
    RunExpired,
    RunLeased,
    SerializationError,
    StepFailed,
    TerminalError,
    UnserializableResult,
)
from ..journal import LLM_KINDS, Journal, RunRecord, Status, StepEntry, entry_cost
from ..timestamps import format_time
from ..approvals.request import request_digest, take_decision
from ..approvals.policy import ApprovalPolicy
from .asking import claim_pending, save_ancestors, set_pending, wait_for_decision
from .inputs import (canonical, first_difference, fingerprint, load_request, step_identity,
                     store_request)
from .options import ExecutionOptions
from .replay import ReplayLog, enclosing_step
from .retry import NO_RETRY, RetryPolicy
from .scope import Scope, current_flow, current_scope, enter, install_task_numbering, leave
from . import attempts
from .events import ExecutionListener, decision_event
from .writer import JournalWriter

__all__ = ["ChildStarter", "Execution", "NullObserver", "Observer", "Restart",
           "Suspend", "child_run_id", "run_coroutine_here"]

class Observer(Protocol):
    """Receives what happens in a run, for a live view. Called on the executing flow;
    must be quick and must not raise."""

    def on_step(self, entry: StepEntry, replayed: bool) -> None: ...

    def on_record(self, record: RunRecord) -> None: ...


class NullObserver:
    def on_step(self, entry: StepEntry, replayed: bool) -> None:
        pass

    def on_record(self, record: RunRecord) -> None:
        pass


class Suspend(BaseException):
    """Unwinds the handler when the run parks to wait for an approval (never caught by
    ``except Exception`` in user code)."""


class Restart(BaseException):
    """Unwinds the handler to execute it again from a changed step (``on_change="rerun"``)."""


#: Runs a child run to its end for :meth:`Execution.child`:
#: ``(child_id, title, fn, args, kwargs, parent) -> (result, child record)``.
ChildStarter = Callable[[str, str, Callable[..., Any], tuple, dict, "Execution"],
                        tuple[Any, RunRecord]]


#: Kinds of steps that only read a value or set the run's state: doing one again changes
#: nothing outside the run, so one found under another key is not refused as moved.
_NO_EFFECT_KINDS = frozenset({"now", "uuid", "random", "sleep", "state"})


def _journaled_as_failure(exc: Exception) -> bool:
    """Whether an exception ends a step as its journaled outcome. durable_nb's own errors
    that stop a run (a mismatch, a lost lease, a budget ...) say nothing about the step:
    it stays unjournaled and runs again on resume. TerminalError and a replayed failure
    are outcomes."""
    return not isinstance(exc, DurableError) or isinstance(exc, (TerminalError, StepFailed))


def child_run_id(parent: str, name: str, key: str) -> str:
    """``PARENT/NAME-KEY``: the id of the child run started by step ``key``."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "child"
    return f"{parent}/{slug}-{key}"


class Execution:
    """One attempt at executing a run in this process: the step cursor over its journal."""

    def __init__(self, journal: Journal, record: RunRecord, options: ExecutionOptions,
                 observer: Observer, *, token: str, start_child: ChildStarter | None = None,
                 parent: "Execution | None" = None, strict: bool = False) -> None:
        self.journal = journal
        self.record = record
        self.options = options
        self.observer = observer
        # With an observer (a panel) keeping replayed entries, their results are copied
        # (decoded) for the code, which may change what it gets.
        self._entries_private = type(observer) is NullObserver
        self.run_id = record.run_id
        self.parent = parent
        self.strict = strict
        self._start_child = start_child
        size = journal.count_steps(self.run_id, record.step_count)
        self.replay_log = ReplayLog(journal, self.run_id, size, record.retried_steps)
        self.writer = JournalWriter(journal, record, token, size, options.on_journal_error,
                                    observer.on_record)
        self.lock = self.writer.lock
        # The scopes open now, by path, while the journal holds entries to replay: where a
        # held entry could still be asked for (see _reachable).
        self.open_scopes: dict[str, Scope] = {}
        # When each task of this execution was created, by scope path: journaled with its
        # steps (StepEntry.spawned), so that a re-run keeps the tasks that existed before the
        # step that changed (journal.cut_at_key).
        self.task_spawned: dict[str, int] = {}
        # The live steps whose functions run now, by key: (kind, name, fingerprint), for the
        # ``parent`` of the steps they make.
        self.live_identities: dict[str, tuple[str, str, str]] = {}
        self.root = Scope(self, "", current_flow())
        self.opened(self.root)
        self.iteration = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cost = 0.0
        self.state: dict[str, Any] = {}
        self.cancel_event = threading.Event()
        self.wake_event = threading.Event()
        self.lease_lost = False
        self.interrupted = False
        self.finished = False
        self.parking = False
        #: Told of the run's requests and their decisions (:mod:`.events`; the runner
        #: registers its notifier); None: nobody listens.
        self.listener: ExecutionListener | None = None
        #: The run's choice of notification channels, recorded with each request it asks,
        #: so that every sender honours it; None: no choice (the journal's channels).
        self.notify_choice: dict | None = None
        self.restart_from: int | None = None
        # The journal mismatch found in one flow: every other flow stops at its next step.
        self.mismatch: JournalMismatch | None = None
        self.budget_failure: BudgetExhausted | None = None
        # (position, step key, exception) of every failure journaled or replayed in this
        # execution: the runner finds the step whose failure failed the run among them.
        self.failures: list[tuple[int, str, BaseException]] = []
        self.live_steps = 0
        # Until everything journaled was replayed, each live step notes the attempt's
        # replays so far in the record it writes: an attempt that dies keeps the count.
        self._replays_counting = size > 0

    # -- where the code is ---------------------------------------------------------------

    @property
    def replaying(self) -> bool:
        """True while the journal holds entries this execution has not replayed yet (the
        steps made inside a replayed step are replayed with it)."""
        return self.replay_log.pending()

    def opened(self, scope: Scope) -> None:
        """Scope ``scope`` is open: a task or a step's function started."""
        if not self.replay_log.drained:
            self.open_scopes[scope.path] = scope

    def ended(self, scope: Scope) -> None:
        self.open_scopes.pop(scope.path, None)

    def task_created(self, scope: Scope) -> None:
        """The task of ``scope`` was just created: note the journal position every step
        whose outcome this execution has handed out so far is below - the next position once
        it has journaled a step, else one past the highest entry it replayed (a task created
        while replaying could have seen no later one)."""
        writer = self.writer
        live = writer.next_position
        self.task_spawned[scope.path] = (live if live > self.replay_log.size
                                         else self.replay_log.reached)

    def _spawned(self, key: str) -> list[int] | None:
        """``StepEntry.spawned`` for a step with key ``key`` made in this execution."""
        if "#" not in key:
            return None
        parts = key.split(".")
        spawned = []
        for depth in range(len(parts) - 1):
            if "#" in parts[depth]:
                at = self.task_spawned.get(".".join(parts[:depth + 1]))
                if at is None:
                    return None
                spawned.append(at)
        return spawned

    def scope(self) -> Scope:
        """The scope the running flow takes steps in; ContextNotActive if it has none here."""
        scope = current_scope()
        if scope is None or scope.execution is not self:
            raise ContextNotActive(self._not_active(scope))
        why = scope.usable_here()
        if why is not None:
            raise ContextNotActive(
                f"ctx of run {self.run_id!r} was used {why}, where step keys would depend on "
                f"timing. Run concurrent work as asyncio tasks inside the run (an async cell or "
                f"handler, asyncio.gather) or with ctx.call_tools(..., parallel=True).")
        return scope

    def _not_active(self, scope: Scope | None) -> str:
        if scope is not None:
            return (f"ctx of run {self.run_id!r} was used while run {scope.execution.run_id!r} "
                    f"executes here; use that run's ctx.")
        if self.finished:
            return (f"ctx of run {self.run_id!r} was used after its execution ended (in a later "
                    f"cell, or by code kept from the cell). ctx works only inside the "
                    f"%%durable_agent cell (or the handler given to durable_nb.execute) while "
                    f"it runs; re-run that cell to continue the run.")
        return (f"ctx of run {self.run_id!r} was used from a thread that durable_nb did not "
                f"start, where step keys would depend on timing. Run concurrent work as asyncio "
                f"tasks inside the run (an async cell or handler, asyncio.gather) or with "
                f"ctx.call_tools(..., parallel=True).")

    def step_key(self) -> str:
        """Inside a step's function, that step's key; elsewhere the next step's."""
        scope = self.scope()
        return scope.path if scope.is_step else scope.peek_key()

    # -- checks at every step boundary ----------------------------------------------------

    def check_live(self) -> None:
        """Raise if the run must stop before its next step: restarted, parked, cancelled,
        lease lost, a journal write failed (``on_journal_error="stop"``)."""
        self.writer.check()
        if self.restart_from is not None:
            raise Restart()
        if self.mismatch is not None:
            raise self.mismatch
        if self.parking:
            raise Suspend()
        if self.cancel_event.is_set():
            raise RunCancelled(f"run {self.run_id!r} was cancelled; its journal is intact. "
                               f"Execute it again to resume.")
        if self.lease_lost:
            raise RunLeased(self.run_id, self.journal.lease(self.run_id) or {},
                            advice="this executor lost the lease and stopped.")

    def _check_deadline(self, key: str) -> None:
        deadline = self.record.deadline
        if deadline is not None and time.time() > deadline:
            raise RunExpired(f"run {self.run_id!r} passed its deadline ({format_time(deadline)}) "
                             f"before step {key}; it is marked FAILED and will not resume. "
                             f"Start a new run id for a new attempt.")

    # -- replay -----------------------------------------------------------------------------

    def _replay(self, key: str, kind: str, name: str, fp: str, inputs: Any) -> StepEntry | None:
        self.check_live()
        entry = self.replay_log.take(key)
        if entry is None:
            if self.strict:
                self.not_journaled(key, kind, name, inputs)
            if kind not in _NO_EFFECT_KINDS and not self.replay_log.drained:
                self._refuse_moved(key, kind, name, fp)
            if self.record.status is Status.DONE:
                self._new_step_after_done(key, kind, name)
            return None
        if entry.kind != kind or entry.name != name:
            self._changed(entry, JournalMismatch(
                self.run_id, entry.position, f"{entry.kind} {entry.name!r}", f"{kind} {name!r}",
                key=key))
        elif fp != entry.fingerprint and (self.strict or self.options.on_change != "replay"):
            # An empty fingerprint is a step without inputs: arguments added later are a change.
            self._changed(entry, InputChanged(self.run_id, entry.position, f"{kind} {name!r}",
                                              self._describe_change(entry, inputs), key=key),
                          inputs)
        with self.lock:
            self._count(entry)
        self.observer.on_step(entry, True)
        return entry

    def _refuse_moved(self, key: str, kind: str, name: str, fp: str) -> None:
        """Before step ``key`` executes: refuse if the journal holds the same step (kind,
        name, inputs) under a key this execution can no longer reach. The program's shape
        changed (steps moved into tasks or other steps, reordered), and executing it would
        repeat work the journal says was done."""
        moved = [e for e in self.replay_log.alike(kind, name, fp)
                 if not self._reachable(e.key, key)]
        inside = key + "."
        if any(e.key.startswith(inside) for e in moved) and self.replay_log.made_in(
                key, step_identity(kind, name, fp)):
            # The steps inside this key were made by a step like this one: it is that step
            # executing again (it died in flight, or failed the run), and the steps inside it
            # are its own to ask for, not ones moved out of it.
            moved = [e for e in moved if not e.key.startswith(inside)]
        if not moved:
            return
        moved.sort(key=lambda e: e.position)
        keys = ", ".join(e.key for e in moved[:5]) + (" ..." if len(moved) > 5 else "")
        self._changed(moved[0], JournalMismatch(
            self.run_id, moved[0].position, f"{kind} {name!r} at {keys}",
            f"{kind} {name!r} at {key}", key=key,
            reason=(f"the journal holds step {keys} ({kind} {name!r}, the same inputs), which "
                    f"this execution can no longer reach, and the code now asks for the same "
                    f"step as a new step {key}: the program's shape changed (steps reordered, "
                    f"or moved into tasks, asyncio.gather or other steps), and executing it "
                    f"would do again what the journal says was done")))

    def _reachable(self, held: str, live: str) -> bool:
        """Whether the journaled step ``held`` may still be asked for in this execution,
        when step ``live`` is about to execute.

        It may in a flow that is not the live step's nor one of its ancestors (those are
        suspended in program order: what they did is behind them, what they will do comes
        after this step), and that has not gone past it: a concurrent task that has not got
        there yet. In the live step's own scope, only at a later key (steps whose keys were
        taken together, ``call_tools(parallel=True)``), not at an earlier one nor inside the
        live step (a step moved out of the step that made it). Not in a step or task that
        ended."""
        here, _, index = live.rpartition(".")
        parts = held.split(".")
        depth = len(parts) - 1
        while (scope := self.open_scopes.get(".".join(parts[:depth]))) is None:
            depth -= 1  # the root scope ("") is open while the journal holds entries
        child = parts[depth]  # held itself (depth == len - 1), or the scope it is in
        if scope.path == here:
            return "#" not in child and int(child) > int(index)
        if not scope.path or here.startswith(scope.path + "."):
            return False  # an ancestor of the live step
        if depth == len(parts) - 1:
            return True
        numbers = scope.numbers
        if "#" in child:
            task, _, number = child.rpartition("#")
            return numbers.tasks.get(task, 0) <= int(number)
        return numbers.next <= int(child)

    def check_all_replayed(self) -> None:
        """At the end of an execution that returned: refuse if the journal holds steps it
        never asked for (the code makes fewer steps than the journal holds, or others), so
        that no result is returned that the journal does not hold; also if the code went
        on after a mismatch it caught."""
        if self.mismatch is not None:
            raise self.mismatch
        rest = self.replay_log.rest()
        if not rest:
            return
        keys = ", ".join(f"{e.key} ({e.kind} {e.name!r})" for e in rest[:5]) + (
            f" and {len(rest) - 5} more" if len(rest) > 5 else "")
        if self.strict:
            raise ReplayDiverged(
                f"run {self.run_id!r}: a pure replay never asked for journaled steps {keys}: "
                f"the code took another path given the same step results.")
        self._changed(rest[0], JournalMismatch(
            self.run_id, rest[0].position, keys, "no further step", key=rest[0].key,
            reason=(f"the code ended without asking for journaled steps {keys}: it makes "
                    f"fewer or other steps than the journal holds")))

    def _describe_change(self, entry: StepEntry, inputs: Any) -> str:
        if entry.request is None:
            return ("arguments were added (it was journaled without any)" if inputs else
                    "its inputs changed")
        old = load_request(entry.request, lambda digest: self.journal.get_blob(self.run_id, digest))
        return first_difference(old, canonical(inputs)) or "its inputs changed"

    def not_journaled(self, key: str, kind: str, name: str, inputs: Any) -> None:
        """In a pure replay (``strict``), the code asks for step ``key``, which the journal
        does not hold: raises :class:`ReplayDiverged` (a dry replay, a subclass, says where
        the run would execute instead). Nothing of the step has run."""
        raise ReplayDiverged(
            f"run {self.run_id!r}: a pure replay asked for step {key} ({kind} {name!r}), "
            f"which the first execution never journaled: the code took another path "
            f"given the same step results (a branch on the clock, randomness, or data "
            f"read outside ctx).")

    def diverged(self, entry: StepEntry, error: JournalMismatch, inputs: Any) -> None:
        """In a pure replay (``strict``), journaled step ``entry`` is asked otherwise
        (``error`` says how; ``inputs``: what it is asked now, None where it is another
        step): raises :class:`ReplayDiverged`."""
        what = (f"{error.journaled}: {error.change}" if isinstance(error, InputChanged) else
                f"the first execution journaled {error.journaled}, the replay asked for "
                f"{error.requested}")
        raise ReplayDiverged(
            f"run {self.run_id!r}: a pure replay did not reproduce step {entry.position} "
            f"({what}): the code took another path, or passed other inputs, given the same "
            f"step results (a branch on the clock, randomness, or data read outside ctx).")

    def _changed(self, entry: StepEntry, error: JournalMismatch, inputs: Any = None) -> None:
        if self.strict:
            self.diverged(entry, error, inputs)
        if self.options.on_change == "rerun":
            with self.lock:
                if self.restart_from is None or entry.position < self.restart_from:
                    self.restart_from = entry.position
            raise Restart()
        self.mismatch = error
        raise error

    def _new_step_after_done(self, key: str, kind: str, name: str) -> None:
        if self.options.on_change == "rerun":
            with self.lock:
                self.restart_from = self.replay_log.size  # keep every step; reopen the run
            raise Restart()
        raise JournalMismatch(
            self.run_id, self.replay_log.size, "the end of the journal", f"{kind} {name!r}",
            key=key, reason=(f"the run is DONE with {self.replay_log.size} steps, but the code "
                             f"now asks for a new step {key} ({kind} {name!r})"))

    def outcome(self, entry: StepEntry) -> Any:
        """The journaled result of a step, or its journaled exception raised again."""
        try:
            if not entry.ok:
                error = serde.decode_error(entry.error or {})
            elif entry.plain_result and self._entries_private:
                # Plain JSON data: decode() would return an equal copy, and nobody else
                # holds this entry (no observer got it), so the parsed data is handed out.
                return entry.result
            else:
                return serde.decode(entry.result)
        except serde.DecodeError as exc:
            raise CorruptEntry(f"step:{self.run_id}:{entry.position}",
                               f"its outcome cannot be decoded ({exc})", run_id=self.run_id,
                               position=entry.position) from None
        # Replayed, it may fail the run again (it did not in the execution that journaled it,
        # which died first): then it is the step to try again on resume, as a live failure.
        self.failures.append((entry.position, entry.key, error))
        raise error

    def _count(self, entry: StepEntry) -> None:
        self.prompt_tokens += entry.prompt_tokens
        self.completion_tokens += entry.completion_tokens
        self.cost += entry_cost(entry)
        if entry.kind in LLM_KINDS:
            self.iteration += 1

    # -- the durable step -------------------------------------------------------------------

    def step(self, kind: str, name: str, fn: Callable[..., Any], args: tuple = (),
             kwargs: dict | None = None, *, retry: RetryPolicy | None = None,
             inputs: Any = None, usage: Callable[[Any], tuple[int, int]] | None = None,
             meta: Callable[[Any], dict | None] | None = None,
             before_live: Callable[[], None] | None = None) -> Any:
        """Replay the next step of the running flow, or run ``fn`` and journal its outcome.

        ``inputs`` (canonical JSON data) identify what the step is asked, compared on
        replay; ``usage(result)`` gives (prompt, completion) tokens to account; ``meta``
        extra data for the entry; ``before_live`` runs only when the step must execute
        (a budget check before paying for an LLM call).
        """
        scope = self.scope()
        key = scope.next_key()
        fp = fingerprint(inputs) if inputs else ""
        entry = self._replay(key, kind, name, fp, inputs)
        if entry is not None:
            return self.outcome(entry)
        return self.run_live(scope, key, kind, name, fn, args, kwargs, retry=retry,
                             inputs=inputs, fp=fp, usage=usage, meta=meta,
                             before_live=before_live)

    async def step_async(self, kind: str, name: str, fn: Callable[..., Any], args: tuple = (),
                         kwargs: dict | None = None, *, retry: RetryPolicy | None = None,
                         inputs: Any = None,
                         usage: Callable[[Any], tuple[int, int]] | None = None,
                         meta: Callable[[Any], dict | None] | None = None,
                         before_live: Callable[[], None] | None = None) -> Any:
        """:meth:`step` for a coroutine function ``fn``."""
        scope = self.scope()
        key = scope.next_key()
        fp = fingerprint(inputs) if inputs else ""
        entry = self._replay(key, kind, name, fp, inputs)
        if entry is not None:
            return self.outcome(entry)
        with self._live_step(scope, key, kind, name, inputs, fp, before_live) as started:
            value = await (retry or NO_RETRY).call_async(fn, *args, **(kwargs or {}))
        return self._record_result(key, kind, name, started, value, inputs, fp, usage, meta)

    def run_live(self, scope: Scope, key: str, kind: str, name: str, fn: Callable[..., Any],
                 args: tuple = (), kwargs: dict | None = None, *,
                 retry: RetryPolicy | None = None, inputs: Any = None, fp: str = "",
                 usage: Callable[[Any], tuple[int, int]] | None = None,
                 meta: Callable[[Any], dict | None] | None = None,
                 before_live: Callable[[], None] | None = None) -> Any:
        """Run step ``key``'s function in its own scope and journal its outcome;
        ``before_live`` runs first, in that scope (``step_key()`` is this step's)."""
        with self._live_step(scope, key, kind, name, inputs, fp, before_live) as started:
            value = (retry or NO_RETRY).call(fn, *args, **(kwargs or {}))
        return self._record_result(key, kind, name, started, value, inputs, fp, usage, meta)

    @contextmanager
    def _live_step(self, scope: Scope, key: str, kind: str, name: str, inputs: Any, fp: str,
                   before_live: Callable[[], None] | None) -> Iterator[float]:
        """Step ``key`` executing in its own scope: yields its start time; a failure the
        journal keeps is journaled on its way out."""
        self._check_deadline(key)
        started = time.time()
        sub = scope.step_scope(key)
        self.opened(sub)
        self.live_identities[key] = (kind, name, fp)
        token = enter(sub)
        try:
            if before_live is not None:
                before_live()
            yield started
        except Exception as exc:
            if _journaled_as_failure(exc):
                self._record_failure(key, kind, name, started, exc, inputs, fp)
            raise
        finally:
            leave(token)
            sub.closed = True
            self.ended(sub)
            self.live_identities.pop(key, None)

    def _record_failure(self, key: str, kind: str, name: str, started: float, exc: Exception,
                        inputs: Any, fp: str) -> None:
        entry = self._append(StepEntry(
            -1, key, name, kind, fp, ok=False,
            error=serde.encode_error(exc, terminal=isinstance(exc, TerminalError)),
            started_at=started, finished_at=time.time()), inputs)
        self.failures.append((entry.position, key, exc))

    def _record_result(self, key: str, kind: str, name: str, started: float, value: Any,
                       inputs: Any, fp: str, usage: Callable[[Any], tuple[int, int]] | None,
                       meta: Callable[[Any], dict | None] | None) -> Any:
        try:
            encoded = serde.encode(value)
        except SerializationError as exc:
            raise UnserializableResult(self.run_id, key, name, str(exc)) from None
        prompt, completion = usage(value) if usage else (0, 0)
        self._append(StepEntry(-1, key, name, kind, fp, result=encoded, started_at=started,
                               finished_at=time.time(), prompt_tokens=prompt,
                               completion_tokens=completion, meta=meta(value) if meta else None),
                     inputs)
        return value

    def _append(self, entry: StepEntry, inputs: Any, record_changed: bool = False) -> StepEntry:
        """Account for a completed step and journal it."""
        blobs = None
        if inputs:
            entry.request, blobs = store_request(canonical(inputs))
        entry.spawned = self._spawned(entry.key)
        enclosing = enclosing_step(entry.key)
        made_in = self.live_identities.get(enclosing) if enclosing is not None else None
        if made_in is not None:
            entry.parent = step_identity(*made_in)
        with self.lock:
            self._count(entry)
            if entry.prompt_tokens or entry.completion_tokens or entry.kind in LLM_KINDS:
                self.record.prompt_tokens = self.prompt_tokens
                self.record.completion_tokens = self.completion_tokens
                self.record.cost = self.cost
                self.record.iteration = self.iteration
                record_changed = True
            if self._replays_counting:  # the attempt's replays go with the record
                record_changed = self._note_replays() or record_changed
            self.live_steps += 1
            try:
                self.writer.append(entry, record_changed=record_changed, blobs=blobs)
            except RunLeased:
                self.lease_lost = True
                raise
        if self.options.call_gate is not None:
            self.options.call_gate.account(self.run_id, entry)
        self.observer.on_step(entry, False)
        if record_changed:
            self.observer.on_record(self.record)
        return entry

    def _note_replays(self) -> bool:
        """Note the attempt's replays so far on the record; whether that changed it."""
        drained = self.replay_log.drained  # read first: nothing is replayed after it
        changed = attempts.note_replayed(self.record, self.replay_log.taken)
        self._replays_counting = not drained
        return changed

    def save_record(self) -> None:
        """Write the run record (a status change), fenced, after the queued entries."""
        try:
            self.writer.save_record()
        except RunLeased:
            self.lease_lost = True
            raise
        self.observer.on_record(self.record)

    # -- several steps at once ---------------------------------------------------------------

    def steps_in_order(self, kind: str, calls: list[tuple[str, Callable[[], Any], Any]], *,
                       parallel: bool = False) -> list[tuple[bool, Any]]:
        """Several steps ``(name, fn, inputs)`` taking consecutive keys in list order, each
        replayed or run: ``(True, result)`` or ``(False, exception)`` per step, the same
        live and on replay. durable_nb's own errors (TerminalError among them) are raised.
        With ``parallel``, the functions that must run are called concurrently on threads,
        each in its own scope."""
        scope = self.scope()
        keys = [scope.next_key() for _ in calls]
        outcomes: list[tuple[bool, Any] | None] = [None] * len(calls)
        live: list[tuple[int, Callable[[], Any]]] = []
        for i, ((name, fn, inputs), key) in enumerate(zip(calls, keys)):
            fp = fingerprint(inputs) if inputs else ""
            entry = self._replay(key, kind, name, fp, inputs)
            if entry is None:
                live.append((i, functools.partial(self.run_live, scope, key, kind, name, fn,
                                                  inputs=inputs, fp=fp)))
            else:
                outcomes[i] = _settle(functools.partial(self.outcome, entry))
        if parallel and len(live) > 1:
            with ThreadPoolExecutor(max_workers=min(8, len(live)),
                                    thread_name_prefix=f"durable-nb-{self.run_id}") as pool:
                futures = [(i, pool.submit(contextvars.copy_context().run, _settle, run))
                           for i, run in live]
                for i, future in futures:
                    outcomes[i] = future.result()
        else:
            for i, run in live:
                outcomes[i] = _settle(run)
        return outcomes  # type: ignore[return-value]

    # -- approvals --------------------------------------------------------------------------

    def approval(self, name: str, details: Any, policy: ApprovalPolicy | None = None,
                 approvers: list[str] | None = None, schema: dict | None = None) -> dict:
        """Journaled approval: record it pending, wait for (or park until) a decision given
        for what it shows (:mod:`~durable_nb.approvals.request`), or the one its deadline's
        ``policy`` takes (:mod:`~durable_nb.approvals.tick`), by whom it allows:
        ``approvers`` (a tool's or the request's), else the run's
        (:mod:`~durable_nb.approvals.policy`). ``schema`` (a tool call's: the JSON schema of
        ``details["arguments"]``) lets a decision edit the arguments; the step's result then
        carries them (``args``), as it carries a rejection's ``message``."""
        scope = self.scope()
        key = scope.next_key()
        inputs = {"details": details}
        fp = fingerprint(inputs)
        entry = self._replay(key, "approval", name, fp, inputs)
        if entry is not None:
            return self.outcome(entry)
        digest = request_digest(name, details)
        pending = claim_pending(self, key, name, details, digest, policy or ApprovalPolicy(),
                                approvers, schema)
        decision = None if pending is None else wait_for_decision(self, pending)
        if decision is None:  # the run parks: its request stays pending in the journal
            self.parking = True
            raise Suspend()
        # Stamped taken in the journal (and left there) before the step: from here on the
        # decision can never change, and a second one is refused naming this one.
        decision = take_decision(self.journal, self.run_id, pending, decision)
        if self.listener is not None:
            self.listener.on_event(decision_event(self.record, dict(pending, run_id=self.run_id),
                                                  decision))
        result = {"approved": bool(decision.get("approved")), "note": decision.get("note"),
                  "by": decision.get("by"), "at": decision.get("at", time.time()),
                  "digest": digest}
        for field in ("via", "args", "message", "answer"):
            if decision.get(field) is not None:
                result[field] = decision[field]
        meta: dict[str, Any] = {"details": details}
        if decision.get("replaced"):
            meta["replaced"] = decision["replaced"]
        with self.lock:
            set_pending(self, None)
            attempts.note_decision(self.record, name, result, decision.get("replaced"))
            self._append(StepEntry(-1, key, name, "approval", fp, result=result,
                                   started_at=pending["requested_at"], finished_at=time.time(),
                                   meta=meta), inputs, record_changed=True)
        self.wake_event.set()  # a concurrent approval waiting for the slot takes it now
        save_ancestors(self)
        return result

    # -- sleep and children ----------------------------------------------------------------

    def sleep(self, seconds: float) -> None:
        """Durable sleep: the wake-up time is journaled before sleeping."""
        now = time.time()
        until = float(self.step("sleep", "sleep", lambda: {"until": now + seconds},
                                inputs={"seconds": seconds})["until"])
        while (remaining := until - time.time()) > 0:
            self.check_live()
            self.wake_event.wait(min(remaining, 0.5))
            self.wake_event.clear()

    def child(self, name: str, fn: Callable[..., Any], args: tuple, kwargs: dict,
              inputs: Any) -> Any:
        """Run a sub-agent as its own run; journal its result as one step here."""
        if self._start_child is None:
            raise DurableError(f"run {self.run_id!r} cannot start child runs here")
        started: dict[str, Any] = {}

        def run_child() -> Any:
            child_id = child_run_id(self.run_id, name, self.step_key())
            result, record = self._start_child(child_id, name, fn, args, kwargs, self)
            started.update(run_id=child_id, record=record)
            return result

        return self.step("child", name, run_child, inputs=inputs,
                         meta=lambda _: {"run_id": started["run_id"]},
                         usage=lambda _: (started["record"].prompt_tokens,
                                          started["record"].completion_tokens))


def _settle(thunk: Callable[[], Any]) -> tuple[bool, Any]:
    """``(True, value)``, or ``(False, exception)`` for an exception that is a step's
    outcome; durable_nb's errors that stop the run propagate."""
    try:
        return True, thunk()
    except Exception as exc:
        if isinstance(exc, DurableError) and not isinstance(exc, StepFailed):
            raise
        return False, exc


def run_coroutine_here(coroutine: Any, root: Scope) -> Any:
    """Run an async handler on a new event loop in this thread, its tasks numbered
    (:func:`~durable_nb.execution.scope.task_factory`), its main task owning ``root``."""
    async def main() -> Any:
        root.owner = asyncio.current_task()
        install_task_numbering()
        return await coroutine

    return asyncio.run(main())
