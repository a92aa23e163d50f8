"""A question an MCP server asks during a tool call (elicitation), asked as a run's request.

The server sends a message and a JSON schema of the answer it wants. The run asks it as an
approval request whose details say ``"kind": "elicitation"`` and keep the message, the schema,
the server and the tool: it waits (or parks) like any approval, shown wherever approvals are,
and is answered with :func:`answer` (Python) or ``python -m durable_nb.mcp answer`` (the
command line): accept with content that fits the schema, decline, or cancel. The answer is
the approval's decision, its note the answer as JSON (``{"action": ..., "content": ...}``),
journaled as a step inside the tool call's step: when the call is made again (the run crashed
or parked during it), the server's question gets the journaled answer, nobody is asked again.

A plain Approve (the panel's button, ``durable_nb.approve``) is accept with no content when
the schema requires nothing, else cancel; a plain Reject is decline.
"""

from __future__ import annotations

import json
from typing import Any

from ..approvals.decision import Decision
from ..errors import InvalidAnswer, NoPendingApproval
from ..execution import Execution
from ..approvals.request import pending_digest
from ..journal import JournalSpec, open_journal
from ..llm.tools import Tool
from ..registry import approve, reject

__all__ = ["ACTIONS", "ELICITATION_KIND", "answer", "answer_of", "ask", "is_elicitation"]

#: The ``kind`` in the details of an approval request that is a server's question.
ELICITATION_KIND = "elicitation"
#: The answers MCP knows.
ACTIONS = ("accept", "decline", "cancel")


def ask(execution: Execution, server: Any, tool: str, message: str, schema: dict
        ) -> tuple[str, dict | None]:
    """Ask the run's people ``message`` (a journaled approval step in the flow that called
    ``tool``); ``(action, content)`` to send back to the server."""
    details = {"kind": ELICITATION_KIND, "server": server.name, "tool": tool,
               "message": message, "schema": schema}
    return answer_of(execution.approval(f"{tool} asks", details), schema)


def answer_of(decision: dict, schema: dict) -> tuple[str, dict | None]:
    """``(action, content)`` of a decision on an elicitation request (see the module
    docstring for plain Approve and Reject)."""
    given = _parsed(decision.get("note"))
    if given is not None:
        return given["action"], given.get("content") if given["action"] == "accept" else None
    if not decision.get("approved"):
        return "decline", None
    return ("accept", {}) if not schema.get("required") else ("cancel", None)


def _parsed(note: Any) -> dict | None:
    if not isinstance(note, str) or not note.startswith("{"):
        return None
    try:
        value = json.loads(note)
    except ValueError:
        return None
    if isinstance(value, dict) and value.get("action") in ACTIONS:
        return value
    return None


def is_elicitation(pending: dict | None) -> bool:
    """Whether a pending approval request is an MCP server's question."""
    details = (pending or {}).get("details")
    return isinstance(details, dict) and details.get("kind") == ELICITATION_KIND


def answer(run_id: str, action: str, content: dict | None = None, *, by: str | None = None,
           expect: str | None = None, via: str = "Python",
           journal: JournalSpec = None) -> Decision:
    """Answer the question run ``run_id`` waits on: ``action`` ``"accept"`` with ``content``
    (checked against the question's JSON schema: :class:`~durable_nb.errors.InvalidAnswer`,
    nothing written, when it does not fit), ``"decline"`` or ``"cancel"``. Written once,
    by whom the request allows, bound to the request as read here (or to the one whose
    digest starts with ``expect``), as :func:`durable_nb.approve` is."""
    if action not in ACTIONS:
        raise InvalidAnswer(f"the action must be one of {', '.join(ACTIONS)}, not {action!r}")
    opened = open_journal(journal)
    pending = opened.get_run(run_id).pending_approval
    if not is_elicitation(pending):
        raise NoPendingApproval(
            f"run {run_id!r} is not waiting for an answer to an MCP server's question"
            + (f" (it waits for approval of {pending.get('name')!r}: use durable_nb.approve)"
               if pending else "") + ".")
    schema = pending["details"].get("schema") or {}
    if action == "accept":
        content = _checked(content or {}, schema)
    elif content is not None:
        raise InvalidAnswer(f"only accept carries content; {action} takes none")
    note = json.dumps({"action": action, "content": content}, ensure_ascii=False)
    decide = approve if action == "accept" else reject
    return decide(run_id, note, by=by, expect=expect or pending_digest(pending), via=via,
                  journal=opened)


def _checked(content: Any, schema: dict) -> dict:
    check = Tool(fn=dict, name="answer", description="", parameters=schema)
    try:
        return check.validate(content)
    except ValueError as exc:
        text = str(exc).replace("arguments for tool 'answer'", "answer")
        text = text.replace(" Call it again with corrected arguments.", "")
        raise InvalidAnswer(f"{text} (the question's schema: "
                            f"{json.dumps(schema, ensure_ascii=False)})") from None
