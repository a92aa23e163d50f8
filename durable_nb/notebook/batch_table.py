"""What the batch panel draws of its items as HTML, from their :class:`ItemResult` alone: the
status colours and orders, the progress bar with its legend, and the items table a page at a
time. Pure functions of the items (no widget, no lock), for the live panel and its saved view.

A row of the live table is clicked in the page: its ``onclick`` writes the item's key into
the panel's *item* field (``.dnb-pick input``), which sends it to the kernel as typing would.
"""

from __future__ import annotations

import html
import json
from collections import Counter
from typing import Any

from ..batches.batch import ItemResult
from ..journal import Status
from ..summary import format_cost
from .step_view import STATUS_COLOURS, badge

__all__ = ["BAR_ORDER", "BATCH_CSS", "ITEM_COLOURS", "PAGE_ROWS", "PENDING", "STATUS_ORDER",
           "TABLE_HEAD", "item_row", "items_table", "pages_of", "preview", "progress_bar",
           "waiting_words"]

PENDING = "PENDING"  # an item that never started
ITEM_COLOURS = {**{s.value: c for s, c in STATUS_COLOURS.items()}, PENDING: "#afb8c1"}
#: Order of the "status" sort and of the saved view's rows (what needs a look first).
STATUS_ORDER = ["FAILED", "WAITING_APPROVAL", "RUNNING", "CANCELLED", PENDING, "DONE"]
#: Order of the progress bar's segments and of its legend.
BAR_ORDER = ["DONE", "FAILED", "CANCELLED", "WAITING_APPROVAL", "RUNNING", PENDING]
PAGE_ROWS = 20

BATCH_CSS = """<style>
.dnb-batch .dnb-summary, .dnb-batch table.dnb-items, .dnb-batch .dnb-approval-row {
  line-height: 1.45}
.dnb-batch table.dnb-items td > span {font-size: 0.9em}
.dnb-batch .dnb-bar {display: flex; height: 14px; border-radius: 4px; overflow: hidden;
  background: #eaeef2; margin: 4px 0 2px 0; max-width: 900px}
.dnb-batch .dnb-bar > span {display: block; height: 100%}
.dnb-batch .dnb-legend span.dnb-dot {display: inline-block; width: 9px; height: 9px;
  border-radius: 2px; margin: 0 3px 0 0}
.dnb-batch table.dnb-items {border-collapse: collapse; font-size: 0.85em; width: 100%;
  max-width: 1200px; table-layout: fixed}
.dnb-batch table.dnb-items th {text-align: left; border-bottom: 1px solid #d0d7de;
  padding: 2px 6px; font-weight: bold}
.dnb-batch table.dnb-items td {padding: 2px 6px; white-space: nowrap; overflow: hidden;
  text-overflow: ellipsis; border-bottom: 1px solid rgba(127, 127, 127, 0.15)}
.dnb-batch table.dnb-items td.dnb-num {text-align: right}
.dnb-batch table.dnb-items tr.dnb-row {cursor: pointer}
.dnb-batch table.dnb-items tr.dnb-row:hover {background: rgba(127, 127, 127, 0.12)}
.dnb-batch table.dnb-items tr.dnb-picked {background: rgba(31, 111, 235, 0.12)}
.dnb-batch .dnb-muted {color: #6e7781}
.dnb-batch .dnb-approval-row {border-bottom: 1px solid rgba(127, 127, 127, 0.2)}
.dnb-batch.dnb-busy table.dnb-items tr.dnb-row {cursor: default}
.dnb-batch.dnb-busy table.dnb-items tr.dnb-row:hover {background: none}
</style>"""

TABLE_HEAD = ("<colgroup><col style='width:3.5em'><col style='width:14em'>"
              "<col style='width:12em'><col style='width:4em'><col style='width:6.5em'>"
              "<col style='width:6em'><col><col></colgroup><tr><th>#</th><th>key</th>"
              "<th>status</th><th>iter</th><th>tokens</th><th>cost</th><th>result</th>"
              "<th>error</th></tr>")

# Not while the field is disabled (the cell runs: see BatchPanel.executing_in_cell).
_ONCLICK = ("var f=this.closest('.dnb-batch').querySelector('.dnb-pick input');"
            "if(f.disabled)return;"
            "f.value=this.dataset.key;f.dispatchEvent(new Event('change',{bubbles:true}))")


