"""Running a cell as a durable run inside a kernel, with its panel.

The cell runs on the kernel's main thread, so prints, the stop button (KeyboardInterrupt) and
headless execution behave as in any cell. When the run reaches an approval nobody has decided
yet, it *parks*: the run is left WAITING_APPROVAL, the cell ends, and the panel shows the
buttons. The kernel is then idle, so a click reaches it on every ipykernel version (6.x has no
subshells, 7.4 routes widget messages to the main shell). A watcher thread waits for the
decision (a click, ``durable-nb approve`` or another notebook: all go through the journal) and
resumes the run on that thread by executing it again: completed steps replay from the journal
in microseconds and the loop goes on after the approval, with the same panel live.
"""

from __future__ import annotations

import ast
import getpass
import inspect
import linecache
import os
import sys
import threading
import time
import traceback
from typing import Any, Callable

from . import registry
from .errors import RunLeased
from .journal import Journal, RunRecord, Status, this_host
from .panel import RunPanel
from .runner import RunOptions, RunOutcome, Runner, live_execution, source_hash

__all__ = ["NotebookRun", "compile_cell", "active_run"]

_RESULT_NAME = "__durable_result__"
_active: dict[str, "NotebookRun"] = {}
# Re-entrant (fix): start() holds it while stopping the cell's previous NotebookRun, whose
# stop() takes it too; a plain Lock deadlocked every re-run of a cell in the same kernel.
_active_lock = threading.RLock()


def active_run(run_id: str) -> "NotebookRun | None":
    with _active_lock:
        return _active.get(run_id)


def compile_cell(source: str, run_id: str, namespace: dict) -> Callable[[Any], Any]:
    """The cell body as a handler: it runs in ``namespace`` (the user's) with ``ctx`` set,
    and returns the value of a final expression, as a cell would display it."""
    filename = f"<durable_agent {run_id}>"
    # Registered so that tracebacks show the cell's lines.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    tree = ast.parse(source, filename)
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body[-1]
        tree.body[-1] = ast.copy_location(
            ast.Assign(targets=[ast.Name(_RESULT_NAME, ast.Store())], value=last.value), last)
        ast.fix_missing_locations(tree)
    code = compile(tree, filename, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)

    def handler(ctx: Any) -> Any:
        namespace["ctx"] = ctx
        namespace.pop(_RESULT_NAME, None)
        if code.co_flags & inspect.CO_COROUTINE:  # top-level await: the runner awaits it
            sink = _route_of_this_thread()

            async def run_async_cell() -> Any:
                # The runner may await this on a thread of its own: print where the cell does.
                restore = _route_output(sink) if sink is not None else None
                try:
                    await eval(code, namespace)
                finally:
                    if restore is not None:
                        restore()
                return namespace.pop(_RESULT_NAME, None)

            return run_async_cell()
        exec(code, namespace)
        return namespace.pop(_RESULT_NAME, None)

    return handler


class _RoutedStream:
    """sys.stdout/stderr stand-in that sends what a run's thread prints to its panel log and
    everything else where it went before."""

    def __init__(self, original: Any) -> None:
        self.original = original
        self.routes: dict[int, Callable[[str], None]] = {}

    def write(self, text: str) -> int:
        route = self.routes.get(threading.get_ident())
        if route is None:
            return self.original.write(text)
        route(text)
        return len(text)

    def flush(self) -> None:
        self.original.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.original, name)


def _route_of_this_thread() -> Callable[[str], None] | None:
    stream = sys.stdout
    return stream.routes.get(threading.get_ident()) if isinstance(stream, _RoutedStream) else None


