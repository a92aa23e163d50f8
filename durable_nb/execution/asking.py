"""How an execution asks a person: the approval step's pending request (kept from an
earlier execution if it shows the same, else a new one), made the run's (and its
ancestors') pending request one at a time, and the wait for the decision given for it or
the one its deadline takes. The cursor (:meth:`~durable_nb.execution.cursor.Execution.approval`)
replays and journals the step around these; where the run parks instead of waiting, they
return None and the cursor suspends it.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

from ..approvals.policy import ApprovalPolicy, deadline_of
from ..approvals.request import applies, decision_kind, find_decision, pending_digest
from ..approvals.tick import apply_deadline
from ..approvals.wording import decision_words
from ..journal import Status
from .events import RequestWaiting, snapshot

if TYPE_CHECKING:
    from .cursor import Execution

__all__ = ["claim_pending", "pending_request", "save_ancestors", "set_pending",
           "wait_for_decision"]


def claim_pending(execution: Execution, key: str, name: str, details: Any, digest: str,
                  policy: ApprovalPolicy, approvers: list[str] | None = None,
                  schema: dict | None = None) -> dict | None:
    """Make the approval at step ``key`` the run's pending request, and return it; one
    waits at a time (a concurrent one waits for the slot, or parks: None). The pending
    request left at this step by an earlier execution is kept (its id, its deadline running
    on) only if it shows the same name and details; otherwise this is a new request, with a
    new id, that no earlier decision decides."""
    while True:
        with execution.lock:
            pending = execution.record.pending_approval
            if not pending or (pending.get("key") == key
                               and pending.get("run_id", execution.run_id) == execution.run_id):
                decided = (find_decision(execution.journal, execution.run_id, pending)
                           if pending and pending_digest(pending) != digest else None)
                pending = pending_request(pending, key, name, details, digest, policy,
                                          decided)
                # Who may decide, as the code says now (also on a request kept from an
                # earlier execution: an edited list applies to it).
                pending.update(
                    approvers=approvers if approvers is not None else execution.options.approvers,
                    four_eyes=bool(execution.options.four_eyes),
                    started_by=execution.record.started_by)
                if schema is not None:  # as the code says now, like who decides
                    pending["schema"] = schema
                if execution.notify_choice is not None:
                    pending["notify"] = execution.notify_choice
                set_pending(execution, pending)
                break
        if execution.options.on_approval == "park":
            return None
        execution.check_live()
        execution.wake_event.wait(execution.options.poll_interval)
        execution.wake_event.clear()
    execution.save_record()
    save_ancestors(execution)
    if execution.listener is not None:
        execution.listener.on_event(RequestWaiting(snapshot(execution.record)))
    return pending


def pending_request(earlier: dict | None, key: str, name: str, details: Any, digest: str,
                    policy: ApprovalPolicy, decided: dict | None = None) -> dict:
    """The request for the approval at step ``key``: ``earlier`` (the one pending at this
    step) if it shows the same, else a new one that says it replaces ``earlier`` (and that
    ``decided``, given for it, is not applied)."""
    if earlier and pending_digest(earlier) == digest:
        kept = {k: v for k, v in earlier.items() if k != "run_id"}
        return dict(kept, digest=digest)  # one written before digests gets its digest
    now = time.time()
    pending = {"key": key, "name": name, "details": details, "digest": digest,
               "id": uuid.uuid4().hex, "requested_at": now, **policy.pending_fields(now)}
    if earlier:
        # Shown with the request, so that a person knows the request at this step changed,
        # and that a decision they gave (``decided``, if one was) is not applied to it.
        pending["replaces"] = {"name": earlier.get("name"), "details": earlier.get("details"),
                               "digest": pending_digest(earlier)}
        if decided is not None:
            pending["replaces"]["decided"] = decision_words(decided)
    return pending


def set_pending(execution: Execution, pending: dict | None) -> None:
    """``pending`` is the run's pending request (None: none is), in its record and in
    those of its ancestors, through which a child's request is shown and decided too
    (their records are written by :func:`save_ancestors`)."""
    run_id = execution.run_id
    shown: Execution | None = execution
    while shown is not None:
        shown.record.pending_approval = None if pending is None else dict(pending,
                                                                          run_id=run_id)
        shown.record.status = Status.RUNNING if pending is None else Status.WAITING_APPROVAL
        shown = shown.parent


def save_ancestors(execution: Execution) -> None:
    """Write the records of ``execution``'s ancestors (a parent run, its parent ...)."""
    ancestor = execution.parent
    while ancestor is not None:
        ancestor.save_record()
        ancestor = ancestor.parent


def wait_for_decision(execution: Execution, pending: dict) -> dict | None:
    """Wait for a decision on approval ``pending`` (one given for what it shows), or
    for its deadline, whose policy decides or escalates it
    (:func:`~durable_nb.approvals.tick.apply_deadline`): the decision; None when the run
    parks instead of waiting (``on_approval="park"``).

    The journal tells of a decision or a cancel given anywhere
    (:meth:`~durable_nb.journal.Journal.wait_for_request`: PostgreSQL's NOTIFY; the disk
    journal is read every ``poll_interval``); one given in this process, an interrupt or
    a cancel the heartbeat found set ``wake_event``. A journal that notifies is read
    again at least every ``max(poll_interval, stale_after)`` seconds."""
    options = execution.options
    kind = decision_kind(pending)
    decision = find_decision(execution.journal, execution.run_id, pending)
    while True:
        if decision is not None:
            return decision
        timeout_at = deadline_of(pending)
        if timeout_at is not None and time.time() >= timeout_at:
            applied = apply_deadline(execution.journal, execution.run_id, pending)
            if applied is not None and applied[0] == "decided":
                return applied[1]
            if applied is not None:  # escalated (here or elsewhere): a new deadline
                pending = applied[1]
                kind = decision_kind(pending)
                with execution.lock:
                    set_pending(execution, pending)
                execution.save_record()
                save_ancestors(execution)
                if execution.listener is not None:  # the escalation's notifications
                    execution.listener.on_event(RequestWaiting(snapshot(execution.record)))
                continue
        if options.on_approval == "park":
            return None
        execution.check_live()
        wait = (max(options.poll_interval, options.stale_after) if execution.journal.notifies
                else options.poll_interval)
        if timeout_at is not None:
            wait = max(0.0, min(wait, timeout_at - time.time()))
        decision = execution.journal.wait_for_request(
            kind, execution.run_id, wait, accept=lambda d: applies(d, pending),
            wake=execution.wake_event, poll_interval=options.poll_interval)
        execution.wake_event.clear()
        if decision is None and execution.journal.notifies \
                and execution.journal.get_request("cancel", execution.run_id) is not None:
            execution.cancel_event.set()  # told at once, not at the heartbeat's next look
