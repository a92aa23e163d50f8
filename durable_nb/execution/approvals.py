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

**A decision is written once.** :func:`leave_decision` is the one place every path decides
through (``durable-nb approve``, ``durable_nb.approve``, a panel, the Jupyter server, a
batch's Approve all, an approval's timeout): the journal's atomic
:meth:`~durable_nb.journal.Journal.add_request`, so of processes racing to decide one
request exactly one wins, and every other is refused with
:class:`~durable_nb.errors.DecisionExists` naming who decided, how and when. The executor
takes a decision with :func:`take_decision`, an atomic compare-and-set that stamps it
``taken_at`` and leaves it in the journal: from then on it can never change. Before that,
``replace=True`` changes it on purpose (a compare-and-set too), and the new decision keeps
the ones it replaced in ``replaced``, which the approval step journals with it.

**On a hub, only the hub's service writes a decision** (:mod:`durable_nb.hub.authority`):
any other process hands it to the service, which decides as the hub user.

**Only a person the request allows decides it** (:mod:`~durable_nb.execution.approvers`:
its approvers' list, four-eyes), checked by :func:`leave_decision` too, so on every path:
anyone else is refused with :class:`~durable_nb.errors.NotAllowedToDecide`, nothing written,
the refusal kept in the run's history.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable
from typing import Any

from ..errors import DecisionExists
from ..hub.authority import decided_elsewhere
from ..journal import Journal, StepEntry
from ..timestamps import format_time
from .approvers import allowed_approvers, refusal
from .history import record_event

__all__ = ["LEGACY_KIND", "applies", "decided_already", "decision_kind", "decision_words",
           "find_decision", "leave_decision", "pending_digest", "request_digest", "short",
           "take_decision", "taken_decision"]

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


def leave_decision(journal: Journal, run_id: str, pending: dict, *, approved: bool,
                   note: str | None, by: str, via: str, replace: bool = False) -> dict:
    """Decide ``pending`` (the pending approval of run ``run_id`` as read), once: the decision
    written, as the journal holds it.

    :class:`~durable_nb.errors.NotAllowedToDecide` (nothing written, the refusal in the run's
    history) when ``by`` may not decide it (:mod:`~durable_nb.execution.approvers`: its
    approvers' list, four-eyes; a deadline, ``via="timeout"``, always may).
    :class:`~durable_nb.errors.DecisionExists` (nothing written) when the request was decided
    already: always once the run took that decision; without ``replace``, before too. With
    ``replace`` a decision the run has not taken is replaced, the new one listing it (and any
    it replaced) in ``replaced``. Racing deciders: exactly one wins, and with ``replace`` the
    replacement and the executor's take are one after the other, never both."""
    kind = decision_kind(pending)
    target = pending.get("run_id", run_id)
    decision = {"key": pending.get("key"), "digest": pending_digest(pending),
                "name": pending.get("name"), "approved": approved, "note": note, "by": by,
                "via": via, "at": time.time()}
    elsewhere = decided_elsewhere(journal, target, pending, decision, replace=replace)
    if elsewhere is not None:  # on a hub: the service decided, as the hub user
        return elsewhere
    refused = refusal(target, pending, by, via)
    if refused is not None:
        record_event(journal, target, "refused",
                     f"{_verdict_words(decision, False)} refused: {refused.brief}",
                     pending=pending, by=by, via=via, approvers=allowed_approvers(pending))
        raise refused
    while True:
        earlier = journal.add_request(kind, target, decision)
        if earlier is None:
            return _recorded(journal, target, pending, decision)
        if not applies(earlier, pending):
            # Left for another request at this step by a version without ids: not a decision
            # on this one, so it is not kept in its way.
            if journal.swap_request(kind, target, earlier, decision):
                return _recorded(journal, target, pending, decision)
            continue
        if earlier.get("taken_at") is not None or not replace:
            if via != "timeout":  # a deadline that lost to a person refused nobody
                record_event(journal, target, "refused",
                             f"{_verdict_words(decision, False)} refused: the request was "
                             f"{decision_words(earlier)} already", pending=pending, by=by,
                             via=via)
            raise decided_already(target, str(pending.get("name")), earlier,
                                  taken=earlier.get("taken_at") is not None)
        replacing = dict(decision, replaced=[
            *earlier.get("replaced", ()),
            {k: v for k, v in earlier.items() if k in _KEPT_OF_REPLACED}])
        if journal.swap_request(kind, target, earlier, replacing):
            return _recorded(journal, target, pending, replacing)
        # Taken or replaced meanwhile: look at it again.


def decided_already(run_id: str, name: str, decision: dict, *, taken: bool
                    ) -> DecisionExists:
    """The refusal of a decision on a request that ``decision`` decided already, in this
    module's words."""
    return DecisionExists(run_id, name, decision, taken=taken, words=decision_words(decision),
                          timed=decision_words(decision, timed=True))


def _recorded(journal: Journal, run_id: str, pending: dict, decision: dict) -> dict:
    """``decision``, written, after adding it to the run's history."""
    record_event(journal, run_id, "decided", decision_words(decision), pending=pending,
                 by=decision.get("by"), via=decision.get("via"),
                 approved=bool(decision.get("approved")), note=decision.get("note"))
    return decision


#: What a replaced decision keeps in ``replaced``.
_KEPT_OF_REPLACED = ("approved", "note", "by", "via", "at")


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


def decision_words(decision: dict, *, timed: bool = False, note: int = 0) -> str:
    """``approved by ana via panel``, and what it replaced: ``(replacing rejected by bo via
    durable-nb)``; with ``timed``, each followed by when (``at 2026-12-03 10:02:11``); with
    ``note``, the decision's note on one line, cut to ``note`` characters (``('ship it')``).
    The one wording of a decision: the CLI, the panel, a refusal and the history use it."""
    words = _verdict_words(decision, timed)
    if note and decision.get("note"):
        text = " ".join(str(decision["note"]).split())
        text = text if len(text) <= note else text[:note - 1] + "\u2026"
        words += f" ({text!r})"
    replaced = decision.get("replaced") or ()
    if replaced:
        words += " (replacing " + ", then ".join(_verdict_words(r, timed)
                                                 for r in replaced) + ")"
    return words


def _verdict_words(decision: dict, timed: bool) -> str:
    verdict = "approved" if decision.get("approved") else "rejected"
    how = f" via {decision['via']}" if decision.get("via") else ""
    when = f" at {format_time(decision.get('at'), '?')}" if timed else ""
    return f"{verdict} by {decision.get('by') or 'someone'}{how}{when}"
