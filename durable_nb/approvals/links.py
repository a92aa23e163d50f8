"""Decision links: a single-use URL in a notification that decides one request.

A link is ``{base}durable-nb/decide#TOKEN``; the Jupyter server extension serves the page
(:mod:`durable_nb.server.decide`). The token is in the URL's fragment, which a browser never
sends: servers and proxies log no secret, and no Referer carries one. The page's script
reads it and sends it only in a POST's body. The token is ``JOURNAL.RUN.SECRET``:

- ``JOURNAL``: the journal's id (:func:`~durable_nb.journal.index.journal_id`), which the
  server looks up among the journals it shows; ``RUN``: the run id in URL-safe base64. Both
  are references, not secrets: the server finds the run's records without any index of links.
- ``SECRET``: 32 random bytes. The journal keeps only its SHA-256, as the key of the link's
  record (``link/HEX`` in the run's deliveries store): a reader of the journal (a read-only
  user, an export, a backup) learns nothing that opens a link, and a token whose secret was
  never issued finds no record.

The record is bound to the request (its ``id`` and ``digest``), to whom it was sent, and to
an expiry (the request's ``timeout_at``, else issue time plus ``[links] max_age``). It is
used once: its state goes ``issued`` -> ``used`` by the journal's compare-and-set
(:meth:`~durable_nb.journal.Journal.swap_delivery`), so of any number of racing uses exactly
one decides (:func:`use_link`), through :func:`~durable_nb.approvals.decide.decide` like
every other path. A link sent to one person (an e-mail address) decides as that person; a
link sent to a Slack channel or a webhook does not say who clicks it, so it decides only a
request that allows anyone (no approvers' list, no four-eyes).

Anonymous requests cannot grow the journal without bound: a refused use is recorded in the
run's history once per link and reason.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from ..errors import (ApprovalChanged, DecisionExists, DurableError, InvalidAnswer,
                      JournalError, NoPendingApproval, NotAllowedToDecide, UnknownRun)
from ..journal import Journal, Status
from ..journal.base import LINK_PREFIX
from ..journal.index import journal_id
from ..journal.postgres import is_postgres_url
from ..timestamps import format_time
from .decide import decide
from .history import record_event
from .policy import refusal
from .request import pending_digest
from .wording import decision_words, verdict

__all__ = ["LINK_PATH", "LINK_PREFIX", "PERSONAL_CHANNELS", "LinkOutcome", "LinkSettings",
           "base_url", "choice_url", "inspect_link", "issue_links", "journal_ref",
           "kernel_server_url", "link_key", "parse_token", "sent_to", "use_link"]

#: The path under a Jupyter server's base URL that serves the page; the token follows ``#``.
LINK_PATH = "durable-nb/decide"
#: The channels whose links reach one person (so a link decides as them).
PERSONAL_CHANNELS = frozenset({"email"})


class LinkSettings(Protocol):
    """What links are issued with (``[links]`` of the notification configuration)."""
    base_url: str | None
    max_age: float
    enabled: bool


def kernel_server_url(env: Mapping[str, str] = os.environ) -> str | None:
    """The URL of the Jupyter server that started this kernel (found by its pid,
    ``JPY_PARENT_PID``, among the ``jpserver-PID.json`` files of Jupyter's runtime
    directory), or None when none did."""
    try:
        pid = int(env.get("JPY_PARENT_PID") or 0)
    except ValueError:
        return None
    if not pid:
        return None
    try:
        from jupyter_core.paths import jupyter_runtime_dir

        info = json.loads((Path(jupyter_runtime_dir()) / f"jpserver-{pid}.json").read_text())
    except (ImportError, OSError, ValueError):
        return None
    url = info.get("url")
    if info.get("sock") or not isinstance(url, str) or not url.startswith("http"):
        return None  # a server on a unix socket: not reachable by URL
    return url if url.endswith("/") else url + "/"


def _hub_url(env: Mapping[str, str]) -> str | None:
    """A JupyterHub single-user server's public URL (``https://hub.example.org/user/ana/``):
    ``JUPYTERHUB_PUBLIC_URL`` (set when the hub has a ``public_url``), with the server's
    prefix ``JUPYTERHUB_SERVICE_PREFIX`` (``/user/ana/``) when it lacks it."""
    public, prefix = env.get("JUPYTERHUB_PUBLIC_URL"), env.get("JUPYTERHUB_SERVICE_PREFIX")
    if not public or not public.startswith(("http://", "https://")):
        return None
    parts = urlsplit(public)
    if prefix and not parts.path.rstrip("/").endswith(prefix.rstrip("/")):
        return f"{parts.scheme}://{parts.netloc}/{prefix.strip('/')}/"
    return public if public.endswith("/") else public + "/"


def base_url(config: LinkSettings, env: Mapping[str, str] = os.environ,
             server_url: str | None = None) -> tuple[str | None, str]:
    """The base URL links are sent with, and where it came from (or, with None, why there is
    none): ``[links] base_url`` (or ``$DURABLE_NB_NOTIFY_LINK_BASE_URL``); a JupyterHub
    server's public URL; ``server_url``, the Jupyter server this process is (its extension
    sends with it); the one that started this kernel."""
    if not config.enabled:
        return None, "decision links are turned off ([links] enabled = false)"
    if config.base_url:
        return config.base_url, "[links] base_url"
    hub = _hub_url(env)
    if hub:
        return hub, "JupyterHub's public URL"
    if server_url:
        return (server_url if server_url.endswith("/") else server_url + "/"), \
            "this Jupyter server"
    kernel = kernel_server_url(env)
    if kernel:
        return kernel, "the Jupyter server of this kernel"
    return None, ("no decision links: no Jupyter server is known to the sender; set [links] "
                  "base_url in notify.toml or DURABLE_NB_NOTIFY_LINK_BASE_URL")


def choice_url(url: str, choice: str) -> str:
    """A link that opens its page with ``choice`` (``approve``, ``reject``) focused: the
    query goes before the fragment that holds the token."""
    page, _, token = url.partition("#")
    return f"{page}?choice={choice}#{token}"


def sent_to(link: dict) -> str:
    """To whom a link was sent, in words: ``ana@example.org (e-mail)``, ``the Slack
    channel``, ``the webhook``."""
    channel, to = link.get("channel"), link.get("to")
    if channel == "email":
        return f"{to} (e-mail)"
    return {"slack": "the Slack channel", "webhook": "the webhook"}.get(str(channel), str(to))


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _unb64(text: str) -> str:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()


def journal_ref(location: str) -> str:
    """The journal part of a token: the id of the journal's location as shown (a database
    URL without its password, so that sender and server agree whatever credentials each
    holds)."""
    if not is_postgres_url(location):
        location = str(Path(location).expanduser().resolve())
    return journal_id(location)


def link_key(secret: str) -> str:
    """The key of a link's record: the SHA-256 of its secret (the secret is never stored)."""
    return LINK_PREFIX + hashlib.sha256(secret.encode()).hexdigest()


