"""What a parked request is sent after its first notification: reminders before its deadline,
and the news that it was escalated.

Each follow-up is a delivery of its own, claimed once per channel across processes like the
first one (:mod:`.delivery`), under the key ``REQUEST/CHANNEL/SUFFIX``:

- ``remind-N``: the request's N-th reminder (``remind_at``, from ``ctx.approval(...,
  remind=...)``), due from its time until the deadline, and only while nobody decided;
- ``escalated``: sent once the request was escalated
  (:mod:`durable_nb.execution.deadlines`); the e-mail goes to the escalation's approvers that
  are e-mail addresses (else to the channel's ``to``).

A reminder that came due while no process looked is sent when one looks, unless the
deadline passed or a later reminder is due too (only the last one due is sent).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..execution.deadlines import deadline_of

__all__ = ["FollowUp", "due_followups"]


@dataclass(frozen=True)
class FollowUp:
    """A follow-up notice due for a request."""
    suffix: str  # of its delivery key: "remind-2", "escalated"
    event: str   # the notice's event: "approval.reminder", "approval.escalated"
    text: str    # the history's sentence once it is sent, "{channel}" for its channel


def due_followups(pending: dict, now: float) -> list[FollowUp]:
    """The follow-ups of ``pending`` (with its escalation, if any) due at ``now``, whether
    sent already or not (the caller claims each once)."""
    due: list[FollowUp] = []
    escalation = pending.get("escalation")
    if escalation:
        due.append(FollowUp("escalated", "approval.escalated",
                            f"escalation to {', '.join(escalation.get('approvers') or ())} "
                            f"sent by {{channel}}"))
        return due  # reminders were for the first deadline
    deadline = deadline_of(pending)
    if deadline is None or now >= deadline:
        return due
    reached = [i for i, at in enumerate(pending.get("remind_at") or ()) if now >= at]
    if reached:
        number = reached[-1] + 1
        left = max(0, round(deadline - now))
        due.append(FollowUp(f"remind-{number}", "approval.reminder",
                            f"reminder {number} sent by {{channel}}: no decision yet, "
                            f"{left} s left before the deadline"))
    return due
