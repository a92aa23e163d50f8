"""A journal is a test: recorded runs checked against the code as it is now, by a dry
replay (:mod:`.dry`) that executes nothing and writes nothing.

:func:`check` is the Python surface; ``durable-nb check`` (:mod:`durable_nb.cli.check`),
``%durable check`` (:mod:`durable_nb.notebook.check`) and the pytest plugin
(:mod:`.pytest_plugin`) are built on it. What it says per run: :mod:`.results`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..batches.batch import item_keys
from ..errors import UnknownRun
from ..journal import DiskJournal, Journal, JournalSpec, RunRecord, open_journal
from ..options import RunOptions
from .dry import dry_replay
from .results import DIVERGES, REPLAYS, WOULD_EXECUTE, CheckReport, RunCheck, Verdict

__all__ = ["DIVERGES", "REPLAYS", "WOULD_EXECUTE", "CheckReport", "RunCheck", "Verdict",
           "check", "check_items", "check_journal", "read_only"]


def check(handler: Callable[..., Any], *, journal: JournalSpec = None,
          runs: Iterable[str] | None = None, prefix: str | None = None,
          items: Iterable[Any] | None = None, key: Callable[[Any], Any] | str | None = None,
          **options: Any) -> CheckReport:
    """Check recorded runs against ``handler`` as it is now, executing nothing.

    Each run's handler is executed in a dry replay: every step is answered from the
    journal, and the first step the journal cannot answer stops it. No model request is
    sent, no tool runs, no approval is asked, no lease is taken, nothing is written (a
    journal given by location is opened read-only). Each run gets a :class:`RunCheck` whose
    verdict is ``replays``, ``would execute`` or ``diverges`` (see
    :mod:`durable_nb.checking.results`).

    Which runs: ``runs`` (ids), else every run whose id starts with ``prefix``, else every
    run of the journal; child runs (``ctx.child``) are checked with their parent, not on
    their own. ``handler(ctx)`` is the function given to :func:`durable_nb.execute`. A
    batch's items (:func:`durable_nb.map`): ``prefix`` is the batch id, ``items`` the items
    and ``key`` their key as given to ``map``, and ``handler(ctx, item)``; an item not
    started yet would execute. Further keyword options are :class:`RunOptions`' (``model=``
    and ``client=`` as the runs were executed with: they are part of what a chat step asks).
    """
    source = read_only(journal)
    opts = RunOptions(**{"on_approval": "park", **options, "verify_replay": False})
    if items is not None:
        return _check_items(handler, source, prefix, list(items), key, opts)
    return check_journal(lambda _record: handler, source, _records(source, runs, prefix), opts)


def check_journal(handler_for: Callable[[RunRecord], Callable[[Any], Any]], journal: Journal,
                  records: Iterable[RunRecord], options: RunOptions) -> CheckReport:
    """Each of ``records`` checked in a dry replay of ``handler_for(record)``: the loop
    every surface shares, for handlers that depend on the run."""
    return CheckReport([dry_replay(journal, record, handler_for(record), options)
                        for record in records])


def read_only(journal: JournalSpec) -> Journal:
    """The journal at ``journal`` opened read-only (a DiskJournal object is opened again
    read-only at its directory; another Journal object is used as given: a dry replay only
    reads it)."""
    if isinstance(journal, DiskJournal) and not journal.read_only:
        return open_journal(journal.location, read_only=True)
    return open_journal(journal, read_only=True)


def _records(journal: Journal, runs: Iterable[str] | None,
             prefix: str | None) -> list[RunRecord]:
    if runs is not None:
        records = []
        for run_id in runs:
            record = journal.find_run(run_id)
            if record is None:
                raise UnknownRun(run_id, journal.location)
            records.append(record)
        return records
    return [r for r in journal.list_runs(prefix or "") if r.parent is None]


def _check_items(handler: Callable[[Any, Any], Any], journal: Journal, batch_id: str | None,
                 items: list[Any], key: Callable[[Any], Any] | str | None,
                 options: RunOptions) -> CheckReport:
    if not batch_id:
        raise ValueError("check(items=...) needs prefix=, the batch's id (the batch_id given "
                         "to durable_nb.map), to find the items' runs")
    return check_items(lambda index: lambda ctx: handler(ctx, items[index]), batch_id,
                       item_keys(items, key), journal, options)


def check_items(handler_of: Callable[[int], Callable[[Any], Any]], batch_id: str,
                keys: list[str], journal: Journal, options: RunOptions) -> CheckReport:
    """A batch's items checked: item ``i`` is run ``BATCH/keys[i]``, checked with
    ``handler_of(i)``; an item whose run was not started would execute."""
    batch_id = batch_id.rstrip("/")
    recorded = {r.run_id: r for r in journal.list_runs(f"{batch_id}/")}  # one read, not one a run
    found = []
    for index, item_key in enumerate(keys):
        run_id = f"{batch_id}/{item_key}"
        record = recorded.get(run_id)
        if record is None:
            found.append(RunCheck(run_id, WOULD_EXECUTE, None, 0,
                                  f"item {index} was not started: every step is new"))
        else:
            found.append(dry_replay(journal, record, handler_of(index), options))
    return CheckReport(found)
