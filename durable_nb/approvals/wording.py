"""The one wording of a decision: the CLI, the panel, the decision page, the Slack message,
the export, a refusal and the history all say a decision with :func:`decision_words`."""

from __future__ import annotations

from ..timestamps import format_time

__all__ = ["decision_words", "verdict", "verdict_words"]


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
    """What was decided, without who: ``approved``, ``rejected``, ``approved with edited
    arguments`` and ``rejected with a message`` where it says more than yes or no,
    ``answered accept`` for the answer to a server's question."""
    answer = decision.get("answer")
    if isinstance(answer, dict) and answer.get("action"):
        return f"answered {answer['action']}"
    said = "approved" if decision.get("approved") else "rejected"
    if decision.get("args") is not None:
        return said + " with edited arguments"
    if decision.get("message"):
        return said + " with a message"
    return said
