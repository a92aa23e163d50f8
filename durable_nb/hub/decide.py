"""How the hub's service decides: as the hub user, with the starter the database recorded.

The service logs in as the journal's decider role, so the decision path lets it write
(:func:`~durable_nb.hub.authority.decided_elsewhere` answers None there). Before it does,
:func:`decide_as` replaces what a run's own record says about who started it (which the
starter's kernel wrote, and could have written as anyone) with the hub users whose database
roles created and last wrote the run, and applies the hub's four-eyes rule
(:class:`~durable_nb.hub.config.HubConfig`); then the request's approvers' list and
four-eyes are checked as everywhere (:mod:`~durable_nb.execution.approvers`), and a refusal
is one line and an event in the run's history.
"""

from __future__ import annotations

from ..errors import ApprovalChanged, NoPendingApproval
from ..execution.approvals import leave_decision, pending_digest
from ..execution.approvers import same_person
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
              approved: bool, note: str | None, via: str, request_id: str | None = None,
              digest: str | None = None, replace: bool = False) -> dict:
    """Decide run ``run_id``'s pending approval as hub user ``user``: the decision written.
    ``request_id``/``digest``: the request the person saw (refused with
    :class:`~durable_nb.errors.ApprovalChanged` if the run now asks something else)."""
    record = journal.get_run(run_id)
    pending = record.pending_approval
    if pending is None:
        raise NoPendingApproval(f"run {run_id!r} is not waiting for an approval (status "
                                f"{record.status}).")
    if ((request_id is not None and pending.get("id") != request_id) or
            (digest is not None and pending_digest(pending) != digest)):
        raise ApprovalChanged(f"run {run_id!r} now waits for another request than the one "
                              f"that was seen: nothing was decided. Look at it again.")
    target = pending.get("run_id", run_id)
    vetted = dict(pending)
    known = starters(journal, config, target)
    if config.four_eyes and known:
        vetted["four_eyes"] = True
    if known:
        vetted["started_by"] = next((s for s in known if same_person(s, user)), known[-1])
    return leave_decision(journal, run_id, vetted, approved=approved, note=note, by=user,
                          via=via, replace=replace)
