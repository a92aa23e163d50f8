"""What a run's panel shows of its pending approval: the request, who may decide it, by when
and what its deadline does then, a decision given on it that the run has not taken yet, and
how to decide it from elsewhere. Pure functions of the pending approval (the panel,
:mod:`~durable_nb.notebook.panel`, draws them; its saved view keeps them).
"""

from __future__ import annotations

import html
import json
import time

from ..approvals.policy import allowed_approvers, deadline_of
from ..approvals.question import is_question
from ..approvals.request import request_words, short
from ..approvals.wording import decision_words
from ..timestamps import format_time
from .step_view import clip

__all__ = ["approval_html", "deadline_words", "open_in_lab"]

#: What the deadline's policy does, by ``on_timeout``.
_THEN = {"reject": "rejected", "approve": "approved"}


def open_in_lab(escaped_run_id: str) -> str:
    """A link that JupyterLab's Durable runs extension opens as the run's view (it listens for
    clicks on ``data-durable-nb-run``); elsewhere it does nothing."""
    return (f"<a href='#' class='dnb-open-run' data-durable-nb-run='{escaped_run_id}' "
            f"style='text-decoration: underline'>Durable runs</a>")


def _clock(moment: float, now: float) -> str:
    """``10:32`` on the same day as ``now`` (local time), else the date and time."""
    day = time.strftime("%Y-%m-%d", time.localtime(moment))
    if day == time.strftime("%Y-%m-%d", time.localtime(now)):
        return time.strftime("%H:%M", time.localtime(moment))
    return format_time(moment)[:-3]


def _in(seconds: float) -> str:
    """``in 14 min``, ``in 2 h 5 min``, ``in 40 s``: rounded the way a person reads a clock."""
    if seconds < 60:
        return f"in {int(seconds)} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"in {minutes} min"
    return f"in {minutes // 60} h {minutes % 60} min"


def deadline_words(pending: dict, now: float | None = None) -> str | None:
    """``decide by 10:32 (in 14 min), then rejected``: the deadline of ``pending``
    (:func:`~durable_nb.approvals.policy.deadline_of`, the escalation's once escalated)
    and what its policy does then; None when it has none. Drawn at ``now``: the relative
    part is as of then."""
    moment = deadline_of(pending)
    if not isinstance(moment, (int, float)) or isinstance(moment, bool):
        return None
    now = time.time() if now is None else now
    escalation = pending.get("escalation")
    if pending.get("on_timeout") == "escalate" and not escalation:
        who = ", ".join(str(a) for a in pending.get("escalate_to") or ()) or "other approvers"
        then = f"escalated to {who}"
    elif escalation:
        then = "rejected"  # a second deadline, after an escalation, rejects
    else:
        then = _THEN.get(str(pending.get("on_timeout") or "reject"), "rejected")
    if moment <= now:
        return f"its deadline {_clock(moment, now)} passed: {then} at the next look"
    return f"decide by {_clock(moment, now)} ({_in(moment - now)}), then {then}"


def _changed_html(earlier: dict | None) -> str:
    """What a request that replaced another at its step says of the one it replaced: that
    a decision given for it is not applied (only when one was given)."""
    if not earlier:
        return ""
    was = (f"{html.escape(str(earlier.get('name')))} "
           f"<code>{html.escape(clip(json.dumps(earlier.get('details'), default=str)))}</code> "
           f"(details digest {short(earlier.get('digest'))})")
    if earlier.get("decided"):
        return (f"<div><b>The request at this step changed</b>: the decision given for "
                f"{was} ({html.escape(str(earlier['decided']))}) is not applied to this one."
                f"</div>")
    return f"<div><b>The request at this step changed</b> since it was shown: it was {was}.</div>"


