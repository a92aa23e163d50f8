"""A request's identity: what an approval shows, and the decision left for it.

A pending approval (``RunRecord.pending_approval``) carries the ``digest`` of its name and
details, and an ``id`` of its own: every time a request is shown anew (a first claim, a
request at the same step that asks something else after the cell was edited, a re-run after a
reset) it gets a new id. A decision is left in the journal under that id (request kind
``decision.ID``) and carries the digest of the request the person saw; the waiting approval
takes only a decision under its own id with its own digest. So:

- a decision is never applied to a request nobody saw: when the request at a step changes,
  the step waits for a new decision, and the old one stays in the journal, not applied;
- concurrent approvals never take, overwrite or delete each other's decisions: each is under
  its own id, and an executor deletes only the decision it took.

Decisions written by durable_nb versions before digests (request kind ``decision``, no
digest) are taken only by the pending approval they were given for, still showing the same
name and details (kept, without an id, when the run resumes).

The executor takes a decision with :func:`take_decision`, an atomic compare-and-set that
stamps it ``taken_at`` and leaves it in the journal: from then on it can never change.
Deciding is :func:`durable_nb.approvals.decide.decide`'s.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Sequence
from typing import Any

from ..journal import Journal, StepEntry
from .policy import escalation_key

__all__ = ["LEGACY_KIND", "applies", "decision_kind", "editable", "escalation_fields",
           "find_decision", "find_decisions", "pending_digest", "request_digest", "request_words",
           "short", "take_decision", "taken_decision", "with_escalation"]

#: The request kind of decisions given before approvals had ids.
LEGACY_KIND = "decision"


def request_digest(name: str, details: Any) -> str:
    """The digest of an approval's name and details (JSON data) as shown to a person."""
    text = json.dumps({"name": name, "details": details}, sort_keys=True,
                      separators=(",", ":"), ensure_ascii=False, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def short(digest: str | None) -> str:
    """The first 12 characters of a digest, as the panel and the CLI show it."""
    return (digest or "")[:12]


def request_words(pending: dict) -> str:
    """How a request is named to a person: ``request id 637b2f55...`` (what ``--request``
    takes) and ``details digest 9f7996211197`` (the digest of its name and details, what
    ``--expect`` takes); a request written before ids has only the digest."""
    digest = f"details digest {short(pending_digest(pending))}"
    return f"request id {pending['id']}, {digest}" if pending.get("id") else digest


def pending_digest(pending: dict) -> str:
    """The digest of what a pending approval shows (computed for one written before
    digests)."""
    return pending.get("digest") or request_digest(pending.get("name", ""),
                                                   pending.get("details"))


def editable(pending: dict | None) -> bool:
    """Whether a decision on ``pending`` may edit its arguments: a tool call's request, with
    the JSON schema of ``details["arguments"]`` (``schema``)."""
    pending = pending or {}
    details = pending.get("details")
    return isinstance(pending.get("schema"), dict) and isinstance(details, dict) \
        and isinstance(details.get("arguments"), dict)


def decision_kind(pending: dict) -> str:
    """The journal request kind under which decisions on ``pending`` are left."""
    return f"decision.{pending['id']}" if pending.get("id") else LEGACY_KIND


def applies(decision: dict, pending: dict) -> bool:
    """Whether ``decision`` decides ``pending``: given for its step and for what it shows.
    A decision without a digest (an older durable_nb) decides only a pending approval
    without an id, at its step."""
    if decision.get("key") != pending.get("key"):
        return False
    if "digest" not in decision:
        return not pending.get("id")
    return decision["digest"] == pending_digest(pending)


def find_decision(journal: Journal, run_id: str, pending: dict) -> dict | None:
    """The decision left for ``pending`` of run ``run_id`` (the run that asked), or None."""
    decision = journal.get_request(decision_kind(pending), run_id)
    return decision if decision is not None and applies(decision, pending) else None


def find_decisions(journal: Journal, asks: Sequence[tuple[str, dict]]) -> list[dict | None]:
    """:func:`find_decision` for each ``(run_id, pending)`` of ``asks``, in their order, the
    requests read at once (:meth:`~durable_nb.journal.Journal.requests_of`)."""
    found = journal.requests_of((decision_kind(pending), run_id) for run_id, pending in asks)
    decisions = []
    for run_id, pending in asks:
        decision = found.get((decision_kind(pending), run_id))
        decisions.append(decision if decision is not None and applies(decision, pending)
                         else None)
    return decisions


def take_decision(journal: Journal, run_id: str, pending: dict, decision: dict) -> dict:
    """The executor of run ``run_id`` takes ``decision`` on ``pending``: stamped ``taken_at``
    in the journal, atomically, so that nothing replaces it from then on. Returns the
    decision taken: a replacement written since ``decision`` was read, if there is one. A
    decision taken already (by an executor that died before journaling the approval) is
    taken as it is."""
    kind = decision_kind(pending)
    while decision.get("taken_at") is None:
        taken = dict(decision, taken_at=time.time())
        if journal.swap_request(kind, run_id, decision, taken):
            return taken
        current = find_decision(journal, run_id, pending)
        if current is None:
            return decision  # removed by hand: the one read stands
        decision = current
    return decision


def taken_decision(steps: Iterable[StepEntry], digest: str | None = None) -> StepEntry | None:
    """The journaled approval step (a decision its run took) for the request whose digest
    starts with ``digest``, or the last approval step without ``digest``; None if none."""
    found = None
    for entry in steps:
        if entry.kind != "approval" or not entry.ok or not isinstance(entry.result, dict):
            continue
        if digest is None or str(entry.result.get("digest") or "").startswith(digest.lower()):
            found = entry
    return found


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
    return dict(pending, escalation=escalation_fields(found)) if found else pending


def escalation_fields(record: dict) -> dict:
    """The ``escalation`` of a pending approval, from its claim record."""
    return {"at": record["at"], "approvers": list(record["approvers"]),
            "timeout_at": record["timeout_at"]}
