"""The live ipywidgets panel under a batch cell (``%%durable_agent BATCH --over ITEMS``): a
view over the batch's items, as :class:`~durable_nb.batches.batch.BatchObserver`.

It shows a progress bar by status, throughput and ETA, tokens and cost so far and what
replay saved, the items as a table (sortable, filtered by status and by text, a page at a
time), the pending approvals with Approve / Reject per item (a server's question with Answer,
its form, and Decline: :mod:`~durable_nb.notebook.batch_rows`) and "approve all shown" behind a
confirmation, and, for the item clicked in the table, its own run panel
(:class:`~durable_nb.notebook.panel.RunPanel` over the journal).

Traffic stays low whatever the batch's size: redraws are throttled to one every
``refresh_interval`` seconds (with a trailing redraw, so the last change is never lost), and
one redraw sends at most a few comm messages (the summary, the table, the log), so a batch
of 1,000 fast items sends a few updates a second, not thousands. Observer calls come from the
items' threads; all state is guarded by one lock.

A row of the table is clicked in the page: its ``onclick`` writes the item's key into the
panel's *item* field, which sends it to the kernel as a person typing it would (the field
also takes a key typed by hand). Without a widget front end the panel reads as a text
summary (:meth:`BatchPanel.summary`).
"""

from __future__ import annotations

import html
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import ipywidgets as w

from ..batches.batch import Batch, BatchObserver, ItemResult
from ..errors import DecisionExists, DurableError, NotAllowedToDecide
from ..approvals.question import is_question
from ..approvals.request import pending_digest
from ..journal import LLM_KINDS, Journal, Status, StepEntry, entry_cost
from .panel import PANEL_CSS, RunPanel
from .saved_view import LOG_KEPT, saved_view
from .batch_rows import approval_row
from .batch_table import (BAR_ORDER, BATCH_CSS, ITEM_COLOURS, PENDING, STATUS_ORDER,
                          TABLE_HEAD, item_row, items_table, pages_of, preview, progress_bar,
                          waiting_words)
from .step_view import STOPPED_COLOUR
from .step_view import badge as _badge
from ..registry import get_run
from ..summary import cost_of, format_cost, format_duration

__all__ = ["BatchPanel"]

_SAVED_ROWS = 100  # items the saved view lists (problems first)
_APPROVAL_ROWS = 10
_SORTS = [("item order", "index"), ("key", "key"), ("status (problems first)", "status"),
          ("iterations (most first)", "-iterations"), ("tokens (most first)", "-tokens"),
          ("cost (highest first)", "-cost")]

# Shown instead of live controls while the batch executes in the foreground of its cell.
_BUSY_HINT = ("<div class='dnb-muted'>Running in this cell: the kernel is busy and cannot "
              "receive clicks, so the filters, sorting, pages and item view work once the "
              "cell ends. Stop it with the kernel's stop button (&#9632;); the items keep "
              "their journals and resume when the cell runs again.</div>")


def _seconds(seconds: float) -> str:
    """A short time to the hundredth (``0.04 s``), a longer one as format_duration does."""
    return f"{seconds:.2f} s" if seconds < 10 else format_duration(seconds)


def _close_tree(widget: Any) -> None:
    """Close a widget and the widgets inside it (their comms and front-end models)."""
    for child in getattr(widget, "children", ()):
        _close_tree(child)
    widget.close()


