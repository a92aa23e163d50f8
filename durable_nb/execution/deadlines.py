"""An approval's deadline, applied from the journal by whichever process looks first.

An approval asked with ``timeout`` keeps its policy in the pending approval
(``RunRecord.pending_approval``): ``timeout_at`` (Unix time), ``on_timeout`` (``"reject"``,
``"approve"`` or ``"escalate"``), ``escalate_to`` (approvers, names or e-mail addresses) and
``remind_at`` (Unix times at which a reminder is due). A pending approval written before
these fields has only ``timeout_at`` (or nothing) and is rejected at its deadline, as before.

:func:`apply_deadline` is the one place the policy is applied, by the run's executor while
it waits, by a notebook's watcher, by the server extension's sweep and by any process that
opens the journal (the CLI, ``durable_nb.runs()``, ``%durable``), so that a run parked past
its deadline is decided whether or not a kernel is alive:

- **A decision** goes through :func:`~durable_nb.execution.approvals.leave_decision`
  (``by="timeout"``, ``via="timeout"``, the note saying the policy): of processes racing,
  and a person deciding at the same moment, exactly one decision is written.
- **An escalation** is claimed once: an add-once record ``REQUEST/escalation`` in the
  journal's deliveries store (:meth:`~durable_nb.journal.Journal.add_delivery`). The
  process that adds it records the ``escalated`` event; every process that finds it merges
  it into the pending approval it holds as ``escalation = {"at", "approvers",
  "timeout_at"}``, and one that can take the run's lease for a moment (nobody executes the
  run) writes it into the run record. A second deadline, as long as the first, runs from the
  escalation; after it the request is rejected.

Each decision and escalation is a history event (:mod:`.history`): ``timed_out``,
``escalated``; reminders (``reminded``) are sent by :mod:`durable_nb.notify.followups`.
"""

from __future__ import annotations

import datetime
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Union

from ..errors import ApprovalPolicyError, DecisionExists, DurableError
from ..journal import Journal, RunRecord, Status
from ..timestamps import format_time
from .approvals import find_decision, leave_decision
from .history import record_event
from .lease import Lease

__all__ = ["ON_TIMEOUT", "ApprovalPolicy", "Duration", "apply_deadline", "apply_deadlines",
           "apply_due_deadlines", "deadline_of", "due", "escalation_key", "parse_duration",
           "with_escalation", "write_escalation"]

#: What an approval's ``timeout`` and ``remind`` take: seconds, a timedelta, or "90s",
#: "30m", "2h", "1d".
Duration = Union[int, float, datetime.timedelta, str]

#: The policies ``on_timeout`` takes.
ON_TIMEOUT = ("reject", "approve", "escalate")

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*")
_FORMS = 'seconds (a number), a datetime.timedelta, or a string like "90s", "30m", "2h", "1d"'


