"""What ``%load_ext durable_nb`` says about runs a dead kernel left behind."""

from __future__ import annotations

import time
from collections import Counter

from .. import registry
from ..journal import Journal, RunRecord, Status

__all__ = ["describe_unfinished"]


def describe_unfinished(journal: Journal) -> list[str]:
    """Lines about runs left RUNNING or WAITING_APPROVAL by a dead kernel; expired ones are
    marked FAILED ("expired on resume") on the way. The items of a batch are told as one
    line per batch."""
    lines = []
    batches = {record.batch_id for record in journal.list_batches()}
    left: dict[str, Counter] = {}
    # Only the unfinished runs are read (the journal's status index), however many it holds.
    for record in registry.runs((Status.RUNNING, Status.WAITING_APPROVAL), journal=journal):
        if record.parent:
            continue
        if registry.lease_holder(record.run_id, journal=journal) is not None:
            continue
        batch_id = record.run_id.rpartition("/")[0]
        if record.deadline is not None and time.time() > record.deadline:
            record.status = Status.FAILED
            record.error = "expired on resume: the deadline passed while it was interrupted"
            journal.put_run(record)
            lines.append(f"{record.run_id}: expired (deadline {time.ctime(record.deadline)}), "
                         f"marked FAILED")
        elif batch_id in batches:
            left.setdefault(batch_id, Counter())[record.status] += 1
        else:
            lines.append(_describe_run(record))
    for batch_id, counts in left.items():
        parts = []
        if counts[Status.RUNNING]:
            parts.append(f"{counts[Status.RUNNING]} item{'s' if counts[Status.RUNNING] != 1 else ''}"
                         f" interrupted")
        if counts[Status.WAITING_APPROVAL]:
            parts.append(f"{counts[Status.WAITING_APPROVAL]} waiting for approval")
        lines.append(f"{batch_id}: batch with {' and '.join(parts)}; re-run its cell to finish "
                     f"it (`%durable batch show {batch_id}` lists the items)")
    return lines


def _describe_run(record: RunRecord) -> str:
    if record.status is Status.WAITING_APPROVAL:
        name = (record.pending_approval or {}).get("name")
        return (f"{record.run_id}: waiting for approval of {name!r} at iteration "
                f"{record.iteration}; re-run its cell to show the buttons, or "
                f"`%durable approve {record.run_id}`")
    return (f"{record.run_id}: interrupted at iteration {record.iteration} "
            f"(step {record.step_count}); re-run its cell to continue")