class BatchPanel(BatchObserver):
    """A live view of one batch. ``on_decide(run_id, approved, note, digest, request_id)``
    (``digest`` and ``request_id``: of the approval request shown; Approve all adds
    ``via="Approve all"`` as a sixth argument) and ``on_cancel(run_id)`` are called from its buttons;
    ``journal`` is where the items are (for pending approvals' details and the item
    panels)."""

    def __init__(self, batch_id: str, *, title: str = "", journal: Journal | None = None,
                 on_decide: Callable[..., None] | None = None,
                 on_cancel: Callable[[str], None] | None = None,
                 max_total_tokens: int | None = None, max_total_cost: float | None = None,
                 refresh_interval: float = 0.5) -> None:
        self.batch_id = batch_id
        self.title = title
        self._journal = journal
        self._on_decide = on_decide
        self._on_cancel = on_cancel
        self.max_total_tokens = max_total_tokens
        self.max_total_cost = max_total_cost
        self._refresh_interval = refresh_interval
        self._lock = threading.RLock()
        self._items: list[ItemResult] = []
        self._by_key: dict[str, int] = {}
        self._pending: dict[int, dict] = {}  # index -> pending approval of a parked item
        self._executing = False
        self._stopped: str | None = None
        self._t0: float | None = None
        self._t_end: float | None = None
        self._finished_now = 0  # items that finished in this panel's executions
        self._answered = 0  # DONE before the execution began: answered from their records
        self._answered_tokens = 0
        self._answered_cost = 0.0
        self._replayed_steps = 0
        self._executed_steps = 0
        # index -> {step position: replayed} as this panel's executions got each step (the
        # first time: a step executed, then replayed when its item resumes after an approval,
        # stays executed and is not counted as saved)
        self._origins: dict[int, dict[int, bool]] = {}
        self._replayed_tokens = 0
        self._replayed_cost = 0.0
        self._log_buffer: list[str] = []
        self._log_kept = ""  # the log's last LOG_KEPT characters, for the saved view
        self._message = ""
        self._last_refresh = 0.0
        self._timer: threading.Timer | None = None
        self._picked: int | None = None
        self._item_panel: RunPanel | None = None
        self._shown_pending: tuple[int, ...] = ()
        self._rows_in_cell = False  # whether the approval rows shown were drawn without buttons
        # (run id, digest and id of the request shown)
        self._confirming: list[tuple[str, str, str | None]] = []
        self._left_out = ""  # what Approve all leaves out: questions, for their forms
        self._in_cell = False  # executing in the foreground of its cell: see executing_in_cell
        self.redraws = 0

        self.summary_html = w.HTML()
        self.status_filter = w.Dropdown(
            options=[("all", "")] + [(s.lower().replace("_", " "), s) for s in STATUS_ORDER],
            value="", description="status", layout=w.Layout(width="220px"))
        self.text_filter = w.Text(placeholder="filter: key, result or error text",
                                  layout=w.Layout(width="260px"))
        self.sort = w.Dropdown(options=_SORTS, value="index", description="sort",
                               layout=w.Layout(width="250px"))
        self.prev_button = w.Button(description="", icon="chevron-left", tooltip="previous page",
                                    layout=w.Layout(width="36px"))
        self.next_button = w.Button(description="", icon="chevron-right", tooltip="next page",
                                    layout=w.Layout(width="36px"))
        self.page = 0
        self.table = w.HTML()
        self.pick = w.Text(placeholder="click a row, or type an item's key",
                           description="item", continuous_update=False,
                           layout=w.Layout(width="340px"))
        self.pick.add_class("dnb-pick")
        self.close_button = w.Button(description="Close", icon="times",
                                     layout=w.Layout(width="auto", display="none"))
        self.detail = w.VBox([])
        self.approval_head = w.HTML()
        self.approval_note = w.Text(placeholder="optional note for the agent(s)",
                                    layout=w.Layout(width="320px"))
        self.approve_all_button = w.Button(description="Approve all shown",
                                           button_style="success", icon="check-double",
                                           layout=w.Layout(width="auto"))
        self.confirm_text = w.HTML()
        self.confirm_button = w.Button(description="Yes, approve", button_style="success",
                                       icon="check", layout=w.Layout(width="auto"))
        self.confirm_cancel = w.Button(description="Cancel", layout=w.Layout(width="auto"))
        self.confirm_box = w.VBox([self.confirm_text, w.HBox([self.confirm_button,
                                                              self.confirm_cancel])],
                                  layout=w.Layout(display="none", border="1px solid #bf8700",
                                                  padding="4px", margin="4px 0"))
        self.approval_rows = w.VBox([])
        self.approval_box = w.VBox(
            [self.approval_head, w.HBox([self.approval_note, self.approve_all_button]),
             self.confirm_box, self.approval_rows],
            layout=w.Layout(display="none", border="1px solid #bf8700", padding="6px",
                            margin="4px 0"))
        self.log = w.Output(layout=w.Layout(max_height="160px", overflow="auto"))
        self.busy_hint = w.HTML(_BUSY_HINT, layout=w.Layout(display="none"))
        for button in (self.approve_all_button, self.confirm_button, self.confirm_cancel,
                       self.prev_button, self.next_button, self.close_button):
            button.add_class("dnb-button")
        controls = w.HBox([self.status_filter, self.text_filter, self.sort, self.prev_button,
                           self.next_button])
        self.widget = w.VBox([self.summary_html, self.approval_box, self.busy_hint, controls,
                              self.table, w.HBox([self.pick, self.close_button]), self.detail,
                              self.log])
        self.widget.add_class("dnb-panel")
        self.widget.add_class("dnb-batch")
        self.widget.add_class("dnb-live")  # tells the saved view (static_html) to hide

        self.status_filter.observe(lambda _: self._view_changed(), names="value")
        self.text_filter.observe(lambda _: self._view_changed(), names="value")
        self.sort.observe(lambda _: self._view_changed(), names="value")
        self.prev_button.on_click(lambda _: self._turn(-1))
        self.next_button.on_click(lambda _: self._turn(1))
        self.pick.observe(lambda change: self._safely(self._open, change["new"]), names="value")
        self.close_button.on_click(lambda _: self._safely(self._close))
        self.approve_all_button.on_click(lambda _: self._safely(self._ask_approve_all))
        self.confirm_button.on_click(lambda _: self._safely(self._approve_all))
        self.confirm_cancel.on_click(lambda _: self._safely(self._cancel_confirm))
        self.refresh(force=True)

    @classmethod
    def load(cls, batch: Batch, *, journal: Journal | None = None, **kwargs: Any
             ) -> "BatchPanel":
        """A panel rebuilt from the journal (:func:`durable_nb.batch`)."""
        panel = cls(batch.batch_id, title=batch.title, journal=journal, **kwargs)
        panel.on_start(list(batch.items), [])
        return panel

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
        """The widget, with the text summary for front ends without widgets."""
        bundle = dict(self.widget._repr_mimebundle_(include=include, exclude=exclude) or {})
        bundle["text/plain"] = self.summary()
        return bundle

    # -- observer (items' threads) -------------------------------------------------------

    def on_start(self, items: list[ItemResult], todo: list[int]) -> None:
        with self._lock:
            self._items = [replace(item) for item in items]
            self._by_key = {item.key: item.index for item in items}
            answered = [item for item in items if item.replayed]
            self._answered = len(answered)
            self._answered_tokens = sum(item.tokens for item in answered)
            self._answered_cost = sum(item.cost for item in answered)
            self._t0 = time.monotonic()
            self._t_end = None
            self._finished_now = 0
            self._stopped = None
            waiting = [item for item in items if item.status is Status.WAITING_APPROVAL]
        for item in waiting:
            self._note_pending(item)
        self.refresh(force=True)

    def on_item(self, item: ItemResult) -> None:
        with self._lock:
            if not 0 <= item.index < len(self._items):
                return
            before = self._items[item.index]
            if item.status in (Status.DONE, Status.FAILED, Status.CANCELLED) \
                    and before.status not in (Status.DONE, Status.FAILED, Status.CANCELLED):
                self._finished_now += 1
            self._items[item.index] = replace(item)
            if item.status is not Status.WAITING_APPROVAL:
                self._pending.pop(item.index, None)
            picked = self._picked == item.index
        if item.status is Status.WAITING_APPROVAL:
            self._note_pending(item)
        if picked and self._item_panel is not None and self._journal is not None:
            record = self._journal.find_run(item.run_id)
            if record is not None:
                self._item_panel.on_record(record)
        self.refresh()

    def on_item_step(self, index: int, entry: StepEntry, replayed: bool) -> None:
        with self._lock:
            if not 0 <= index < len(self._items):
                return
            seen = self._origins.setdefault(index, {})
            if replayed and entry.position in seen:
                return  # an item resumed after its approval replays what this panel saw
            seen[entry.position] = replayed
            if replayed:
                self._replayed_steps += 1
                if entry.tokens:
                    self._replayed_tokens += entry.tokens
                    self._replayed_cost += cost_of([entry])[0]
            else:
                self._executed_steps += 1
                item = self._items[index]
                if entry.kind in LLM_KINDS:
                    item.iterations += 1
                item.prompt_tokens += entry.prompt_tokens
                item.completion_tokens += entry.completion_tokens
                item.cost += entry_cost(entry)
            panel = self._item_panel if self._picked == index else None
        if panel is not None:
            panel.on_step(entry, replayed)
        self.refresh()

    def _note_pending(self, item: ItemResult) -> None:
        pending = None
        if self._journal is not None:
            try:
                record = self._journal.find_run(item.run_id)
            except DurableError:
                record = None
            pending = record.pending_approval if record is not None else None
        with self._lock:
            self._pending[item.index] = pending or {}

    # -- executions (the notebook's batch) -------------------------------------------------

    def executing(self, on: bool) -> None:
        """The batch is executing items (the cell, or its watcher resuming approved items),
        or stopped doing so."""
        with self._lock:
            self._executing = on
            if on:
                self._stopped = None
            else:
                self._t_end = time.monotonic()
        self.refresh(force=True)

    def executing_in_cell(self, in_cell: bool) -> None:
        """Say whether the batch now executes in the foreground of its cell. While it does,
        a click cannot be relied on to reach the kernel (ipykernel 7.4 delivers it to the
        busy main shell, which reads it only after the cell; 6.x queues it behind the cell):
        every control is disabled, the approvals show how to decide from a terminal instead
        of buttons, and a note says why and what stops the batch (the kernel's stop button).
        When the cell ends (items parked, or resumed in the background) the kernel is idle
        and every click arrives."""
        with self._lock:
            self._in_cell = in_cell
            panel = self._item_panel
        if panel is not None:
            panel.executing_in_cell(in_cell)
        self.refresh(force=True)

    def sync(self, items: list[ItemResult]) -> None:
        """Take the items as an execution left them (after an interrupt, whose items'
        last change is not reported one by one)."""
        with self._lock:
            for item in items:
                if 0 <= item.index < len(self._items) and item.status is not None:
                    self._items[item.index] = replace(item)
                    if item.status is not Status.WAITING_APPROVAL:
                        self._pending.pop(item.index, None)
        self.refresh(force=True)

    def stopped(self, why: str) -> None:
        """This execution was stopped (``"interrupted"``): the badge says so."""
        with self._lock:
            self._stopped = why
        self.refresh(force=True)

    def append_log(self, text: str) -> None:
        """Add printed text to the log (sent with the next redraw)."""
        if text:
            with self._lock:
                self._log_buffer.append(text)
                self._log_kept = (self._log_kept + text)[-LOG_KEPT:]
            self.refresh()

    def tell(self, message: str) -> None:
        """A one-line message under the summary (a decision recorded, an error)."""
        with self._lock:
            self._message = message
        self.refresh(force=True)

    # -- buttons and fields (comm threads) ---------------------------------------------

    def _safely(self, action: Callable[..., Any], *args: Any) -> None:
        try:
            action(*args)
        except Exception as exc:  # shown, never raised into the comm handler
            self.tell(f"durable_nb: {exc}")

    def _view_changed(self) -> None:
        with self._lock:
            self.page = 0
            self._confirming = []
        self.refresh(force=True)

    def _turn(self, step: int) -> None:
        with self._lock:
            self.page = max(0, self.page + step)
        self.refresh(force=True)

    def _decide(self, run_id: str, approved: bool, digest: str | None,
                request_id: str | None) -> None:
        if self._on_decide is None:
            return
        note = self.approval_note.value.strip()
        try:
            self._on_decide(run_id, approved, note, digest, request_id)
        except DecisionExists as exc:  # its buttons stay off: the first decision stands
            self.tell(f"{run_id} was {exc.words} already; nothing was changed")
            return
        except NotAllowedToDecide as exc:  # not this person's to decide: who may
            self.tell(str(exc))
            return
        self.tell(f"{'approved' if approved else 'rejected'} {run_id}")

    def _ask_approve_all(self) -> None:
        # An MCP server's question is left out: a plain approve is no answer to its form.
        with self._lock:
            shown = self._pending_shown()
            asked = sum(1 for i in shown if is_question(self._pending.get(i)))
            shown = [i for i in shown if not is_question(self._pending.get(i))]
            runs = [self._items[i].run_id for i in shown]
            self._confirming = [(self._items[i].run_id, pending_digest(self._pending[i]),
                                 self._pending[i].get("id") or "")
                                for i in shown if self._pending.get(i)]
            self._left_out = (f"{asked:,} question{'s' if asked != 1 else ''} of an MCP server "
                              f"left for {'their' if asked != 1 else 'its'} form" if asked
                              else "")
        if not runs:
            self.tell("no pending approvals are shown" + (f" ({self._left_out})"
                                                          if asked else ""))
            return
        listed = ", ".join(html.escape(r) for r in runs[:8]) + \
            (f" and {len(runs) - 8:,} more" if len(runs) > 8 else "")
        self.confirm_text.value = (f"<b>Approve the pending approval of {len(runs):,} "
                                   f"item{'s' if len(runs) != 1 else ''}?</b> {listed}"
                                   + (f"; {self._left_out}" if asked else ""))
        self.confirm_button.description = f"Yes, approve {len(runs):,}"
        self.confirm_box.layout.display = "flex"

    def _approve_all(self) -> None:
        with self._lock:
            runs, self._confirming = self._confirming, []
        self.confirm_box.layout.display = "none"
        if self._on_decide is None or not runs:
            return
        note = self.approval_note.value.strip()
        done, skipped, decided, refused = 0, 0, [], []
        for run_id, digest, request_id in runs:
            try:
                self._on_decide(run_id, True, note, digest, request_id, "Approve all")
                done += 1
            except DecisionExists as exc:  # decided meanwhile, elsewhere: that one stands
                decided.append(exc)
            except NotAllowedToDecide as exc:  # not this person's: the others still are
                refused.append(exc)
            except DurableError:  # no longer waiting
                skipped += 1
        told = f"approved {done:,} item{'s' if done != 1 else ''}"
        if self._left_out:
            told += f"; {self._left_out}"
        if decided:
            first = decided[0]
            told += (f"; {len(decided):,} had been decided already, left as they were ("
                     f"{first.run_id}: {first.words}"
                     + (" ..." if len(decided) > 1 else "") + ")")
        if refused:
            told += (f"; {len(refused):,} refused, not yours to decide: "
                     + "; ".join(f"{r.run_id} ({r.brief})" for r in refused[:8])
                     + (f" and {len(refused) - 8:,} more" if len(refused) > 8 else ""))
        if skipped:
            told += f"; {skipped:,} no longer waited"
        self.tell(told)

    def _cancel_confirm(self) -> None:
        with self._lock:
            self._confirming = []
        self.confirm_box.layout.display = "none"

    def _open(self, key: str) -> None:
        key = key.strip()
        if not key:
            self._close()
            return
        with self._lock:
            index = self._by_key.get(key)
            item = self._items[index] if index is not None else None
        if item is None:
            self._show_detail(w.HTML(f"<span class='dnb-muted'>no item {html.escape(key)}"
                                     f" in batch {html.escape(self.batch_id)}</span>"))
            return
        if item.status is None or self._journal is None:
            self._show_detail(w.HTML(f"<span class='dnb-muted'>item {html.escape(key)} has "
                                     f"not started yet</span>"))
            with self._lock:
                self._picked, self._item_panel = index, None
            self.close_button.layout.display = None
            self.refresh(force=True)
            return
        info = get_run(item.run_id, journal=self._journal)
        run_id = item.run_id
        with self._lock:
            origins = dict(self._origins.get(index, {}))
        panel = RunPanel.load(
            info, origins, journal=self._journal,
            on_decide=(lambda ok, note, digest, request_id, **content:
                       self._on_decide(run_id, ok, note, digest, request_id, **content))
            if self._on_decide else None, answers=True,
            on_cancel=(lambda: self._on_cancel(run_id)) if self._on_cancel else None)
        with self._lock:
            self._picked, self._item_panel = index, panel
            in_cell = self._in_cell
        if in_cell:
            panel.executing_in_cell(True)
        self._show_detail(panel.widget)
        self.close_button.layout.display = None
        self.refresh(force=True)

    def _show_detail(self, widget: Any) -> None:
        old = self.detail.children
        self.detail.children = [widget] if widget is not None else []
        for shown in old:
            _close_tree(shown)

    def _close(self) -> None:
        with self._lock:
            self._picked, self._item_panel = None, None
        self._show_detail(None)
        self.close_button.layout.display = "none"
        if self.pick.value:
            self.pick.value = ""
        self.refresh(force=True)

    # -- the view ----------------------------------------------------------------------

    def view(self) -> list[ItemResult]:
        """The items the table shows: filtered by status and text, sorted."""
        with self._lock:
            return self._view()

    def _view(self) -> list[ItemResult]:
        wanted = self.status_filter.value
        text = self.text_filter.value.strip().lower()
        items = [i for i in self._items if not wanted or i.state == wanted]
        if text:
            items = [i for i in items
                     if text in i.key.lower() or text in (i.error or "").lower()
                     or text in preview(i.result, 400).lower()]
        order = self.sort.value
        if order == "key":
            items.sort(key=lambda i: i.key)
        elif order == "status":
            items.sort(key=lambda i: (STATUS_ORDER.index(i.state), i.index))
        elif order.startswith("-"):
            field = order[1:]
            items.sort(key=lambda i: (-getattr(i, field), i.index))
        return items

    def _pending_shown(self) -> list[int]:
        return [i.index for i in self._view() if i.status is Status.WAITING_APPROVAL]

    # -- drawing -------------------------------------------------------------------------

    def refresh(self, force: bool = False) -> None:
        """Redraw if forced or if the last redraw is older than the refresh interval; a
        skipped redraw is made when the interval has passed."""
        now = time.monotonic()
        with self._lock:
            wait = self._refresh_interval - (now - self._last_refresh)
            if not force and wait > 0:
                if self._timer is None:
                    self._timer = threading.Timer(wait, self._trailing)
                    self._timer.daemon = True
                    self._timer.start()
                return
            self._last_refresh = now
            self.redraws += 1
            view = self._view()
            pages = pages_of(view)
            self.page = min(self.page, pages - 1)
            summary = self._summary_html()
            table = items_table(self._items, view, self.page, self._picked)
            log, self._log_buffer = "".join(self._log_buffer), []
            pending = tuple(i.index for i in view if i.status is Status.WAITING_APPROVAL)
            in_cell = self._in_cell
            rows_changed = (pending[:_APPROVAL_ROWS], in_cell) != \
                (self._shown_pending, self._rows_in_cell)
            self._shown_pending, self._rows_in_cell = pending[:_APPROVAL_ROWS], in_cell
            rows = [(self._items[i], self._pending.get(i) or {}) for i in self._shown_pending]
            head = self._approval_head(len(pending))
            approvable = sum(1 for i in pending if not is_question(self._pending.get(i)))
            first_page, last_page = self.page == 0, self.page >= pages - 1
        with self.widget.hold_sync():
            self.summary_html.value = summary
            self.table.value = table
            self._enable(not in_cell)
            self.prev_button.disabled = first_page or in_cell
            self.next_button.disabled = last_page or in_cell
            self.approval_head.value = head
            self.approve_all_button.description = f"Approve all {approvable:,} shown"
            self.approval_box.layout.display = "flex" if pending else "none"
        if rows_changed:
            old = self.approval_rows.children
            self.approval_rows.children = [self._approval_row(item, p, in_cell)
                                           for item, p in rows]
            for row in old:  # their comms too, so that views of old rows do not pile up
                _close_tree(row)
        if log:
            self.log.append_stdout(log)

    def _enable(self, live: bool) -> None:
        """Enable the controls (the kernel receives clicks), or disable them and say why
        (the cell runs: see executing_in_cell)."""
        for control in (self.status_filter, self.text_filter, self.sort, self.pick,
                        self.close_button, self.approval_note, self.approve_all_button,
                        self.confirm_button, self.confirm_cancel):
            control.disabled = not live
        self.busy_hint.layout.display = "none" if live else None
        if live:
            self.widget.remove_class("dnb-busy")
        else:
            self.widget.add_class("dnb-busy")

    def _trailing(self) -> None:
        with self._lock:
            self._timer = None
        self.refresh()

    def _counts(self) -> Counter:
        return Counter(i.state for i in self._items)

    def _state(self, counts: Counter) -> tuple[str, str]:
        """The batch's state as (text, colour): stopped, RUNNING, WAITING_APPROVAL, DONE,
        FINISHED (some items not DONE) or INCOMPLETE."""
        total = len(self._items)
        finished = counts["DONE"] + counts["FAILED"] + counts["CANCELLED"]
        if self._stopped:
            return f"stopped: {self._stopped}", STOPPED_COLOUR
        if self._t0 is None:
            return "STARTING", ITEM_COLOURS["RUNNING"]
        if self._executing:
            return "RUNNING", ITEM_COLOURS["RUNNING"]
        if counts["WAITING_APPROVAL"]:
            return "WAITING_APPROVAL", ITEM_COLOURS["WAITING_APPROVAL"]
        if finished == total:
            if counts["DONE"] == total:
                return "DONE", ITEM_COLOURS["DONE"]
            return f"FINISHED: {total - counts['DONE']:,} not done", ITEM_COLOURS["FAILED"]
        return "INCOMPLETE: re-run the cell to finish", STOPPED_COLOUR

    def _summary_html(self, message: bool = True) -> str:
        """The summary; with ``message``, the last one-line message (a click's answer,
        which the saved view, read later, leaves out)."""
        counts = self._counts()
        total = len(self._items)
        title = f" &middot; {html.escape(self.title)}" if self.title else ""
        dead = ("<div class='dnb-dead'><b>This panel belongs to a kernel that stopped</b>; "
                "re-run the cell to reconnect (DONE items are answered from the journal, the "
                "others resume). What it shows is as of the moment the kernel stopped.</div>")
        head = (f"{PANEL_CSS}{BATCH_CSS}{dead}<b>batch {html.escape(self.batch_id)}</b>{title} "
                f"{_badge(*self._state(counts))}")
        lines = [f"<div class='dnb-summary'>{head}", progress_bar(counts, total),
                 f"<div>{' &middot; '.join(self._facts(counts))}</div>"]
        saved = self._saved_text()
        if saved:
            lines.append(f"<div style='color:#1a7f37'>{html.escape(saved)}</div>")
        if self._message and message:
            lines.append(f"<div class='dnb-muted'>{html.escape(self._message)}</div>")
        return "".join(lines) + "</div>"

    def _facts(self, counts: Counter) -> list[str]:
        facts = []
        now = time.monotonic()
        if self._t0 is not None:
            spent = (now if self._executing or self._t_end is None else self._t_end) - self._t0
            if self._executing:
                facts.append(f"elapsed {format_duration(spent)}")
                if self._finished_now and spent > 0:
                    rate = self._finished_now / spent
                    left = counts[PENDING] + counts["RUNNING"]
                    facts.append(f"{rate * 60:,.1f} items/min")
                    if left:
                        facts.append(f"ETA {format_duration(left / rate)}")
            elif self._executed_steps:
                facts.append(f"took {format_duration(spent)}")
            else:  # nothing executed: every item answered or replayed from the journal
                facts.append(f"replayed in {_seconds(spent)}")
        prompt = sum(i.prompt_tokens for i in self._items)
        completion = sum(i.completion_tokens for i in self._items)
        budget = f" of {self.max_total_tokens:,}" if self.max_total_tokens else ""
        facts.append(f"tokens <b>{prompt + completion:,}</b>{budget} ({prompt:,} prompt / "
                     f"{completion:,} completion)")
        cost = sum(i.cost for i in self._items)
        if cost or self.max_total_cost:
            facts.append(f"cost <b>{format_cost(cost)}</b>"
                         + (f" of {format_cost(self.max_total_cost)}"
                            if self.max_total_cost else ""))
        return facts

    def _saved_text(self) -> str:
        parts = []
        if self._answered:
            parts.append(f"{self._answered:,} item{'s' if self._answered != 1 else ''} "
                         f"answered from the journal")
        if self._replayed_steps:
            parts.append(f"{self._replayed_steps:,} step"
                         f"{'s' if self._replayed_steps != 1 else ''} replayed")
        if not parts:
            return ""
        tokens = self._answered_tokens + self._replayed_tokens
        dollars = self._answered_cost + self._replayed_cost
        money = f", {format_cost(dollars)}" if dollars else ""
        spent = f": {tokens:,} tokens{money} not spent again" if tokens else ""
        return "replay: " + ", ".join(parts) + spent

    def _approval_head(self, shown: int) -> str:
        waiting = [i.index for i in self._items if i.status is Status.WAITING_APPROVAL]
        total = len(waiting)
        questions = sum(1 for i in waiting if is_question(self._pending.get(i)))
        more = f" (first {_APPROVAL_ROWS} listed)" if shown > _APPROVAL_ROWS else ""
        hidden = f"; {total - shown:,} more hidden by the filter" if total > shown else ""
        example = next((self._items[i].run_id for i in self._shown_pending), "BATCH/KEY")
        asked = next((self._items[i].run_id for i in waiting
                      if is_question(self._pending.get(i))), "BATCH/KEY")
        answer = (f" A question is answered in its form: its Answer button (the item's run "
                  f"panel), <code>%durable inbox</code> or <code>durable-nb answer "
                  f"{html.escape(asked)}</code>." if questions else "")
        return (f"<b>{waiting_words(total - questions, questions)}</b>"
                f"{hidden}{more}. Decide here, or from anywhere: "
                f"<code>durable-nb approve {html.escape(example)}</code>.{answer}"
                f"<div class='dnb-dead'>Approve and Reject do nothing here: the kernel that "
                f"drew them stopped. Re-run the cell for live buttons, or decide with "
                f"<code>durable-nb approve {html.escape(example)}</code>.</div>")

    def _approval_row(self, item: ItemResult, pending: dict, in_cell: bool = False) -> w.HBox:
        def decide(approved: bool) -> None:
            self._decide(item.run_id, approved, pending_digest(pending) if pending else None,
                         (pending.get("id") or "") if pending else None)

        def answer() -> None:  # the item's run panel, with the question's form
            if self.pick.value == item.key:
                self._open(item.key)
            self.pick.value = item.key

        return approval_row(item, pending, in_cell=in_cell, decide=decide, answer=answer,
                            safely=self._safely)

    # -- the saved view ------------------------------------------------------------------

    def static_html(self) -> str:
        """The panel as it is now, in static HTML (:func:`~durable_nb.notebook.saved_view.saved_view`):
        the summary, the items waiting for approval with how to decide them, and the first
        items in status order (problems first)."""
        with self._lock:
            summary = self._summary_html(message=False)
            items = sorted(self._items, key=lambda i: (STATUS_ORDER.index(i.state), i.index))
            shown = items[:_SAVED_ROWS]
            table = "".join(item_row(item, live=False) for item in shown)
            log = self._log_kept
            waiting = [i.index for i in items if i.status is Status.WAITING_APPROVAL]
            questions = sum(1 for i in waiting if is_question(self._pending.get(i)))
        more = (f"<div class='dnb-muted'>{len(items) - len(shown):,} more items: "
                f"<code>durable-nb batch show {html.escape(self.batch_id)}</code></div>"
                if len(items) > len(shown) else "")
        decide = (f"<div style='border:1px solid #bf8700;padding:6px'><b>"
                  f"{waiting_words(len(waiting) - questions, questions)}</b>: decide with "
                  f"<code>durable-nb approve {html.escape(self.batch_id)}/KEY</code>"
                  + (" (a question: <code>durable-nb answer</code>)" if questions else "")
                  + ", or re-run the cell for the buttons.</div>" if waiting else "")
        body = (f"{summary}{decide}<table class='dnb-items'>{TABLE_HEAD}{table}</table>{more}"
                if items else summary)
        return saved_view(f"<div class='dnb-batch'>{body}</div>", f"batch {self.batch_id}", log)

    # -- text ----------------------------------------------------------------------------

    def summary(self) -> str:
        """The panel as plain text: state, counts, tokens, cost, replay savings, failures
        and pending approvals (for nbconvert, papermill, a terminal)."""
        with self._lock:
            counts = self._counts()
            items = list(self._items)
            pending = dict(self._pending)
            state = self._state(counts)[0]
            facts = self._facts(counts)
            saved = self._saved_text()
        lines = [f"durable batch {self.batch_id}" + (f" ({self.title})" if self.title else "")
                 + f": {state}"]
        total = len(items)
        by_status = ", ".join(f"{counts[s]:,} {s}" for s in BAR_ORDER if counts[s])
        lines.append(f"{total:,} items: {by_status or 'none'}")
        plain = [html.unescape(f.replace("<b>", "").replace("</b>", "")) for f in facts]
        lines.append(", ".join(plain))
        if saved:
            lines.append(saved)
        failed = [i for i in items if i.status in (Status.FAILED, Status.CANCELLED)]
        if failed:
            lines.append("failed:")
            lines += [f"  {i.run_id}: {preview(i.error or str(i.status), 200)}"
                      for i in failed[:10]]
            if len(failed) > 10:
                lines.append(f"  ... {len(failed) - 10:,} more: durable-nb batch show "
                             f"{self.batch_id} --status failed")
        waiting = [i for i in items if i.status is Status.WAITING_APPROVAL]
        if waiting:
            lines.append("waiting for approval (durable-nb approve BATCH/KEY; a question: "
                         "durable-nb answer BATCH/KEY):")
            for i in waiting[:10]:
                p = pending.get(i.index) or {}
                asked = " (a question: durable-nb answer)" if is_question(p) else ""
                lines.append(f"  {i.run_id}{asked}: {p.get('name')!r} "
                             f"{preview(json.dumps(p.get('details'), default=str), 200)}")
            if len(waiting) > 10:
                lines.append(f"  ... {len(waiting) - 10:,} more: durable-nb batch show "
                             f"{self.batch_id} --status waiting_approval")
        return "\n".join(lines)
