"""What time makes due, applied: :func:`tick`, called by whoever sweeps.

An approval asked with ``timeout`` keeps its policy in the pending approval
(:mod:`.policy`). Time makes four things due: the deadline (the policy decides), an
escalation (the request goes to ``escalate_to`` with a second deadline), reminders, and
notices whose claim lapsed (a process claimed a delivery and died). :func:`tick` applies the
first two itself and hands the journal's waiting runs to a ``listener`` for the other two,
which are the notification layer's (:func:`durable_nb.notify.delivery.sweep`): this room does
not import ``notify/``, which imports it.

Callers: the Jupyter server extension's sweeper (:mod:`durable_nb.server.notify`, which sleeps
until :attr:`Ticked.next_due`, at most its period), ``durable-nb sweep`` for a journal with no
Jupyter server (cron, a Kubernetes CronJob), the notification layer's sweep; for one request,
:func:`apply_deadline`: an executor waiting in the run, and a notebook's watcher. Reading a
run never ticks (``runs``, ``show``, ``get_run`` show the effective state:
:mod:`.state`).

- **A decision** goes through :func:`~durable_nb.approvals.decide.decide` (``by="timeout"``,
  ``via="timeout"``, the note saying the policy): of processes racing, and a person deciding
  at the same moment, exactly one decision is written.
- **An escalation** is claimed once: an add-once record ``REQUEST/escalation`` in the
  journal's deliveries store (:meth:`~durable_nb.journal.Journal.add_delivery`). The
  process that adds it records the ``escalated`` event; every process that finds it merges
  it into the pending approval it holds as ``escalation = {"at", "approvers",
  "timeout_at"}``, and one that finds the run's lease free for a moment (nobody executes the
  run) writes it into the run record. A second deadline, as long as the first, runs from the
  escalation; after it the request is rejected.

Each decision and escalation is a history event (:mod:`.history`): ``timed_out``,
``escalated``.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..errors import DecisionExists, DurableError, NoPendingApproval
from ..journal import Journal, RunRecord, Status, this_host
from ..timestamps import format_time
from .authority import deadline_elsewhere
from .decide import decide
from .history import record_event
from .policy import deadline_of, escalation_key, next_due
from .request import escalation_fields, find_decision, pending_digest, with_escalation

__all__ = ["Listener", "Ticked", "apply_deadline", "tick", "write_escalation"]

#: What :func:`tick` hands its waiting runs to once it applied deadlines and escalations:
#: ``listener(journal, records)``, the records read again. The notification layer sends
#: reminders due, escalation notices and notices whose claim lapsed in it.
Listener = Callable[[Journal, list[RunRecord]], object]


@dataclass
class Ticked:
    """What one :func:`tick` did: ``applied`` by run (``"decided"`` or ``"escalated"``);
    ``overdue``, the runs whose deadline passed with nothing applied (a journal opened
    read-only, or a journal error: left for the next tick); ``next_due``, when something
    next falls due after now in the runs it saw (None: nothing). The journal's retention
    policy is not a tick's: the sweepers apply it
    (:func:`durable_nb.retention.sweep.apply_policy`)."""
    applied: dict[str, str] = field(default_factory=dict)
    overdue: list[str] = field(default_factory=list)
    next_due: float | None = None


def tick(journal: Journal, *, now: float | None = None,
         records: Iterable[RunRecord] | None = None,
         listener: Listener | None = None) -> Ticked:
    """Apply what time makes due at ``now`` (default: the clock) in ``records`` (default:
    every run of ``journal`` that waits for a decision): each deadline passed is applied by
    its policy (decided through :func:`~durable_nb.approvals.decide.decide`, or escalated),
    then ``listener`` is called with the waiting runs as they are now. Never raises for one run's trouble (a journal error is left for the next tick); a
    journal opened read-only is only read."""
    moment = time.time() if now is None else now
    waiting = _waiting(journal.list_runs(status=Status.WAITING_APPROVAL)
                       if records is None else records)
    ticked = Ticked()
    for record in waiting:
        pending = record.pending_approval or {}
        deadline = deadline_of(pending)
        if deadline is None or moment < deadline:
            continue  # nothing due: nothing read beyond the record
        run_id = pending.get("run_id", record.run_id)
        try:
            if find_decision(journal, run_id, pending) is not None:
                continue  # decided (by a person, or an earlier tick): its run takes it
            if journal.read_only:
                ticked.overdue.append(run_id)
                continue
            applied = apply_deadline(journal, run_id, pending, now=lambda: moment)
            if applied is None:
                continue
            kind, value = applied
            if kind == "escalated":
                write_escalation(journal, record, value)
            ticked.applied[run_id] = kind
        except (DurableError, OSError):
            ticked.overdue.append(run_id)
    if ticked.applied:  # read again: escalations and decisions change what is due
        waiting = _waiting(found for r in waiting
                           if (found := journal.find_run(r.run_id)) is not None)
    dues = [d for r in waiting if (d := _next_due(journal, r, moment)) is not None]
    ticked.next_due = min(dues) if dues else None
    if listener is not None:
        listener(journal, waiting)
    return ticked


def _waiting(records: Iterable[RunRecord]) -> list[RunRecord]:
    return [r for r in records if r.status is Status.WAITING_APPROVAL and r.pending_approval]


def _next_due(journal: Journal, record: RunRecord, moment: float) -> float | None:
    """When something about ``record``'s request falls due after ``moment`` (a deadline
    passed is not: it was applied, or is retried at the next tick)."""
    pending = record.pending_approval or {}
    if pending.get("on_timeout") == "escalate":
        pending = with_escalation(journal, pending.get("run_id", record.run_id), pending,
                                  moment)
    due = next_due(pending, moment)
    return due if due is not None and due > moment else None


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
    handed = deadline_elsewhere(journal, run_id, pending)  # on a hub: the service's to apply
    if handed is not None:
        return None if handed[1] is None else (handed[0], handed[1])
    policy = pending.get("on_timeout") or "reject"
    if policy == "escalate" and not pending.get("escalation"):
        return "escalated", _escalate(journal, run_id, pending, now)
    approved = policy == "approve" and not pending.get("escalation")
    try:
        decision = decide(journal, run_id, request_id=pending.get("id"),
                          digest=pending_digest(pending), approved=approved,
                          note=_note(pending, approved), by="timeout", via="timeout")
    except DecisionExists as exc:
        return "decided", exc.decision  # a person (or another process) was first
    except NoPendingApproval:
        return None  # the run went on, or asks something else: nothing of this is due
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
        escalated = dict(pending, escalation=escalation_fields(claim))
        record_event(journal, run_id, "escalated",
                     f"no decision by the deadline {format_time(pending.get('timeout_at'), '?')}"
                     f": escalated to {', '.join(claim['approvers'])}, who have until "
                     f"{format_time(claim['timeout_at'], '?')} before it is rejected",
                     pending=pending, by="timeout", via="timeout",
                     approvers=claim["approvers"], timeout_at=claim["timeout_at"])
        return escalated
    found = journal.deliveries(run_id).get(escalation_key(pending))
    return dict(pending, escalation=escalation_fields(found)) if found else pending


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


def write_escalation(journal: Journal, record: RunRecord, escalated: dict) -> None:
    """The escalation of ``escalated`` (a pending approval :func:`apply_deadline` returned)
    made lasting in the run record: written into ``record``'s pending approval if it still
    shows that request without it, under the run's lease (taken for this one write: never
    while the run is being executed, whose executor merges the escalation itself). On a hub
    only the service writes it (a user's role may not write another person's run; the run's
    executor merges the escalation when it looks)."""
    pending = record.pending_approval or {}
    if pending.get("escalation") or pending.get("id") != escalated.get("id"):
        return
    decider, is_decider, _ = journal.decision_authority()
    if decider is not None and not is_decider:
        return
    holder = {"token": uuid.uuid4().hex, "purpose": "escalation", "pid": os.getpid(),
              "host": this_host(), "heartbeat": time.time()}
    try:
        # Any holder counts as alive: an executor (or one that died) merges the escalation
        # itself when it looks, so this write never takes a run over.
        journal.acquire_lease(record.run_id, holder, lambda _holder: True)
    except DurableError:
        return
    try:
        current = journal.find_run(record.run_id)
        if current is None or current.status is not Status.WAITING_APPROVAL \
                or not current.pending_approval \
                or current.pending_approval.get("id") != escalated.get("id") \
                or current.pending_approval.get("escalation"):
            return
        current.pending_approval = dict(current.pending_approval,
                                        escalation=escalated["escalation"])
        journal.put_run(current, token=holder["token"])
    finally:
        journal.release_lease(record.run_id, holder["token"])
