"""How the hub's service decides: as the hub user, with the starter the database recorded.

The service logs in as the journal's decider role, so the decision path lets it write
(:func:`~durable_nb.approvals.authority.decided_elsewhere` answers None there). It decides
through :func:`~durable_nb.approvals.decide.decide`, as every path does, with the request id
and digest the person saw, and one substitution (``vetted``): what a run's own record says
about who started it (which the starter's kernel wrote, and could have written as anyone)
is replaced with the hub users whose database roles created and last wrote the run, and the
hub's four-eyes rule (:class:`~durable_nb.hub.config.HubConfig`) is added; then the
request's approvers' list and four-eyes are checked as everywhere
(:func:`~durable_nb.approvals.policy.refusal`), and a refusal is one line and an event in
the run's history.
"""

from __future__ import annotations

from ..approvals.decide import decide
from ..approvals.policy import same_person
from ..journal import Journal
from .config import HubConfig

__all__ = ["decide_as", "starters"]


def starters(journal: Journal, config: HubConfig, run_id: str) -> list[str]:
    """The hub users whose database roles created run ``run_id`` and last wrote its record
    (the service's own role left out): who started it, as far as the database knows."""
    decider, _, roles = journal.decision_authority(run_id)
    found: list[str] = []
    for role in roles:
        person = config.person_of_role(role)
        if person is not None and role != decider and person not in found:
            found.append(person)
    return found


def decide_as(journal: Journal, config: HubConfig, run_id: str, *, user: str,
              approved: bool, note: str | None, via: str, request_id: str | None,
              digest: str, replace: bool = False, refusals_once: str | None = None,
              args: dict | None = None, message: str | None = None,
              answer: dict | None = None) -> dict:
    """Decide run ``run_id``'s pending approval as hub user ``user``, if it is the request
    ``request_id`` and ``digest`` name (the one the person saw): the decision written, with
    its edited ``args`` or its ``message`` to the model if given. Errors as
    :func:`~durable_nb.approvals.decide.decide`'s."""
    def vetted(pending: dict) -> dict:
        known = starters(journal, config, pending.get("run_id", run_id))
        if not known:
            return pending
        facts = dict(pending, started_by=next((s for s in known if same_person(s, user)),
                                              known[-1]))
        if config.four_eyes:
            facts["four_eyes"] = True
        return facts

    return decide(journal, run_id, request_id=request_id, digest=digest, approved=approved,
                  by=user, via=via, note=note, replace=replace, refusals_once=refusals_once,
                  vetted=vetted, args=args, message=message, answer=answer)
