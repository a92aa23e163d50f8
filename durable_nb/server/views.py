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

from ..registry import (interrupted_among, is_interrupted, recorded_decision,
                        recorded_decisions)
from ..summary import shown_value
from ..approvals.policy import allowed_approvers
from ..approvals.question import ACTIONS
from ..approvals.request import editable, pending_digest
from ..registry import lease_holder
from ..errors import JournalError
from ..journal import Journal, RunRecord, Status, StepEntry
from ..approvals.history import history
from ..notify.audit import delivery_outcome, notifications, request_deliveries
from ..notify.delivery import pending_of
from .journals import KnownJournal

__all__ = ["GROUPS", "SUMMARY_REUSE", "Facts", "Listing", "batch_view", "decision_summary",
           "facts", "keep_facts", "list_runs", "parse_groups", "run_summary", "run_view",
           "summary"]

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
            "timeout_at": pending.get("timeout_at"),
            # Who may decide (None: anyone), and the starter four-eyes refuses.
            "approvers": allowed_approvers(pending), "four_eyes": bool(pending.get("four_eyes")),
            "started_by": pending.get("started_by"),
            # A tool call's arguments may be edited (the decision's ``args``).
            "editable": editable(pending)}


def run_summary(journal: KnownJournal, opened: Journal, record: RunRecord, *,
                interrupted: bool | None = None, root_dir: str | None = None,
                notified: Notified | None = None, decided: dict[str, dict] | None = None
                ) -> dict:
    """A run as ``GET runs`` lists it (:data:`.api.RUNS`). ``interrupted``: known already
    (else one lease read for a RUNNING run); a WAITING_APPROVAL run costs one read for a
    decision not taken yet unless ``decided`` (the journal's facts) says, and one for its
    notifications unless ``notified`` has them.
    Where it comes from: ``journal`` (id), ``journal_location`` (as shown: a PostgreSQL
    URL without its password) and ``journal_name`` (relative to the server root under it);
    ``notebook`` (under the server root, what Lab opens; None elsewhere) and
    ``notebook_path`` (as the kernel recorded it)."""
    if interrupted is None:
        interrupted = is_interrupted(record, opened)
    decision = recorded_decision(record, opened) if decided is None else \
        decided.get(record.run_id)
    batch = record.run_id.rpartition("/")[0] if record.parent is None else ""
    return {
        "journal": journal.id, "run_id": record.run_id, "title": _str(record.title),
        "status": record.status.value, "interrupted": interrupted,
        "created_at": _number(record.created_at), "updated_at": _number(record.updated_at),
        "finished_at": _number(record.finished_at), "iteration": _number(record.iteration),
        "prompt_tokens": _number(record.prompt_tokens),
        "completion_tokens": _number(record.completion_tokens),
        "cost": _number(record.cost), "steps": _number(record.step_count),
        "journal_location": journal.display, "journal_name": journal.name(root_dir),
        "notebook": _notebook(record.notebook, root_dir),
        "notebook_path": record.notebook if isinstance(record.notebook, str) else None,
        "cell_id": record.cell_id if isinstance(record.cell_id, str) else None,
        "pending_approval": _pending(record),
        "deliveries": _deliveries(opened, record, notified),
        "decision": None if decision is None else decision_summary(decision),
        "batch_id": batch or None,
        "parent": record.parent if isinstance(record.parent, str) else None,
        "error": record.error if isinstance(record.error, str) else None,
    }


#: What a waiting run's row says of its request's notifications, as read with the journal's
#: facts: ``{run_id: (request id, request_deliveries)}``.
Notified = dict[str, tuple[str, dict]]


def _deliveries(opened: Journal, record: RunRecord, known: Notified | None = None) -> dict | None:
    """For a run waiting for a decision, its request's notifications: counts by outcome and
    the problem of one that failed or is retrying (:func:`~durable_nb.notify.audit.
    request_deliveries`); None for any other run (the run view has them all). Taken from
    ``known`` (the journal's facts) when it has this request, else one read."""
    found = pending_of(record)
    if found is None:
        return None
    run_id, pending = found
    request_id = str(pending["id"])
    kept = (known or {}).get(record.run_id)
    if kept is not None and kept[0] == request_id:
        return kept[1] or None
    return request_deliveries(opened.deliveries(run_id), request_id) or None


