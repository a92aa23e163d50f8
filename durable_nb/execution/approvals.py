"""Approvals bound to what was shown.

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
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..journal import Journal

__all__ = ["LEGACY_KIND", "applies", "decision_kind", "find_decision", "pending_digest",
           "request_digest", "short"]

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


def pending_digest(pending: dict) -> str:
    """The digest of what a pending approval shows (computed for one written before
    digests)."""
    return pending.get("digest") or request_digest(pending.get("name", ""),
                                                   pending.get("details"))


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
