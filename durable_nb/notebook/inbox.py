"""An approvals inbox in the kernel's own output (``%durable inbox``), for front ends that
show ipywidgets but load no Jupyter extension (VS Code, Colab, ...), where the Lab sidebar
and its inbox do not exist.

The inbox lists the requests waiting in one journal, across its runs and the notebooks that
started them (a terminal's and a script's too), each with its run, tool, details and when it
was asked, and Approve / Reject with a note. A click decides through
:func:`decide_request`, the one place this module decides: bound to the request's id and
digest as the card showed them, written once (a request decided elsewhere meanwhile, or
asked again, is refused and said, never decided in its place). A kernel watching the parked
run (the notebook that parked it, alive) resumes it; otherwise the run goes on when its cell
is run again.

Widget callbacks run on a kernel subshell's thread (JupyterLab >= 4.4), not the main one: a
lock keeps one decision and one redraw at a time, and the journal is opened per call.
"""

from __future__ import annotations

import html
import json
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any

import ipywidgets as widgets

from .. import registry
from ..errors import DurableError
from ..approvals.question import answer_words, is_question
from ..approvals.request import editable, pending_digest, request_words, short
from ..approvals.wording import decision_words, verdict
from .answer_form import AnswerForm, QuestionForm
from ..journal import JournalSpec, RunRecord, Status, default_location, open_journal
from ..timestamps import format_time
from .extensions import lab_extension_served
from .watchers import wake_watchers

__all__ = ["ApprovalsInbox", "WaitingRequest", "decide_request", "waiting_requests",
           "where_the_sidebar_is"]

#: How a decision given here is told apart in the run's history.
VIA = "%durable inbox"

_DETAILS_SHOWN = 2000


@dataclass(frozen=True)
class WaitingRequest:
    """One request a run waits for, as a card shows it (and binds its decision to)."""

    run_id: str
    title: str | None
    notebook: str | None
    name: str
    details: Any
    request_id: str | None
    digest: str
    requested_at: float | None
    #: A decision given already that the run has not taken yet (its kernel gone), or None.
    decided: dict | None
    #: The pending request as read (its schema makes its arguments editable).
    pending: dict | None = None


def waiting_requests(journal: JournalSpec = None) -> list[WaitingRequest]:
    """The requests waiting in ``journal`` (default: the kernel's), oldest run first."""
    opened = open_journal(journal)
    found = []
    for record in registry.runs(Status.WAITING_APPROVAL, journal=opened):
        pending = record.pending_approval
        if not isinstance(pending, dict):
            continue
        found.append(_request(record, pending, registry.recorded_decision(record, opened)))
    return found


def _request(record: RunRecord, pending: dict, decided: dict | None) -> WaitingRequest:
    request_id = pending.get("id")
    return WaitingRequest(
        run_id=record.run_id, title=record.title if isinstance(record.title, str) else None,
        notebook=record.notebook if isinstance(record.notebook, str) else None,
        name=str(pending.get("name")), details=pending.get("details"),
        request_id=None if request_id is None else str(request_id),
        digest=pending_digest(pending), requested_at=pending.get("requested_at"),
        decided=decided, pending=pending)


def decide_request(journal: JournalSpec, request: WaitingRequest, *, approved: bool,
                   note: str | None, **content: Any) -> str:
    """Decide ``request`` as its card showed it; the sentence to show. Raises a
    :class:`~durable_nb.errors.DurableError` (decided already, changed, not this person's
    to decide) with nothing written.

    The one call of this module that decides: the registry's decision, the same as
    ``durable-nb approve``, the panel and the Jupyter server, bound to the request's id and
    digest, so a card of request #1 does not decide an identical #2 asked after it.
    ``content``: ``args`` (edited arguments), ``message`` (for the model) or ``answer`` (to
    a server's question)."""
    opened = open_journal(journal)
    decide = registry.approve if approved else registry.reject
    decision = decide(request.run_id, note or None, expect=request.digest,
                      request_id=request.request_id or "", via=VIA, journal=opened,
                      **content)
    # A parked run (or batch item) of this kernel resumes without waiting for its poll.
    wake_watchers(request.run_id)
    said = verdict({"approved": decision.approved, "args": decision.args,
                    "message": decision.message})
    if decision.answer is not None:
        said = f"answered {answer_words(decision.answer)}"
    return (f"{said} by {decision.by}: the run resumes in a kernel that watches it, else "
            f"when its cell is run again")