def _notified(opened: Journal, waiting: Iterable[RunRecord]) -> tuple[Notified, list]:
    """The waiting runs' :data:`Notified`, and what changes when one of their notifications
    is claimed, tried, sent or failed (a delivery's record changes, not the run's): part of
    the summary's version, so that the sidebar shows a failure as it happens. One read per
    waiting run, read at once, kept with the journal's facts."""
    notified: Notified = {}
    marks = []
    asking = [(record, found) for record in waiting if (found := pending_of(record)) is not None]
    delivered = opened.deliveries_of({found[0] for _, found in asking}) if asking else {}
    for record, found in asking:
        rows = delivered[found[0]]
        request_id = str(found[1]["id"])
        notified[record.run_id] = (request_id, request_deliveries(rows, request_id))
        marks.append((record.run_id, sorted(
            (key, delivery_outcome(row), len(row.get("attempts") or []))
            for key, row in rows.items())))
    return notified, marks


# A record is JSON written by durable_nb; one written by someone else may hold anything where
# a title or a number should be: shown as text, or as nothing, never an error for the listing.
def decision_summary(decision: dict) -> dict:
    """A decision as the API shows it: verdict, who, how, when, note, digest, ``args`` (the
    edited arguments of an approval, an object, else None), ``message`` (a rejection's
    message to the model, else None) and ``answer`` (an MCP server's question: ``{"action",
    "content"}``; None for an approval, or when the journal holds no answer of a known
    action: journal data, never trusted as shaped)."""
    answer = decision.get("answer")
    if not (isinstance(answer, dict) and answer.get("action") in ACTIONS):
        answer = None
    elif not isinstance(answer.get("content"), dict):
        answer = {"action": answer["action"], "content": None}
    else:
        answer = {"action": answer["action"], "content": answer["content"]}
    return {"approved": decision.get("approved"), "by": decision.get("by"),
            "via": decision.get("via"), "at": decision.get("at"), "note": decision.get("note"),
            "digest": decision.get("digest"), "answer": answer,
            "args": args if isinstance(args := decision.get("args"), dict) else None,
            "message": message if isinstance(message := decision.get("message"), str)
            else None}


def _str(value: Any) -> str:
    return value if isinstance(value, str) else _text(value)


def _number(value: Any) -> float | int | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


# -- what a listing and a summary read of each journal, cached --------------------------------

#: Seconds a journal's facts with RUNNING runs are reused while its files are unchanged: a
#: process that dies writes nothing, and its run must show as interrupted after at most this.
SUMMARY_REUSE = 5.0
#: How many runs of each status the newest-first fetches of a journal keep at most.
_NEWEST_KEPT = 500


@dataclass
class Facts:
    """What listings and summaries read of one journal: its counts by status, its RUNNING
    runs (each with whether it is interrupted), its pending approvals (no decision given),
    its waiting runs' notifications, the summary's part, and the newest runs of each status as pages asked for them.

    Kept per journal while its files do not change (a directory journal: its SQLite database
    and write-ahead log, size and time); when it has RUNNING runs, their leases are read
    again every :data:`SUMMARY_REUSE` seconds and the whole journal only if one of them turned
    interrupted (or came back): a listing or summary of hundreds of journals reads only those
    that changed. A PostgreSQL journal has no such marker and is read every time."""

    mark: tuple | None
    read_at: float
    counts: dict[Status, int]
    running: list[tuple[RunRecord, bool]]
    pending: int
    notified: Notified
    part: list
    newest: dict[tuple[Status, int], list[RunRecord]]
    #: The decisions given and not taken yet, by waiting run (:func:`recorded_decisions`).
    decided: dict[str, dict]

    def fresh(self, mark: tuple | None, now: float) -> bool:
        return (mark is not None and mark == self.mark
                and (not self.running or now - self.read_at < SUMMARY_REUSE))


_facts: dict[str, Facts] = {}


def keep_facts(ids: set[str]) -> None:
    """Forget the facts of every journal but ``ids`` (those no longer allowed: gone)."""
    for gone in set(_facts) - ids:
        _facts.pop(gone, None)