def preview(value: Any, limit: int = 80) -> str:
    """``value`` on one line of at most ``limit`` characters (JSON for data, ``…`` where
    cut); empty for None."""
    if value is None:
        return ""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"


def progress_bar(counts: Counter, total: int) -> str:
    """The bar of the items by status (``counts`` of :attr:`ItemResult.state`) and its
    legend, as two ``div``."""
    segments = "".join(
        f"<span style='width:{100 * counts[s] / total:.3f}%;background:{ITEM_COLOURS[s]}' "
        f"title='{counts[s]:,} {s}'></span>" for s in BAR_ORDER if total and counts[s])
    legend = [f"<b>{counts['DONE']:,} / {total:,}</b> done"]
    legend += [f"<span class='dnb-dot' style='background:{ITEM_COLOURS[s]}'></span>"
               f"{counts[s]:,} {s.lower().replace('_', ' ')}"
               for s in BAR_ORDER[1:] if counts[s]]
    return (f"<div class='dnb-bar'>{segments}</div>"
            f"<div class='dnb-legend'>{' &nbsp;&middot;&nbsp; '.join(legend)}</div>")


def waiting_words(approvals: int, questions: int) -> str:
    """What the parked items wait for, in words: an MCP server's question waits for its
    answer (its form), never for an approval ("2 items waiting for approval and 1 question
    waiting for its answer")."""
    parts = [f"{approvals:,} item{'s' if approvals != 1 else ''} waiting for approval"
             if approvals else "",
             f"{questions:,} question{'s' if questions != 1 else ''} waiting for "
             f"{'its' if questions == 1 else 'their'} answer" if questions else ""]
    return " and ".join(p for p in parts if p) or "nothing waiting"


def pages_of(view: list[ItemResult]) -> int:
    """How many pages of :data:`PAGE_ROWS` the table of ``view`` has (one when empty)."""
    return max(1, -(-len(view) // PAGE_ROWS))


def item_row(item: ItemResult, *, picked: bool = False, live: bool = True) -> str:
    """A row of the table; ``picked``: the item whose run is open below; ``live``: a click
    opens the item (the saved view has no kernel to open it)."""
    state = item.state
    shown = badge(state.lower().replace("_", " "), ITEM_COLOURS[state])
    result = preview(item.result) if item.status is Status.DONE else ""
    full_result = preview(item.result, 500) if result else ""
    error = item.error or ""
    cost = format_cost(item.cost) if item.cost else "-"
    click = (f"class='dnb-row{' dnb-picked' if picked else ''}' "
             f"data-key='{html.escape(item.key)}' onclick=\"{_ONCLICK}\"" if live else "")
    return (f"<tr {click}><td class='dnb-num'>{item.index}</td>"
            f"<td title='{html.escape(item.run_id)}'>{html.escape(item.key)}</td>"
            f"<td>{shown}</td><td class='dnb-num'>{item.iterations}</td>"
            f"<td class='dnb-num'>{item.tokens:,}</td><td class='dnb-num'>{cost}</td>"
            f"<td title='{html.escape(full_result)}'>{html.escape(result)}</td>"
            f"<td style='color:#cf222e' title='{html.escape(preview(error, 500))}'>"
            f"{html.escape(preview(error, 120))}</td></tr>")


def items_table(items: list[ItemResult], view: list[ItemResult], page: int,
                picked: int | None) -> str:
    """Page ``page`` (from 0) of ``view`` (the ``items`` filtered and sorted) as the live
    table, with where it stands among them; ``picked``: the index of the item open."""
    start = page * PAGE_ROWS
    shown = view[start:start + PAGE_ROWS]
    if not items:
        return "<div class='dnb-muted'>no items</div>"
    if not view:
        return "<div class='dnb-muted'>no item matches the filter</div>"
    rows = [item_row(item, picked=picked == item.index) for item in shown]
    pages = pages_of(view)
    where = (f"rows {start + 1:,}&ndash;{start + len(shown):,} of {len(view):,}"
             + (f" (filtered from {len(items):,})" if len(view) != len(items) else "")
             + (f" &middot; page {page + 1} of {pages}" if pages > 1 else "")
             + " &middot; click a row to see its run")
    return (f"<table class='dnb-items'>{TABLE_HEAD}{''.join(rows)}</table>"
            f"<div class='dnb-muted'>{where}</div>")