def parse_duration(value: Duration, what: str = "timeout") -> float:
    """``value`` in seconds (positive); :class:`ApprovalPolicyError` saying the forms
    accepted."""
    seconds: float | None = None
    if isinstance(value, datetime.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION.fullmatch(value.lower())
        if match:
            seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds is None or not seconds > 0 or seconds == float("inf"):
        raise ApprovalPolicyError(f"{what}={value!r} is not a duration: use {_FORMS}, "
                                  f"more than zero.")
    return seconds


@dataclass(frozen=True)
class ApprovalPolicy:
    """What happens when nobody decides an approval in time (see the module docstring)."""
    timeout: float | None = None
    on_timeout: str = "reject"
    escalate_to: tuple[str, ...] = ()
    #: Seconds before the deadline at which a reminder is due, longest first.
    remind: tuple[float, ...] = ()

    @classmethod
    def of(cls, timeout: Duration | None = None, on_timeout: str = "reject",
           escalate_to: str | Sequence[str] | None = None,
           remind: Duration | Sequence[Duration] | None = None) -> "ApprovalPolicy":
        """The policy for these options, checked: :class:`ApprovalPolicyError` naming the
        option that is wrong and what it takes."""
        seconds = None if timeout is None else parse_duration(timeout)
        if on_timeout not in ON_TIMEOUT:
            raise ApprovalPolicyError(f"on_timeout={on_timeout!r} is not a policy: use "
                                      f"{', '.join(map(repr, ON_TIMEOUT))}.")
        approvers = _approvers(escalate_to)
        if on_timeout == "escalate" and not approvers:
            raise ApprovalPolicyError('on_timeout="escalate" needs escalate_to: a list of '
                                      'approvers (user names or e-mail addresses).')
        if remind is None:
            befores: tuple[float, ...] = ()
        else:
            many = isinstance(remind, (list, tuple))
            befores = tuple(parse_duration(r, "remind") for r in (remind if many else [remind]))
        if befores and seconds is None:
            raise ApprovalPolicyError("remind needs a timeout: reminders are sent that long "
                                      "before the deadline.")
        return cls(seconds, on_timeout, approvers, tuple(sorted(set(befores), reverse=True)))

    def pending_fields(self, requested_at: float) -> dict:
        """The fields of a pending approval asked at ``requested_at`` under this policy
        (an approval without a timeout has none of them but ``timeout_at``)."""
        if self.timeout is None:
            return {"timeout_at": None}
        timeout_at = requested_at + self.timeout
        fields: dict[str, Any] = {"timeout_at": timeout_at, "timeout": self.timeout,
                                  "on_timeout": self.on_timeout}
        if self.escalate_to:
            fields["escalate_to"] = list(self.escalate_to)
        if self.remind:
            fields["remind_at"] = [timeout_at - before for before in self.remind
                                   if timeout_at - before > requested_at]
        return fields


def _approvers(value: str | Sequence[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise ApprovalPolicyError(f"escalate_to={value!r} is not a list of approvers: use user "
                                  f"names or e-mail addresses, e.g. ['ana', 'bo@example.org'].")
    return tuple(dict.fromkeys(n.strip() for n in names if n.strip()))


def deadline_of(pending: dict) -> float | None:
    """When ``pending`` is decided by its policy: the escalation's deadline once escalated,
    else ``timeout_at`` (None: no deadline)."""
    escalation = pending.get("escalation")
    if escalation:
        return escalation.get("timeout_at")
    return pending.get("timeout_at")


def escalation_key(pending: dict) -> str:
    """The key of ``pending``'s escalation record in the deliveries store."""
    return f"{pending['id']}/escalation"


def with_escalation(journal: Journal, run_id: str, pending: dict,
                    now: float | None = None) -> dict:
    """``pending`` (of run ``run_id``, the run that asked) with its escalation, if one was
    claimed in the journal that ``pending`` does not show yet (read only once its first
    deadline passed: there can be none before)."""
    if pending.get("escalation") or pending.get("on_timeout") != "escalate" \
            or not pending.get("id") \
            or (time.time() if now is None else now) < float(pending.get("timeout_at") or 0):
        return pending
    found = journal.deliveries(run_id).get(escalation_key(pending))
    return dict(pending, escalation=_escalation_fields(found)) if found else pending


def _escalation_fields(record: dict) -> dict:
    return {"at": record["at"], "approvers": list(record["approvers"]),
            "timeout_at": record["timeout_at"]}


def apply_deadline(journal: Journal, run_id: str, pending: dict, *,
                   now: Callable[[], float] = time.time) -> tuple[str, dict] | None:
    """Apply ``pending``'s policy if its deadline passed (``pending`` of run ``run_id``, the
    run that asked; read from its record). None when there is nothing to do (no deadline,
    not yet); ``("decided", decision)`` with the decision the request now has (the
    policy's, or a person's who was first); ``("escalated", pending)`` with ``pending`` as
    escalated (here or by another process), its new deadline still ahead."""
    if not pending.get("id") and pending.get("timeout_at") is None:
        return None
    merged = with_escalation(journal, run_id, pending, now())
    deadline = deadline_of(merged)
    if deadline is None or now() < deadline:
        return None if merged is pending else ("escalated", merged)
    pending = merged
    decided = find_decision(journal, run_id, pending)
    if decided is not None:
        return "decided", decided
    policy = pending.get("on_timeout") or "reject"
    if policy == "escalate" and not pending.get("escalation"):
        return "escalated", _escalate(journal, run_id, pending, now)
    approved = policy == "approve" and not pending.get("escalation")
    try:
        decision = leave_decision(journal, run_id, pending, approved=approved,
                                  note=_note(pending, approved), by="timeout", via="timeout")
    except DecisionExists as exc:
        return "decided", exc.decision  # a person (or another process) was first
    record_event(journal, run_id, "timed_out", _timed_out_text(pending, approved, deadline),
                 pending=pending, by="timeout", via="timeout", approved=approved,
                 policy=policy)
    return "decided", decision


def _escalate(journal: Journal, run_id: str, pending: dict, now: Callable[[], float]) -> dict:
    """``pending`` escalated: the escalation claimed once in the journal (this process's,
    or the one another process claimed first)."""
    at = now()
    first = float(pending.get("timeout") or
                  (pending["timeout_at"] - float(pending.get("requested_at") or at)))
    claim = {"at": at, "approvers": list(pending.get("escalate_to") or ()),
             "timeout_at": at + max(first, 0.0), "digest": pending.get("digest")}
    if journal.add_delivery(run_id, escalation_key(pending), claim):
        escalated = dict(pending, escalation=_escalation_fields(claim))
        record_event(journal, run_id, "escalated",
                     f"no decision by the deadline {format_time(pending.get('timeout_at'), '?')}"
                     f": escalated to {', '.join(claim['approvers'])}, who have until "
                     f"{format_time(claim['timeout_at'], '?')} before it is rejected",
                     pending=pending, by="timeout", via="timeout",
                     approvers=claim["approvers"], timeout_at=claim["timeout_at"])
        return escalated
    found = journal.deliveries(run_id).get(escalation_key(pending))
    return dict(pending, escalation=_escalation_fields(found)) if found else pending


def _note(pending: dict, approved: bool) -> str:
    timeout = pending.get("timeout") or (
        pending["timeout_at"] - float(pending.get("requested_at") or pending["timeout_at"]))
    note = f"no decision within {timeout:g} s"
    escalation = pending.get("escalation")
    if escalation:
        return note + f", nor by {', '.join(escalation['approvers'])} after the escalation"
    if approved:
        return note + ": approved by its on_timeout policy"
    return note


def _timed_out_text(pending: dict, approved: bool, deadline: float) -> str:
    verdict = "approved" if approved else "rejected"
    if pending.get("escalation"):
        why = "no decision by the escalation's deadline"
    else:
        why = "no decision by the deadline"
    policy = pending.get("on_timeout") or "reject"
    return f"{why} {format_time(deadline, '?')}: {verdict} by the policy on_timeout={policy!r}"


def apply_deadlines(journal: Journal, records: Iterable[RunRecord] | None = None, *,
                    now: Callable[[], float] = time.time) -> dict[str, str]:
    """:func:`apply_deadline` for each run of ``records`` (default: every run of ``journal``
    that waits for a decision) whose request's deadline passed: what was done, by the run
    that asked. An escalation is also written into each waiting record that shows the
    request, when nobody executes that run. Never raises for one run's trouble (a journal
    error is left for the next look); a journal opened read-only is left as it is."""
    if journal.read_only:
        return {}
    if records is None:
        records = journal.list_runs(status=Status.WAITING_APPROVAL)
    done: dict[str, str] = {}
    for record in records:
        pending = record.pending_approval
        if record.status is not Status.WAITING_APPROVAL or not pending:
            continue
        deadline = deadline_of(pending)
        if deadline is None or now() < deadline:
            continue  # nothing due: nothing read beyond the record
        run_id = pending.get("run_id", record.run_id)
        try:
            applied = apply_deadline(journal, run_id, pending, now=now)
            if applied is None:
                continue
            kind, value = applied
            if kind == "escalated":
                write_escalation(journal, record, value)
            done[run_id] = kind
        except (DurableError, OSError):
            continue
    return done


def due(records: Iterable[RunRecord], now: float | None = None) -> list[RunRecord]:
    """The waiting runs of ``records`` whose request's deadline has passed (read from the
    records alone: nothing else is read)."""
    moment = time.time() if now is None else now
    return [r for r in records if r.status is Status.WAITING_APPROVAL and r.pending_approval
            and (deadline_of(r.pending_approval) or float("inf")) <= moment]


def apply_due_deadlines(records: Iterable[RunRecord], open_writable: Callable[[], Journal]
                        ) -> dict[str, str]:
    """:func:`apply_deadlines` for the runs of ``records`` (read through a read-only
    handle: a listing, ``durable-nb show``) whose deadline passed, through the journal
    ``open_writable`` opens, only if there is one: what was done. A journal that cannot be
    written (a read-only copy) is left as it is."""
    waiting = due(records)
    if not waiting:
        return {}
    try:
        return apply_deadlines(open_writable(), waiting)
    except (DurableError, OSError):
        return {}


def write_escalation(journal: Journal, record: RunRecord, escalated: dict) -> None:
    """The escalation of ``escalated`` (a pending approval :func:`apply_deadline` returned)
    made lasting in the run record: written into ``record``'s pending approval if it still
    shows that request without it, under the run's lease (taken for this one write: never
    while the run is being executed, whose executor merges the escalation itself)."""
    pending = record.pending_approval or {}
    if pending.get("escalation") or pending.get("id") != escalated.get("id"):
        return
    try:
        lease = Lease.acquire(journal, record.run_id)
    except DurableError:
        return  # executed right now: its executor merges the escalation when it looks
    try:
        current = journal.find_run(record.run_id)
        if current is None or current.status is not Status.WAITING_APPROVAL \
                or not current.pending_approval \
                or current.pending_approval.get("id") != escalated.get("id") \
                or current.pending_approval.get("escalation"):
            return
        current.pending_approval = dict(current.pending_approval,
                                        escalation=escalated["escalation"])
        journal.put_run(current, token=lease.token)
    finally:
        lease.release()
