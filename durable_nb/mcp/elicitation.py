"""A question an MCP server asks during a tool call (elicitation), asked as a run's request.

The server sends a message and a JSON schema of the answer it wants. The run asks it as an
approval request whose details say ``"kind": "elicitation"`` and keep the message, the schema,
the server and the tool (:mod:`durable_nb.approvals.question`): it waits (or parks) like any
approval, shown as a form wherever approvals are (the panel, ``%durable inbox``, the
decision page, ``durable-nb show``, notifications), and is answered there, with
:func:`answer` (Python), ``durable-nb answer RUN accept --content JSON`` or the Jupyter
server's REST API: accept with content that fits the schema, decline, or cancel. The answer
is the decision's ``answer``, checked and written by the one
:func:`~durable_nb.approvals.decide.decide`, journaled as a step inside the tool call's
step: when the call is made again (the run crashed or parked during it), the server's
question gets the journaled answer, nobody is asked again.

A plain Approve (``durable_nb.approve``, a button without the form) is accept with no
content when the schema requires nothing, else cancel; a plain Reject is decline.
"""

from __future__ import annotations

from typing import Any

from ..approvals.decision import Decision
from ..approvals.question import ACTIONS, QUESTION_KIND, answer_of, is_question
from ..errors import InvalidAnswer, NoPendingApproval
from ..execution import Execution
from ..journal import JournalSpec, open_journal
from ..registry import approve, reject

__all__ = ["ACTIONS", "ELICITATION_KIND", "answer", "ask", "is_elicitation"]

#: The ``kind`` in the details of an approval request that is a server's question.
ELICITATION_KIND = QUESTION_KIND


def ask(execution: Execution, server: Any, tool: str, message: str, schema: dict
        ) -> tuple[str, dict | None]:
    """Ask the run's people ``message`` (a journaled approval step in the flow that called
    ``tool``); ``(action, content)`` to send back to the server."""
    details = {"kind": ELICITATION_KIND, "server": server.name, "tool": tool,
               "message": message, "schema": schema}
    return answer_of(execution.approval(f"{tool} asks", details), schema)


def is_elicitation(pending: dict | None) -> bool:
    """Whether a pending approval request is an MCP server's question."""
    return is_question(pending)


def answer(run_id: str, action: str, content: dict | None = None, *, by: str | None = None,
           expect: str | None = None, via: str = "Python", journal: JournalSpec = None,
           request_id: str | None = None) -> Decision:
    """Answer the question run ``run_id`` waits on: ``action`` ``"accept"`` with ``content``
    (checked against the question's JSON schema: :class:`~durable_nb.errors.InvalidAnswer`,
    nothing written, when it does not fit), ``"decline"`` or ``"cancel"``. Written once,
    by whom the request allows (an answer is a decision: approvers' lists and four-eyes
    apply), bound to the request as read here, or to the one ``request_id`` and ``expect``
    (its digest, or 8 or more characters of it) name: what the person saw."""
    if action not in ACTIONS:
        raise InvalidAnswer(f"the action must be one of {', '.join(ACTIONS)}, not {action!r}")
    opened = open_journal(journal)
    pending = opened.get_run(run_id).pending_approval
    if pending is not None and not is_question(pending) and request_id is None \
            and expect is None:
        raise NoPendingApproval(
            f"run {run_id!r} is not waiting for an answer to an MCP server's question (it "
            f"waits for approval of {pending.get('name')!r}: use durable_nb.approve).")
    given: dict[str, Any] = {"action": action}
    if content is not None:
        given["content"] = content
    decide = approve if action == "accept" else reject
    return decide(run_id, None, by=by, expect=expect, request_id=request_id, via=via,
                  answer=given, journal=opened)
