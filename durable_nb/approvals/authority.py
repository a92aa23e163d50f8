"""Whether this process writes a decision itself, or the hub's service writes it.

The one check :func:`~durable_nb.approvals.decide.decide` (so every path that decides)
makes through :func:`decided_elsewhere` before anything is written. A journal whose
database names a decider role (set up for a hub by the service,
:meth:`~durable_nb.journal.PostgresJournal.become_decider`) takes decisions only from that
role, so a process logged in as another role never writes one: it asks the service named
by ``$DURABLE_NB_HUB_SERVICE`` (set by the hub's administrator in every user's server),
authenticated by the hub API token the hub gave the user's server
(``$JUPYTERHUB_API_TOKEN``). The service decides as the hub user that token belongs to:
the ``by`` this process would have written (``$DURABLE_NB_USER``, ``--by``) is not sent.
What a user changes in her environment can only make the service unreachable (then the
refusal below) or name another user's token she does not have.

Deadlines too (:func:`deadline_elsewhere`, called by
:func:`~durable_nb.approvals.tick.apply_deadline`): on a hub the service alone writes a
deadline's decision, a rejection included, and claims an escalation, as the run's own record
says; a waiting run asks it when its deadline passes, and its sweep applies the rest.

Each refusal raises :class:`~durable_nb.errors.RefusedByHub` (one line) and is an event in
the run's history: the service records the ones it makes; this module the ones it makes
when the service cannot be asked.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request

from ..errors import DecisionExists, DurableError, RefusedByHub
from ..journal import Journal
from .history import record_event

__all__ = ["SERVICE_VARIABLE", "TOKEN_VARIABLE", "deadline_elsewhere", "decided_elsewhere",
           "service_url"]

#: The service's URL under the hub's public URL (``https://hub.example.org/services/durable-nb/``),
#: set for every user's server by the administrator (``c.Spawner.environment``).
SERVICE_VARIABLE = "DURABLE_NB_HUB_SERVICE"
#: The hub API token JupyterHub gives each user's server (and its kernels and terminals).
TOKEN_VARIABLE = "JUPYTERHUB_API_TOKEN"
_TIMEOUT = 30.0
_ASK_AGAIN = 1.0


def service_url() -> str | None:
    """The durable-nb service's URL as this process was told it (ending in ``/``), or None."""
    url = os.environ.get(SERVICE_VARIABLE, "").strip()
    return (url if url.endswith("/") else url + "/") if url else None


def _asks_service(journal: Journal) -> str | None:
    """The decider role when this process must leave decisions to the hub's service (the
    journal names one, and this process does not log in as it); None otherwise."""
    decider, is_decider, _ = journal.decision_authority()
    return None if decider is None or is_decider else decider


def _post(body: dict) -> dict:
    """``body`` posted to the service's ``api/decide`` with this server's hub token: its
    JSON answer. urllib's errors as they come (the callers say what they mean)."""
    url, token = service_url(), os.environ.get(TOKEN_VARIABLE, "").strip()
    if not url or not token:
        raise urllib.error.URLError(f"${SERVICE_VARIABLE} or ${TOKEN_VARIABLE} is not set")
    request = urllib.request.Request(
        url + "api/decide", data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=_TIMEOUT) as response:
        return json.loads(response.read())


def deadline_elsewhere(journal: Journal, run_id: str, pending: dict
                       ) -> tuple[str, dict | None] | None:
    """None when this process applies ``pending``'s deadline itself (no hub, or it is the
    service). On a hub, the service applies it (it alone writes decisions, a deadline's
    rejection too, and claims escalations): ``("decided", decision)``, ``("escalated",
    pending)`` as the service escalated it, or ``("waiting", None)`` when it applied nothing
    now (not due for it, or it could not be asked: its own sweep applies the deadline)."""
    if _asks_service(journal) is None:
        return None
    try:
        answer = _post({"run_id": run_id, "request": pending.get("id"),
                        "digest": pending.get("digest"), "via": "timeout"})
    except urllib.error.HTTPError as exc:
        answer = _answer(exc)
        if exc.code == 409 and isinstance(answer.get("decision"), dict):
            return "decided", answer["decision"]  # a person was first
        answer = {}
    except (urllib.error.URLError, OSError, ValueError):
        answer = {}
    if isinstance(answer.get("escalated"), dict):
        return "escalated", answer["escalated"]
    if isinstance(answer.get("decision"), dict):
        return "decided", answer["decision"]
    # A run waiting past its deadline asks again at once when nothing was applied: asked
    # at most once a second, the service's sweep applies it meanwhile.
    time.sleep(_ASK_AGAIN)
    return "waiting", None