def where_the_sidebar_is() -> str:
    """Where this front end shows durable_nb's Lab sidebar, or why it has none (HTML)."""
    if "google.colab" in sys.modules:
        front_end = "Colab loads no Jupyter extensions"
    elif any(name.startswith("VSCODE_") for name in os.environ):
        front_end = "VS Code loads no Jupyter extensions"
    else:
        front_end = "A front end without Jupyter extensions (VS Code, Colab) has no sidebar"
    return (f"{front_end}: this inbox is the view of every waiting request there. In "
            "JupyterLab, the <b>Durable runs</b> sidebar (left side bar) and its inbox show "
            "them with the run views; in Notebook 7 it is under View &gt; Left Sidebar. Both "
            "need durable-nb installed in the Jupyter server's environment "
            "(<code>pip install \"durable-nb[lab]\"</code>, then restart the server).")


class ApprovalsInbox(widgets.VBox):
    """The inbox widget over ``journal`` (default: the kernel's, as ``%durable`` opens it):
    a card per waiting request, Refresh, and where the Lab sidebar would be."""

    def __init__(self, journal: JournalSpec = None) -> None:
        super().__init__()
        self.add_class("dnb-inbox")
        self._journal = default_location() if journal is None else journal
        self._lock = threading.Lock()
        self._head = widgets.HTML()
        #: What the last click did (decided, or refused and why).
        self.notice = widgets.HTML()
        refresh = widgets.Button(description="Refresh", icon="refresh")
        refresh.on_click(lambda _button: self.refresh())
        self._cards = widgets.VBox()
        #: The cards by run id (what a test clicks, as a person does).
        self.cards: dict[str, _Card] = {}
        # Where the page has the sidebar (its server serves the Lab extension), nothing.
        footer = widgets.HTML("" if lab_extension_served() else
                              f"<div style='color:#666;font-size:90%'>"
                              f"{where_the_sidebar_is()}</div>")
        self.children = [widgets.HBox([self._head, refresh]), self.notice, self._cards, footer]
        self.refresh()

    def _repr_mimebundle_(self, **kwargs: Any) -> dict:
        """The widget, with the requests as text/plain for outputs read without widgets
        (nbconvert, a terminal)."""
        bundle = dict(super()._repr_mimebundle_(**kwargs) or {})
        bundle["text/plain"] = self.summary()
        return bundle

    def summary(self) -> str:
        """The requests shown, one line each, as plain text."""
        lines = [f"{len(self.cards)} approval request(s) waiting"]
        for card in self.cards.values():
            request = card.request
            state = "" if request.decided is None else " (decided, not taken yet)"
            lines.append(f"  {request.run_id}: {request.name} {_compact(request.details)} "
                         f"(details digest {short(request.digest)}){state}")
        return "\n".join(lines)

    def refresh(self, notice: str = "") -> None:
        """Read the journal again and redraw the cards (``notice``: what the last click did)."""
        with self._lock:
            self._redraw(notice)

    def _redraw(self, notice: str) -> None:
        try:
            found = waiting_requests(self._journal)
        except DurableError as exc:
            self._head.value = "<b>Approvals inbox</b>"
            self.notice.value = _error(f"The journal could not be read: {exc}")
            return
        undecided = sum(1 for request in found if request.decided is None)
        where = getattr(self._journal, "location", None) or getattr(
            self._journal, "directory", self._journal)  # a Journal (a panel's) or a location
        self._head.value = (f"<b>Approvals inbox</b>: {undecided} waiting in "
                            f"<code>{html.escape(str(where))}</code>")
        self.notice.value = notice
        self.cards = {request.run_id: _Card(self, request) for request in found}
        self._cards.children = [card.box for card in self.cards.values()] or [
            widgets.HTML("<i>No approval is pending.</i>")]

    def decide(self, request: WaitingRequest, approved: bool, note: str,
               form: AnswerForm | None = None, answer: dict | None = None) -> None:
        """A card's click: decide (with the form's edited arguments or message, or the
        ``answer`` to a server's question), then redraw with what it did."""
        with self._lock:
            try:
                content = {"answer": answer} if answer is not None else \
                    form.content(approved) if form is not None else {}
                done = decide_request(self._journal, request, approved=approved, note=note,
                                      **content)
                said = _ok(f"{request.run_id}: {done}")
            except DurableError as exc:
                said = _error(f"{request.run_id}: nothing was decided: {exc}")
            self._redraw(said)


