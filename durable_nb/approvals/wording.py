"""The one wording of a decision: the CLI, the panel, the decision page, the Slack message,
the export, a refusal and the history all say a decision with :func:`decision_words`."""

from __future__ import annotations

import json

from ..timestamps import format_time

__all__ = ["content_words", "decision_words", "refusal_words", "verdict", "verdict_words"]

#: The most characters of edited arguments or of a message a decision's words quote.
CONTENT_SHOWN = 300


def decision_words(decision: dict, *, timed: bool = False, note: int = 0) -> str:
    """``approved by ana via panel``, and what it replaced: ``(replacing rejected by bo via
    durable-nb)``; with ``timed``, each followed by when (``at 2026-12-03 10:02:11``); with
    ``note``, the decision's note on one line, cut to ``note`` characters (``('ship it')``).
    The one wording of a decision: the CLI, the panel, a refusal and the history use it."""
    words = verdict_words(decision, timed)
    if note and decision.get("note"):
        text = " ".join(str(decision["note"]).split())
        text = text if len(text) <= note else text[:note - 1] + "\u2026"
        words += f" ({text!r})"
    replaced = decision.get("replaced") or ()
    if replaced:
        words += " (replacing " + ", then ".join(verdict_words(r, timed)
                                                 for r in replaced) + ")"
    return words


def verdict_words(decision: dict, timed: bool = False) -> str:
    """``approved by ana via panel`` (with ``timed``: ``... at 2026-12-03 10:02:11``): one
    decision without its note or what it replaced (its :func:`verdict`, then who, how and
    when)."""
    how = f" via {decision['via']}" if decision.get("via") else ""
    when = f" at {format_time(decision.get('at'), '?')}" if timed else ""
    return f"{verdict(decision)} by {decision.get('by') or 'someone'}{how}{when}"


def verdict(decision: dict) -> str:
    """What was decided, without who: ``approved``, ``rejected``; where it says more than
    yes or no, what it says: ``approved with edited arguments {"table": "staging.users"}``,
    ``rejected with the message "use staging"`` (each cut to :data:`CONTENT_SHOWN`
    characters); ``answered accept`` for the answer to a server's question."""
    answer = decision.get("answer")
    if isinstance(answer, dict) and answer.get("action"):
        return f"answered {answer['action']}"
    said = "approved" if decision.get("approved") else "rejected"
    content = content_words(decision)
    return f"{said} {content}" if content else said


def content_words(decision: dict) -> str:
    """What a decision says beyond yes or no, quoted: ``with edited arguments {...}`` (as
    JSON), ``with the message "..."``; empty for a plain one."""
    if decision.get("args") is not None:
        return f"with edited arguments {_quoted(decision['args'])}"
    if decision.get("message"):
        return f"with the message {_quoted(str(decision['message']))}"
    return ""


def refusal_words(attempt: dict, why: str) -> str:
    """One sentence for a decision refused: ``a decision by bo via durable-nb to approve
    with edited arguments {...} was refused: the request was already approved by ana via
    panel``. ``attempt`` is the decision refused (``approved``, ``by``, ``via``, ``args``,
    ``message``), ``why`` the reason, a clause without a full stop."""
    how = f" via {attempt['via']}" if attempt.get("via") else ""
    verb = "approve" if attempt.get("approved") else "reject"
    answer = attempt.get("answer")
    if isinstance(answer, dict) and answer.get("action"):
        verb = f"answer {answer['action']}"
    content = content_words(attempt)
    to = f" to {verb}" + (f" {content}" if content else "")
    return f"a decision by {attempt.get('by') or 'someone'}{how}{to} was refused: {why}"


def _quoted(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= CONTENT_SHOWN else text[:CONTENT_SHOWN - 1] + "\u2026"