def decided_elsewhere(journal: Journal, run_id: str, pending: dict, decision: dict, *,
                      replace: bool, signed_in: bool = True) -> dict | None:
    """None when this process may write ``decision`` on ``pending`` (of run ``run_id``)
    itself: the journal names no decider role (no hub), or this process logs in as it (the
    service). Otherwise the decision the hub's service wrote for the hub user this
    process's token names; :class:`~durable_nb.errors.RefusedByHub` when the service
    refused, or cannot be asked; :class:`~durable_nb.errors.DecisionExists` when the request
    was decided already. ``signed_in`` False (a link that does not say who clicked it) is
    sent, so the service applies the rule for such links."""
    decider = _asks_service(journal)
    if decider is None:
        return None
    name = str(pending.get("name"))
    by = str(decision.get("by"))
    url, token = service_url(), os.environ.get(TOKEN_VARIABLE, "").strip()
    if not url or not token:
        return _refuse(journal, run_id, pending, by, str(decision.get("via")),
                       f"on this hub only the durable-nb service (database role {decider}) "
                       f"writes decisions; decide in its inbox, or from a server the hub "
                       f"started (it sets ${SERVICE_VARIABLE} and ${TOKEN_VARIABLE})")
    body = {"run_id": run_id, "request": pending.get("id"), "digest": decision.get("digest"),
            "approved": bool(decision.get("approved")), "note": decision.get("note"),
            "via": decision.get("via"), "replace": replace, "signed_in": signed_in,
            **{k: decision[k] for k in ("args", "message", "answer") if k in decision}}
    try:
        return _post(body)["decision"]
    except urllib.error.HTTPError as exc:
        answer = _answer(exc)
        if exc.code == 409 and isinstance(answer.get("decision"), dict):
            raise DecisionExists(run_id, name, answer["decision"],
                                 taken=bool(answer.get("taken")),
                                 words=str(answer.get("words")),
                                 timed=str(answer.get("words"))) from None
        if exc.code in (401, 403):
            # The service recorded its own refusals; a token it did not accept is ours.
            why = answer.get("why") or (f"the hub did not accept this server's token "
                                        f"(HTTP {exc.code})")
            if "why" in answer:
                raise RefusedByHub(run_id, name, answer.get("by") or by, why) from None
            return _refuse(journal, run_id, pending, by, str(decision.get("via")), why)
        raise DurableError(f"the hub's durable-nb service at {url} answered HTTP {exc.code}: "
                           f"{answer.get('why') or answer.get('message') or exc.reason}") from None
    except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
        return _refuse(journal, run_id, pending, by, str(decision.get("via")),
                       f"the hub's durable-nb service at {url} could not be asked ({exc}); "
                       f"only it writes decisions on this hub")


def _answer(exc: urllib.error.HTTPError) -> dict:
    try:
        answer = json.loads(exc.read() or b"{}")
    except ValueError:
        return {}
    return answer if isinstance(answer, dict) else {}


def _refuse(journal: Journal, run_id: str, pending: dict, by: str, via: str, why: str
            ) -> dict:
    """Record the refusal in the run's history and raise it."""
    record_event(journal, run_id, "refused", f"a decision by {by} via {via} refused: {why}",
                 pending=pending, by=by, via=via)
    raise RefusedByHub(run_id, str(pending.get("name")), by, why)
