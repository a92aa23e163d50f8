"""The durable-nb hub service: the team's inbox and the only writer of decisions.

Started by JupyterHub (``c.JupyterHub.services``, ``python -m durable_nb.hub.service``) at
``/services/durable-nb/`` under the hub's public URL, signed in with the hub's OAuth
(:class:`jupyterhub.services.auth.HubOAuthenticated`): a person is who the hub says, and a
request from a user's server or kernel is who its hub API token belongs to. It logs in to
the shared journal (``$DURABLE_NB_JOURNAL``) as the decider role, names itself the decider
at start (:meth:`~durable_nb.journal.PostgresJournal.become_decider`, granting the roles of
the configuration's users what they need and no more) and serves:

- ``GET  /services/durable-nb/``: the inbox, every run waiting for a decision, with
  Approve and Reject for the requests the signed-in user may decide (an MCP server's
  question: its fields, Accept, Decline and Cancel);
- ``POST /services/durable-nb/decide``: the inbox's buttons (the hub's XSRF check);
- ``POST /services/durable-nb/api/decide``: a decision from a user's kernel, panel, CLI or
  server (:mod:`durable_nb.approvals.authority`), JSON in and out, authenticated by the token;
- ``GET|POST /services/durable-nb/durable-nb/decide#TOKEN``: a decision link, for the
  person it was sent to (:mod:`durable_nb.hub.links`), who signs in to the hub to use it.
  The page is the Jupyter server's (:mod:`durable_nb.server.decide`): the token stays in
  the URL's fragment, which no browser sends, so neither the hub, its proxy nor this
  service logs it; the page's script posts it in the body; every answer says
  ``Referrer-Policy: no-referrer``. A person not signed in yet is sent through the hub's
  login with the token kept in the tab's ``sessionStorage``, never in a URL.

It is the team's one sweeper (:func:`~durable_nb.hub.links.start_sweeping`, every
``$DURABLE_NB_HUB_SWEEP`` seconds, default 10): deadlines always, and, with
``$DURABLE_NB_HUB_PUBLIC_URL`` (the hub's ``public_url``) and notification channels in its
environment, the team's notifications with their links.

Every decision goes through :func:`~durable_nb.hub.decide.decide_as`.
"""

from __future__ import annotations

import dataclasses
import html
import json
import os
from typing import Any
from urllib.parse import urlparse

from ..approvals.links import LINK_PATH, parse_token
from ..approvals.question import ACTIONS, question_of
from ..approvals.request import find_decisions, pending_digest
from ..approvals.tick import apply_deadline
from ..approvals.wording import decision_words
from ..errors import (DecisionExists, DurableError, MissingExtra, NoPendingApproval,
                      NotAllowedToDecide, UnknownRun)
from ..journal import Journal, RunRecord, Status, open_journal
from ..notify.config import NotifyConfig
from ..notify.start import for_directory
from .config import HubConfig, load_config
from .decide import decide_as, own_request, starters_of
from .links import link_decision, start_sweeping

__all__ = ["inbox_requests", "make_app", "main"]

try:
    from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
    from jupyterhub.utils import url_path_join
    from tornado import web

    from ..server.decide import loader_page, question_form, read_form, render
except ImportError as exc:  # pragma: no cover - the extra names what to install
    raise MissingExtra(f"the durable-nb hub service needs JupyterHub and Jupyter Server "
                       f"({exc}): pip install 'durable-nb[hub]'") from None


def team_notify_config(service_url: str) -> NotifyConfig:
    """The service's notification configuration (its environment, where :func:`main` put
    the map's addresses as the e-mail recipients), with links to ``service_url`` (none
    without it)."""
    notify = for_directory(None)
    links = dataclasses.replace(notify.links, base_url=service_url or None,
                                enabled=bool(service_url) and notify.links.enabled)
    return dataclasses.replace(notify, links=links)


def _why(exc: DurableError) -> str:
    """A refusal's reason, without the ``run ...: ... was not decided:`` its message adds."""
    text = str(exc)
    text = text.split(" was not decided: ", 1)[-1]
    return text.removesuffix(" Nothing was written.").rstrip(".")


