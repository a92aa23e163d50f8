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

Each refusal raises :class:`~durable_nb.errors.RefusedByHub` (one line) and is an event in
the run's history: the service records the ones it makes; this module the ones it makes
when the service cannot be asked.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

from ..errors import DecisionExists, DurableError, RefusedByHub
from ..journal import Journal
from .history import record_event

__all__ = ["SERVICE_VARIABLE", "TOKEN_VARIABLE", "decided_elsewhere", "service_url"]

#: The service's URL under the hub's public URL (``https://hub.example.org/services/durable-nb/``),
#: set for every user's server by the administrator (``c.Spawner.environment``).
SERVICE_VARIABLE = "DURABLE_NB_HUB_SERVICE"
#: The hub API token JupyterHub gives each user's server (and its kernels and terminals).
TOKEN_VARIABLE = "JUPYTERHUB_API_TOKEN"
_TIMEOUT = 30.0


def service_url() -> str | None:
    """The durable-nb service's URL as this process was told it (ending in ``/``), or None."""
    url = os.environ.get(SERVICE_VARIABLE, "").strip()
    return (url if url.endswith("/") else url + "/") if url else None


def decided_elsewhere(journal: Journal, run_id: str, pending: dict, decision: dict, *,
                      replace: bool) -> dict | None:
    """None when this process may write ``decision`` on ``pending`` (of run ``run_id``)
    itself: the journal names no decider role (no hub), or this process logs in as it (the
    service). Otherwise the decision the hub's service wrote for the hub user this
    process's token names; :class:`~durable_nb.errors.RefusedByHub` when the service
    refused, or cannot be asked; :class:`~durable_nb.errors.DecisionExists` when the request
    was decided already."""
    decider, is_decider, _ = journal.decision_authority()
    if decider is None or is_decider:
        return None
    name = str(pending.get("name"))
    by = str(decision.get("by"))
    url, token = service_url(), os.environ.get(TOKEN_VARIABLE, "").strip()
    if decision.get("via") == "timeout" and not decision.get("approved"):
        return None  # a deadline's rejection any run may write: it only stops the run
    if not url or not token:
        return _refuse(journal, run_id, pending, by, str(decision.get("via")),
                       f"on this hub only the durable-nb service (database role {decider}) "
                       f"writes decisions; decide in its inbox, or from a server the hub "
                       f"started (it sets ${SERVICE_VARIABLE} and ${TOKEN_VARIABLE})")
    body = {"run_id": run_id, "request": pending.get("id"), "digest": decision.get("digest"),
            "approved": bool(decision.get("approved")), "note": decision.get("note"),
            "via": decision.get("via"), "replace": replace,
            **{k: decision[k] for k in ("args", "message", "answer") if k in decision}}
    request = urllib.request.Request(
        url + "api/decide", data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT) as response:
            return json.loads(response.read())["decision"]
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
