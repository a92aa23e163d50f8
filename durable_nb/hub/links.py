"""The team's notifications and decision links, from the hub service alone.

The service is the one sweeper of the team's journal (:func:`start_sweeping`): it applies
deadlines and sends each request once per recipient, by the channels its own environment
configures (``DURABLE_NB_NOTIFY_*``, set by the administrator in ``c.JupyterHub.services``),
to the addresses of the administrator's map (:class:`~durable_nb.hub.config.HubConfig`),
never to an address a user's environment names. Its links point at the service under the
hub's public URL (``.../services/durable-nb/durable-nb/decide/TOKEN``), so they work while
the starter's and every other user's server is stopped.

A link is bound to the person it was sent to: opening it needs the hub's sign-in, and only
the hub user whose address it was sent to decides by it, as herself
(:func:`~durable_nb.hub.decide.decide_as`: the approvers' list and four-eyes with the
starter the database recorded). Only the service's role writes link records (the
database refuses anyone else's), so nobody else can name a recipient.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

from ..errors import DurableError, JournalError, NotAllowedToDecide
from ..execution.approvals import decision_words
from ..execution.history import record_event
from ..journal import Journal
from ..notify.config import NotifyConfig
from ..notify.delivery import sweep
from ..notify.links import LINK_PATH, inspect_link, parse_token, sent_to
from ..notify.start import for_directory
from .config import HubConfig
from .decide import decide_as

__all__ = ["LINK_PATH", "link_decision", "start_sweeping", "team_notify_config"]

_log = logging.getLogger("durable_nb.hub")


def team_notify_config(config: HubConfig, service_url: str) -> NotifyConfig:
    """The service's notification configuration (its environment, where :func:`main
    <durable_nb.hub.service.main>` put the map's addresses as the e-mail recipients), with
    links to ``service_url``."""
    notify = for_directory(None)
    return dataclasses.replace(notify, links=dataclasses.replace(notify.links,
                                                                 base_url=service_url))


def start_sweeping(journal: Journal, notify: NotifyConfig, period: float
                   ) -> threading.Thread:
    """Sweep the team's journal every ``period`` seconds on a daemon thread: deadlines
    applied, each request sent once per channel and recipient (the journal's claims make a
    second sweeper, if any, send nothing twice)."""
    def loop() -> None:
        while True:
            try:
                sweep(journal, notify)
            except Exception:  # one bad sweep never ends the loop
                _log.exception("durable_nb hub: a sweep failed")
            time.sleep(period)

    thread = threading.Thread(target=loop, name="durable-nb-hub-sweeper", daemon=True)
    thread.start()
    return thread


def link_decision(journal: Journal, config: HubConfig, token: str, *, user: str,
                  approved: bool | None) -> tuple[int, str, dict | None]:
    """What the link ``token`` does for hub user ``user``: ``(HTTP status, one sentence,
    the pending request it may decide or None)``. With ``approved`` (a POST) it decides, as
    ``user``, once: the link marked used first, put back when the decision is refused."""
    parsed = parse_token(token)
    if parsed is None:
        return 404, "This link is not valid. Nothing was decided.", None
    _, run_id, secret = parsed
    key, outcome = inspect_link(journal, run_id, secret)
    if outcome.kind != "open" or key is None or outcome.link is None:
        return outcome.status, outcome.message, None
    link = outcome.link
    recipient = next((u for u, a in config.emails.items()
                      if a.lower() == str(link.get("to")).lower()), None)
    if recipient != user:
        why = (f"This link was sent to {sent_to(link)}"
               f"{f', which is {recipient}' if recipient else ', no user of this hub'}; you "
               f"are signed in as {user}. Nothing was decided.")
        record_event(journal, run_id, "link_refused", f"decision link sent to "
                     f"{sent_to(link)} refused: opened by {user}", request=link.get("request"),
                     digest=link.get("digest"), name=link.get("name"), to=link.get("to"),
                     by=user, reason="not the recipient")
        return 403, why, None
    if approved is None:
        return 200, "This request waits for your decision.", outcome.pending
    used = dict(link, state="used", used_at=time.time(), approved=approved)
    if not journal.swap_delivery(run_id, key, link, used):
        return 410, "This link was used already. A link decides once.", None
    try:
        decision = decide_as(journal, config, run_id, user=user, approved=approved,
                             note=None, via="link", request_id=link.get("request"),
                             digest=link.get("digest"))
    except DurableError as exc:
        journal.swap_delivery(run_id, key, used, link)  # nothing decided: unused again
        if isinstance(exc, JournalError):
            raise
        return 403 if isinstance(exc, NotAllowedToDecide) else 409, str(exc), None
    record_event(journal, run_id, "link_used", f"decision link sent to {sent_to(link)} "
                 f"used: {decision_words(decision)}", request=link.get("request"),
                 digest=link.get("digest"), name=link.get("name"), by=user, via="link",
                 to=link.get("to"))
    return 200, f"{decision_words(decision).capitalize()}.", None