class _Base(HubOAuthenticated, web.RequestHandler):
    @property
    def journal(self) -> Journal:
        return self.settings["durable_nb_journal"]

    @property
    def config(self) -> HubConfig:
        return self.settings["durable_nb_config"]

    @property
    def user_name(self) -> str:
        return str(self.current_user["name"])


def inbox_requests(journal: Journal, config: HubConfig
                   ) -> list[tuple[RunRecord, dict, list[str], dict | None]]:
    """What the inbox shows, read from the journal: each run waiting for a decision, with its
    request, the hub users who started it and the decision already recorded (None)."""
    asking = [(record, record.pending_approval, record.pending_approval.get("run_id",
                                                                           record.run_id))
              for record in journal.list_runs(status=Status.WAITING_APPROVAL)
              if record.pending_approval]
    # Each kind of read once for all the runs (on PostgreSQL a read is a round trip).
    started = starters_of(journal, config, {run_id for _, _, run_id in asking})
    decided = find_decisions(journal, [(run_id, pending) for _, pending, run_id in asking])
    return [(record, pending, started[run_id], decision)
            for (record, pending, run_id), decision in zip(asking, decided)]


class InboxHandler(_Base):
    """The team's inbox: every run waiting for a decision."""

    @web.authenticated
    def get(self) -> None:
        self.render_inbox(self.get_argument("said", ""))

    def render_inbox(self, said: str) -> None:
        rows = []
        for record, pending, started_by, decided in inbox_requests(self.journal, self.config):
            started = ", ".join(started_by) or "?"
            question = question_of(pending)
            details = question.message if question is not None else \
                json.dumps(pending.get("details"), ensure_ascii=False, default=repr)
            form = (f'<form method="post" action="{self.settings["durable_nb_prefix"]}decide">'
                    f'{self.xsrf_form_html()}'
                    f'<input type="hidden" name="run" value="{html.escape(record.run_id)}">'
                    f'<input type="hidden" name="request" '
                    f'value="{html.escape(str(pending.get("id") or ""))}">'
                    f'<input type="hidden" name="digest" '
                    f'value="{html.escape(pending_digest(pending))}">'
                    f'{self._buttons(pending)}</form>')
            if decided is not None:
                form = html.escape(f"{decision_words(decided)}; the run goes on when it is "
                                   f"resumed")
            elif self.config.four_eyes and self.user_name in started_by:
                form = "you started this run: under four-eyes someone else decides"
            rows.append(f"<tr><td>{html.escape(record.run_id)}</td>"
                        f"<td>{html.escape(record.notebook or '')}</td>"
                        f"<td>{html.escape(str(pending.get('name')))}</td>"
                        f"<td><code>{html.escape(details)}</code></td>"
                        f"<td>{html.escape(started)}</td><td>{form}</td></tr>")
        table = ("<table><tr><th>run</th><th>notebook</th><th>request</th><th>details</th>"
                 "<th>started by</th><th></th></tr>" + "".join(rows) + "</table>") if rows else \
            "<p>Nothing waits for a decision.</p>"
        note = f'<p class="said">{html.escape(said)}</p>' if said else ""
        self.finish(f"<!doctype html><title>durable-nb inbox</title><h1>Inbox</h1>"
                    f"<p>Signed in as {html.escape(self.user_name)}.</p>{note}{table}")


    @staticmethod
    def _buttons(pending: dict) -> str:
        """Approve and Reject; for an MCP server's question, its fields and Accept, Decline
        and Cancel, as on a decision page (:func:`~durable_nb.server.decide.question_form`)."""
        if question_of(pending) is None:
            return ('<button name="approved" value="yes">Approve</button> '
                    '<button name="approved" value="no">Reject</button>')
        return (f'{question_form(pending)}'
                f'<button name="action" value="accept">Accept</button> '
                f'<button name="action" value="decline" formnovalidate>Decline</button> '
                f'<button name="action" value="cancel" formnovalidate>Cancel</button>')