def facts(known: KnownJournal, opened: Journal) -> Facts:
    """The journal's :class:`Facts`, read again only when it changed (JournalError if it
    does not answer)."""
    mark = _files_mark(known)
    now, wall = time.monotonic(), time.time_ns()
    cached = _facts.get(known.id)
    if cached is not None and cached.fresh(mark, now):
        return cached
    if cached is not None and mark is not None and mark == cached.mark \
            and _liveness_unchanged(cached, opened):
        cached.read_at = now
        return cached
    counts = opened.count_runs()
    active = opened.list_runs(status=(Status.RUNNING, Status.WAITING_APPROVAL))
    # Each kind of read once for all the runs: a read per run is a round trip per run on
    # PostgreSQL (seconds for a thousand runs).
    running_runs = [r for r in active if r.status is Status.RUNNING]
    interrupted = interrupted_among(running_runs, opened)
    running = [(r, r.run_id in interrupted) for r in running_runs]
    waiting = [r for r in active if r.status is Status.WAITING_APPROVAL]
    decided = recorded_decisions(waiting, opened)
    pending = sum(1 for r in waiting if r.run_id not in decided)
    newest = opened.list_runs(limit=20, newest_first=True)
    dead = {r.run_id: interrupted for r, interrupted in running}
    notified, delivery_marks = _notified(opened, waiting)
    part = [known.id, sorted((s.value, n) for s, n in counts.items()),
            [(r.run_id, r.updated_at, r.step_count, r.status.value, dead.get(r.run_id, False))
             for r in active],
            [(r.run_id, r.updated_at, r.status.value) for r in newest], delivery_marks]
    read = Facts(mark, now, counts, running, pending, notified, part, {}, decided)
    if _quiet(mark, wall):
        _facts[known.id] = read
    else:
        _facts.pop(known.id, None)
    return read


def _liveness_unchanged(read: Facts, opened: Journal) -> bool:
    """Whether each RUNNING run of ``read`` is as live or as interrupted as when read (one
    lease read each): in a journal whose files did not change, that is all that can have
    changed (a process that died, or stalled past its heartbeat, writes nothing)."""
    interrupted = interrupted_among([record for record, _ in read.running], opened)
    return all((record.run_id in interrupted) == dead for record, dead in read.running)


def _quiet(mark: tuple | None, read_at_ns: int) -> bool:
    """Whether facts read at ``read_at_ns`` (wall clock) may be kept while the files keep
    ``mark``: a directory whose files were last written well before the read. A file's
    time has the resolution of a clock tick (milliseconds), so a write just after the read
    could leave the same time (and, once SQLite's log wrapped around, the same size): such
    facts are not kept."""
    quiet_ns = 50_000_000
    return mark is not None and not any(
        part is not None and part[0] > read_at_ns - quiet_ns for part in mark)


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


def _newest(opened: Journal, read: Facts, status: Status, n: int) -> list[RunRecord]:
    """The journal's ``n`` newest runs in ``status`` (kept in ``read`` for the next page
    of the same size, while the journal is unchanged)."""
    key = (status, n)
    if key not in read.newest:
        records = opened.list_runs_counted(status=status, limit=n, newest_first=True)
        if n > _NEWEST_KEPT:
            return records
        read.newest[key] = records
    return read.newest[key]


# -- the listing ---------------------------------------------------------------------------

@dataclass
class Listing:
    """One page of ``GET runs``."""

    runs: list[dict]
    total: int
    pending_approvals: int
    #: The journals left out because they failed to answer: ``{"journal", "error"}``.
    unavailable: list[dict]


Row = tuple[KnownJournal, Journal, RunRecord]
Fetch = Callable[[int], list[Row]]


def _answering(journals: list[tuple[KnownJournal, Journal]]) -> tuple[
        list[tuple[KnownJournal, Journal, Facts]], list[dict]]:
    """The journals that answer, with their facts, and those that did not, with why: one
    unreachable journal leaves the others listed."""
    answering, failed = [], []
    for known, opened in journals:
        try:
            answering.append((known, opened, facts(known, opened)))
        except JournalError as exc:
            failed.append({"journal": known.id, "error": str(exc)})
    return answering, failed


