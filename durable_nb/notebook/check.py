"""Notebook runs checked against a cell's code now (:mod:`durable_nb.checking`), for
``%%durable_agent ... --check`` and ``%durable check``.

``%%durable_agent RUN --check`` checks the cell's run (with ``--over``: its batch's items)
against the cell as written now, in the notebook's namespace as it is now (a prompt or a
tool edited in another cell counts), executing nothing: no save needed.

``%durable check`` checks runs from any cell: each run's cell code is the cell as saved in
the notebook that started it (the run records its notebook and cell id), else the cell
source the run recorded; which one is said. The namespace is the notebook's now. Either way
the cell runs in a copy of the namespace: its assignments never reach the notebook.
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
    def of(cls, record: RunRecord) -> "CellCode | None":
        """The cell that started ``record``, as saved in its notebook, else the source the
        run recorded; None for a run no cell started (``durable_nb.execute``)."""
        saved = saved_cell(record)
        if saved is not None:
            first, _, body = saved.partition("\n")
            if first.startswith(_MAGIC):
                return cls(first[len(_MAGIC):].strip(), body,
                           f"the cell as saved in {record.notebook}")
        if record.source is None:
            return None
        return cls("", record.source, "the cell source the run recorded (its notebook cell "
                                      "was not found saved)")


def saved_cell(record: RunRecord) -> str | None:
    """The text of the notebook cell that started ``record``, as its notebook file holds
    it now (the file named by the run's ``notebook``, found by the run's ``cell_id``); None
    when either is unknown or not found. Read as JSON data, never executed."""
    if not record.notebook or not record.cell_id:
        return None
    path = Path(record.notebook)
    if not path.is_file():
        path = Path.cwd() / path.name  # a kernel runs in its notebook's folder
    try:
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
    except (OSError, ValueError, AttributeError):
        return None
    for cell in cells:
        if isinstance(cell, dict) and cell.get("id") == record.cell_id:
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
               overrides: Any) -> tuple[CheckReport, list[str]]:
    """``records`` checked against their cells' code now, cell by cell: the report and one
    note per cell saying where its code was found. ``parse_line`` parses a cell's options
    line; ``batch_of(options)`` gives a batch cell's ``(items, keys)``;
    ``overrides`` (``--over``, ``--key``, ``--model`` of ``%durable check``) win over the
    cell's own options."""
    found: list[RunCheck] = []
    notes: list[str] = []
    for group in _by_cell(records):
        code = CellCode.of(group[0])
        ids = [r.run_id for r in group]
        if code is None:
            raise ValueError(f"run {ids[0]!r} was not started by a %%durable_agent cell: check "
                             f"it with durable_nb.check(handler, runs=[...]) or durable-nb check")
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