def parse_token(token: str) -> tuple[str, str, str] | None:
    """``(journal ref, run id, secret)`` of a token, or None when it is not one."""
    parts = token.split(".")
    if len(parts) != 3 or not all(parts) or len(parts[2]) < 32:
        return None
    try:
        run_id = _unb64(parts[1])
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return parts[0], run_id, parts[2]


def issue_links(journal: Journal, run_id: str, pending: dict, *, channel: str,
                recipients: Sequence[str], config: LinkSettings, delivery: str,
                now: Callable[[], float] = time.time, env: Mapping[str, str] = os.environ,
                server_url: str | None = None) -> tuple[list[tuple[str, str]], dict]:
    """A link per recipient for ``pending`` of run ``run_id`` (the run that asked), each
    recorded (hashed) in the journal and in the run's history: ``[(recipient, url)]``, and
    what the delivery record keeps about them (recipients and expiry, or why none)."""
    base, source = base_url(config, env, server_url)
    if base is None:
        return [], {"links": None, "links_missing": source}
    issued_at = now()
    # An escalated request's deadline is its escalation's, later than the first.
    timeout_at = (pending.get("escalation") or {}).get("timeout_at") or pending.get("timeout_at")
    expires_at = float(timeout_at) if timeout_at else issued_at + config.max_age
    made, kept = [], []
    for recipient in recipients:
        secret = secrets.token_urlsafe(32)
        token = f"{journal_ref(journal.location)}.{_b64(run_id)}.{secret}"
        record = {"kind": "link", "state": "issued", "request": pending.get("id"),
                  "digest": pending_digest(pending), "name": pending.get("name"),
                  "channel": channel, "to": recipient, "delivery": delivery,
                  "issued_at": issued_at, "expires_at": expires_at}
        journal.add_delivery(run_id, link_key(secret), record)
        record_event(journal, run_id, "link_issued",
                     f"decision link sent to {sent_to(record)}, valid until "
                     f"{format_time(expires_at, '?')}", pending=pending, to=recipient,
                     channel=channel, expires_at=expires_at)
        made.append((recipient, f"{base}{LINK_PATH}#{token}"))
        kept.append(recipient)
    return made, {"links": {"to": kept, "expires_at": expires_at, "base": source}}