class DecideFormHandler(InboxHandler):
    """The inbox's Approve and Reject, and the answers to a question (its fields read as
    a decision page reads them, :func:`~durable_nb.server.decide.read_form`)."""

    @web.authenticated
    def post(self) -> None:
        run_id = self.get_body_argument("run")
        content: dict[str, Any] = {}
        approved = self.get_body_argument("approved", "") == "yes"
        if self.get_body_argument("action", "") in ACTIONS:
            posted = read_form(self)
            approved, content = posted.action == "approve", posted.content
        try:
            decision = decide_as(self.journal, self.config, run_id, user=self.user_name,
                                 approved=approved, note=None, via="hub inbox",
                                 request_id=self.get_body_argument("request") or None,
                                 digest=self.get_body_argument("digest"), **content)
            said = f"run {run_id!r}: {decision_words(decision)}."
        except (NotAllowedToDecide, DecisionExists, NoPendingApproval, ValueError) as exc:
            self.set_status(403 if isinstance(exc, NotAllowedToDecide) else
                            400 if isinstance(exc, ValueError) else 409)
            said = str(exc)
        self.render_inbox(said)


class ApiDecideHandler(_Base):
    """A decision from a user's server, kernel or terminal, as the hub user of its token."""

    @web.authenticated
    def post(self) -> None:
        try:
            body: dict[str, Any] = json.loads(self.request.body)
            run_id = str(body["run_id"])
        except (ValueError, KeyError, TypeError):
            self.set_status(400)
            self.finish({"why": "the body must be JSON with run_id, request, digest, approved"})
            return
        if body.get("via") == "timeout":
            try:
                self.deadline(run_id)
            except UnknownRun as exc:
                self.set_status(404)
                self.finish({"why": str(exc)})
            return
        # How the person decided, as her process says it (a word like "Python" or
        # "panel"): kept short; the service says it came through it.
        via = f"{' '.join(str(body.get('via') or 'API').split())[:40]} on the hub"
        try:
            decision = decide_as(self.journal, self.config, run_id, user=self.user_name,
                                 approved=bool(body.get("approved")), note=body.get("note"),
                                 via=via, request_id=body.get("request"),
                                 digest=str(body.get("digest") or ""),
                                 replace=bool(body.get("replace")), args=body.get("args"),
                                 message=body.get("message"), answer=body.get("answer"),
                                 signed_in=body.get("signed_in") is not False)
        except UnknownRun as exc:
            self.set_status(404)
            self.finish({"why": str(exc)})
            return
        except ValueError as exc:
            self.set_status(400)
            self.finish({"why": str(exc)})
            return
        except NotAllowedToDecide as exc:
            self.set_status(403)
            self.finish({"why": _why(exc), "by": self.user_name})
            return
        except DecisionExists as exc:
            self.set_status(409)
            self.finish({"decision": exc.decision, "taken": exc.taken, "words": exc.words})
            return
        except NoPendingApproval as exc:
            self.set_status(409)
            self.finish({"why": str(exc)})
            return
        self.finish({"decision": decision})

    def deadline(self, run_id: str) -> None:
        """A run's deadline passed, its process says: the service applies the request's
        policy if it did (:func:`~durable_nb.approvals.tick.apply_deadline`), as the
        one writer of decisions and escalations, with the request as the run that asked
        holds it (:func:`~durable_nb.hub.decide.own_request`). Answers the decision, or
        the request as escalated (``escalated``)."""
        shown = self.journal.get_run(run_id).pending_approval
        pending = None if shown is None else own_request(self.journal, shown, run_id)
        applied = None if pending is None else apply_deadline(
            self.journal, pending["run_id"], pending)
        if applied is not None and applied[0] == "escalated":
            self.finish({"escalated": applied[1]})
        elif applied is None:
            self.set_status(409)
            self.finish({"why": f"run {run_id!r} has no request past its deadline"})
        elif applied[1].get("via") != "timeout":  # a person was first
            self.set_status(409)
            self.finish({"decision": applied[1], "taken": False,
                         "words": decision_words(applied[1])})
        else:
            self.finish({"decision": applied[1]})


