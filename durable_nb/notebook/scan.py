"""What ``%load_ext durable_nb`` says about runs a dead kernel left behind."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator

from .. import registry
from ..execution import attempts
from ..journal import Journal, RunRecord, Status, this_host
from ..timestamps import format_time

__all__ = ["describe_unfinished"]


def describe_unfinished(journal: Journal) -> list[str]:
    """Lines about runs left RUNNING or WAITING_APPROVAL by a dead kernel, and runs FAILED
    because another process was interrupted while executing them (Kernel > Restart
    interrupts the kernel before it stops it); expired ones are marked FAILED ("expired on
    resume") on the way. The items of a batch are told as one line per batch."""
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
            lines.append(f"{record.run_id}: expired (deadline {format_time(record.deadline)}), "
                         f"marked FAILED")
        elif batch_id in batches:
            left.setdefault(batch_id, Counter())[record.status] += 1
        else:
            lines.append(_describe_run(record, journal))
    for record, how in _interrupted(journal):
        batch_id = record.run_id.rpartition("/")[0]
        if batch_id in batches:
            left.setdefault(batch_id, Counter())[Status.RUNNING] += 1
        else:
            lines.append(f"{record.run_id}: {how} at iteration {record.iteration} "
                         f"(step {record.step_count}); re-run its cell to continue")
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


def _interrupted(journal: Journal) -> Iterator[tuple[RunRecord, str]]:
    """Top-level FAILED runs whose last execution, in another process, was interrupted: by
    a kernel restart, the stop button before the kernel went away, or (records from before
    attempts were journaled) an interrupt of unknown origin; with how, in words."""
    for record in registry.runs((Status.FAILED,), journal=journal):
        if record.parent:
            continue
        last = attempts.current(record)
        if last is None:
            if not (record.error or "").startswith("interrupted at step"):
                continue
            how = "interrupted"
        elif last.get("end") in ("interrupted", "kernel-restarted"):
            if last.get("pid") == os.getpid() and last.get("host") == this_host():
                continue  # this kernel's own stop button: the cell said so
            how = ("interrupted by a kernel restart" if last["end"] == "kernel-restarted"
                   else "interrupted")
        else:
            continue
        yield record, how


def _describe_run(record: RunRecord, journal: Journal) -> str:
    if record.status is Status.WAITING_APPROVAL:
        name = (record.pending_approval or {}).get("name")
        decided = registry.recorded_decision(record, journal)
        if decided is not None:  # decided elsewhere (a terminal, the Jupyter server)
            verdict = "approved" if decided.get("approved") else "rejected"
            how = f" via {decided['via']}" if decided.get("via") else ""
            return (f"{record.run_id}: {name!r} {verdict} by {decided.get('by') or 'someone'}"
                    f"{how}, re-run its cell to continue")
        return (f"{record.run_id}: waiting for approval of {name!r} at iteration "
                f"{record.iteration}; re-run its cell to show the buttons, or "
                f"`%durable approve {record.run_id}`")
    return (f"{record.run_id}: interrupted at iteration {record.iteration} "
            f"(step {record.step_count}); re-run its cell to continue")