_CHANGED = ("The request this link was sent for is no longer the one waiting (the run went on, "
            "or asks something else now, or its deadline passed). Nothing was decided.")


@dataclass(frozen=True)
class LinkOutcome:
    """What a link does now: ``kind`` is ``open`` (it may decide), ``decided``, ``unknown``
    (forged, or its run deleted), ``used``, ``expired``, ``changed`` (the request it was sent
    for is no longer the one waiting), ``decided_already``, ``refused`` (the approver check
    said no) or ``failed``; ``status`` the HTTP status a page answers with; ``message`` one
    sentence for a person."""
    kind: str
    status: int
    message: str
    link: dict | None = None
    pending: dict | None = None
    decision: dict | None = None
    run: dict | None = None  # title and notebook of the run, for the page


def inspect_link(journal: Journal, run_id: str, secret: str,
                 now: Callable[[], float] = time.time) -> tuple[str | None, LinkOutcome]:
    """The link's record key and what it would do now (nothing is written: a GET)."""
    key = link_key(secret)
    link = journal.link_records(run_id).get(key)
    if link is None or link.get("kind") != "link":
        return None, LinkOutcome("unknown", 404, "This link is not valid: it was never issued, "
                                 "or its run was deleted. Nothing was decided.")
    try:
        run = journal.get_run(run_id)
    except UnknownRun:
        run = None
    about = {"title": getattr(run, "title", None), "notebook": getattr(run, "notebook", None),
             "status": run.status.value if run is not None else None}
    decision = journal.get_request(f"decision.{link.get('request')}", run_id)
    # Read again after the run and the decision: a use marks the link before it decides, so
    # a decision seen above by a link's own use is seen here as the link used.
    link = journal.link_records(run_id).get(key) or link
    if link.get("state") == "used":
        verdict = "approve" if link.get("approved") else "reject"
        return key, LinkOutcome("used", 410, f"This link was used already, at "
                                f"{format_time(link.get('used_at'), '?')}, to {verdict}. "
                                f"A link decides once.", link, run=about)
    if now() > float(link.get("expires_at") or 0):
        return key, LinkOutcome("expired", 410, f"This link expired at "
                                f"{format_time(link.get('expires_at'), '?')}. Nothing was "
                                f"decided.", link, run=about)
    if decision is not None and decision.get("digest") == link.get("digest"):
        return key, LinkOutcome("decided_already", 409, f"This request was "
                                f"{decision_words(decision, timed=True)} already.", link,
                                decision=decision, run=about)
    pending = run.pending_approval if run is not None else None
    if run is None or run.status is not Status.WAITING_APPROVAL or not pending \
            or pending.get("id") != link.get("request") \
            or pending_digest(pending) != link.get("digest"):
        return key, LinkOutcome("changed", 409, _CHANGED, link, run=about)
    refused = refusal(run_id, pending, str(link.get("to")), "link",
                      signed_in=link.get("channel") in PERSONAL_CHANNELS)
    if refused is not None:
        return key, LinkOutcome("refused", 403, f"This link cannot decide this request: "
                                f"{_why(refused, link)} Nothing was decided.", link,
                                pending=pending, run=about)
    return key, LinkOutcome("open", 200, "This request waits for a decision.", link,
                            pending=pending, run=about)


def _why(refused: NotAllowedToDecide, link: dict) -> str:
    """A refusal in words for the page's reader, who may not be the link's recipient."""
    if refused.shared:
        allowed = refused.approvers
        who = (f"only {', '.join(allowed)} may decide it" if allowed else
               "the person who started the run may not decide it (four-eyes)")
        return (f"it was sent to {sent_to(link)}, which does not say who clicks it, and {who}. "
                f"Sign in to Jupyter and decide in its inbox (the durable_nb sidebar), or "
                f"with `durable-nb approve`.")
    return refused.brief + "."


