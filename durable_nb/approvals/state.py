"""What a waiting run's request amounts to now, read without writing anything.

Reading a run never applies its deadline (that is :func:`~durable_nb.approvals.tick.tick`'s
write): ``durable-nb runs`` and ``show``, ``durable_nb.runs`` and ``get_run``, ``%durable
runs`` and ``show`` read the journal as it is and say what it amounts to:
:func:`effective_state` - decided by its deadline's policy but not resumed yet, or past its
deadline, which a sweep applies as the policy says.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..journal import Journal, RunRecord, Status
from ..timestamps import format_time
from .policy import deadline_of
from .request import find_decision, with_escalation

__all__ = ["Effective", "effective_state"]


@dataclass(frozen=True)
class Effective:
    """A waiting run's effective state: ``status`` (``APPROVED``, ``REJECTED`` or
    ``ESCALATED``) and ``words``, one clause (``rejected by its deadline at 10:32, not
    resumed yet``)."""
    status: str
    words: str


def effective_state(journal: Journal, record: RunRecord, now: float | None = None
                    ) -> Effective | None:
    """What ``record`` (a run as stored) amounts to now, when time changed it: a request
    waiting in it that its deadline decided, or whose deadline passed (what its policy does
    then). None otherwise (a person's decision not taken yet is the decision's to show).
    Reads the decision and the escalation record; writes nothing."""
    pending = record.pending_approval
    if record.status is not Status.WAITING_APPROVAL or not pending:
        return None
    moment = time.time() if now is None else now
    target = pending.get("run_id", record.run_id)
    pending = with_escalation(journal, target, pending, moment)
    decision = find_decision(journal, target, pending)
    if decision is not None:
        if decision.get("via") != "timeout":
            return None
        verdict = "APPROVED" if decision.get("approved") else "REJECTED"
        return Effective(verdict, f"{verdict.lower()} by its deadline at "
                                  f"{format_time(decision.get('at'), '?')}, not resumed yet")
    deadline = deadline_of(pending)
    if deadline is None or moment < deadline:
        return None
    policy = pending.get("on_timeout") or "reject"
    if policy == "escalate" and not pending.get("escalation"):
        to = ", ".join(pending.get("escalate_to") or ())
        return Effective("ESCALATED", f"escalated to {to} by its deadline at "
                                      f"{format_time(deadline, '?')} (sent at the next sweep)")
    verdict = "APPROVED" if policy == "approve" and not pending.get("escalation") \
        else "REJECTED"
    return Effective(verdict, f"{verdict.lower()} by its deadline at "
                              f"{format_time(deadline, '?')}, not resumed yet (written at "
                              f"the next sweep)")
