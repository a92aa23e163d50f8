"""Whole-run edits made of the journal interface's own operations: copying a run (a fork,
or a move to another backend) and rewinding it to an earlier step."""

from __future__ import annotations

import time
from typing import Any

from .base import Journal
from .blobs import referenced_blobs
from .records import LLM_KINDS, RunRecord, Status, StepEntry, entry_cost

__all__ = ["copy_run", "fork_run", "recount", "rewind"]


def copy_run(source: Journal, run_id: str, target: Journal, new_id: str, *,
             changes: dict[str, Any] | None = None) -> RunRecord | None:
    """Copy run ``run_id`` with its entries and blobs to ``target`` as ``new_id`` (its
    record updated with ``changes``); None, and nothing written, if ``new_id`` exists there.
    Leases and pending requests are not copied.

    ``source`` and ``target`` may be journals of different backends (a directory and a
    PostgreSQL URL): the copy is made of interface calls only. Until its last write the
    copy is marked FAILED "incomplete copy", so a copy cut short is never taken for the
    run (delete it and copy again)."""
    record = RunRecord.from_json(source.get_run(run_id).to_json())
    record.run_id = new_id
    record.owner = None
    for name, value in (changes or {}).items():
        setattr(record, name, value)
    placeholder = RunRecord.from_json(record.to_json())
    placeholder.status = Status.FAILED
    placeholder.result = None
    placeholder.pending_approval = None
    placeholder.error = (f"incomplete copy of run {run_id!r} from {source.location}: delete it "
                         f"(durable-nb delete {new_id}) and copy it again")
    if not target.create_run(placeholder):
        return None
    copied: set[str] = set()
    for entry in source.steps(run_id):
        blobs = {}
        for digest in referenced_blobs(entry.request, lambda d: source.get_blob(run_id, d),
                                       copied):
            if digest in copied:
                continue
            text = source.get_blob(run_id, digest)
            if text is not None:
                blobs[digest] = text
                copied.add(digest)
        target.append_step(new_id, entry, blobs=blobs or None)
    record.step_count = target.count_steps(new_id)
    target.put_run(record)
    return record


def fork_run(journal: Journal, record: RunRecord, from_position: int) -> str:
    """Keep the run as it is now as a new run ``RUN@N`` (the first free N), marked as a fork
    taken where the run goes on from ``from_position``; returns the fork's id."""
    changes = {"forked_from": {"run_id": record.run_id, "position": from_position,
                               "at": time.time()},
               "pending_approval": None}
    if record.status in (Status.RUNNING, Status.WAITING_APPROVAL):
        changes.update(status=Status.CANCELLED,
                       error=f"kept as a fork when run {record.run_id!r} was executed again "
                             f"from step {from_position}")
    number = 1
    while copy_run(journal, record.run_id, journal, f"{record.run_id}@{number}",
                   changes=changes) is None:
        number += 1
    return f"{record.run_id}@{number}"


def recount(record: RunRecord, kept: list[StepEntry]) -> None:
    """Set the record's derived totals from the entries that remain."""
    record.prompt_tokens = sum(e.prompt_tokens for e in kept)
    record.completion_tokens = sum(e.completion_tokens for e in kept)
    record.iteration = sum(1 for e in kept if e.kind in LLM_KINDS)
    record.cost = sum(entry_cost(e) for e in kept)
    record.step_count = len(kept)


def rewind(journal: Journal, record: RunRecord, from_position: int) -> int:
    """Forget the run's entries from ``from_position`` on and reopen it (RUNNING, no
    result, no pending approval); the caller writes the record. Returns how many entries
    were removed."""
    removed = journal.truncate(record.run_id, from_position)
    recount(record, list(journal.steps(record.run_id)))
    record.retried_steps = [p for p in record.retried_steps or () if p < from_position] or None
    record.status = Status.RUNNING
    record.error = record.result = record.failed_step = record.finished_at = None
    record.pending_approval = None
    journal.delete_request("decision", record.run_id)
    journal.delete_request("cancel", record.run_id)
    return removed