def use_link(journal: Journal, run_id: str, secret: str, *, approved: bool,
             note: str | None, now: Callable[[], float] = time.time,
             args: dict | None = None, message: str | None = None,
             answer: dict | None = None) -> LinkOutcome:
    """Decide by the link: used once (compare-and-set in the journal), then the decision
    left through :func:`~durable_nb.approvals.decide.decide` by the link's recipient, via
    ``link`` (signed in only for a link sent to one person). A refusal (decided already,
    not allowed) or a journal error (raised) puts the link back unused and decides nothing;
    each kind of refusal is recorded once per link. ``args`` (edited arguments) and
    ``message`` (for the model) and ``answer`` (to a server's question) are the decision's,
    checked by ``decide``: content that does not fit leaves the link unused, and the page
    shows its form again with what was wrong (``open``, 400)."""
    key, outcome = inspect_link(journal, run_id, secret, now)
    if outcome.kind in ("unknown", "used", "expired"):  # the link's own state
        if key is not None:
            _refused(journal, run_id, key, outcome)
        return outcome
    # Whether the request may be decided by this link is decide()'s to say, not this page's.
    link, pending = outcome.link, outcome.pending
    assert key is not None and link is not None
    used = dict(link, state="used", used_at=now(), approved=approved)
    if not journal.swap_delivery(run_id, key, link, used):
        current = journal.link_records(run_id).get(key) or {}
        lost = LinkOutcome("used", 410, f"This link was used already, at "
                           f"{format_time(current.get('used_at'), '?')}. A link decides once.",
                           current or link, run=outcome.run)
        _refused(journal, run_id, key, lost)
        return lost
    try:
        decision = decide(journal, run_id, request_id=link.get("request"),
                          digest=str(link.get("digest") or ""), approved=approved, note=note,
                          by=str(link.get("to")), via="link",
                          signed_in=link.get("channel") in PERSONAL_CHANNELS,
                          refusals_once=key, args=args, message=message, answer=answer)
    except DurableError as exc:
        journal.swap_delivery(run_id, key, used, link)  # nothing decided: unused again
        if isinstance(exc, JournalError):
            raise  # the journal failed: nothing to tell the person but to try again
        if isinstance(exc, DecisionExists):
            failed = LinkOutcome("decided_already", 409, f"This request was "
                                 f"{decision_words(exc.decision, timed=True)} already. "
                                 f"Nothing was changed.", link, decision=exc.decision,
                                 run=outcome.run)
        elif isinstance(exc, NotAllowedToDecide):
            failed = LinkOutcome("refused", 403, f"This link cannot decide this request: "
                                 f"{_why(exc, link)} Nothing was decided.", link, run=outcome.run)
        elif isinstance(exc, (ApprovalChanged, NoPendingApproval)):
            failed = LinkOutcome("changed", 409, _CHANGED, link, run=outcome.run)
        elif isinstance(exc, InvalidAnswer):  # the form again, with what to correct
            return LinkOutcome("open", 400, str(exc), link, pending=pending, run=outcome.run)
        else:
            failed = LinkOutcome("failed", 409, str(exc), link, run=outcome.run)
        if not isinstance(exc, (DecisionExists, NotAllowedToDecide)):
            _refused(journal, run_id, key, failed)  # (decide recorded those refusals)
        return failed
    record_event(journal, run_id, "link_used",
                 f"decision link sent to {sent_to(link)} used: "
                 f"{decision_words(decision)}", pending=pending, by=decision.get("by"),
                 via="link", to=link.get("to"), channel=link.get("channel"))
    said = verdict(decision)
    return LinkOutcome("decided", 200, f"{said[0].upper()}{said[1:]}, as "
                       f"{link.get('to')}.", used, pending=pending, decision=decision,
                       run=outcome.run)


def _refused(journal: Journal, run_id: str, key: str, outcome: LinkOutcome) -> None:
    """The refused use in the run's history, once per link and reason: whoever holds a used
    or forged link can post it any number of times without growing the journal."""
    link = outcome.link or {}
    if not journal.add_delivery(run_id, f"{key}/refused/{outcome.kind}",
                                {"kind": "refusal", "at": time.time()}):
        return
    record_event(journal, run_id, "link_refused",
                 f"decision link sent to {sent_to(link)} refused: "
                 f"{outcome.message}", request=link.get("request"), digest=link.get("digest"),
                 name=link.get("name"), to=link.get("to"), reason=outcome.kind)
