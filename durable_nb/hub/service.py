"""The durable-nb hub service: the team's inbox and the only writer of decisions.

Started by JupyterHub (``c.JupyterHub.services``, ``python -m durable_nb.hub.service``) at
``/services/durable-nb/`` under the hub's public URL, signed in with the hub's OAuth
(:class:`jupyterhub.services.auth.HubOAuthenticated`): a person is who the hub says, and a
request from a user's server or kernel is who its hub API token belongs to. It logs in to
the shared journal (``$DURABLE_NB_JOURNAL``) as the decider role, names itself the decider
at start (:meth:`~durable_nb.journal.PostgresJournal.become_decider`, granting the roles of
the configuration's users what they need and no more) and serves:

- ``GET  /services/durable-nb/``: the inbox, every run waiting for a decision, with
  Approve and Reject for the requests the signed-in user may decide;
- ``POST /services/durable-nb/decide``: the inbox's buttons (the hub's XSRF check);
- ``POST /services/durable-nb/api/decide``: a decision from a user's kernel, panel, CLI or
  server (:mod:`durable_nb.hub.authority`), JSON in and out, authenticated by the token;
- ``GET|POST /services/durable-nb/durable-nb/decide/TOKEN``: a decision link, for the
  person it was sent to (:mod:`durable_nb.hub.links`), who signs in to the hub to use it.

With ``$DURABLE_NB_HUB_PUBLIC_URL`` (the hub's ``public_url``) and notification channels in
its environment it is the team's one sweeper (:func:`~durable_nb.hub.links.start_sweeping`,
every ``$DURABLE_NB_HUB_SWEEP`` seconds, default 10).

Every decision goes through :func:`~durable_nb.hub.decide.decide_as`.
"""

from __future__ import annotations

import dataclasses
import html
import json
import os
from typing import Any
from urllib.parse import urlparse

from ..errors import (DecisionExists, DurableError, MissingExtra, NoPendingApproval,
                      NotAllowedToDecide)
from ..execution.approvals import decision_words, find_decision, pending_digest
from ..execution.deadlines import apply_deadline
from ..journal import Journal, Status, open_journal
from .config import HubConfig, load_config
from .decide import decide_as, starters
from .links import LINK_PATH, link_decision, start_sweeping, team_notify_config

__all__ = ["make_app", "main"]

try:
    from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
    from jupyterhub.utils import url_path_join
    from tornado import web
except ImportError as exc:  # pragma: no cover - the extra names what to install
    raise MissingExtra(f"the durable-nb hub service needs JupyterHub ({exc}): pip install "
                       f"'durable-nb[hub]'") from None


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


class InboxHandler(_Base):
    """The team's inbox: every run waiting for a decision."""

    @web.authenticated
    def get(self) -> None:
        self.render_inbox(self.get_argument("said", ""))

    def render_inbox(self, said: str) -> None:
        rows = []
        for record in self.journal.list_runs(status=Status.WAITING_APPROVAL):
            pending = record.pending_approval
            if not pending:
                continue
            started_by = starters(self.journal, self.config,
                                  pending.get("run_id", record.run_id))
            started = ", ".join(started_by) or "?"
            details = json.dumps(pending.get("details"), ensure_ascii=False, default=repr)
            decided = find_decision(self.journal, pending.get("run_id", record.run_id),
                                    pending)
            form = (f'<form method="post" action="{self.settings["durable_nb_prefix"]}decide">'
                    f'{self.xsrf_form_html()}'
                    f'<input type="hidden" name="run" value="{html.escape(record.run_id)}">'
                    f'<input type="hidden" name="request" '
                    f'value="{html.escape(str(pending.get("id") or ""))}">'
                    f'<input type="hidden" name="digest" '
                    f'value="{html.escape(pending_digest(pending))}">'
                    f'<button name="approved" value="yes">Approve</button> '
                    f'<button name="approved" value="no">Reject</button></form>')
            if decided is not None:
                form = html.escape(f"{decision_words(decided)}; the run goes on when it is "
                                   f"resumed")
            elif self.config.four_eyes and self.user_name in started_by:
                form = "you started this run: under four-eyes someone else decides"
            rows.append(f"<tr><td>{html.escape(record.run_id)}</td>"
                        f"<td>{html.escape(str(pending.get('name')))}</td>"
                        f"<td><code>{html.escape(details)}</code></td>"
                        f"<td>{html.escape(started)}</td><td>{form}</td></tr>")
        table = ("<table><tr><th>run</th><th>request</th><th>details</th><th>started by</th>"
                 "<th></th></tr>" + "".join(rows) + "</table>") if rows else \
            "<p>Nothing waits for a decision.</p>"
        note = f'<p class="said">{html.escape(said)}</p>' if said else ""
        self.finish(f"<!doctype html><title>durable-nb inbox</title><h1>Inbox</h1>"
                    f"<p>Signed in as {html.escape(self.user_name)}.</p>{note}{table}")


