"""``durable_nb.prune``: remove old runs from a journal, with an export of each first when
asked (``export=DIR``), for whoever must keep an audit trail. What is kept and why:
:mod:`durable_nb.retention.plan`; how it is removed: :mod:`durable_nb.retention.sweep`."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from ..errors import RetentionError
from ..journal import Journal, JournalSpec, open_journal
from ..approvals.policy import Duration
from .plan import Unit
from .policy import RetentionPolicy, Statuses
from .sweep import BeforeRemoval, PruneResult, carry_out

__all__ = ["export_name", "prune"]


def export_name(run_id: str, copy: int = 1) -> str:
    """The file name of a run's export in an export folder: the run id with ``/`` and
    other characters a file name cannot hold %-escaped (one file per run, never a subfolder),
    ``.json``; ``copy`` 2 and on: `` (2)`` before ``.json``, for a run id pruned before (a
    space and parentheses are %-escaped in a run id, so no run's name is another's)."""
    return _file_name(run_id, copy, ".json")


def _file_name(name: str, copy: int, suffix: str) -> str:
    return quote(name, safe="@-_.=+,") + (f" ({copy})" if copy > 1 else "") + suffix


def _claim(folder: Path, name: str, suffix: str) -> Path:
    """A file of ``folder`` for ``name`` that no export wrote, created empty here (so that
    two prunes never write the same file): an export never overwrites an earlier prune's,
    whose run had the same id, but takes the next copy's name."""
    copy = 1
    while True:
        path = folder / _file_name(name, copy, suffix)
        try:
            path.open("x").close()
            return path
        except FileExistsError:
            copy += 1


def _exporter(folder: Path) -> BeforeRemoval:
    # Imported here: the exports (and what they write with) are for prunes that ask.
    from ..export import export_batch, export_run

    def export(journal: Journal, unit: Unit) -> None:
        for record in (*unit.runs, *unit.children):
            path = _claim(folder, record.run_id, ".json")
            _written(path, export_run, record.run_id, path, format="json", journal=journal)
        if unit.batch_id is not None:
            path = _claim(folder, unit.batch_id, ".batch.jsonl")
            _written(path, export_batch, unit.batch_id, path, journal=journal)
    return export


def _written(path: Path, write: Callable[..., object], *args: object, **kwargs: object
             ) -> None:
    """``write(*args, **kwargs)`` into ``path`` claimed for it; the claim removed if it
    fails (the unit is then kept)."""
    try:
        write(*args, **kwargs)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def prune(older_than: Duration, *, status: Statuses = None, prefix: str | None = None,
          dry_run: bool = False, export: str | os.PathLike | None = None,
          journal: JournalSpec = None, by: str | None = None, now: float | None = None,
          reclaim: bool = True, via: str = "python") -> PruneResult:
    """Remove the runs that ended (``status``: DONE, FAILED and CANCELLED by default, or some
    of them, as names: ``"done,failed"``) and have not changed for ``older_than`` (``"30d"``,
    ``"12h"``, seconds, a timedelta), whose id starts with ``prefix``, each with its child
    runs, steps, stored inputs, requests and history; a batch whole or not at all. Never
    removed: a run that waits, runs or was interrupted, one holding a request nobody
    decided, a fork's source while the fork is kept, a run executing now (see
    :mod:`durable_nb.retention.plan`).

    ``dry_run``: only say what would be removed (nothing is written; a journal given by its
    location is opened read-only). ``export``: a folder where each run is written as JSON
    (``durable-nb export --format json``; a batch also as JSON lines) under its lease, just
    before it is removed; never over an earlier export (a run id pruned before, and used
    again since: ``RUN (2).json``). A dry run with an export is refused
    (:class:`~durable_nb.errors.RetentionError`): it would export nothing. ``now``: the
    moment ages are measured from (default: the clock). ``reclaim``: give the space back afterwards (SQLite's or PostgreSQL's ``VACUUM``).

    The prune is recorded in the journal's own history (how many runs, their statuses, by
    ``by``, when), which ``durable-nb runs`` shows. Returns what was removed, and every run
    in scope kept, with why. On a hub's journal only the hub's service prunes:
    :class:`~durable_nb.errors.PruneRefused` for anyone else."""
    policy = RetentionPolicy.of(older_than, status, prefix)
    if dry_run and export is not None:
        raise RetentionError("a dry run (--dry-run) removes nothing, so it exports nothing: "
                             "leave out the export folder (--export), or prune for real")
    opened = open_journal(journal, read_only=dry_run and not isinstance(journal, Journal))
    before = None
    if export is not None:
        folder = Path(export)
        folder.mkdir(parents=True, exist_ok=True)
        before = _exporter(folder)
    return carry_out(opened, policy, now=now, by=by, via=via, dry_run=dry_run,
                     before_removal=before, reclaim=reclaim)