def _decided_html(decision: dict) -> str:
    """A decision given on the pending request that its run has not gone on with yet."""
    words = decision_words(decision, timed=isinstance(decision.get("at"), (int, float)))
    verdict, rest = words.split(" ", 1)
    note = (f": &ldquo;{html.escape(clip(str(decision['note']), 300))}&rdquo;"
            if decision.get("note") else "")
    colour = "#1a7f37" if decision.get("approved") else "#cf222e"
    return (f"<div class='dnb-decided' style='color:{colour}'><b>{verdict.capitalize()}</b> "
            f"{html.escape(rest)}{note}. The run goes on with this decision when it resumes "
            f"(re-run its cell if no kernel watches it).</div>")


def _deciders_html(pending: dict) -> str:
    """Who may decide ``pending``, when not anyone: its approvers, and the starter excluded
    under four-eyes."""
    approvers = allowed_approvers(pending)
    starter = pending.get("started_by") if pending.get("four_eyes") else None
    if approvers is None and not starter:
        return ""
    who = ", ".join(approvers) if approvers else "anyone"
    but = f" but {starter}, who started the run (four-eyes)" if starter else ""
    return (f"<div class='dnb-deciders' style='color:#6e7781'>Who may decide: "
            f"{html.escape(who + but)}</div>")


def approval_html(pending: dict, run_id: str, *, in_cell: bool = False,
                  decided: dict | None = None, not_allowed: str | None = None,
                  editing: bool = False) -> str:
    """The pending approval ``pending`` of run ``run_id`` as the panel shows it: the request,
    then the decision given on it (``decided``), or who may decide, by when, why this
    panel's person may not (``not_allowed``) and how to decide elsewhere (``in_cell``: the
    cell waits for a decision from outside, see
    :meth:`~durable_nb.notebook.panel.RunPanel.executing_in_cell`). ``editing``: the
    arguments are shown in a form to edit under it, so not here as well."""
    shown = pending.get("details")
    if editing and isinstance(shown, dict):
        shown = {k: v for k, v in shown.items() if k != "arguments"
                 and not (k == "tool" and v == pending.get("name"))}
    details = json.dumps(shown, indent=2, ensure_ascii=False, default=str) if shown else ""
    asked = format_time(pending.get("requested_at"), "")
    since = f" &middot; asked at {asked}" if asked else ""
    run_id = html.escape(str(pending.get("run_id") or run_id))
    # A server's question shows its message and fields in its form, not as JSON.
    question = is_question(pending)
    head = (f"<b>{'Answer needed' if question else 'Approval needed'}:</b> "
            f"{html.escape(str(pending.get('name')))} "
            f"(step {html.escape(str(pending.get('key')))}, "
            f"{html.escape(request_words(pending))}){since}"
            + ("" if question or not details else
               f"<pre class='dnb-text dnb-details'>{html.escape(clip(details))}</pre>")
            + _changed_html(pending.get('replaces')))
    if decided:
        return head + _decided_html(decided)
    head += _deciders_html(pending)
    deadline = deadline_words(pending)
    if deadline:
        head += (f"<div class='dnb-deadline' style='color:#9a6700'>"
                 f"{html.escape(deadline[0].upper() + deadline[1:])}</div>")
    if not_allowed is not None:
        head += (f"<div class='dnb-not-allowed' style='color:#cf222e'>"
                 f"{html.escape(not_allowed)}</div>")
    command = (f"<code>durable-nb answer {run_id} accept --content JSON</code> (or "
               f"<code>decline</code>, <code>cancel</code>)" if question else
               f"<code>durable-nb approve {run_id}</code> (or <code>reject</code>)")
    outside = "" if not in_cell else (
        f"<div>This cell waits for a decision from outside; a click cannot reach the busy "
        f"kernel. Decide with {command} in a terminal, or in {open_in_lab(run_id)} "
        f"(JupyterLab).</div>")
    return (f"{head}{outside}"
            f"<div class='dnb-dead'>Approve and Reject do nothing here: the kernel that "
            f"drew them stopped. Re-run the cell for live buttons, decide in "
            f"{open_in_lab(run_id)} (JupyterLab, no kernel needed), or from anywhere: "
            f"<code>durable-nb approve {run_id}</code> in a terminal, "
            f"<code>%durable approve {run_id}</code> in a notebook.</div>")
