"""Deciding a request: :func:`decide`, the one way in.

Every path that decides calls :func:`decide`: the panel and the saved view, the Jupyter
server's inbox (REST), a decision link's page, ``durable-nb approve/reject``,
``durable_nb.approve/reject``, a batch's Approve all, and a deadline (:mod:`.tick`, with
``by="timeout"``). Every check is here, in this order, and a refused decision writes no
decision:

1. **The request is live**: the run waits for an approval now (status ``WAITING_APPROVAL``).
   A fork ``RUN@N`` kept CANCELLED, a finished or a running run asks nobody:
   :class:`~durable_nb.errors.NoPendingApproval`.
2. **It is the request the person saw**: the caller passes the request's ``id`` and
   ``digest`` as it showed them; if the run waits for another request now (it took the one
   seen and asks an identical one again, or its cell was edited),
   :class:`~durable_nb.errors.ApprovalChanged` (or
   :class:`~durable_nb.errors.DecisionExists` when the one seen was decided and taken).
   A decision for request #1 never approves an identical #2.
3. **Not past its deadline** (unless it is the deadline deciding): the policy decides then
   (:func:`durable_nb.approvals.tick.tick`); :class:`~durable_nb.errors.NoPendingApproval`.
4. **Who writes it**: on a JupyterHub whose journal names a decider role, a process that
   is not the hub's service hands the decision to the service
   (:func:`~durable_nb.approvals.authority.decided_elsewhere`), which decides as the hub
   user its token names, through this function; where the service cannot be asked,
   :class:`~durable_nb.errors.RefusedByHub`, the refusal in the run's history.
5. **The person may decide it** (:func:`~durable_nb.approvals.policy.refusal`: its
   approvers' list, four-eyes). A decider the path did not identify (``signed_in=False``: a
   link sent to a Slack channel or a webhook, which anyone who sees the message can click)
   decides only a request that allows anyone: where an approvers' list or four-eyes applies
   they must sign in. :class:`~durable_nb.errors.NotAllowedToDecide`, the refusal in the
   run's history.
6. **Written once**: the journal's atomic :meth:`~durable_nb.journal.Journal.add_request`,
   so of deciders racing exactly one wins and every other is refused with
   :class:`~durable_nb.errors.DecisionExists`. ``replace=True`` changes a decision the run
   has not taken yet (compare-and-set), keeping the ones it replaced in ``replaced``.

A decision says more than yes or no where the request allows it (checked after 2, before 3;
bad content writes nothing: :class:`~durable_nb.errors.InvalidAnswer`, one line naming what
is wrong):

- **approve with edited arguments** (``args``): only on a request that carries the JSON
  schema of its arguments (a tool's call: its ``schema``); the edit must fit that schema.
  The decision keeps ``args``, and the tool runs with them, live and on replay.
- **reject with a message** (``message``): the text the model receives as the tool's
  answer in place of the standard one.
- **answer a question** (``answer``, ``{"action": "accept" | "decline" | "cancel",
  "content": {...}}``): only on a request that is an MCP server's question
  (:mod:`.question`); accept (with ``approved``) carries content that must fit the
  question's schema, decline and cancel (without) none. A plain decision on a question is
  written with the answer it amounts to (:func:`~.question.plain_answer`), so every
  decision on a question holds its answer, bound to the request like the rest.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from ..errors import ApprovalChanged, DecisionExists, InvalidAnswer, NoPendingApproval
from ..journal import Journal, Status
from ..schema_check import json_type, schema_defect, schema_problems
from ..timestamps import format_time
from .authority import decided_elsewhere
from .history import record_event
from .policy import allowed_approvers, deadline_of, refusal
from .question import checked_answer, is_question, plain_answer
from .request import (applies, decision_kind, find_decision, pending_digest, request_words,
                      short, taken_decision, with_escalation)
from .wording import decision_words, refusal_words

__all__ = ["MIN_DIGEST", "decide", "decided_already"]

#: The fewest characters of a digest that name a request (``--expect``).
MIN_DIGEST = 8


def decide(journal: Journal, run_id: str, *, request_id: str | None, digest: str,
           approved: bool, by: str, via: str, note: str | None = None,
           replace: bool = False, signed_in: bool = True,
           refusals_once: str | None = None,
           vetted: Callable[[dict], dict] | None = None, args: dict | None = None,
           message: str | None = None, answer: dict | None = None) -> dict:
    """Decide the request run ``run_id`` waits for, if it is the one ``request_id`` and
    ``digest`` (the whole digest, or its first :data:`MIN_DIGEST` or more characters) name:
    the decision written, as the journal holds it. The checks and errors are the module's.

    ``by`` is who decides, ``via`` how (``panel``, ``Jupyter server``, ``link``,
    ``durable-nb``, ``Python``, ``timeout``); ``signed_in`` False for a decider the path did
    not identify (a shared link). ``refusals_once`` (a caller nobody signed in: a link's key)
    records each kind of refusal in the history once for that key, so that anonymous
    requests cannot grow the journal without bound. ``vetted`` (the hub's service,
    :mod:`durable_nb.hub.decide`) is given the pending request once it is known to be the
    one seen, and returns it with the policy facts the caller trusts over the run's own
    record (who started the run, four-eyes); checks 3 to 6 use what it returns. ``args``
    (with ``approved``): the edited arguments the tool runs with; ``message`` (without):
    what the model is told; ``answer``: the answer to a server's question (accept with
    ``approved``, decline or cancel without)."""
    if not isinstance(digest, str) or len(digest) < MIN_DIGEST:
        raise ValueError(f"digest={digest!r} is too short to name a request: give "
                         f"{MIN_DIGEST} or more characters of its digest (`durable-nb show "
                         f"{run_id}` prints it).")
    record = journal.get_run(run_id)
    pending = record.pending_approval
    live = record.status is Status.WAITING_APPROVAL and pending is not None
    matches = live and _names(pending, request_id, digest)
    if not matches:
        # The request seen is not the one pending (or none is): was it decided and taken?
        taken = taken_decision(journal.steps(run_id), digest)
        if taken is not None:
            raise decided_already(run_id, taken.name, taken.result, taken=True)
    if not live:
        fork = (f": it is a fork of {record.forked_from.get('run_id')!r}, a record of the past "
                f"that asks nobody" if getattr(record, "forked_from", None) else "")
        raise NoPendingApproval(
            f"run {run_id!r} is not waiting for an approval (status {record.status}){fork}. "
            f"Nothing was decided. See `durable-nb show {run_id}`.")
    assert pending is not None
    if not matches:
        raise ApprovalChanged(
            f"run {run_id!r} now waits for approval of {pending.get('name')!r} "
            f"{_details_text(pending.get('details'))} ({request_words(pending)}), not for "
            f"the request that was seen (request id {request_id or '-'}, details digest "
            f"{short(digest)}): nothing was decided. Look at it with `durable-nb show "
            f"{run_id}` and decide again.")
    content = _content(run_id, pending, approved=approved, args=args, message=message,
                       answer=answer)
    target = pending.get("run_id", run_id)
    now = time.time()
    pending = with_escalation(journal, target, pending, now)
    if vetted is not None:
        pending = vetted(pending)
    deadline = deadline_of(pending)
    if via == "timeout" and (deadline is None or approved and (
            pending.get("on_timeout") != "approve" or pending.get("escalation"))):
        # A deadline decides as the asking run's own record says (not a parent's copy).
        raise NoPendingApproval(f"run {run_id!r}: {pending.get('name')!r} has no deadline "
                                f"whose policy {'approves' if approved else 'decides'} it. "
                                f"Nothing was decided.")
    if via != "timeout" and deadline is not None and now >= deadline \
            and find_decision(journal, target, pending) is None:  # (else: decided already)
        raise NoPendingApproval(
            f"run {run_id!r}: {pending.get('name')!r} passed its deadline "
            f"{format_time(deadline, '?')}, so its policy decides it "
            f"(on_timeout={pending.get('on_timeout') or 'reject'!r}). Nothing was decided.")
    return _leave(journal, target, pending, approved=approved, note=note, by=by, via=via,
                  replace=replace, signed_in=signed_in, refusals_once=refusals_once,
                  content=content)


def _content(run_id: str, pending: dict, *, approved: bool, args: dict | None,
             message: str | None, answer: dict | None) -> dict:
    """The decision's content beyond yes or no (``args``, ``message``, ``answer``),
    checked against ``pending``: :class:`~durable_nb.errors.InvalidAnswer` naming what is
    wrong."""
    name = pending.get("name")
    content: dict = {}
    if answer is not None:
        content["answer"] = checked_answer(run_id, pending, answer, approved)
    elif is_question(pending):
        content["answer"] = plain_answer(approved, pending["details"].get("schema") or {})
    if args is not None:
        if not approved:
            raise InvalidAnswer(f"run {run_id!r}: edited arguments go with an approval, not a "
                                f"rejection (reject with a message instead). Nothing was "
                                f"decided.")
        schema = pending.get("schema")
        if not isinstance(schema, dict):
            raise InvalidAnswer(f"run {run_id!r}: {name!r} has no arguments to edit (only a "
                                f"tool call's approval has). Nothing was decided.")
        if not isinstance(args, dict):
            raise InvalidAnswer(f"run {run_id!r}: the edited arguments for {name!r} must be a "
                                f"JSON object, got {json_type(args)}. Nothing was decided.")
        defect = schema_defect(schema)
        if defect:
            raise InvalidAnswer(f"run {run_id!r}: the schema of {name!r}'s arguments cannot "
                                f"check an edit: {defect}. Approve without editing, or reject. "
                                f"Nothing was decided.")
        problems = schema_problems(args, schema)
        if problems:
            raise InvalidAnswer(f"run {run_id!r}: the edited arguments for {name!r} do not fit "
                                f"its schema: {'; '.join(problems)}. Nothing was decided.")
        content["args"] = args
    if message is not None:
        if approved:
            raise InvalidAnswer(f"run {run_id!r}: a message for the model goes with a "
                                f"rejection; an approval runs the call (edit its arguments "
                                f"instead). Nothing was decided.")
        if not isinstance(message, str) or not message.strip():
            raise InvalidAnswer(f"run {run_id!r}: the message for the model must be "
                                f"non-empty text. Nothing was decided.")
        content["message"] = message
    return content


def _details_text(details: object) -> str:
    text = json.dumps(details, ensure_ascii=False, default=str)
    return text if len(text) <= 200 else text[:199] + "\u2026"


def _names(pending: dict, request_id: str | None, digest: str) -> bool:
    """Whether ``request_id`` and ``digest`` name ``pending`` (a request written before ids
    has none: the digest alone names it)."""
    if (pending.get("id") or None) != (request_id or None):
        return False
    return pending_digest(pending).startswith(digest.lower())


def _leave(journal: Journal, target: str, pending: dict, *, approved: bool, note: str | None,
           by: str, via: str, replace: bool, signed_in: bool,
           refusals_once: str | None, content: dict) -> dict:
    kind = decision_kind(pending)
    decision = {"key": pending.get("key"), "digest": pending_digest(pending),
                "name": pending.get("name"), "approved": approved, "note": note, "by": by,
                "via": via, "at": time.time(), **content}
    elsewhere = decided_elsewhere(journal, target, pending, decision, replace=replace,
                                  signed_in=signed_in)
    if elsewhere is not None:  # on a hub: the service decided, as the hub user
        return elsewhere
    refused = refusal(target, pending, by, via, signed_in=signed_in)
    if refused is not None:
        _refused(journal, target, pending, refused.reason, refusals_once,
                 refusal_words(decision, refused.brief),
                 by=by, via=via, approvers=allowed_approvers(pending))
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
                _refused(journal, target, pending, "decided already", refusals_once,
                         refusal_words(decision, f"the request was already "
                                                 f"{decision_words(earlier, timed=True)}"),
                         by=by, via=via, approved=approved, args=decision.get("args"),
                         message=decision.get("message"))
            raise decided_already(target, str(pending.get("name")), earlier,
                                  taken=earlier.get("taken_at") is not None)
        replacing = dict(decision, replaced=[
            *earlier.get("replaced", ()),
            {k: v for k, v in earlier.items() if k in _KEPT_OF_REPLACED}])
        if journal.swap_request(kind, target, earlier, replacing):
            return _recorded(journal, target, pending, replacing)
        # Taken or replaced meanwhile: look at it again.


def _refused(journal: Journal, run_id: str, pending: dict, reason: str,
             once: str | None, text: str, **fields: object) -> None:
    """The refusal in the run's history; with ``once``, only the first time for that key and
    reason (an add-once claim in the run's deliveries store)."""
    if once is not None and not journal.add_delivery(
            run_id, f"{once}/refused/{reason}", {"kind": "refusal", "at": time.time()}):
        return
    record_event(journal, run_id, "refused", text, pending=pending, **fields)


def decided_already(run_id: str, name: str, decision: dict, *, taken: bool
                    ) -> DecisionExists:
    """The refusal of a decision on a request that ``decision`` decided already."""
    return DecisionExists(run_id, name, decision, taken=taken, words=decision_words(decision),
                          timed=decision_words(decision, timed=True))


def _recorded(journal: Journal, run_id: str, pending: dict, decision: dict) -> dict:
    """``decision``, written, after adding it to the run's history."""
    record_event(journal, run_id, "decided", decision_words(decision), pending=pending,
                 by=decision.get("by"), via=decision.get("via"),
                 approved=bool(decision.get("approved")), note=decision.get("note"),
                 args=decision.get("args"), message=decision.get("message"),
                 answer=decision.get("answer"))
    return decision


#: What a replaced decision keeps in ``replaced``.
_KEPT_OF_REPLACED = ("approved", "note", "by", "via", "at", "args", "message", "answer")