def _newest_first(rows: Iterable[Row]) -> list[Row]:
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

    Without ``q`` or ``prefix``, the counts and the RUNNING runs come from each journal's
    :class:`Facts` (nothing read for an unchanged journal) and only the records the page
    shows are read, from the journals that have runs in its groups; with ``prefix`` the
    journals count under it; with ``q`` (text in the id, title or notebook, any case) every
    record of the groups is read."""
    q = q.strip().lower()
    answering, failed = _answering(journals)
    sized: list[tuple[str, int, Fetch]] = []
    running: list[tuple[KnownJournal, Journal, RunRecord, bool]] = [
        (known, opened, record, dead) for known, opened, read in answering
        for record, dead in read.running
        if record.run_id.startswith(prefix) and (not q or _matches(record, q))]
    counts = {known.id: opened.count_runs(prefix) if prefix and not q else read.counts
              for known, opened, read in answering}
    for group in groups:
        if group in ("RUNNING", "INTERRUPTED"):
            rows = _newest_first((k, j, r) for k, j, r, dead in running
                                 if dead == (group == "INTERRUPTED"))
            sized.append((group, len(rows), lambda n, rows=rows: rows[:n]))
        elif q:
            rows = _newest_first(
                (known, opened, record) for known, opened, _ in answering
                for record in opened.list_runs_counted(prefix, status=group)
                if _matches(record, q))
            sized.append((group, len(rows), lambda n, rows=rows: rows[:n]))
        else:
            status = Status(group)
            total = sum(counts[known.id].get(status, 0) for known, _, _ in answering)
            sized.append((group, total, lambda n, status=status: _newest_first(
                (known, opened, record) for known, opened, read in answering
                if counts[known.id].get(status)
                for record in (opened.list_runs_counted(prefix, status=status, limit=n,
                                                        newest_first=True) if prefix
                               else _newest(opened, read, status, n)))[:n]))
    notified = {known.id: read.notified for known, _, read in answering}
    decided = {known.id: read.decided for known, _, read in answering}
    start, end = page * limit, (page + 1) * limit
    shown: list[dict] = []
    offset = 0
    for group, total, fetch in sized:
        if offset < end and offset + total > start:
            for known, opened, record in fetch(min(total, end - offset))[max(0, start - offset):]:
                shown.append(run_summary(known, opened, record, root_dir=root_dir,
                                         interrupted=group == "INTERRUPTED",
                                         notified=notified[known.id],
                                         decided=decided[known.id]))
        offset += total
    return Listing(shown, offset, sum(read.pending for _, _, read in answering), failed)


def summary(journals: list[tuple[KnownJournal, Journal]]) -> dict:
    """``GET summary``: ``{"pending_approvals", "unavailable", "version"}``, the version a
    digest that changes when anything ``GET runs`` shows changes (counts by status, the
    waiting and running runs, which of them are interrupted, the newest runs, the pending
    count, the journals that did not answer).

    What the sidebar polls every second or two: built from each journal's :class:`Facts`,
    so it reads only the journals written since the last poll (and those with RUNNING runs
    every :data:`SUMMARY_REUSE` seconds)."""
    global _last_version
    answering, failed = _answering(journals)
    pending = sum(read.pending for _, _, read in answering)
    reads = [read for _, _, read in answering]
    if not failed and len(reads) == len(_last_version[0]) and all(
            a is b for a, b in zip(reads, _last_version[0])):
        return {"pending_approvals": pending, "unavailable": failed,
                "version": _last_version[1]}
    parts: list[Any] = [pending, failed] + [read.part for read in reads]
    version = hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]
    _last_version = ([] if failed else reads, version)
    return {"pending_approvals": pending, "unavailable": failed, "version": version}


#: The facts the last summary was built from (the same objects: nothing was read again)
#: and its version.
_last_version: tuple[list[Facts], str] = ([], "")


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
                 "notifications": [dict(row, outcome=delivery_outcome(row))
                                   for row in notifications(opened, run_id)],
                 "history": history(opened, run_id),
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
