"""What the REST API answers: runs, steps and batches as JSON, built from journal data only.

Everything here reads records and entries through the journal interface and turns them into
plain JSON (numbers, strings, JSON data as stored). Nothing is decoded with
:mod:`durable_nb.serde`, imported or executed: a step's result naming a class is shown as the
text of its JSON. Blocking (journal I/O): the handlers call these off the IOLoop.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..registry import is_interrupted, recorded_decision
from ..summary import shown_value
from ..execution.approvals import pending_digest
from ..registry import lease_holder
from ..errors import JournalError
from ..journal import Journal, RunRecord, Status, StepEntry
from .journals import KnownJournal

__all__ = ["GROUPS", "SUMMARY_REUSE", "Listing", "batch_view", "list_runs", "parse_groups",
           "pending_count", "run_summary", "run_view", "summary"]

#: How the listing is grouped and ordered: waiting for a person first, done last. INTERRUPTED
#: is RUNNING in the journal with no live process executing it.
GROUPS = ("WAITING_APPROVAL", "RUNNING", "INTERRUPTED", "FAILED", "CANCELLED", "DONE")
_TEXT_LIMIT = 2000


def parse_groups(text: str | None) -> tuple[str, ...]:
    """``status=`` of ``GET runs``: comma-separated groups in any case (all when empty);
    ValueError naming the allowed ones."""
    if not text:
        return GROUPS
    wanted = {part.strip().upper() for part in text.split(",") if part.strip()}
    unknown = wanted - set(GROUPS)
    if unknown:
        raise ValueError(f"unknown status {', '.join(sorted(unknown))}: use "
                         f"{', '.join(g.lower() for g in GROUPS)}")
    return tuple(g for g in GROUPS if g in wanted)


def _text(value: Any, limit: int = _TEXT_LIMIT) -> str:
    """Journal JSON data as one line of text (serde tags unwrapped, nothing decoded)."""
    try:
        return shown_value(value, limit)
    except (RecursionError, ValueError, TypeError):
        return "(not shown: the data is nested too deeply or is not JSON)"


def _notebook(path: str | None, root_dir: str | None) -> str | None:
    """The run's notebook relative to the server's root (what JupyterLab opens); None when
    it is not under the root."""
    if not path or not isinstance(path, str):
        return None
    if not os.path.isabs(path):
        return path.lstrip("/")
    if root_dir:
        relative = os.path.relpath(path, root_dir)
        if not relative.startswith(".."):
            return relative.replace(os.sep, "/")
    return None


def _pending(record: RunRecord) -> dict | None:
    pending = record.pending_approval
    if not isinstance(pending, dict):
        return None
    return {"run_id": pending.get("run_id", record.run_id), "key": pending.get("key"),
            "name": pending.get("name"), "details": pending.get("details"),
            "details_text": _text(pending.get("details")), "digest": pending_digest(pending),
            "id": pending.get("id"), "requested_at": pending.get("requested_at"),
            "timeout_at": pending.get("timeout_at")}


def run_summary(journal: KnownJournal, opened: Journal, record: RunRecord, *,
                interrupted: bool | None = None, root_dir: str | None = None) -> dict:
    """A RunSummary (see API.md). ``interrupted``: known already (else one lease read for a
    RUNNING run); a WAITING_APPROVAL run costs one read for a decision not taken yet."""
    if interrupted is None:
        interrupted = is_interrupted(record, opened)
    decision = recorded_decision(record, opened)
    batch = record.run_id.rpartition("/")[0] if record.parent is None else ""
    return {
        "journal": journal.id, "run_id": record.run_id, "title": _str(record.title),
        "status": record.status.value, "interrupted": interrupted,
        "created_at": _number(record.created_at), "updated_at": _number(record.updated_at),
        "finished_at": _number(record.finished_at), "iteration": _number(record.iteration),
        "prompt_tokens": _number(record.prompt_tokens),
        "completion_tokens": _number(record.completion_tokens),
        "cost": _number(record.cost), "steps": _number(record.step_count),
        "notebook": _notebook(record.notebook, root_dir),
        "cell_id": record.cell_id if isinstance(record.cell_id, str) else None,
        "pending_approval": _pending(record),
        "decision": None if decision is None else {
            "approved": decision.get("approved"), "by": decision.get("by"),
            "at": decision.get("at"), "note": decision.get("note"),
            "digest": decision.get("digest")},
        "batch_id": batch or None,
        "parent": record.parent if isinstance(record.parent, str) else None,
        "error": record.error if isinstance(record.error, str) else None,
    }


# A record is JSON written by durable_nb; one written by someone else may hold anything where
# a title or a number should be: shown as text, or as nothing, never an error for the listing.
def _str(value: Any) -> str:
    return value if isinstance(value, str) else _text(value)


def _number(value: Any) -> float | int | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


# -- the listing ---------------------------------------------------------------------------

@dataclass
class Listing:
    """One page of ``GET runs``."""

    runs: list[dict]
    total: int
    pending_approvals: int
    #: The journals left out because they failed to answer: ``{"journal", "error"}``.
    unavailable: list[dict]


def _answering(journals: list[tuple[KnownJournal, Journal]], prefix: str = "") -> tuple[
        list[tuple[KnownJournal, Journal]], dict[str, dict[Status, int]], list[dict]]:
    """The journals that answer (counted by status under ``prefix``: one index read each),
    their counts, and those that did not, with why: one unreachable journal leaves the
    others listed."""
    answering, counts, failed = [], {}, []
    for known, opened in journals:
        try:
            counts[known.id] = opened.count_runs(prefix)
            answering.append((known, opened))
        except JournalError as exc:
            failed.append({"journal": known.id, "error": str(exc)})
    return answering, counts, failed


Fetch = Callable[[int], list[tuple[KnownJournal, Journal, RunRecord]]]


def _newest_first(rows: Iterable[tuple[KnownJournal, Journal, RunRecord]]) -> list:
    return sorted(rows, key=lambda row: (_number(row[2].created_at) or 0, row[2].run_id),
                  reverse=True)


def _matches(record: RunRecord, q: str) -> bool:
    return any(isinstance(text, str) and q in text.lower()
               for text in (record.run_id, record.title, record.notebook))


def list_runs(journals: list[tuple[KnownJournal, Journal]], *, groups: tuple[str, ...],
              prefix: str = "", q: str = "", page: int = 0, limit: int = 50,
              root_dir: str | None = None) -> Listing:
    """The page ``page`` (``limit`` runs) of the runs of ``journals`` in ``groups``, grouped
    in :data:`GROUPS` order, newest first within a group.

    Without ``q`` the journals count runs from their index and read only the records the
    page shows (plus the RUNNING ones, whose leases tell which are interrupted); with ``q``
    (text in the id, title or notebook, any case) every record of the groups is read."""
    q = q.strip().lower()
    journals, counts, failed = _answering(journals, prefix)
    sized: list[tuple[str, int, Fetch]] = []
    running: list[tuple[KnownJournal, Journal, RunRecord, bool]] = []
    if {"RUNNING", "INTERRUPTED"} & set(groups):
        for known, opened in journals:
            for record in opened.list_runs_counted(prefix, status=Status.RUNNING):
                if not q or _matches(record, q):
                    running.append((known, opened, record, is_interrupted(record, opened)))
    for group in groups:
        if group in ("RUNNING", "INTERRUPTED"):
            rows = _newest_first((k, j, r) for k, j, r, dead in running
                                 if dead == (group == "INTERRUPTED"))
            sized.append((group, len(rows), lambda n, rows=rows: rows[:n]))
        elif q:
            rows = _newest_first(
                (known, opened, record) for known, opened in journals
                for record in opened.list_runs_counted(prefix, status=group) if _matches(record, q))
            sized.append((group, len(rows), lambda n, rows=rows: rows[:n]))
        else:
            status = Status(group)
            total = sum(counts[known.id].get(status, 0) for known, _ in journals)
            sized.append((group, total, lambda n, status=status: _newest_first(
                (known, opened, record) for known, opened in journals
                for record in opened.list_runs_counted(prefix, status=status, limit=n,
                                                       newest_first=True))[:n]))
    start, end = page * limit, (page + 1) * limit
    shown: list[dict] = []
    offset = 0
    for group, total, fetch in sized:
        if offset < end and offset + total > start:
            for known, opened, record in fetch(min(total, end - offset))[max(0, start - offset):]:
                shown.append(run_summary(known, opened, record, root_dir=root_dir,
                                         interrupted=group == "INTERRUPTED"))
        offset += total
    return Listing(shown, offset, pending_count(journals), failed)


def pending_count(journals: list[tuple[KnownJournal, Journal]]) -> int:
    """How many runs wait for a person: WAITING_APPROVAL without a decision given (a
    decided run waits only for its cell to be re-run)."""
    return sum(1 for _, opened in journals
               for record in opened.list_runs(status=Status.WAITING_APPROVAL)
               if recorded_decision(record, opened) is None)


def summary(journals: list[tuple[KnownJournal, Journal]]) -> dict:
    """``GET summary``: ``{"pending_approvals", "unavailable", "version"}``, the version a
    digest that changes when anything ``GET runs`` shows changes (counts by status, the
    waiting and running runs, which of them are interrupted, the newest runs, the pending
    count, the journals that did not answer).

    What the sidebar polls every second or two: for directory journals whose files have
    not changed since the last answer (nothing written, not even a lease's heartbeat), that
    answer is given again without reading, for up to :data:`SUMMARY_REUSE` seconds (a
    process that dies writes nothing: its run shows as interrupted after at most that)."""
    key = tuple(known.id for known, _ in journals)
    marks = tuple(_files_mark(known) for known, _ in journals)
    now, wall = time.monotonic(), time.time_ns()
    cached = _summaries.get(key)
    if cached is not None and cached[0] == marks and now - cached[1] < SUMMARY_REUSE:
        return cached[2]
    journals, all_counts, failed = _answering(journals)
    pending = pending_count(journals)
    parts: list[Any] = [pending, failed]
    for known, opened in journals:
        counts = all_counts[known.id]
        active = opened.list_runs(status=(Status.RUNNING, Status.WAITING_APPROVAL))
        newest = opened.list_runs(limit=20, newest_first=True)
        parts.append([known.id, sorted((s.value, n) for s, n in counts.items()),
                      [(r.run_id, r.updated_at, r.step_count, r.status.value,
                        is_interrupted(r, opened)) for r in active],
                      [(r.run_id, r.updated_at, r.status.value) for r in newest]])
    answer = {"pending_approvals": pending, "unavailable": failed,
              "version": hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]}
    if _reusable(marks, wall):
        _summaries[key] = (marks, now, answer)
    return answer


def _reusable(marks: tuple, read_at_ns: int) -> bool:
    """Whether an answer read at ``read_at_ns`` (wall clock) may be given again while the
    files keep ``marks``: every journal is a directory whose files were last written well
    before the read. A file's time has the resolution of a clock tick (milliseconds), so a
    write just after the read could leave the same time (and, once SQLite's log wrapped
    around, the same size): such an answer is not kept."""
    quiet_ns = 50_000_000
    for mark in marks:
        if mark is None:
            return False
        if any(part is not None and part[0] > read_at_ns - quiet_ns for part in mark):
            return False
    return True


#: Seconds an unchanged directory journal's summary is answered again without reading it.
SUMMARY_REUSE = 5.0
_summaries: dict[tuple[str, ...], tuple[tuple, float, dict]] = {}


def _files_mark(known: KnownJournal) -> tuple | None:
    """What changes whenever a directory journal is written (its SQLite database and
    write-ahead log: size and modification time); None for PostgreSQL."""
    if known.kind != "disk":
        return None
    mark = []
    for name in ("cache.db", "cache.db-wal"):
        try:
            stat = os.stat(os.path.join(known.location, name))
            mark.append((stat.st_mtime_ns, stat.st_size))
        except OSError:
            mark.append(None)
    return tuple(mark)


# -- one run, one batch ----------------------------------------------------------------------

def _step(entry: StepEntry) -> dict:
    if entry.ok:
        answer = _text(entry.result)
    else:
        error = entry.error if isinstance(entry.error, dict) else {}
        answer = f"{_text(error.get('type'), 200)}: {_text(error.get('message'))}"
    return {"position": entry.position, "key": entry.key, "kind": entry.kind, "name": entry.name,
            "ok": entry.ok, "started_at": entry.started_at, "finished_at": entry.finished_at,
            "prompt_tokens": entry.prompt_tokens, "completion_tokens": entry.completion_tokens,
            "cost": (entry.meta or {}).get("cost") if isinstance((entry.meta or {}).get("cost"),
                                                                  (int, float)) else None,
            "asked": _text(entry.request), "answer": answer}


def run_view(known: KnownJournal, opened: Journal, run_id: str, *,
             root_dir: str | None = None) -> dict:
    """``GET run``: the record as a RunSummary with the rest of what the run view shows, and
    every step (as text). UnknownRun if there is none."""
    record = opened.get_run(run_id)
    steps = [_step(entry) for entry in opened.steps(run_id)]
    record.step_count = len(steps)
    view = run_summary(known, opened, record, root_dir=root_dir)
    view.update({"result": _text(record.result) if record.status is Status.DONE else None,
                 "forked_from": record.forked_from, "deadline": record.deadline,
                 "max_iterations": record.max_iterations, "max_tokens": record.max_tokens,
                 "max_cost": record.max_cost,
                 "executing": lease_holder(run_id, journal=opened) is not None,
                 "source": record.source if isinstance(record.source, str) else None})
    return {"record": view, "steps": steps}


def batch_view(known: KnownJournal, opened: Journal, batch_id: str, *,
               root_dir: str | None = None) -> dict | None:
    """``GET batch``: the batch's counts by status (PENDING: items never started) and its
    items in item order; None if there is no such batch."""
    record = opened.find_batch(batch_id)
    if record is None:
        return None
    runs = {r.run_id: r for r in opened.list_runs_counted(f"{batch_id}/")}
    items = [runs.get(f"{batch_id}/{key}") for key in record.keys]
    summaries = [run_summary(known, opened, r, root_dir=root_dir) for r in items if r is not None]
    counts = Counter("INTERRUPTED" if s["interrupted"] else s["status"] for s in summaries)
    counts["PENDING"] = sum(1 for r in items if r is None)
    return {"batch": {"journal": known.id, "batch_id": record.batch_id, "title": record.title,
                      "items": len(record.keys), "counts": {k: v for k, v in counts.items() if v},
                      "created_at": record.created_at, "updated_at": record.updated_at},
            "items": summaries}
