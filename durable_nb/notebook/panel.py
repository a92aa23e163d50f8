"""The live ipywidgets panel under a ``%%durable_agent`` cell: a view over one run.

It observes the executing run (status, iteration, tokens, cost, step timeline, approvals, log)
and redraws at most every ``refresh_interval`` seconds, so a loop of thousands of fast steps
costs a few comm messages, not thousands; its step timeline, most of a redraw's bytes and of
the browser's work, at most every second (a forced redraw, as the last one, draws it too).
Everything it shows but the log can be rebuilt from the journal (:meth:`RunPanel.load`).
Callbacks may run on a kernel subshell thread (ipykernel >= 7 with JupyterLab >= 4.4) or on a
worker thread: all state is guarded by one lock.

Each timeline row opens (an HTML ``<details>``, no kernel round trip) to what the step was
asked and what came back. When the kernel that drew the panel stops, ipywidgets marks its
views ``jupyter-widgets-disconnected``; the panel's own CSS then shows a note saying so in
place of ipywidgets' broken-link icons, and why its buttons do nothing.
"""

from __future__ import annotations

import html
import json
import threading
import time
import uuid
from collections import deque
from typing import Any, Callable

import ipywidgets as w

from ..execution import attempts
from ..errors import DecisionExists, JournalError, NotAllowedToDecide
from ..approvals.question import is_question
from ..approvals.request import editable, find_decision, pending_digest, request_words
from .answer_form import AnswerForm, QuestionForm
from ..approvals.wording import decision_words
from ..journal import LLM_KINDS, Journal, RunRecord, Status, StepEntry
from ..summary import format_cost, replay_savings
from .approval_view import approval_html, open_in_lab
from .panel_words import (PANEL_CSS, attempt_number, attempts_html, attempts_live_html,
                          degraded_text, stopped_badge, timing_words)
from .saved_view import LOG_KEPT, saved_view
from .step_view import STATUS_COLOURS, STOPPED_COLOUR, StepView, badge, clip

__all__ = ["PANEL_CSS", "RunPanel"]

_STARTING = "#6e7781"
#: Seconds between redraws of a running run's panel when nothing else redraws it (the
#: elapsed time ticks), and at least between two redraws of its timeline that are not forced:
#: the browser renders the timeline's rows whole at each, which with a loop of fast steps
#: cost it more than the kernel's work (benchmarks/RESULTS.md, section 12).
_TICK = 1.0
# Instead of a Cancel button while the run executes in the foreground of its cell.
_STOP_HINT = ("<div style='color:#6e7781'>Running in this cell: stop it with the kernel's stop "
              "button (&#9632;); the run keeps its journal and resumes when the cell runs "
              "again.</div>")
_SETUP_STYLE = ("background:#fff8c5;border:1px solid #d4a72c;color:#4d2d00;padding:4px 8px;"
                "margin:2px 0 6px 0;border-radius:4px;line-height:1.4")
_TIMELINE_ROWS = 30



