"""The live ipywidgets panel under a ``%%durable_agent`` cell: a view over one run.

It observes the executing run (status, iteration, tokens, step timeline, approvals, log) and
redraws at most every ``refresh_interval`` seconds, so a loop of thousands of fast steps costs a
few comm messages, not thousands. Everything it shows can be rebuilt from the journal
(:meth:`RunPanel.load`). Callbacks may run on a kernel subshell thread (ipykernel >= 7 with
JupyterLab >= 4.4) or on a worker thread: all state is guarded by one lock.
"""

from __future__ import annotations

import html
import json
import threading
import time
from collections import deque
from typing import Any, Callable

import ipywidgets as w

from .journal import RunRecord, Status, StepEntry

__all__ = ["RunPanel"]

_STATUS_COLOURS = {
    Status.RUNNING: "#1f6feb", Status.WAITING_APPROVAL: "#bf8700", Status.DONE: "#1a7f37",
    Status.FAILED: "#cf222e", Status.CANCELLED: "#6e7781",
}
_TIMELINE_ROWS = 30


def _badge(text: str, colour: str) -> str:
    return (f'<span style="background:{colour};color:white;border-radius:8px;padding:1px 8px;'
            f'font-size:0.85em">{html.escape(text)}</span>')


class RunPanel:
    """A live view of one run. Implements :class:`~durable_nb.execution.Observer`.

    ``on_decide(approved, note)`` and ``on_cancel()`` are called from the buttons.
    """

    def __init__(self, record: RunRecord, *, on_decide: Callable[[bool, str], None] | None = None,
                 on_cancel: Callable[[], None] | None = None, refresh_interval: float = 0.25,
                 note: str | None = None) -> None:
        self._lock = threading.RLock()
        self._record = record
        self._on_decide = on_decide
        self._on_cancel = on_cancel
        self._refresh_interval = refresh_interval
        self._last_refresh = 0.0
        self._recent: deque[tuple[StepEntry, bool]] = deque(maxlen=_TIMELINE_ROWS)
        self._replayed = 0
        self._executed = 0
        # Positions already in the timeline: a run resumed after an approval replays its
        # steps again, and those must not show twice or count as replayed twice.
        self._shown: set[int] = set()
        self._note = note
        self._result_html = ""
        self._log_buffer: list[str] = []

        self.header = w.HTML()
        self.stats = w.HTML()
        self.timeline = w.HTML()
        self.result = w.HTML()
        self.log = w.Output(layout=w.Layout(max_height="240px", overflow="auto"))
        self.approval_text = w.HTML()
        self.approval_note = w.Text(placeholder="optional note for the agent",
                                    layout=w.Layout(width="320px"))
        self.approve_button = w.Button(description="Approve", button_style="success", icon="check")
        self.reject_button = w.Button(description="Reject", button_style="danger", icon="times")
        self.cancel_button = w.Button(description="Cancel run", button_style="",
                                      icon="stop",
                                      layout=w.Layout(width="auto", align_self="flex-start"))
        self.approval_box = w.VBox([self.approval_text, w.HBox(
            [self.approval_note, self.approve_button, self.reject_button])],
            layout=w.Layout(display="none", border="1px solid #bf8700", padding="6px"))
        self.approve_button.on_click(lambda _: self._decide(True))
        self.reject_button.on_click(lambda _: self._decide(False))
        self.cancel_button.on_click(lambda _: self._cancel())
        self.widget = w.VBox([self.header, self.stats, self.approval_box, self.timeline,
                              self.log, self.result, self.cancel_button])
        self.refresh(force=True)

    @classmethod
    def load(cls, info: Any, **kwargs: Any) -> "RunPanel":
        """A panel rebuilt from the journal (a :class:`~durable_nb.registry.RunInfo`)."""
        panel = cls(info, **kwargs)
        for entry in info.steps:
            panel._recent.append((entry, True))
        panel._replayed = len(info.steps)
        panel._shown = {entry.position for entry in info.steps}
        panel.refresh(force=True)
        return panel

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

    # -- buttons (any thread) ------------------------------------------------------------

    def _decide(self, approved: bool) -> None:
        if self._on_decide is None:
            return
        self.approve_button.disabled = self.reject_button.disabled = True
        try:
            self._on_decide(approved, self.approval_note.value.strip())
        except Exception as exc:  # shown, never raised into the comm handler
            self.approve_button.disabled = self.reject_button.disabled = False
            self.append_log(f"durable_nb: could not record the decision: {exc}\n")

    def _cancel(self) -> None:
        if self._on_cancel is not None:
            self.cancel_button.disabled = True
            try:
                self._on_cancel()
            except Exception as exc:
                self.append_log(f"durable_nb: could not cancel: {exc}\n")

    # -- observer ----------------------------------------------------------------------

    def on_step(self, entry: StepEntry, replayed: bool) -> None:
        with self._lock:
            if replayed and entry.position in self._shown:
                return  # already shown by an earlier execution of this run
            self._shown.add(entry.position)
            self._recent.append((entry, replayed))
            if replayed:
                self._replayed += 1
            else:
                self._executed += 1
        self.refresh()

    def on_record(self, record: RunRecord) -> None:
        with self._lock:
            self._record = record
        self.refresh(force=record.status is not Status.RUNNING or bool(record.pending_approval))

    def on_text(self, delta: str) -> None:
        """Streamed reply text (``ctx.chat(stream=True)``), shown in the log as it arrives."""
        self.append_log(delta)

    def append_log(self, text: str) -> None:
        """Add printed text to the log area (buffered until the next redraw)."""
        with self._lock:
            self._log_buffer.append(text)
        self.refresh()

    def show_result(self, value: Any = None, error: BaseException | None = None) -> None:
        if error is not None:
            text = f"<b>Error:</b> <code>{html.escape(f'{type(error).__name__}: {error}')}</code>"
        elif value is not None:
            if isinstance(value, str):
                body = value
            else:
                try:
                    body = json.dumps(value, indent=2, default=str)
                except (TypeError, ValueError):
                    body = repr(value)
            text = f"<b>Result:</b><pre style='white-space:pre-wrap'>{html.escape(body[:4000])}</pre>"
        else:
            text = ""
        with self._lock:
            self._result_html = text
        self.refresh(force=True)

    # -- drawing -----------------------------------------------------------------------

    def refresh(self, force: bool = False) -> None:
        """Redraw if forced or if the last redraw is older than the refresh interval."""
        now = time.monotonic()
        with self._lock:
            if not force and now - self._last_refresh < self._refresh_interval:
                return
            self._last_refresh = now
            record = self._record
            log, self._log_buffer = "".join(self._log_buffer), []
            header, stats = self._header_html(record), self._stats_html(record)
            timeline = self._timeline_html()
            pending = record.pending_approval
            result = self._result_html
        with self.widget.hold_sync() if hasattr(self.widget, "hold_sync") else _nothing():
            self.header.value = header
            self.stats.value = stats
            self.timeline.value = timeline
            self.result.value = result
            if pending:
                details = json.dumps(pending.get("details"), indent=2)
                self.approval_text.value = (
                    f"<b>Approval needed:</b> {html.escape(str(pending.get('name')))} "
                    f"(step {pending.get('key')})<pre style='white-space:pre-wrap'>"
                    f"{html.escape(details)}</pre>")
                self.approval_box.layout.display = "flex"
                self.approve_button.disabled = self.reject_button.disabled = False
            else:
                self.approval_box.layout.display = "none"
            finished = record.status in (Status.DONE, Status.FAILED, Status.CANCELLED)
            self.cancel_button.layout.display = "none" if finished else "inline-flex"
        if log:
            self.log.append_stdout(log)

    def _header_html(self, record: RunRecord) -> str:
        title = f" &middot; {html.escape(record.title)}" if record.title else ""
        note = (f"<div style='color:#bf8700'>{html.escape(self._note)}</div>" if self._note else "")
        degraded = ""
        if record.journal_degraded_from is not None:
            degraded = (f"<div style='color:#cf222e'><b>Journal degraded from step "
                        f"{record.journal_degraded_from}</b>: writes are failing and being "
                        f"retried; these steps may run again after a crash.</div>")
        return (f"<b>{html.escape(record.run_id)}</b>{title} "
                f"{_badge(str(record.status), _STATUS_COLOURS[record.status])}{note}{degraded}")

    def _stats_html(self, record: RunRecord) -> str:
        iters = f"{record.iteration}" + (f" / {record.max_iterations}"
                                         if record.max_iterations else "")
        budget = f" of {record.max_tokens:,}" if record.max_tokens else ""
        end = time.time() if record.status is Status.RUNNING else record.updated_at
        elapsed = max(0.0, end - record.created_at)
        parts = [f"iteration <b>{iters}</b>",
                 f"tokens <b>{record.prompt_tokens:,}</b> prompt / "
                 f"<b>{record.completion_tokens:,}</b> completion{budget}",
                 f"steps <b>{self._replayed:,}</b> replayed, <b>{self._executed:,}</b> executed",
                 f"elapsed {elapsed:,.1f} s"]
        if record.error:
            parts.append(f"<span style='color:#cf222e'>{html.escape(record.error)}</span>")
        summary = ""
        if record.context_summary:
            summary = (f"<details><summary>context summary</summary><pre style='white-space:"
                       f"pre-wrap'>{html.escape(record.context_summary)}</pre></details>")
        return " &middot; ".join(parts) + summary

    def _timeline_html(self) -> str:
        if not self._recent:
            return ""
        rows = []
        for entry, replayed in self._recent:
            mark = _badge("replayed", "#6e7781") if replayed else _badge("executed", "#1a7f37")
            outcome = "" if entry.ok else _badge("failed", "#cf222e")
            extra = ""
            if entry.kind == "approval" and entry.ok and isinstance(entry.result, dict):
                decided = entry.result
                outcome = (_badge("approved", "#1a7f37") if decided.get("approved")
                           else _badge("rejected", "#cf222e"))
                note = f": {decided['note']}" if decided.get("note") else ""
                extra = html.escape(f"by {decided.get('by')}{note}")
            if entry.prompt_tokens or entry.completion_tokens:
                extra = f"{entry.prompt_tokens}+{entry.completion_tokens} tok"
            if entry.kind == "compact" and entry.meta:
                extra = f"{entry.meta.get('tokens_before')} &rarr; {entry.meta.get('tokens_after')} tok"
            rows.append(f"<tr><td>{entry.position}</td><td>{html.escape(entry.kind)}</td>"
                        f"<td>{html.escape(entry.name)}</td><td>{entry.duration * 1000:.1f} ms</td>"
                        f"<td>{mark} {outcome}</td><td>{extra}</td></tr>")
        hidden = self._replayed + self._executed - len(self._recent)
        more = f"<div style='color:#6e7781'>{hidden:,} earlier steps not shown</div>" if hidden > 0 else ""
        return (f"{more}<style>.dnb-timeline td, .dnb-timeline th {{padding: 1px 6px; "
                f"line-height: 1.2}}</style><table class='dnb-timeline' style='font-size:0.85em'>"
                f"<tr><th>#</th><th>kind</th><th>name</th><th>time</th><th>how</th>"
                f"<th>detail</th></tr>{''.join(rows)}</table>")


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None
