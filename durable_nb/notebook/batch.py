"""A batch cell's execution inside a kernel: ``%%durable_agent BATCH --over ITEMS``, its
panel, and the watcher that resumes parked items when their approvals are decided.

The cell runs the batch on the kernel's main thread, which waits while the items run on a
pool of threads (:func:`durable_nb.batches.batch.prepare`), so the stop button (KeyboardInterrupt)
reaches it: the items in flight stop at their next step, FAILED "interrupted" and resumed
by the next run of the cell; items not started stay unstarted. An item that reaches an
approval nobody has decided *parks* and frees its place; the cell ends when no item can
progress (every item finished or parked), and the kernel is idle for the panel's clicks. A
watcher thread then looks for decisions in the journal (the panel's buttons,
``durable-nb approve BATCH/KEY``, another notebook) and resumes those items on itself, as
:class:`~durable_nb.notebook.session.NotebookRun` does for one run.

Each item's prints, prefixed with the item's key, go to the cell's output while the cell
runs, and to the panel's log when the watcher resumes items in the background (there is no
cell to print to then): each print is shown once.

The cell's value is the :class:`BatchValue`: a :class:`~durable_nb.batches.batch.Batch` whose display
and items are brought up to date with the panel, so what is shown under the cell is the
batch's latest state, not the state when the cell returned.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable

from .. import registry
from ..batches.batch import Batch, ItemResult, prepare
from ..batches.batch import batch as read_batch
from .batch_panel import BatchPanel
from ..errors import DurableError, RunLeased
from ..journal import Journal, Status, this_host
from .output import CellDisplays, route_output
from .watchers import BATCH_WATCHERS, batch_id_of

__all__ = ["BatchValue", "NotebookBatch", "active_batch", "batch_of_run"]


def active_batch(batch_id: str) -> "NotebookBatch | None":
    """The batch cell of this kernel that executes or watches ``batch_id``, if any."""
    return BATCH_WATCHERS.get(batch_id)


def batch_of_run(run_id: str) -> "NotebookBatch | None":
    """The active batch whose item is the run ``run_id`` (``BATCH/KEY``), if any."""
    batch_id = batch_id_of(run_id)
    return active_batch(batch_id) if batch_id else None


class BatchValue(Batch):
    """The Batch a batch cell returns: displayed with a display id, and updated in place
    (its items and its display) by :meth:`update` when the batch changes after the cell
    returned (items resumed after their approvals)."""

    _handle: Any = None

    @classmethod
    def of(cls, batch: Batch) -> "BatchValue":
        return cls(batch.batch_id, list(batch.items), list(batch.removed), batch.title)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        self._handle = display({"text/plain": repr(self)}, raw=True, display_id=True)

    def update(self, batch: Batch) -> None:
        """Take ``batch``'s items, and show them where this value is shown."""
        self.items[:] = batch.items
        self.removed[:] = batch.removed
        if self._handle is not None:
            self._handle.update({"text/plain": repr(self)}, raw=True)


class _ItemLog:
    """Where one item's prints go: whole lines, prefixed with the item's key, to the cell's
    output while the cell runs in the foreground, else to the panel's log."""

    def __init__(self, batch: "NotebookBatch", key: str) -> None:
        self.batch = batch
        self.prefix = f"[{key}] "
        self.partial = ""

    def __call__(self, text: str) -> None:
        lines = (self.partial + text).split("\n")
        self.partial = lines.pop()
        if lines:
            self.batch._print("".join(f"{self.prefix}{line}\n" for line in lines))

    def flush(self) -> None:
        if self.partial:
            self.batch._print(f"{self.prefix}{self.partial}\n")
            self.partial = ""