class RunPanel:
    """A live view of one run. Implements :class:`~durable_nb.execution.Observer`.

    ``on_decide(approved, note, digest, request_id)`` and ``on_cancel()`` are called from
    the buttons; ``digest`` and ``request_id`` name the approval request the panel shows
    (the decision is for it, never for another one the run asks meanwhile).
    ``journal`` (where the run is) lets step details show what each step was asked.
    ``setup_html`` (HTML) says what the Jupyter server lacks, shown live and saved.
    """

    def __init__(self, record: RunRecord, *,
                 on_decide: Callable[..., None] | None = None,
                 on_cancel: Callable[[], None] | None = None, refresh_interval: float = 0.5,
                 note: str | None = None, journal: Journal | None = None,
                 starting: bool = False, setup_html: str = "", answers: bool = False
                 ) -> None:
        self._lock = threading.RLock()
        self._record = record
        # ``starting``: an execution is about to take the run; until it reports (on_record),
        # the status in ``record`` is an earlier execution's and is not shown as current.
        self._starting = starting
        self._attempt_n = attempt_number(record)
        self._ticker: threading.Thread | None = None
        # Redraws are numbered when computed; the widgets take only a newer one, so a
        # redraw computed before a status change never paints over the one after it.
        self._drawn = 0
        self._painted = 0
        self._paint_lock = threading.Lock()
        self._journal = journal
        self._on_decide = on_decide
        self._shown_digest: str | None = None  # of the approval request shown
        self._shown_request: str | None = None  # its id
        # A decision on it that refused this panel's (given elsewhere first): shown even
        # without a journal to read it from.
        self._refused: dict | None = None
        # Why this panel's person may not decide the request (digest, reason): shown under it.
        self._not_allowed: tuple[str | None, str] | None = None
        self._on_cancel = on_cancel
        self._in_cell = False  # executing in the foreground of its cell: see executing_in_cell
        self._refresh_interval = refresh_interval
        self._last_refresh = 0.0
        self._last_timeline = 0.0
        self._timeline_steps = -1  # steps counted when the timeline was drawn last
        # (entry, replayed); replayed None: journaled before, see load()
        self._recent: deque[tuple[StepEntry, bool | None]] = deque(maxlen=_TIMELINE_ROWS)
        # How the run's steps were got, one count per step of the run (not per execution:
        # a run resumed in this kernel after an approval replays its steps again, and they
        # were executed, or replayed from before this kernel, once): position -> True
        # replayed, False executed by an execution seen here, None journaled before.
        self._origins: dict[int, bool | None] = {}
        self._replayed = 0
        self._executed = 0
        self._replayed_entries: dict[int, StepEntry] = {}  # with tokens: the savings line
        # Where the LLM steps' prices came from (the cost line's tooltip), and whether any
        # had none: a run whose every call was priced at zero says "free" once.
        self._price_sources: dict[str, None] = {}
        self._priced = self._unpriced = False
        # Positions already in the timeline: a run resumed after an approval replays its
        # steps again; they are not shown twice.
        self._shown: set[int] = set()
        self._rows = 0  # timeline rows so far (the last _TIMELINE_ROWS are drawn)
        # The error that refused the run before it started (nothing journaled, no run).
        self._refusal: BaseException | None = None
        self._note = note
        self._error: BaseException | None = None
        self._result_html = ""
        self._result_text = ""
        self._log_buffer: list[str] = []
        self._log_kept = ""  # the log's last LOG_KEPT characters, for the saved view
        self._log_ends_line = True
        self._journaled = 0  # steps a loaded panel shows that no execution it saw touched
        self._streaming = False
        self.steps = StepView(journal, record.run_id)  # the timeline's rows and details

        # What this Jupyter server lacks for the panel's link and dead-kernel buttons to work
        # (notebook/extensions.py): shown live and in the saved view.
        self._setup_html = "" if not setup_html else (
            f"<div class='dnb-setup' style='{_SETUP_STYLE}'>{setup_html}</div>")
        self.setup = w.HTML(self._setup_html)
        self.header = w.HTML()
        # The attempts apart from the header, which is redrawn every second: their content
        # changes only with the attempts. Opened by a click, they stay open across redraws
        # and new views of the panel (see attempts_live_html).
        self.attempts = w.HTML(layout=w.Layout(display="none"))
        self._token = uuid.uuid4().hex[:12]
        self.stats = w.HTML()
        self.timeline = w.HTML()
        self.result = w.HTML()
        self.log = w.Output(layout=w.Layout(max_height="240px", overflow="auto"))
        self.approval_text = w.HTML()
        self.approval_note = w.Text(placeholder="optional note for the agent",
                                    layout=w.Layout(width="320px"))
        self.approve_button = w.Button(description="Approve", button_style="success", icon="check")
        self.reject_button = w.Button(description="Reject", button_style="danger", icon="times")
        self.cancel_button = w.Button(description="Cancel run", button_style="", icon="stop",
                                      layout=w.Layout(width="auto", align_self="flex-start"))
        for button in (self.approve_button, self.reject_button, self.cancel_button):
            button.add_class("dnb-button")
        self.stop_hint = w.HTML(_STOP_HINT, layout=w.Layout(display="none"))
        # Every request waiting in the journal, of any run or notebook, under the panel: the
        # inbox of front ends without the Lab sidebar (VS Code, Colab).
        self.inbox_button = w.Button(description="Approvals inbox", icon="inbox",
                                     tooltip="every request waiting in this journal",
                                     layout=w.Layout(width="auto", align_self="flex-start"))
        self.inbox_button.on_click(lambda _: self._toggle_inbox())
        self.inbox_area = w.VBox()
        self.approval_buttons = w.HBox([self.approval_note, self.approve_button,
                                        self.reject_button])
        # ``answers``: on_decide takes edited arguments / a message (``args=``, ``message=``)
        # and the answer to a server's question (``answer=``), whose form replaces the buttons.
        self.answer_form = AnswerForm() if answers else None
        self.question_form = QuestionForm(self._answer) if answers else None
        self.approval_box = w.VBox([self.approval_text,
                                    *([self.answer_form.box] if self.answer_form else []),
                                    *([self.question_form.box] if self.question_form else []),
                                    self.approval_buttons],
                                   layout=w.Layout(display="none", border="1px solid #bf8700",
                                                   padding="6px"))
        self.approve_button.on_click(lambda _: self._decide(True))
        self.reject_button.on_click(lambda _: self._decide(False))
        self.cancel_button.on_click(lambda _: self._cancel())
        self.widget = w.VBox([self.setup, self.header, self.attempts, self.stats,
                              self.approval_box, self.timeline, self.log, self.result,
                              self.cancel_button, self.stop_hint, self.inbox_button,
                              self.inbox_area])
        self.widget.add_class("dnb-panel")
        self.widget.add_class("dnb-live")  # tells the saved view (static_html) to hide
        self.refresh(force=True)

    @classmethod
    def load(cls, info: Any, origins: dict[int, bool] | None = None,
             **kwargs: Any) -> "RunPanel":
        """A panel rebuilt from the journal (a :class:`~durable_nb.registry.RunInfo`).

        ``origins`` maps a step's position to how an execution the caller watched got it
        (True: replayed, False: executed), e.g. a batch panel's; a step not in it is
        labelled "journaled": an earlier execution recorded it, and none seen here touched it.
        """
        panel = cls(info, **kwargs)
        origins = origins or {}
        for entry in info.steps:
            panel.steps.note_messages(entry)
            panel._count(entry, origins.get(entry.position))
        panel._shown = {entry.position for entry in info.steps}
        panel.refresh(force=True)
        return panel

    @property
    def record(self) -> RunRecord:
        """The run's record as the panel shows it now."""
        with self._lock:
            return self._record

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
        """The widget, with a readable text/plain summary for frontends without widgets
        (nbconvert, papermill outputs, a terminal)."""
        bundle = dict(self.widget._repr_mimebundle_(include=include, exclude=exclude) or {})
        bundle["text/plain"] = self.summary()
        return bundle

    # -- buttons (any thread) ------------------------------------------------------------

    def _answer(self, action: str) -> None:
        """A click on the question's Accept, Decline or Cancel."""
        if self.question_form is not None:
            self._decide(action == "accept", self.question_form.answer(action))

    def _buttons_enabled(self, enabled: bool) -> None:
        self.approve_button.disabled = self.reject_button.disabled = not enabled
        if self.question_form is not None:
            for button in self.question_form.buttons.children:
                button.disabled = not enabled

    def _decide(self, approved: bool, answer: dict | None = None) -> None:
        if self._on_decide is None:
            return
        self._buttons_enabled(False)
        try:
            content = ({"answer": answer} if answer is not None else
                       self.answer_form.content(approved) if self.answer_form else {})
            self._on_decide(approved, self.approval_note.value.strip(), self._shown_digest,
                            self._shown_request, **content)
        except DecisionExists as exc:  # decided elsewhere first: that decision is shown
            with self._lock:
                self._refused = exc.decision
            self.refresh(force=True)
        except NotAllowedToDecide as exc:  # not theirs to decide: who may, under the request
            with self._lock:
                self._not_allowed = (self._shown_digest, str(exc))
            self._buttons_enabled(True)
            self.refresh(force=True)
        except Exception as exc:  # shown, never raised into the comm handler
            self._buttons_enabled(True)
            if answer is not None and self.question_form is not None:
                self.question_form.say(f"Nothing was answered: {exc}")
            self.append_log(f"durable_nb: could not record the decision: {exc}\n")

    def _toggle_inbox(self) -> None:
        from .inbox import ApprovalsInbox  # imported late: the inbox imports the session's

        shown = bool(self.inbox_area.children)
        self.inbox_area.children = () if shown else (ApprovalsInbox(self._journal),)

    def _cancel(self) -> None:
        if self._on_cancel is None:
            return
        # Seen at once: the run stops only at its next step boundary, and a click must not
        # look ignored until then.
        self.cancel_button.disabled = True
        self.cancel_button.description = "Cancelling..."
        try:
            self._on_cancel()
        except Exception as exc:  # shown, never raised into the comm handler
            self.cancel_button.disabled = False
            self.cancel_button.description = "Cancel run"
            self.append_log(f"durable_nb: could not cancel: {exc}\n")

    def executing_in_cell(self, in_cell: bool) -> None:
        """Say whether the run now executes in the foreground of its cell. While it does, a
        click cannot be relied on to reach the kernel (ipykernel 7.4 delivers it to the busy
        main shell, which reads it only after the cell; 6.x queues it behind the cell too):
        the panel shows no Cancel, Approve or Reject button then, but what stops the run (the
        kernel's stop button) or decides it (a terminal). A parked run, or one resumed in the
        background, has the buttons: the kernel is idle and every click arrives."""
        with self._lock:
            self._in_cell = in_cell
        self.refresh(force=True)

    # -- observer ----------------------------------------------------------------------

    def _count(self, entry: StepEntry, replayed: bool | None) -> None:
        """Put a step in the timeline and count it by how it was got (see origin_badge)."""
        self._recent.append((entry, replayed))
        self._rows += 1
        if entry.tokens and (entry.kind in LLM_KINDS or entry.kind == "compact"):
            source = (entry.meta or {}).get("price_source")
            if isinstance((entry.meta or {}).get("cost"), (int, float)):
                self._priced = True
                if isinstance(source, str):  # older entries have none
                    self._price_sources[source] = None
            else:
                self._unpriced = True
        self._note_origin(entry, replayed)

    def _note_origin(self, entry: StepEntry, replayed: bool | None) -> None:
        """Count step ``entry`` of the run once, by how it was got: executed if an execution
        seen here executed it (a later one that replays it changes nothing), else replayed
        if one replayed it, else journaled before."""
        position = entry.position
        if position in self._origins:
            before = self._origins[position]
            if before == replayed or (before is False and replayed):
                return
            self._tally(position, before, -1)
        self._origins[position] = replayed
        self._tally(position, replayed, 1)
        if replayed and entry.tokens:
            self._replayed_entries[position] = entry

    def _tally(self, position: int, replayed: bool | None, by: int) -> None:
        if replayed is None:
            self._journaled += by
        elif replayed:
            self._replayed += by
            if by < 0:
                self._replayed_entries.pop(position, None)
        else:
            self._executed += by

    def on_step(self, entry: StepEntry, replayed: bool) -> None:
        with self._lock:
            if replayed and entry.position in self._shown:
                # Shown by an earlier execution of this run (resumed after an approval):
                # this one replayed it, and its row stays as it is.
                self._note_origin(entry, True)
            else:
                self._shown.add(entry.position)
                self.steps.note_messages(entry)
                self._count(entry, replayed)
            if self._streaming and entry.kind in LLM_KINDS:
                self._streaming = False
                if not self._log_ends_line:  # the streamed reply ends its line
                    self._log_buffer.append("\n")
                    self._log_ends_line = True
        self.refresh()

    def on_record(self, record: RunRecord) -> None:
        if record.run_id != self._record.run_id:
            return  # a child run's (ctx.child reports to its parent's view): not this run's
        with self._lock:
            number = attempt_number(record)
            new_attempt = number != self._attempt_n or self._starting
            if number != self._attempt_n:
                # A new execution: how the last one ended is history, not the current state.
                self._attempt_n = number
                self._error = None
                self._result_html = self._result_text = ""
            self._starting = False
            self._record = record
            ticking = record.status is Status.RUNNING and not record.pending_approval
        self.refresh(force=new_attempt or record.status is not Status.RUNNING
                     or bool(record.pending_approval))
        if ticking:
            self._start_ticker()

    def _start_ticker(self) -> None:
        """Redraw every second while the run is RUNNING here (the elapsed time moves when
        a step takes long); the thread ends with the execution."""
        with self._lock:
            if self._ticker is not None and self._ticker.is_alive():
                return
            self._ticker = threading.Thread(target=self._tick, daemon=True,
                                            name=f"durable-nb-panel-{self._record.run_id}")
            self._ticker.start()

    def _running(self) -> bool:
        with self._lock:
            record = self._record
            return record.status is Status.RUNNING and not record.pending_approval \
                and self._error is None and not self._starting

    def _tick(self) -> None:
        # Not forced: a redraw for a step less than the refresh interval ago already moved
        # the elapsed time, and the timeline is redrawn only when a step came since.
        while True:
            time.sleep(_TICK)
            if not self._running():
                return
            self.refresh()

    def on_text(self, delta: str) -> None:
        """Streamed reply text (``ctx.chat(stream=True)``), shown in the log as it arrives."""
        with self._lock:
            self._streaming = True
        self.append_log(delta)

    def on_note(self, text: str) -> None:
        """A message from the runner (e.g. executing again from a changed step)."""
        with self._lock:
            self._note = text
        self.refresh(force=True)

    def append_log(self, text: str) -> None:
        """Add printed text to the log area (buffered until the next redraw)."""
        if not text:
            return
        with self._lock:
            self._log_buffer.append(text)
            self._log_kept = (self._log_kept + text)[-LOG_KEPT:]
            self._log_ends_line = text.endswith("\n")
        self.refresh()

    def show_result(self, value: Any = None, error: BaseException | None = None,
                    shown_below: bool = False) -> None:
        """Show the run's result, or the error that stopped this execution; with
        ``shown_below`` (the cell shows it right below the panel) only a pointer to it, so
        that each is shown once."""
        text = ""
        if error is not None:
            message = str(error) or type(error).__name__
            if shown_below:
                text = (f"<div style='color:#cf222e'><b>Error:</b> "
                        f"{html.escape(type(error).__name__)} (the message is below)</div>")
            else:
                text = (f"<b>Error:</b> <div class='dnb-text' style='color:#cf222e'>"
                        f"{html.escape(f'{type(error).__name__}: {message}')}</div>")
            plain = f"error: {type(error).__name__}: {message}"
        elif value is not None and shown_below:
            text = ("<div style='color:#6e7781'><b>Result:</b> the cell's value, shown below"
                    "</div>")
            plain = "result: the cell's value, shown below"
        elif value is not None:
            if isinstance(value, str):
                body = value
            else:
                try:
                    body = json.dumps(value, indent=2, default=str)
                except (TypeError, ValueError):
                    body = repr(value)
            text = (f"<b>Result:</b><div class='dnb-text' style='font-family:var(--jp-code-font-"
                    f"family, monospace)'>{html.escape(clip(body, 4000))}</div>")
            plain = f"result: {clip(body, 1000)}"
        else:
            plain = ""
        with self._lock:
            self._error = error
            self._starting = False
            self._result_html = text
            self._result_text = plain
        self.refresh(force=True)

    def show_refusal(self, error: BaseException, shown_below: bool = False) -> None:
        """Say that the run was refused before it started (bad options, a channel named but
        not configured ...): nothing was journaled, so there is no run to tell of, only the
        refusal (``error``, or with ``shown_below`` a pointer to it below the panel)."""
        with self._lock:
            self._refusal = error
        self.show_result(error=error, shown_below=shown_below)

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
            header, stats = self._header_html(record, attempts=False), self._stats_html(record)
            tried = attempts_live_html(record, self._token)
            timeline = None  # None: the timeline drawn last stays (a later redraw draws it)
            steps = self._rows
            if force or (now - self._last_timeline >= _TICK and steps != self._timeline_steps):
                timeline, self._last_timeline = self._timeline_html(), now
                self._timeline_steps = steps
            pending = record.pending_approval
            result = self._result_html
            finished = record.status in (Status.DONE, Status.FAILED, Status.CANCELLED) \
                or self._error is not None
            in_cell = self._in_cell
            self._drawn += 1
            drawn = self._drawn
        decided = self._decision_on(pending) if pending else None
        with self._paint_lock:
            if drawn > self._painted:
                self._painted = drawn
                self._paint(header, stats, timeline, result, pending, finished, in_cell,
                            decided)
                self.attempts.value = tried  # unchanged: nothing is sent, nothing redrawn
                self.attempts.layout.display = None if tried else "none"
            if log:
                self.log.append_stdout(log)

    def _decision_on(self, pending: dict) -> dict | None:
        """The decision given on ``pending`` (anywhere: a terminal, the Jupyter server, this
        panel) that its run has not gone on with yet, or None: read from the journal."""
        refused = self._refused
        if refused is not None and refused.get("digest") == pending_digest(pending):
            return refused
        if self._journal is None:
            return None
        try:
            return find_decision(self._journal, pending.get("run_id", self._record.run_id),
                                 pending)
        except (JournalError, OSError):
            return None  # not known now: the buttons stay, and a click is refused if need be

    def _paint(self, header: str, stats: str, timeline: str | None, result: str,
               pending: dict | None, finished: bool, in_cell: bool,
               decided: dict | None = None) -> None:
        # Each widget's change is a message of its own, shown as it arrives: the header (the
        # status badge) goes last, so a page never shows DONE over counts of before the end.
        with self.widget.hold_sync() if hasattr(self.widget, "hold_sync") else _nothing():
            self.stats.value = stats
            if timeline is not None:
                self.timeline.value = timeline
            self.result.value = result
            if pending:
                # Decided (here or elsewhere): the decision is shown, not live buttons.
                live = not (in_cell or decided)
                # The arguments in the form only, when the form shows them to edit.
                editing = live and self.answer_form is not None and editable(pending)
                self.approval_text.value = self._approval_html(pending, in_cell, decided,
                                                               editing=editing)
                self._shown_digest = pending_digest(pending)
                self._shown_request = pending.get("id") or ""  # "": asked before ids
                self.approval_box.layout.display = "flex"
                # A server's question: its form and Accept / Decline / Cancel, not the buttons.
                asking = self.question_form is not None and self.question_form.show(
                    pending, live=live)
                self.approval_buttons.layout.display = "flex" if live and not asking else "none"
                self.approve_button.disabled = self.reject_button.disabled = bool(decided)
                if self.answer_form is not None:
                    self.answer_form.show(pending if live else None)
            else:
                self.approval_box.layout.display = "none"
                if self.answer_form is not None:
                    self.answer_form.show(None)
                if self.question_form is not None:
                    self.question_form.show(None)
            self.cancel_button.layout.display = "none" if finished or in_cell else None
            self.stop_hint.layout.display = None if in_cell and not finished else "none"
            self.header.value = header

    def _approval_html(self, pending: dict, in_cell: bool = False,
                       decided: dict | None = None, editing: bool = False) -> str:
        refused = self._not_allowed
        not_allowed = refused[1] if refused is not None and \
            refused[0] == pending_digest(pending) else None
        return approval_html(pending, self._record.run_id, in_cell=in_cell, decided=decided,
                             not_allowed=not_allowed, editing=editing)

    def _header_html(self, record: RunRecord, attempts: bool = True) -> str:
        """Run id, title, status badge and notes; with ``attempts``, the attempts (the live
        panel has them in a widget of their own: see self.attempts)."""
        title = f" &middot; {html.escape(record.title)}" if record.title else ""
        error = self._error
        if self._refusal is not None:
            shown = badge("not started", _STARTING)
            state = (f"<div style='color:#6e7781'>durable_nb refused to start this run "
                     f"({html.escape(type(self._refusal).__name__)}, see the error below): "
                     f"nothing was executed or journaled. Fix what the error says and run the "
                     f"cell again.</div>")
        elif self._starting and record.status is not Status.DONE:
            shown = badge("starting", _STARTING)
            state = (f"<div style='color:#6e7781'>Taking the run over; it was {record.status} "
                     f"when the last execution ended.</div>")
        elif error is not None and record.status not in (Status.FAILED, Status.CANCELLED):
            # The journal keeps its status (a mismatch changes nothing); this execution stopped.
            shown = badge(stopped_badge(error), STOPPED_COLOUR)
            state = (f"<div style='color:#6e7781'>The run is {record.status} in the journal "
                     f"(unchanged); this execution of the cell stopped, see the error below."
                     f"</div>")
        else:
            shown = badge(str(record.status), STATUS_COLOURS[record.status])
            state = ""
        note = f"<div style='color:#bf8700'>{html.escape(self._note)}</div>" if self._note else ""
        degraded = ""
        if record.journal_degraded_from is not None:
            degraded = (f"<div style='color:#cf222e'><b>Not durable: journal degraded from "
                        f"step {record.journal_degraded_from}</b> "
                        f"(on_journal_error='continue'): {degraded_text(record)}</div>")
        dead = ("<div class='dnb-dead'><b>This panel belongs to a kernel that stopped</b>; "
                "re-run the cell to reconnect (the run resumes or replays from its journal). "
                "What it shows is as of the moment the kernel stopped; "
                f"{open_in_lab(html.escape(record.run_id))} (JupyterLab) shows it as it is "
                "now.</div>")
        return (f"{PANEL_CSS}{dead}<b>{html.escape(record.run_id)}</b>{title} "
                f"{shown}{state}{attempts_html(record) if attempts else ''}{note}{degraded}")

    def _free(self, record: RunRecord) -> bool:
        return not record.cost and self._priced and not self._unpriced

    def _cost_text(self, record: RunRecord) -> str:
        free = self._free(record)
        if not record.cost and not record.max_cost and not free:
            return ""
        text = "free" if free else format_cost(record.cost)
        if record.max_cost:
            text += f" of {format_cost(record.max_cost)}"
        sources = "; ".join(self._price_sources)
        title = f" title='prices: {html.escape(sources, quote=True)}'" if sources else ""
        return f"cost <b{title}>{text}</b>"

    def _stats_html(self, record: RunRecord) -> str:
        if self._refusal is not None:
            return ""  # no run: nothing to count
        iters = f"{record.iteration}" + (f" / {record.max_iterations}"
                                         if record.max_iterations else "")
        budget = f" of {record.max_tokens:,}" if record.max_tokens else ""
        parts = [f"iteration <b>{iters}</b>",
                 f"tokens <b>{record.prompt_tokens:,}</b> prompt / "
                 f"<b>{record.completion_tokens:,}</b> completion{budget}"]
        cost = self._cost_text(record)
        if cost:
            parts.append(cost)
        parts.append(f"steps <b>{self._replayed:,}</b> replayed, <b>{self._executed:,}</b> "
                     f"executed" + self._journaled_text())
        parts.append(timing_words(record))
        line = " &middot; ".join(parts)
        if self._replayed_entries:
            line += (f"<div style='color:#1a7f37'>{html.escape(self._savings())}</div>")
        # The error of an execution this panel saw is its result (or the cell's output,
        # which the result points to): said once.
        if record.error and self._error is None:
            line += f"<div class='dnb-text' style='color:#cf222e'>{html.escape(record.error)}</div>"
        if record.context_summary:
            line += (f"<details><summary>context summary</summary><pre class='dnb-text'>"
                     f"{html.escape(record.context_summary)}</pre></details>")
        return line

    def _journaled_text(self) -> str:
        return f", {self._journaled:,} journaled before" if self._journaled else ""

    def _savings(self) -> str:
        return replay_savings(list(self._replayed_entries.values()), count=self._replayed)

    # -- the timeline ------------------------------------------------------------------

    def _timeline_html(self) -> str:
        if not self._recent:
            return ""
        rows = [self.steps.row(entry, replayed) for entry, replayed in self._recent]
        hidden = self._rows - len(self._recent)
        more = (f"<div style='color:#6e7781'>{hidden:,} earlier steps not shown "
                f"(<code>%durable show {html.escape(self._record.run_id)}</code> lists all)</div>"
                if hidden > 0 else "")
        head = ("<div class='dnb-head'><span>#</span><span>kind</span><span>name</span>"
                "<span>time</span><span>how</span><span>detail (click a step for more)</span>"
                "</div>")
        return f"{more}<div class='dnb-steps'>{head}{''.join(rows)}</div>"

    # -- the saved view ------------------------------------------------------------------

    def static_html(self) -> str:
        """The panel as it is now, in static HTML (:func:`saved_view`): status, stats, the
        pending approval with how to decide it, the timeline (each step opens to its
        details, decided approvals included), the log and the result.

        A pending approval carries an empty ``dnb-decide-here`` element naming the run, the
        digest and the id of the request shown: JupyterLab's Durable runs extension turns it
        into Approve / Reject buttons that decide through the Jupyter server (no kernel
        needed), bound to that request; elsewhere it shows nothing. A request decided
        already (here or elsewhere: a terminal, the Jupyter server) shows that decision
        instead."""
        with self._lock:
            record = self._record
            body = [self._setup_html, self._header_html(record),
                    f"<div>{self._stats_html(record)}</div>"]
            pending = record.pending_approval
            timeline, result, log = self._timeline_html(), self._result_html, self._log_kept
        decided = self._decision_on(pending) if pending else None
        if pending and decided:  # decided elsewhere: the decision, not buttons
            body.append("<div style='border:1px solid #bf8700;padding:6px'>"
                        f"{self._approval_html(pending, decided=decided)}</div>")
        elif pending:
            run_id = html.escape(record.run_id, quote=True)
            digest = html.escape(pending_digest(pending), quote=True)
            request = html.escape(str(pending.get("id") or ""), quote=True)
            body.append("<div style='border:1px solid #bf8700;padding:6px'>"
                        f"{self._approval_html(pending)}"
                        f"<div>Decide from anywhere: <code>durable-nb "
                        f"{'answer' if is_question(pending) else 'approve'} {run_id}</code>.</div>"
                        f"<div class='dnb-decide-here' data-durable-nb-decide='{run_id}' "
                        f"data-durable-nb-digest='{digest}' "
                        f"data-durable-nb-request='{request}'></div></div>")
        body += [timeline, f"<div>{result}</div>"]
        return saved_view("".join(body), f"run {record.run_id}", log)

    # -- text ----------------------------------------------------------------------------

    def summary(self) -> str:
        """The panel as plain text: status, iteration, tokens, cost, pending approval,
        result or error."""
        with self._lock:
            record = self._record
            error = self._error
            result = self._result_text
        if self._refusal is not None:
            return (f"durable run {record.run_id}: not started (refused before it started; "
                    f"nothing was executed or journaled)\n{result}")
        status = str(record.status)
        if self._starting and record.status is not Status.DONE:
            status = f"starting (it was {record.status} when the last execution ended)"
        elif error is not None and record.status not in (Status.FAILED, Status.CANCELLED):
            status = f"{stopped_badge(error)} (the run is {record.status} in the journal)"
        lines = [f"durable run {record.run_id}" + (f" ({record.title})" if record.title else "")
                 + f": {status}"]
        resumed = attempts.resumed_words(record)
        if resumed:
            lines.append(resumed)
        iters = f"{record.iteration}" + (f" / {record.max_iterations}"
                                         if record.max_iterations else "")
        facts = [f"iteration {iters}",
                 f"tokens {record.prompt_tokens:,} prompt + {record.completion_tokens:,} "
                 f"completion"]
        if record.cost or record.max_cost or self._free(record):
            facts.append(f"cost {'free' if self._free(record) else format_cost(record.cost)}"
                         + (f" of {format_cost(record.max_cost)}" if record.max_cost else ""))
        facts.append(f"steps {self._replayed:,} replayed, {self._executed:,} executed"
                     + self._journaled_text())
        facts.append(timing_words(record))
        lines.append(", ".join(facts))
        if self._replayed_entries:
            lines.append(self._savings())
        if record.journal_degraded_from is not None:
            lines.append(f"NOT DURABLE: journal degraded from step "
                         f"{record.journal_degraded_from}: {degraded_text(record)}")
        if record.pending_approval:
            p = record.pending_approval
            lines.append(f"waiting for approval of {p.get('name')!r}: "
                         f"{json.dumps(p.get('details'), default=str)[:300]} "
                         f"({request_words(p)})")
            decided = self._decision_on(p)
            if decided:
                lines.append(f"{decision_words(decided)}; re-run its cell to continue")
        if record.error and not result.startswith("error"):
            lines.append(f"error: {record.error}")
        if result:
            lines.append(result)
        return "\n".join(lines)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None
