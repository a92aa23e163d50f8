"""How the hub's service decides: as the hub user, with facts no user's role can forge.

The service logs in as the journal's decider role, so the decision path lets it write
(:func:`~durable_nb.approvals.authority.decided_elsewhere` answers None there). It decides
through :func:`~durable_nb.approvals.decide.decide`, as every path does, with the request id
and digest the person saw, and one substitution (``vetted``): the policy facts a decision is
checked against are read from the record of the run that asked (:func:`own_request`), which
only the role that created that run writes (the database's rule); what that record says about
who started the run (which the starter's kernel wrote, and could have written as anyone) is
replaced with the hub users whose database roles created and last wrote the run; an
escalation's approvers are the request's own ``escalate_to``; and the hub's four-eyes rule
(:class:`~durable_nb.hub.config.HubConfig`) is added. A run whose starter the database does
not know is refused where four-eyes applies (fail closed). Then the request's approvers' list
and four-eyes are checked as everywhere (:func:`~durable_nb.approvals.policy.refusal`), and
a refusal is one line and an event in the run's history.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..approvals.decide import decide
from ..approvals.history import record_event
from ..approvals.policy import same_person
from ..approvals.request import pending_digest, with_escalation
from ..errors import RefusedByHub
from ..journal import Journal
from .config import HubConfig

__all__ = ["decide_as", "own_request", "starters", "starters_of"]


def starters(journal: Journal, config: HubConfig, run_id: str) -> list[str]:
    """The hub users whose database roles created run ``run_id`` and last wrote its record
    (the service's own role left out): who started it, as far as the database knows."""
    decider, _, roles = journal.decision_authority(run_id)
    return _people(config, decider, roles)


def starters_of(journal: Journal, config: HubConfig, run_ids: Iterable[str]
                ) -> dict[str, list[str]]:
    """:func:`starters` for each run, by run id, read at once."""
    decider = journal.decision_authority()[0]
    return {run_id: _people(config, decider, roles)
            for run_id, roles in journal.writers_of(run_ids).items()}


def _people(config: HubConfig, decider: str | None, roles: Iterable[str | None]) -> list[str]:
    found: list[str] = []
    for role in roles:
        person = config.person_of_role(role)
        if person is not None and role != decider and person not in found:
            found.append(person)
    return found


def own_request(journal: Journal, pending: dict, run_id: str) -> dict | None:
    """``pending`` (shown by run ``run_id``: the run itself, or a parent showing its child's)
    as the run that asked holds it in its own record, with its escalation; None when that
    run does not wait for this request (same id, step and digest). A parent's copy is its
    own creator's to write; only the asking run's record is its starter's."""
    target = pending.get("run_id", run_id)
    record = journal.find_run(target)
    own = record.pending_approval if record is not None else None
    if not own or own.get("id") != pending.get("id") or own.get("key") != pending.get("key") \
            or pending_digest(own) != pending_digest(pending):
        return None
    own = with_escalation(journal, target, dict(own, run_id=target))
    escalation = own.get("escalation")
    if isinstance(escalation, dict):  # who decides once escalated is the request's own list
        own["escalation"] = dict(escalation, approvers=list(own.get("escalate_to") or ()))
    return own


def decide_as(journal: Journal, config: HubConfig, run_id: str, *, user: str,
              approved: bool, note: str | None, via: str, request_id: str | None,
              digest: str, replace: bool = False, refusals_once: str | None = None,
              signed_in: bool = True, args: dict | None = None,
              message: str | None = None, answer: dict | None = None) -> dict:
    """Decide run ``run_id``'s pending approval as hub user ``user``, if it is the request
    ``request_id`` and ``digest`` name (the one the person saw): the decision written, with
    its edited ``args`` or its ``message`` to the model if given. ``signed_in`` False: the
    user's process says the decider came by a link nobody signed in to (a channel's), and
    the rule for such links applies. Errors as :func:`~durable_nb.approvals.decide.decide`'s;
    :class:`~durable_nb.errors.RefusedByHub` when the facts cannot be vouched for."""
    def refuse(pending: dict, target: str, why: str) -> RefusedByHub:
        record_event(journal, target, "refused", f"a decision by {user} via {via} refused: "
                     f"{why}", pending=pending, by=user, via=via)
        return RefusedByHub(target, str(pending.get("name")), user, why)

    def vetted(pending: dict) -> dict:
        target = pending.get("run_id", run_id)
        own = own_request(journal, pending, run_id)
        if own is None:
            raise refuse(pending, target, f"run {target!r} does not wait for this request in "
                         f"its own record (a copy shown by run {run_id!r} differs)")
        known = starters(journal, config, target)
        if not known:
            if config.four_eyes or own.get("four_eyes"):
                raise refuse(own, target, f"the database does not know who started run "
                             f"{target!r} (it predates the hub's roles), so four-eyes cannot "
                             f"be checked: the hub's administrator decides it")
            return dict(own, started_by=None)
        facts = dict(own, started_by=next((s for s in known if same_person(s, user)),
                                          known[-1]))
        if config.four_eyes:
            facts["four_eyes"] = True
        return facts

    return decide(journal, run_id, request_id=request_id, digest=digest, approved=approved,
                  by=user, via=via, note=note, replace=replace, refusals_once=refusals_once,
                  signed_in=signed_in, vetted=vetted, args=args, message=message,
                  answer=answer)
