"""The team's notifications and decision links, from the hub service alone.

The service is the one sweeper of the team's journal (:func:`start_sweeping`): each sweep is
:func:`~durable_nb.notify.sweeper.sweep_journal`, so deadlines and escalations are applied by
:func:`~durable_nb.approvals.tick.tick` and each request is sent once per recipient (then the journal's retention policy applied when
due: on a hub only the service prunes), by the
channels its own environment configures (``DURABLE_NB_NOTIFY_*``, set by the administrator
in ``c.JupyterHub.services``), to the addresses of the administrator's map
(:class:`~durable_nb.hub.config.HubConfig`), never to an address a user's environment names.
Its links point at the service under the hub's public URL
(``.../services/durable-nb/durable-nb/decide#TOKEN``: the token in the fragment, as
everywhere, :mod:`durable_nb.approvals.links`), so they work while the starter's and every
other user's server is stopped.

A link is bound to the person it was sent to: opening it needs the hub's sign-in, and only
the hub user whose address it was sent to decides by it, as herself
(:func:`~durable_nb.hub.decide.decide_as`: the approvers' list and four-eyes with the
starter the database recorded). Only the service's role writes link records (the
database refuses anyone else's), so nobody else can name a recipient.
"""

from __future__ import annotations

import logging
import threading
import time

from ..approvals.history import record_event
from ..approvals.links import LinkOutcome, inspect_link, journal_ref, parse_token, sent_to
from ..approvals.wording import decision_words
from ..errors import (ApprovalChanged, DecisionExists, DurableError, JournalError,
                      NoPendingApproval, NotAllowedToDecide)
from ..journal import Journal
from ..notify.config import NotifyConfig
from ..notify.sweeper import sweep_journal
from .config import HubConfig
from .decide import decide_as

__all__ = ["link_decision", "start_sweeping"]

_log = logging.getLogger("durable_nb.hub")

_UNKNOWN = LinkOutcome("unknown", 404, "This link is not valid: it was never issued, or its "
                       "run or journal is gone. Nothing was decided.")
_CHANGED = ("The request this link was sent for is no longer the one waiting (the run went on, "
            "or asks something else now, or its deadline passed). Nothing was decided.")


def start_sweeping(journal: Journal, notify: NotifyConfig, period: float
                   ) -> threading.Thread:
    """Sweep the team's journal every ``period`` seconds on a daemon thread
    (:func:`~durable_nb.notify.sweeper.sweep_journal`: deadlines applied, then each request
    sent once per channel and recipient; the journal's claims make a second sweeper, if
    any, send nothing twice)."""
    def loop() -> None:
        while True:
            try:
                sweep_journal(journal, notify)
            except Exception:  # one bad sweep never ends the loop
                _log.exception("durable_nb hub: a sweep failed")
            time.sleep(period)

    thread = threading.Thread(target=loop, name="durable-nb-hub-sweeper", daemon=True)
    thread.start()
    return thread


def link_decision(journal: Journal, config: HubConfig, token: str, *, user: str,
                  approved: bool | None, note: str | None = None,
                  args: dict | None = None, message: str | None = None,
                  answer: dict | None = None) -> LinkOutcome:
    """What the link ``token`` does for hub user ``user`` (the page renders it). With
    ``approved`` (Approve or Reject) it decides, as ``user``, once, with the edited
    ``args`` or the ``message`` for the model if given: the link marked used first, put
    back when the decision is refused."""
    parsed = parse_token(token)
    if parsed is None or parsed[0] != journal_ref(journal.location):
        return _UNKNOWN
    _, run_id, secret = parsed
    key, outcome = inspect_link(journal, run_id, secret)
    if outcome.kind != "open" or key is None or outcome.link is None:
        return outcome
    link = outcome.link
    recipient = next((u for u, a in config.emails.items()
                      if a.lower() == str(link.get("to")).lower()), None)
    if recipient != user:
        why = (f"This link was sent to {sent_to(link)}"
               f"{f', which is {recipient}' if recipient else ', no user of this hub'}; you "
               f"are signed in as {user}. Nothing was decided.")
        # Once per link and person: viewing it again does not grow the journal.
        if journal.add_delivery(run_id, f"{key}/refused/not-recipient/{user}",
                                {"kind": "refusal", "at": time.time()}):
            record_event(journal, run_id, "link_refused", f"decision link sent to "
                         f"{sent_to(link)} refused: opened by {user}",
                         request=link.get("request"), digest=link.get("digest"),
                         name=link.get("name"), to=link.get("to"), by=user,
                         reason="not the recipient")
        return LinkOutcome("refused", 403, why, link, run=outcome.run)
    if approved is None:
        return outcome
    used = dict(link, state="used", used_at=time.time(), approved=approved)
    if not journal.swap_delivery(run_id, key, link, used):
        return LinkOutcome("used", 410, "This link was used already. A link decides once.",
                           link, run=outcome.run)
    try:
        decision = decide_as(journal, config, run_id, user=user, approved=approved,
                             note=note, via="link", request_id=link.get("request"),
                             digest=str(link.get("digest") or ""), refusals_once=key,
                             args=args, message=message, answer=answer)
    except DurableError as exc:
        journal.swap_delivery(run_id, key, used, link)  # nothing decided: unused again
        if isinstance(exc, JournalError):
            raise
        if isinstance(exc, DecisionExists):
            return LinkOutcome("decided_already", 409, f"This request was "
                               f"{decision_words(exc.decision, timed=True)} already. Nothing "
                               f"was changed.", link, decision=exc.decision, run=outcome.run)
        if isinstance(exc, NotAllowedToDecide):
            return LinkOutcome("refused", 403, f"This link cannot decide this request: "
                               f"{exc.brief}. Nothing was decided.", link, run=outcome.run)
        if isinstance(exc, (ApprovalChanged, NoPendingApproval)):
            return LinkOutcome("changed", 409, _CHANGED, link, run=outcome.run)
        return LinkOutcome("failed", 409, str(exc), link, run=outcome.run)
    record_event(journal, run_id, "link_used", f"decision link sent to {sent_to(link)} "
                 f"used: {decision_words(decision)}", pending=outcome.pending, by=user,
                 via="link", to=link.get("to"), channel=link.get("channel"))
    return LinkOutcome("decided", 200, f"{'Approved' if approved else 'Rejected'}, as {user}.",
                       used, pending=outcome.pending, decision=decision, run=outcome.run)
