"""Export a batch: one JSON line per item, or a notebook report of its items."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import serde
from ..batches.batch import batch as read_batch
from ..journal import Journal, open_journal
from ..summary import format_cost, plain
from . import markdown as md
from .markdown import EXPORT_VERSION

if TYPE_CHECKING:
    import nbformat

__all__ = ["BATCH_FORMATS", "batch_notebook", "export_batch"]

BATCH_FORMATS = ("jsonl", "ipynb")
_REPORT_ROWS = 1000  # items listed in a notebook report's table (the JSON lines hold all)


def export_batch(batch_id: str, path: str | os.PathLike, *, format: str | None = None,
                 journal: Journal | str | None = None) -> Path:
    """Write batch ``batch_id`` to ``path``: one JSON line per item (``"jsonl"``: the item's
    index, key, run, status, result as journaled JSON data, error, iterations, tokens,
    cost) or a notebook report (``"ipynb"``: counts, tokens and cost, the items as a table,
    the failures and pending approvals, and a cell that loads the batch). By default the
    format comes from the file extension. Only reads the journal; the file is replaced
    whole or not at all."""

    path = Path(path)
    fmt = format or path.suffix.lower().lstrip(".")
    if fmt not in BATCH_FORMATS:
        raise ValueError(f"cannot tell the export format from the file name {str(path)!r}: "
                         f"name it .jsonl (one line per item) or .ipynb (a report)")
    source = open_journal(journal, read_only=True)
    batch = read_batch(batch_id, journal=source)
    if fmt == "jsonl":
        text = "".join(json.dumps({**item.to_dict(), "result": serde.encode(item.result)},
                                  ensure_ascii=False) + "\n" for item in batch)
    else:
        pending = {item.run_id: (source.find_run(item.run_id).pending_approval or {})
                   for item in batch if item.status is not None
                   and item.status.value == "WAITING_APPROVAL"}
        text = md.nbformat().writes(batch_notebook(batch, pending))
    md.write_whole(path, text)
    return path


def batch_notebook(batch: Any, pending: dict[str, dict] | None = None) -> nbformat.NotebookNode:
    """A notebook report of a :class:`~durable_nb.batches.batch.Batch`: valid under
    ``nbformat.validate``, without outputs. ``pending`` maps item run ids to their pending
    approvals (name, details)."""
    nbf = md.nbformat()
    markdown_cell, code_cell = md.markdown_cell, nbf.v4.new_code_cell
    pending = pending or {}
    items = list(batch)
    counts = batch.counts
    total = {"items": len(items), "counts": counts, "tokens": batch.tokens,
             "prompt_tokens": sum(i.prompt_tokens for i in items),
             "completion_tokens": sum(i.completion_tokens for i in items), "cost": batch.cost}
    cells = [markdown_cell(_batch_title_md(batch, total), metadata={"durable_nb": total})]
    cells.append(markdown_cell(_batch_table_md(items)))
    failed = [i for i in items if i.state in ("FAILED", "CANCELLED")]
    if failed:
        cells.append(markdown_cell(_failures_md(failed)))
    waiting = [i for i in items if i.state == "WAITING_APPROVAL"]
    if waiting:
        cells.append(markdown_cell(_waiting_md(waiting, pending)))
    cells.append(markdown_cell("## Load it\n\nThe batch as data (not executed here): "
                                   "`records()` gives plain dicts, `to_pandas()` a DataFrame "
                                   "when pandas is installed."))
    cells.append(code_cell(f"import durable_nb\n\nbatch = durable_nb.batch({batch.batch_id!r})"
                               f"\nbatch.records()[:5]"))
    nb = nbf.v4.new_notebook(cells=cells, metadata={
        **md.KERNEL_METADATA,
        "durable_nb": {"export_version": EXPORT_VERSION, "batch_id": batch.batch_id}})
    nbf.validate(nb)
    return nb


def _batch_title_md(batch: Any, total: dict[str, Any]) -> str:
    order = ["DONE", "FAILED", "CANCELLED", "WAITING_APPROVAL", "RUNNING", "PENDING"]
    rows = [f"| {status} | {total['counts'][status]:,} |" for status in order
            if total["counts"].get(status)]
    done = total["counts"].get("DONE", 0)
    lines = [f"# Batch {batch.title or batch.batch_id}", "",
             f"Durable batch {md.code(batch.batch_id)}, exported from its journal: "
             f"{total['items']:,} items, each the run {md.code(batch.batch_id + '/KEY')}.", "",
             "| status | items |", "| --- | ---: |", *rows, "",
             f"- tokens: {total['prompt_tokens']:,} prompt + {total['completion_tokens']:,} "
             f"completion = {total['tokens']:,}",
             (f"- cost: {format_cost(total['cost'])}"
              + (f" ({format_cost(total['cost'] / done)} per DONE item)" if done else ""))
             if total["cost"] else "- cost: none known (no LLM call with a known price)"]
    if batch.removed:
        lines.append(f"- {len(batch.removed):,} items no longer in the batch's list, their runs "
                     f"kept: {', '.join(md.code(k) for k in batch.removed[:10])}"
                     + (" ..." if len(batch.removed) > 10 else ""))
    return "\n".join(lines)


def _cell_text(text: Any, limit: int = 80) -> str:
    text = " ".join(str(text).split())
    if len(text) > limit:
        text = text[:limit - 1] + "\u2026"
    return text.replace("|", "\\|")


def _batch_table_md(items: list[Any]) -> str:
    lines = ["## Items", "", "| # | key | status | iterations | tokens | cost | result / error |",
             "| ---: | --- | --- | ---: | ---: | ---: | --- |"]
    for item in items[:_REPORT_ROWS]:
        if item.state == "DONE":
            outcome = item.result if isinstance(item.result, str) else \
                json.dumps(plain(item.result), ensure_ascii=False, default=str)
        else:
            outcome = item.error or ""
        lines.append(f"| {item.index} | {_cell_text(item.key, 40)} | {item.state} | "
                     f"{item.iterations} | {item.tokens:,} | "
                     f"{format_cost(item.cost) if item.cost else '-'} | {_cell_text(outcome)} |")
    if len(items) > _REPORT_ROWS:
        lines += ["", f"The first {_REPORT_ROWS:,} of {len(items):,} items; the JSON lines export "
                      f"(`durable-nb batch export ID --to items.jsonl`) holds all."]
    return "\n".join(lines)


def _failures_md(failed: list[Any]) -> str:
    lines = ["## Failures", "",
             f"{len(failed):,} items did not finish. Re-running the batch tries FAILED items "
             f"again (unless `--retry-failed no`); `durable-nb show RUN` tells one item's steps.",
             ""]
    for item in failed[:200]:
        lines += [f"### {item.run_id} ({item.state})", "", md.fence(item.error or "(no message)",
                                                                  "text"), ""]
    if len(failed) > 200:
        lines.append(f"... and {len(failed) - 200:,} more: `durable-nb batch show ID --status "
                     f"failed --limit 0`")
    return "\n".join(lines)


def _waiting_md(waiting: list[Any], pending: dict[str, dict]) -> str:
    lines = ["## Waiting for approval", "",
             "Decide from anywhere, e.g. `durable-nb approve RUN` or `durable-nb reject RUN "
             "NOTE`; the batch's cell (re-run, or still watching) resumes them.", ""]
    for item in waiting[:200]:
        p = pending.get(item.run_id) or {}
        lines.append(f"- {md.code(item.run_id)}: {md.code(str(p.get('name')))} "
                     f"{md.code(json.dumps(p.get('details'), ensure_ascii=False, default=str))}")
    return "\n".join(lines)