def _route_output(sink: Callable[[str], None]) -> Callable[[], None]:
    """Route this thread's prints to ``sink`` until the returned function is called."""
    streams = []
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not isinstance(stream, _RoutedStream):
            stream = _RoutedStream(stream)
            setattr(sys, name, stream)
        stream.routes[threading.get_ident()] = sink
        streams.append(stream)
    ident = threading.get_ident()

    def restore() -> None:
        for stream in streams:
            stream.routes.pop(ident, None)

    return restore


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
        self.executing = False
        record = journal.find_run(run_id) or RunRecord(run_id=run_id, title=options.title or "")
        note = None
        if options.source is not None and record.source_hash not in (None,
                                                                      source_hash(options.source)):
            note = ("This cell changed since the run started. Steps are still checked against "
                    "the journal: a divergence stops with JournalMismatch (use --on-mismatch "
                    "reset to re-run from the first divergent step).")
        self.panel = RunPanel(record, on_decide=self.decide, on_cancel=self.cancel, note=note)

    # -- the cell ----------------------------------------------------------------------

    def start(self) -> RunOutcome:
        """Execute in the calling (main) thread; park and watch if an approval is pending."""
        with _active_lock:
            previous = _active.get(self.run_id)
            if previous is not None and previous.executing:
                raise RunLeased(
                    self.run_id, {"pid": os.getpid(), "host": this_host()},
                    advice=(f"this kernel resumed it in the background after an approval. "
                            f"Wait for it with `%durable wait {self.run_id}` or stop it with "
                            f"the panel's Cancel button, then re-run the cell."))
            if previous is not None:
                previous.stop()
            _active[self.run_id] = self
        outcome = self._execute()
        if outcome.status is Status.WAITING_APPROVAL:
            self._watch()
        return outcome

    def _execute(self) -> RunOutcome:
        restore = _route_output(self.panel.append_log)
        self.executing = True
        try:
            outcome = Runner(self.run_id, self.handler, journal=self.journal,
                             options=self.options, observer=self.panel).run()
        except BaseException as exc:
            self.panel.on_record(self.journal.find_run(self.run_id) or self.panel._record)
            self.panel.show_result(error=exc)
            raise
        finally:
            self.executing = False
            restore()
        self.panel.on_record(outcome.record)
        if outcome.status is Status.DONE:
            self.panel.show_result(outcome.result)
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
        timeout_at = record.pending_approval.get("timeout_at")
        if timeout_at is not None and time.time() >= timeout_at:
            return True  # resume: the approval times out as a rejection
        target = record.pending_approval.get("run_id", self.run_id)
        decision = self.journal.read_json(f"decision:{target}")
        return isinstance(decision, dict) and \
            decision.get("position") == record.pending_approval.get("position")

    def _watch_loop(self) -> None:
        while not self._stopped.is_set():
            self._wake.wait(self.options.poll_interval * 2)
            self._wake.clear()
            if self._stopped.is_set():
                return
            try:
                decided = self._decided()
                if decided is None:
                    self.panel.on_record(self.journal.get_run(self.run_id))
                    return
                if not decided:
                    continue
                outcome = self._execute()
            except RunLeased:
                return  # another kernel or process resumed it first
            except BaseException as exc:
                self.panel.append_log("".join(traceback.format_exception(exc)))
                return
            if outcome.status is not Status.WAITING_APPROVAL:
                return

    def wake(self) -> None:
        """Look for a decision now rather than at the next poll."""
        self._wake.set()

    def stop(self) -> None:
        """Stop watching (the run stays parked in the journal)."""
        self._stopped.set()
        self._wake.set()
        with _active_lock:
            if _active.get(self.run_id) is self:
                del _active[self.run_id]

    # -- buttons -----------------------------------------------------------------------

    def decide(self, approved: bool, note: str) -> None:
        decide = registry.approve if approved else registry.reject
        decide(self.run_id, note or None, by=f"{getpass.getuser()} (notebook)",
               journal=self.journal)
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


def describe_unfinished(journal: Journal) -> list[str]:
    """Lines about runs left RUNNING or WAITING_APPROVAL by a dead kernel; expired ones are
    marked FAILED ("expired on resume") on the way."""
    lines = []
    for record in registry.runs(journal=journal):
        if record.status not in (Status.RUNNING, Status.WAITING_APPROVAL) or record.parent:
            continue
        if registry.lease_holder(record.run_id, journal=journal) is not None:
            continue
        if record.deadline is not None and time.time() > record.deadline:
            record.status = Status.FAILED
            record.error = "expired on resume: the deadline passed while it was interrupted"
            journal.put_run(record)
            lines.append(f"{record.run_id}: expired (deadline {time.ctime(record.deadline)}), "
                         f"marked FAILED")
        elif record.status is Status.WAITING_APPROVAL:
            name = (record.pending_approval or {}).get("name")
            lines.append(f"{record.run_id}: waiting for approval of {name!r} at iteration "
                         f"{record.iteration}; re-run its cell to show the buttons, or "
                         f"`%durable approve {record.run_id}`")
        else:
            lines.append(f"{record.run_id}: interrupted at iteration {record.iteration} "
                         f"(step {record.step_count}); re-run its cell to continue")
    return lines