class NotebookBatch:
    """One batch cell's batch in this kernel: the panel, the foreground execution, and the
    watcher that resumes parked items after their approvals are decided."""

    def __init__(self, batch_id: str, body: Callable[[Any, int], Any], keys: list[str], *,
                 journal: Journal, concurrency: int, retry_failed: bool, wait: bool,
                 title: str | None, limits: dict[str, Any], options: dict[str, Any]) -> None:
        self.batch_id = batch_id
        self.body = body
        self.keys = keys
        self.journal = journal
        self.concurrency = concurrency
        self.retry_failed = retry_failed
        self.wait_for_decisions = wait
        self.title = title
        self.limits = limits
        self.options = options
        self.execution: Any = None
        self.executing = False
        self._foreground = False
        self._cell_stream: Any = None
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._watcher: threading.Thread | None = None
        self._displays: CellDisplays | None = None
        self.value: BatchValue | None = None
        self.panel = BatchPanel(batch_id, title=title or "", journal=journal,
                                on_decide=self.decide, on_cancel=self.cancel,
                                max_total_tokens=limits.get("max_total_tokens"),
                                max_total_cost=limits.get("max_total_cost"))

    # -- display ---------------------------------------------------------------------------

    def show(self) -> None:
        """Display the panel under the cell, and its saved view (:class:`CellDisplays`)."""
        self._displays = CellDisplays(self.panel)

    def refresh_display(self) -> None:
        """Send the panel's display, its saved view and the cell's value again, so that
        the text summary (what nbclient, papermill and nbconvert keep), the saved view (what
        a reopened notebook shows) and the value tell the batch's latest state."""
        if self._displays is not None:
            self._displays.update()
        if self.value is not None and self.execution is not None:
            self.value.update(self.execution.batch())

    # -- the cell --------------------------------------------------------------------------

    def _handler(self, ctx: Any, index: int) -> Any:
        """One item's execution, on its thread: prints routed to its log, then the body."""
        log = _ItemLog(self, self.keys[index])
        restore = route_output(log)
        try:
            return self.body(ctx, index)
        finally:
            restore()
            log.flush()

    def _print(self, text: str) -> None:
        stream = self._cell_stream
        if not self._foreground or stream is None:
            self.panel.append_log(text)
            return
        try:
            stream.write(text)
        except (OSError, ValueError):
            self.panel.append_log(text)

    def start(self) -> Batch:
        """Execute in the calling (main) thread until no item can progress; watch for
        decisions if items are parked. Returns the batch."""
        with BATCH_WATCHERS.lock:
            previous = BATCH_WATCHERS.get(self.batch_id)
            if previous is not None and previous.executing:
                raise RunLeased(
                    self.batch_id, {"pid": os.getpid(), "host": this_host()},
                    advice=(f"this kernel is resuming approved items of the batch in the "
                            f"background. Wait for them with `%durable batch wait "
                            f"{self.batch_id}`, then re-run the cell."))
            if previous is not None:
                previous.stop()
            BATCH_WATCHERS.put(self.batch_id, self)
        self._cell_stream = getattr(sys.stdout, "original", sys.stdout)
        self._foreground = True
        # A click cannot reach a busy cell's kernel on every ipykernel: the panel's controls
        # say so (and what stops the batch) rather than look live and do nothing.
        self.panel.executing_in_cell(True)
        try:
            keys = self.keys
            self.execution, todo = prepare(
                self._handler, range(len(keys)), batch_id=self.batch_id,
                key=lambda index: keys[index], concurrency=self.concurrency,
                retry_failed=self.retry_failed, title=self.title, journal=self.journal,
                observer=self.panel, **self.limits, **self.options)
            self._run(todo)
            while self.wait_for_decisions and self._parked():
                decided = self._decided()
                if decided:
                    self._run(decided)
                else:
                    time.sleep(self.execution.options.poll_interval * 2)
        except KeyboardInterrupt:
            if self.execution is not None:
                self.panel.sync(self.execution.results)
            self.panel.stopped("interrupted")
            raise
        finally:
            self._foreground = False
            self.panel.executing_in_cell(False)
            self.refresh_display()
        self.value = BatchValue.of(self.execution.batch())
        if self._parked():
            self._watch()
        return self.value

    def _run(self, indexes: list[int]) -> None:
        self.executing = True
        self.panel.executing(True)
        try:
            self.execution.execute(indexes)
        finally:
            self.executing = False
            self.panel.executing(False)

    def interrupted_items(self) -> list[str]:
        """Run ids of the items an interrupt stopped in flight (resumed by a re-run)."""
        if self.execution is None:
            return []
        return [r.run_id for r in self.execution.results if r.status is Status.FAILED
                and (r.error or "").startswith("interrupted at step")]

    # -- after the cell: the watcher -------------------------------------------------------

    def _parked(self) -> list[ItemResult]:
        return [r for r in self.execution.results if r.status is Status.WAITING_APPROVAL]

    def _decided(self) -> list[int]:
        """Parked items with a decision; items no longer waiting (cancelled, resumed
        elsewhere) are brought up to date on the way."""
        decided = []
        for item in self._parked():
            record = self.journal.find_run(item.run_id)
            if record is None or record.status is not Status.WAITING_APPROVAL:
                updated = ItemResult.of(item.index, item.key, item.run_id, record)
                self.execution.results[item.index] = updated
                self.panel.on_item(updated)
            elif self.execution._decided(record):
                decided.append(item.index)
        return decided

    def _watch(self) -> None:
        self._watcher = threading.Thread(target=self._watch_loop, daemon=True,
                                         name=f"durable-nb-watch-batch-{self.batch_id}")
        self._watcher.start()

    def _watch_loop(self) -> None:
        poll = self.execution.options.poll_interval * 2
        while not self._stopped.is_set():
            self._wake.wait(poll)
            self._wake.clear()
            if self._stopped.is_set():
                return
            try:
                decided = self._decided()
                if decided:
                    self._run(decided)
                if not self._parked():
                    break
            except BaseException as exc:  # shown in the panel; the items stay in the journal
                self.panel.tell(f"durable_nb: resuming approved items stopped: "
                                f"{type(exc).__name__}: {exc}. Re-run the cell to go on.")
                break
        self.refresh_display()

    def wake(self) -> None:
        """Look for decisions now rather than at the next poll."""
        self._wake.set()

    def stop(self) -> None:
        """Stop watching (parked items stay parked in the journal)."""
        self._stopped.set()
        self._wake.set()
        BATCH_WATCHERS.forget(self.batch_id, self)

    def watching(self) -> bool:
        """Whether the watcher waits for decisions (or resumes decided items)."""
        return self._watcher is not None and self._watcher.is_alive()

    # -- buttons ---------------------------------------------------------------------------

    def decide(self, run_id: str, approved: bool, note: str, digest: str | None,
               request_id: str | None = None, via: str = "batch panel", **content: Any) -> None:
        """An item's Approve / Reject, or Approve all (``via``), of the request the panel
        showed (``digest``, ``request_id``): written once (DecisionExists, which the panel
        tells, when the item was decided already); ``content``: the edited ``args``, the
        ``message`` or the ``answer`` to a question, from the item's run panel."""
        decide = registry.approve if approved else registry.reject
        decide(run_id, note or None, by=f"{registry.approver_name(host=False)} (notebook)",
               expect=digest, request_id=request_id, via=via, journal=self.journal,
               **content)
        self._wake.set()

    def cancel(self, run_id: str) -> None:
        registry.cancel(run_id, journal=self.journal)
        self._wake.set()


