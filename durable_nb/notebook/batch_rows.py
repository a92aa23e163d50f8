"""A row of the batch panel's pending requests: an item's approval with Approve / Reject,
or an MCP server's question with Answer / Decline.

A question is never offered a plain Approve: with no form, Approve amounts to accept with
no content, or to cancel when its schema wants a field
(:func:`~durable_nb.approvals.question.plain_answer`), so the server would be told
"cancelled" by a click that said "Approve". Its Answer opens the item's run panel, whose
form answers it; the row also says where else it is answered (``%durable inbox``,
``durable-nb answer RUN``).
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable

import ipywidgets as w

from ..approvals.question import is_question
from ..batches.batch import ItemResult
from .batch_table import preview

__all__ = ["approval_row"]


def approval_row(item: ItemResult, pending: dict, *, in_cell: bool,
                 decide: Callable[[bool], None], answer: Callable[[], None],
                 safely: Callable[..., None]) -> w.HBox:
    """The row of ``item``'s ``pending`` request. Approve / Reject call ``decide(True /
    False)``, a question's Answer calls ``answer()`` and its Decline ``decide(False)``,
    each through ``safely(action, *args)`` (which shows what it raised); the buttons stay
    off while ``decide`` runs, for good once it returned, on again if it raised. With
    ``in_cell`` (a click cannot reach the busy kernel) no buttons, but how to decide it
    from a terminal instead."""
    question = is_question(pending)
    details = json.dumps(pending.get("details"), ensure_ascii=False, default=str)
    needs = (f"<div class='dnb-muted'>a question: needs its answer, in its form (Answer), "
             f"<code>%durable inbox</code> or <code>durable-nb answer "
             f"{html.escape(item.run_id)}</code></div>" if question else "")
    text = w.HTML(f"<b>{html.escape(item.key)}</b> &middot; "
                  f"{html.escape(str(pending.get('name', 'approval')))} "
                  f"<code>{html.escape(preview(details, 200))}</code>{needs}",
                  layout=w.Layout(width="560px"))
    if in_cell:
        how = w.HTML(f"<span class='dnb-muted'>buttons when the cell ends, or now: <code>"
                     f"durable-nb {'answer' if question else 'approve'} "
                     f"{html.escape(item.run_id)}</code></span>")
        row = w.HBox([text, how])
        row.add_class("dnb-approval-row")
        return row
    approve = w.Button(description="Answer" if question else "Approve",
                       button_style="info" if question else "success",
                       icon="edit" if question else "check", layout=w.Layout(width="auto"))
    reject = w.Button(description="Decline" if question else "Reject", button_style="danger",
                      icon="times", layout=w.Layout(width="auto"))
    for button in (approve, reject):
        button.add_class("dnb-button")

    def decided(approved: bool) -> None:
        approve.disabled = reject.disabled = True
        try:
            decide(approved)
        except Exception:
            approve.disabled = reject.disabled = False
            raise

    approve.on_click(lambda _: safely(answer) if question else safely(decided, True))
    reject.on_click(lambda _: safely(decided, False))
    row = w.HBox([text, approve, reject])
    row.add_class("dnb-approval-row")
    return row
