"""Notebook runs checked against a cell's code now (:mod:`durable_nb.checking`), for
``%%durable_agent ... --check`` and ``%durable check``.

``%%durable_agent RUN --check`` checks the cell's run (with ``--over``: its batch's items)
against the cell as written now, in the notebook's namespace as it is now (a prompt or a
tool edited in another cell counts), executing nothing: no save needed.

``%durable check`` checks runs from any cell: each run's cell code is the cell of this
kernel's own notebook, as saved, whose id is the run's cell id. The journal only says which
cell: the code it records (``RunRecord.source``) and the notebook it names are never run nor
read, since a shared journal is data anyone with access may have written. A run whose cell is
not in this notebook is not checked, and the note says so. The namespace is the notebook's
now; the cell runs in a copy of it: its assignments never reach the notebook.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..checking import CheckReport, RunCheck, check_items, check_journal
from ..errors import UnknownRun
from ..journal import Journal, RunRecord
from ..options import RunOptions
from .cell import compile_cell, compile_item_cell

__all__ = ["CellCode", "check_cell", "check_runs", "saved_cell"]

_MAGIC = "%%durable_agent"


class CellCode:
    """A ``%%durable_agent`` cell's options line (without the magic's name), its body and
    where they were found (for the report)."""

    def __init__(self, line: str, body: str, where: str) -> None:
        self.line, self.body, self.where = line, body, where

    @classmethod
    def of(cls, record: RunRecord, notebook: str | None) -> "CellCode | None":
        """The ``%%durable_agent`` cell of ``notebook`` (this kernel's own notebook) whose id
        is ``record``'s cell id, as saved; None when there is none."""
        saved = saved_cell(notebook, record.cell_id)
        if saved is None:
            return None
        first, _, body = saved.partition("\n")
        if not first.startswith(_MAGIC):
            return None
        return cls(first[len(_MAGIC):].strip(), body, f"the cell as saved in {notebook}")


def saved_cell(notebook: str | None, cell_id: str | None) -> str | None:
    """The text of cell ``cell_id`` as the notebook file ``notebook`` holds it now; None
    when either is unknown or not found. ``notebook`` is the kernel's own notebook as Jupyter
    Server names it (never a path a journal gives), relative to the kernel's folder when it
    is not found as given. Read as JSON data, never executed."""
    if not notebook or not cell_id:
        return None
    path = Path(notebook)
    if not path.is_file():
        path = Path.cwd() / path.name  # a kernel runs in its notebook's folder
    try:
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
    except (OSError, ValueError, AttributeError):
        return None
    for cell in cells:
        if isinstance(cell, dict) and cell.get("id") == cell_id:
            source = cell.get("source", "")
            return "".join(source) if isinstance(source, list) else str(source)
    return None


def check_cell(body: str, run_id: str, journal: Journal, namespace: dict, *,
               model: str | None = None, items: list | None = None,
               keys: list[str] | None = None, only: Iterable[str] | None = None) -> CheckReport:
    """Cell ``body`` as written now checked against run ``run_id``, or, with ``items`` and
    their ``keys``, against the items of batch ``run_id`` (``only``: just these runs)."""
    options = RunOptions(on_approval="park", verify_replay=False, model=model)
    scope = dict(namespace)
    if items is None:
        record = journal.find_run(run_id)
        if record is None:
            raise UnknownRun(run_id, journal.location)
        handler = compile_cell(body, run_id, scope)
        return check_journal(lambda _record: handler, journal, [record], options)
    item_body = compile_item_cell(body, run_id, scope, items)
    report = check_items(lambda index: lambda ctx: item_body(ctx, index), run_id,
                         keys or [], journal, options)
    if only is not None:
        wanted = set(only)
        report = CheckReport([run for run in report if run.run_id in wanted])
    return report


def check_runs(records: list[RunRecord], journal: Journal, namespace: dict,
               parse_line: Callable[[str], Any], batch_of: Callable[[Any], tuple],
               overrides: Any, notebook: str | None) -> tuple[CheckReport, list[str]]:
    """``records`` checked against their cells' code now, cell by cell, each cell taken from
    ``notebook`` (this kernel's own notebook) by the run's cell id: the report and one note
    per cell saying where its code was found, or that it was not found and the runs were not
    checked. ``parse_line`` parses a cell's options line; ``batch_of(options)`` gives a batch
    cell's ``(items, keys)``; ``overrides`` (``--over``, ``--key``, ``--model`` of
    ``%durable check``) win over the cell's own options."""
    found: list[RunCheck] = []
    notes: list[str] = []
    for group in _by_cell(records):
        ids = [r.run_id for r in group]
        if group[0].cell_id is None:
            notes.append(f"{_shown(ids)}: not checked: not started by a %%durable_agent cell "
                         f"of a notebook: check it with durable_nb.check(handler, runs=[...]) "
                         f"or durable-nb check")
            continue
        code = CellCode.of(group[0], notebook)
        if code is None:
            notes.append(f"{_shown(ids)}: not checked: cell not found in this notebook: run "
                         f"`%%durable_agent ... --check` in the cell")
            continue
        options = parse_line(code.line)
        for name in ("over", "key", "model"):
            if getattr(overrides, name, None) is not None:
                setattr(options, name, getattr(overrides, name))
        notes.append(f"{_shown(ids)}: checked against {code.where}")
        if options.over is not None:
            batch_id = ids[0].rpartition("/")[0]
            items, keys = batch_of(options)
            found += check_cell(code.body, batch_id, journal, namespace, model=options.model,
                                items=items, keys=keys, only=ids).runs
        else:
            for record in group:
                found += check_cell(code.body, record.run_id, journal, namespace,
                                    model=options.model).runs
    return CheckReport(found), notes


def _by_cell(records: list[RunRecord]) -> list[list[RunRecord]]:
    groups: dict[tuple, list[RunRecord]] = {}
    for record in records:
        cell = (record.notebook, record.cell_id, record.source_hash,
                record.run_id.rpartition("/")[0] if record.cell_id is None else "")
        groups.setdefault(cell, []).append(record)
    return list(groups.values())


def _shown(ids: list[str]) -> str:
    return ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