def wait_for_batch(batch_id: str, journal: Journal, timeout: float | None = None) -> Batch:
    """Wait until every item of the batch finished (DONE, FAILED or CANCELLED) and nothing
    executes it; the batch then. Raises DurableError after ``timeout`` seconds, naming the
    items still waiting for approval."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        current = read_batch(batch_id, journal=journal)
        active = active_batch(batch_id)
        if current.done and (active is None or not active.executing) and not any(
                registry.lease_holder(item.run_id, journal=journal) is not None
                for item in current):
            if active is not None:
                active.refresh_display()
            return current
        if active is not None and not active.executing and not active.watching():
            stuck = [item.run_id for item in current if item.status is None
                     or item.status is Status.RUNNING]
            if stuck:
                raise DurableError(
                    f"batch {batch_id!r} will not finish by waiting: {len(stuck):,} of its items "
                    f"never ran or were interrupted ({', '.join(stuck[:3])}"
                    f"{' ...' if len(stuck) > 3 else ''}). Re-run the batch's cell to finish "
                    f"them.")
        if deadline is not None and time.monotonic() > deadline:
            waiting = [item.run_id for item in current if item.status is Status.WAITING_APPROVAL]
            counts = ", ".join(f"{n:,} {s}" for s, n in sorted(current.counts.items()))
            hint = ""
            if waiting:
                listed = ", ".join(waiting[:3]) + (" ..." if len(waiting) > 3 else "")
                hint = (f"; {len(waiting):,} wait for approval ({listed}): approve them with "
                        f"`%durable approve {waiting[0]}` or the panel's buttons")
            raise DurableError(f"batch {batch_id!r} is not finished after {timeout:g} s "
                               f"({counts}){hint}. Wait longer with --timeout, or look at it: "
                               f"`%durable batch show {batch_id}`.")
        time.sleep(0.2)