class DecideFormHandler(InboxHandler):
    """The inbox's Approve and Reject."""

    @web.authenticated
    def post(self) -> None:
        run_id = self.get_body_argument("run")
        try:
            decision = decide_as(self.journal, self.config, run_id, user=self.user_name,
                                 approved=self.get_body_argument("approved") == "yes",
                                 note=None, via="hub inbox",
                                 request_id=self.get_body_argument("request") or None,
                                 digest=self.get_body_argument("digest"))
            said = f"run {run_id!r}: {decision_words(decision)}."
        except (NotAllowedToDecide, DecisionExists, NoPendingApproval) as exc:
            self.set_status(403 if isinstance(exc, NotAllowedToDecide) else 409)
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
            self.deadline(run_id)
            return
        # How the person decided, as her process says it (a word like "Python" or
        # "panel"): kept short; the service says it came through it.
        via = f"{' '.join(str(body.get('via') or 'API').split())[:40]} on the hub"
        try:
            decision = decide_as(self.journal, self.config, run_id, user=self.user_name,
                                 approved=bool(body.get("approved")), note=body.get("note"),
                                 via=via, request_id=body.get("request"),
                                 digest=body.get("digest"), replace=bool(body.get("replace")))
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
        policy if it did (:func:`~durable_nb.execution.deadlines.apply_deadline`), as the
        one writer of decisions."""
        pending = self.journal.get_run(run_id).pending_approval
        applied = None if pending is None else apply_deadline(
            self.journal, pending.get("run_id", run_id), pending)
        if applied is None or applied[0] != "decided":
            self.set_status(409)
            self.finish({"why": f"run {run_id!r} has no request past its deadline"})
        elif applied[1].get("via") != "timeout":  # a person was first
            self.set_status(409)
            self.finish({"decision": applied[1], "taken": False,
                         "words": decision_words(applied[1])})
        else:
            self.finish({"decision": applied[1]})


class LinkHandler(_Base):
    """A decision link: the request, and Approve/Reject for the person it was sent to."""

    @web.authenticated
    def get(self, token: str) -> None:
        self.page(token, None)

    @web.authenticated
    def post(self, token: str) -> None:
        self.page(token, self.get_body_argument("approved") == "yes")

    def page(self, token: str, approved: bool | None) -> None:
        status, said, pending = link_decision(self.journal, self.config, token,
                                              user=self.user_name, approved=approved)
        self.set_status(status)
        form = ""
        if pending is not None:
            details = json.dumps(pending.get("details"), ensure_ascii=False, default=repr)
            form = (f"<p>{html.escape(str(pending.get('name')))} "
                    f"<code>{html.escape(details)}</code></p>"
                    f'<form method="post">{self.xsrf_form_html()}'
                    f'<button name="approved" value="yes">Approve</button> '
                    f'<button name="approved" value="no">Reject</button></form>')
        self.finish(f"<!doctype html><title>durable-nb decision</title><h1>Decision</h1>"
                    f"<p>Signed in as {html.escape(self.user_name)}.</p>"
                    f'<p class="said">{html.escape(said)}</p>{form}')


def make_app(journal: Journal, config: HubConfig, prefix: str) -> web.Application:
    """The service's tornado application under ``prefix`` (``/services/durable-nb/``)."""
    return web.Application([
        (prefix, InboxHandler),
        (url_path_join(prefix, "decide"), DecideFormHandler),
        (url_path_join(prefix, "api/decide"), ApiDecideHandler),
        (url_path_join(prefix, LINK_PATH, "(.+)"), LinkHandler),
        (url_path_join(prefix, "oauth_callback"), HubOAuthCallbackHandler),
    ], cookie_secret=os.urandom(32), durable_nb_journal=journal, durable_nb_config=config,
        durable_nb_prefix=prefix)


def main() -> None:
    """Run the service as JupyterHub starts it (its ``JUPYTERHUB_SERVICE_*`` environment)."""
    import asyncio

    config = load_config()
    journal = open_journal(os.environ["DURABLE_NB_JOURNAL"])
    journal.become_decider(sorted(set(config.roles.values())))
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/durable-nb/")
    where = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
    if os.environ.get("DURABLE_NB_NOTIFY_SMTP_HOST"):
        # E-mail goes to the addresses of the administrator's map, and only there.
        os.environ["DURABLE_NB_NOTIFY_SMTP_TO"] = ",".join(dict.fromkeys(config.emails.values()))
    public = os.environ.get("DURABLE_NB_HUB_PUBLIC_URL", "").rstrip("/")
    notify = team_notify_config(config, public + prefix if public else "")
    if not public:
        notify = dataclasses.replace(notify, links=dataclasses.replace(notify.links,
                                                                       enabled=False))
    if notify.channels():
        start_sweeping(journal, notify, float(os.environ.get("DURABLE_NB_HUB_SWEEP", "10")))

    async def serve() -> None:
        make_app(journal, config, prefix).listen(where.port, where.hostname)
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
