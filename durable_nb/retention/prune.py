"""``durable_nb.prune``: remove old runs from a journal, with an export of each first when
asked (``export=DIR``), for whoever must keep an audit trail. What is kept and why:
:mod:`durable_nb.retention.plan`; how it is removed: :mod:`durable_nb.retention.sweep`."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

from ..journal import Journal, JournalSpec, open_journal
from ..approvals.policy import Duration
from .plan import Unit
from .policy import RetentionPolicy, Statuses
from .sweep import BeforeRemoval, PruneResult, carry_out

__all__ = ["export_name", "prune"]


def export_name(run_id: str) -> str:
    """The file name of a run's export in an export folder: the run id with ``/`` and
    other characters a file name cannot hold %-escaped (one file per run, never a subfolder),
    ``.json``."""
    return quote(run_id, safe="@-_.=+,") + ".json"


def _exporter(folder: Path) -> BeforeRemoval:
    # Imported here: the exports (and what they write with) are for prunes that ask.
    from ..export import export_batch, export_run

    def export(journal: Journal, unit: Unit) -> None:
        for record in (*unit.runs, *unit.children):
            export_run(record.run_id, folder / export_name(record.run_id), format="json",
                       journal=journal)
        if unit.batch_id is not None:
            export_batch(unit.batch_id, folder / (quote(unit.batch_id, safe="@-_.=+,")
                                                  + ".batch.jsonl"), journal=journal)
    return export


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
    before it is removed. ``now``: the moment ages are measured from (default: the clock).
    ``reclaim``: give the space back afterwards (SQLite's or PostgreSQL's ``VACUUM``).

    The prune is recorded in the journal's own history (how many runs, their statuses, by
    ``by``, when), which ``durable-nb runs`` shows. Returns what was removed, and every run
    in scope kept, with why. On a hub's journal only the hub's service prunes:
    :class:`~durable_nb.errors.PruneRefused` for anyone else."""
    policy = RetentionPolicy.of(older_than, status, prefix)
    opened = open_journal(journal, read_only=dry_run and not isinstance(journal, Journal))
    before = None
    if export is not None and not dry_run:
        folder = Path(export)
        folder.mkdir(parents=True, exist_ok=True)
        before = _exporter(folder)
    return carry_out(opened, policy, now=now, by=by, via=via, dry_run=dry_run,
                     before_removal=before, reclaim=reclaim)
