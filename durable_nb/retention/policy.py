"""What a prune removes, said once: :class:`RetentionPolicy` (how old, which statuses, which
runs), for ``durable-nb prune`` and ``durable_nb.prune`` alike, and the journal's own policy
that its sweep applies (stored in the journal: :meth:`~durable_nb.journal.Journal.setting`
``retention``, so that every sweeper of the journal, a Jupyter server's, ``durable-nb
sweep`` or a hub's service, applies the same one)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Union

from ..errors import ApprovalPolicyError, JournalError, PruneRefused, RetentionError
from ..journal import Journal, Status
from ..approvals.policy import Duration, parse_duration

__all__ = ["DEFAULT_EVERY", "PRUNABLE", "RetentionPolicy", "Statuses", "check_may_prune",
           "claim_due", "duration_words", "last_applied", "policy_due", "read_policy",
           "set_policy"]

#: The statuses a prune may remove: a run that ended. RUNNING (executing, or interrupted)
#: and WAITING_APPROVAL runs are never removed.
PRUNABLE = (Status.DONE, Status.FAILED, Status.CANCELLED)
_STATUS_NAMES = ", ".join(s.value.lower() for s in PRUNABLE)
#: How often a sweep applies the journal's policy by default (seconds): once a day.
DEFAULT_EVERY = 86400.0

Statuses = Union[str, Status, Iterable[Union[str, Status]], None]

#: When a sweep last applied the policy: a record of the journal's deliveries store under an
#: id no run can have (run ids hold no spaces), written add-if-absent or compare-and-swap
#: (:func:`claim_due`), so that of sweepers racing exactly one applies it in a period.
_APPLIED = ("journal retention", "applied")


def _statuses(value: Statuses) -> tuple[Status, ...]:
    if value is None:
        return PRUNABLE
    if isinstance(value, (str, Status)):
        value = [part for part in str(value).split(",") if part.strip()]
    try:
        chosen = tuple(dict.fromkeys(Status.parse(s) for s in value))
    except ValueError as exc:
        raise RetentionError(f"{exc}; a prune removes only {_STATUS_NAMES}") from None
    if not chosen:
        raise RetentionError(f"no status given: name one or more of {_STATUS_NAMES} "
                             f"(commas between)")
    never = [s.value for s in chosen if s not in PRUNABLE]
    if never:
        raise RetentionError(
            f"a prune never removes {', '.join(never)}: runs that wait, run or were "
            f"interrupted are kept. Use --status with {_STATUS_NAMES} (commas between).")
    return chosen


def _seconds(value: Duration, what: str) -> float:
    try:
        return parse_duration(value, what)
    except ApprovalPolicyError as exc:
        raise RetentionError(str(exc)) from None


@dataclass(frozen=True)
class RetentionPolicy:
    """Remove runs that ended (``statuses``, default DONE, FAILED and CANCELLED) and have
    not changed for ``older_than`` seconds, whose id starts with ``prefix``; ``every``: how
    often a sweep applies it (a journal's policy). What is never removed whatever the
    policy says: :mod:`durable_nb.retention.plan`."""

    older_than: float
    statuses: tuple[Status, ...] = PRUNABLE
    prefix: str = ""
    every: float = DEFAULT_EVERY

    @classmethod
    def of(cls, older_than: Duration, status: Statuses = None, prefix: str | None = None,
           every: Duration | None = None) -> "RetentionPolicy":
        """The policy from what a person gives: a duration in the one grammar of durations
        (``30d``, ``12h``, seconds, a timedelta), statuses as names (``"done,failed"``)."""
        if prefix is not None and not isinstance(prefix, str):
            raise RetentionError(f"prefix={prefix!r} is not a string of a run id's start")
        return cls(_seconds(older_than, "older_than"), _statuses(status), prefix or "",
                   DEFAULT_EVERY if every is None else _seconds(every, "every"))

    def to_dict(self) -> dict[str, Any]:
        """JSON data, as the journal keeps it."""
        return {"older_than": self.older_than, "statuses": [s.value for s in self.statuses],
                "prefix": self.prefix, "every": self.every}

    @classmethod
    def from_dict(cls, data: Any) -> "RetentionPolicy":
        """The policy the journal keeps; RetentionError when it is not one."""
        if not isinstance(data, dict):
            raise RetentionError(f"the journal's retention policy is not an object: {data!r}")
        return cls.of(data.get("older_than"), data.get("statuses"), data.get("prefix"),
                      data.get("every"))

    def cutoff(self, now: float) -> float:
        """Runs that last changed before this moment are old enough."""
        return now - self.older_than

    def describe(self) -> str:
        """``DONE, FAILED, CANCELLED runs unchanged for 30 days`` (with the prefix)."""
        where = f" whose id starts with {self.prefix!r}" if self.prefix else ""
        return (f"{', '.join(s.value for s in self.statuses)} runs{where} unchanged for "
                f"{duration_words(self.older_than)}")


def duration_words(seconds: float) -> str:
    """``30 days``, ``12 hours``, ``90 minutes``, ``45 seconds``."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}{'' if count == 1 else 's'}"
    return f"{seconds:g} second{'' if seconds == 1 else 's'}"


def check_may_prune(journal: Journal) -> None:
    """Refuse (:class:`~durable_nb.errors.PruneRefused`, one line) to prune a hub's journal
    from any role but the service's; and a journal opened read-only."""
    if journal.read_only:
        raise JournalError(f"the journal at {journal.location} was opened read-only, so "
                           f"nothing can be pruned from it.")
    decider, is_decider, _ = journal.decision_authority()
    if decider is not None and not is_decider:
        raise PruneRefused(
            f"on this hub's journal only the role {decider} (the durable-nb hub service) "
            f"removes runs, by the journal's retention policy; ask your hub's administrator.")


def read_policy(journal: Journal) -> RetentionPolicy | None:
    """The journal's retention policy, or None (the default: runs are kept until pruned)."""
    data = journal.setting("retention")
    return None if data is None else RetentionPolicy.from_dict(data)


def set_policy(journal: Journal, policy: RetentionPolicy | None) -> None:
    """Make ``policy`` the journal's retention policy (None: none), applied by its sweep
    from its next pass. On a hub's journal only the service's role can (the database refuses
    the others): :class:`~durable_nb.errors.PruneRefused` for them."""
    check_may_prune(journal)
    journal.put_setting("retention", None if policy is None else policy.to_dict())
    applied = last_applied(journal)
    if applied is not None and applied.get("at") is not None:
        journal.swap_delivery(*_APPLIED, applied, {"at": None})


def last_applied(journal: Journal) -> dict | None:
    """When a sweep last applied the journal's policy (``{"at", "pid", "host"}``), or None;
    ``at`` None once the policy was set anew."""
    return journal.deliveries(_APPLIED[0]).get(_APPLIED[1])


def _due(policy: RetentionPolicy | None, applied: dict | None, now: float) -> bool:
    last = (applied or {}).get("at")
    return policy is not None and not (isinstance(last, (int, float))
                                       and now - last < policy.every)


def policy_due(journal: Journal, now: float | None = None) -> RetentionPolicy | None:
    """The journal's policy when a sweep should apply it at ``now`` (never applied, or
    ``every`` seconds ago or more); None otherwise, and when it has none. Read only."""
    policy = read_policy(journal)
    return policy if _due(policy, last_applied(journal), time.time() if now is None
                          else now) else None


def claim_due(journal: Journal, now: float, stamp: dict) -> RetentionPolicy | None:
    """The journal's policy when it is due at ``now`` and this call claimed its application
    (``stamp``, with ``"at": now``, written as when it was last applied); None otherwise.
    The claim is one conditional write (add-if-absent, else compare-and-swap of the stamp
    read): of sweepers racing, exactly one gets the policy."""
    policy = read_policy(journal)
    applied = last_applied(journal)
    if not _due(policy, applied, now):
        return None
    won = journal.add_delivery(*_APPLIED, stamp) if applied is None \
        else journal.swap_delivery(*_APPLIED, applied, stamp)
    return policy if won else None