class LinkHandler(_Base):
    """A decision link's page: the request, and Approve/Reject for the person it was sent
    to. GET answers the page whose script posts the fragment's token (or, to someone not
    signed in, keeps the token in the tab and goes through the hub's login first); POST
    shows (``action=view``) or decides (``approve``, ``reject``)."""

    def set_default_headers(self) -> None:
        super().set_default_headers()
        self.set_header("Referrer-Policy", "no-referrer")
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Robots-Tag", "noindex, nofollow")

    def get(self) -> None:
        if self.current_user is None and not self.get_argument("signin", ""):
            self.finish(_KEEP_TOKEN)
            return
        self.signed_in_page()

    @web.authenticated
    def signed_in_page(self) -> None:
        self.finish(loader_page(self.xsrf_form_html()))

    @web.authenticated
    def post(self) -> None:
        # The page shows the arguments to edit and a message field: what is typed there is
        # part of the decision, as on a user's own server.
        posted = read_form(self)
        token, action = posted.token, posted.action
        outcome = link_decision(self.journal, self.config, token, user=self.user_name,
                                approved=None if action == "view" else action == "approve",
                                note=posted.note, **posted.content)
        if outcome.kind == "unknown":
            self.log.warning("durable_nb: a decision link that names no link was posted by "
                             "%s; nothing was decided", self.user_name)
        self.set_status(outcome.status)
        form = (self.xsrf_form_html() + f'<input type="hidden" name="token" '
                f'value="{html.escape(token)}">') if outcome.kind == "open" else ""
        parsed = parse_token(token) if outcome.kind != "unknown" else None
        self.finish(render(outcome, parsed[1] if parsed else "", form=form, taken=False,
                           choice=self.get_body_argument("choice", "")))


#: Before the hub's login (whose form would drop the URL's fragment): the token kept in
#: this tab's sessionStorage, then the same page again, signed in; the server's page reads
#: it from there (:func:`~durable_nb.server.decide.loader_page`).
_KEEP_TOKEN = """<!DOCTYPE html><html><head><meta charset="utf-8">
<meta name="referrer" content="no-referrer"><title>Decision link</title></head><body>
<p>Signing in to the hub&hellip;</p><script>
var token = window.location.hash.slice(1);
if (token) { window.sessionStorage.setItem("durable-nb-link", token); }
window.location.replace(window.location.pathname + "?signin=1");
</script></body></html>"""


def make_app(journal: Journal, config: HubConfig, prefix: str) -> web.Application:
    """The service's tornado application under ``prefix`` (``/services/durable-nb/``)."""
    return web.Application([
        (prefix, InboxHandler),
        (url_path_join(prefix, "decide"), DecideFormHandler),
        (url_path_join(prefix, "api/decide"), ApiDecideHandler),
        (url_path_join(prefix, LINK_PATH), LinkHandler),
        (url_path_join(prefix, "oauth_callback"), HubOAuthCallbackHandler),
    ], cookie_secret=os.urandom(32), durable_nb_journal=journal, durable_nb_config=config,
        durable_nb_prefix=prefix)


def main() -> None:
    """Run the service as JupyterHub starts it (its ``JUPYTERHUB_SERVICE_*`` environment)."""
    import asyncio
    import logging

    # Each request on a line (tornado's access log), as a Jupyter server logs them: a link's
    # token is never among them (it is in the fragment and in POST bodies).
    logging.basicConfig(level=logging.INFO,
                        format="[%(levelname)1.1s %(asctime)s %(name)s] %(message)s")
    config = load_config()
    journal = open_journal(os.environ["DURABLE_NB_JOURNAL"])
    journal.become_decider(sorted(set(config.roles.values())),
                           people={role: user for user, role in config.roles.items()})
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/durable-nb/")
    where = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
    if os.environ.get("DURABLE_NB_NOTIFY_SMTP_HOST"):
        # E-mail goes to the addresses of the administrator's map, and only there.
        os.environ["DURABLE_NB_NOTIFY_SMTP_TO"] = ",".join(dict.fromkeys(config.emails.values()))
    public = os.environ.get("DURABLE_NB_HUB_PUBLIC_URL", "").rstrip("/")
    notify = team_notify_config(public + prefix if public else "")
    start_sweeping(journal, notify, float(os.environ.get("DURABLE_NB_HUB_SWEEP", "10")))

    async def serve() -> None:
        make_app(journal, config, prefix).listen(where.port, where.hostname)
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
