"""What ``%load_ext durable_nb`` says about runs a dead kernel left behind."""

from __future__ import annotations

import time

from .. import registry
from ..journal import Journal, Status

__all__ = ["describe_unfinished"]


def describe_unfinished(journal: Journal) -> list[str]:
    """Lines about runs left RUNNING or WAITING_APPROVAL by a dead kernel; expired ones are
    marked FAILED ("expired on resume") on the way."""
    lines = []
    for record in registry.runs(journal=journal):
        if record.status not in (Status.RUNNING, Status.WAITING_APPROVAL) or record.parent:
            continue
        if registry.lease_holder(record.run_id, journal=journal) is not None:
            continue
        if record.deadline is not None and time.time() > record.deadline:
            record.status = Status.FAILED
            record.error = "expired on resume: the deadline passed while it was interrupted"
            journal.put_run(record)
            lines.append(f"{record.run_id}: expired (deadline {time.ctime(record.deadline)}), "
                         f"marked FAILED")
        elif record.status is Status.WAITING_APPROVAL:
            name = (record.pending_approval or {}).get("name")
            lines.append(f"{record.run_id}: waiting for approval of {name!r} at iteration "
                         f"{record.iteration}; re-run its cell to show the buttons, or "
                         f"`%durable approve {record.run_id}`")
        else:
            lines.append(f"{record.run_id}: interrupted at iteration {record.iteration} "
                         f"(step {record.step_count}); re-run its cell to continue")
    return lines