class _Card:
    """One waiting request: what it asks, a note, Approve and Reject (or the decision given)."""

    def __init__(self, inbox: ApprovalsInbox, request: WaitingRequest) -> None:
        self.request = request
        where = " · ".join(html.escape(part) for part in (request.title, request.notebook)
                           if part)
        shown = request.details
        if request.decided is None and editable(request.pending) and isinstance(shown, dict):
            # The arguments are in the form to edit below: not twice.
            shown = {k: v for k, v in shown.items() if k != "arguments"
                     and not (k == "tool" and v == request.name)}
        details = json.dumps(shown, indent=2, ensure_ascii=False, default=str) if shown else ""
        if len(details) > _DETAILS_SHOWN:
            details = details[:_DETAILS_SHOWN] + "\u2026"
        named = request_words({"id": request.request_id, "digest": request.digest})
        text = widgets.HTML(
            f"<b><code>{html.escape(request.run_id)}</code></b> {where}<br>"
            f"<b>{html.escape(request.name)}</b> · {html.escape(named)}"
            f" · asked {format_time(request.requested_at)}"
            + (f"<pre style='margin:4px 0'>{html.escape(details)}</pre>" if details else ""))
        self.note = widgets.Text(placeholder="note (optional, recorded with the decision)")
        self.approve = widgets.Button(description="Approve", button_style="success")
        self.reject = widgets.Button(description="Reject", button_style="danger")
        self.form = AnswerForm()
        self.form.show(request.pending)
        # A server's question: its fields, Accept / Decline / Cancel (its own buttons).
        self.question = QuestionForm(lambda action: inbox.decide(
            request, action == "accept", self.note.value,
            answer=self.question.answer(action)))
        self.question.show(request.pending)
        self.approve.on_click(lambda _b: inbox.decide(request, True, self.note.value, self.form))
        self.reject.on_click(lambda _b: inbox.decide(request, False, self.note.value,
                                                     self.form))
        if request.decided is not None:
            given = request.decided
            said = decision_words(given)
            if given.get("answer"):
                said = (f"answered {answer_words(given['answer'])} by "
                        f"{given.get('by') or 'someone'}")
            row: widgets.Widget = widgets.HTML(
                f"<i>{html.escape(said)}; not taken by the run "
                "yet (a kernel watching it takes it within seconds, else re-run its cell)</i>")
        elif is_question(request.pending):
            row = self.question.box
        else:
            buttons = widgets.HBox([self.note, self.approve, self.reject])
            # A tool call's arguments, editable, and a message for the model; not there
            # (not even hidden) for a request without arguments to edit.
            row = widgets.VBox([self.form.box, buttons]) if editable(request.pending) \
                else buttons
        self.box = widgets.VBox([text, row], layout=widgets.Layout(
            border="1px solid #bf8700", padding="4px", margin="4px 0"))


def _compact(details: Any) -> str:
    text = json.dumps(details, ensure_ascii=False, default=str)
    return text if len(text) <= 120 else text[:119] + "\u2026"


def _ok(text: str) -> str:
    return f"<div style='color:#1a7f37'>{html.escape(text)}</div>"


def _error(text: str) -> str:
    return f"<div style='color:#cf222e'>{html.escape(text)}</div>"
