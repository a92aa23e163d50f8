"""The run registry: list, inspect, approve, reject, cancel, reset and delete runs.

These work from any process (another notebook, a terminal via ``durable-nb``); a run executing
elsewhere picks requests up from the journal within its poll interval, one executing in this
process at once.
"""

from __future__ import annotations

import getpass
import time
from dataclasses import dataclass, field, fields
from typing import Any

from .context import Decision
from .errors import NoPendingApproval, RunLeased
from .journal import Journal, RunRecord, Status, StepEntry, open_journal, this_host
from .lease import holder_alive
from .runner import live_execution

__all__ = ["RunInfo", "approve", "cancel", "delete", "get_run", "lease_holder", "reject", "reset",
           "runs"]


@dataclass
class RunInfo(RunRecord):
    """A run record with its steps, as :func:`get_run` returns it."""

    steps: list[StepEntry] = field(default_factory=list)
    executing: bool = False

    @property
    def state(self) -> dict[str, Any]:
        """The run's ``ctx.state`` as its journaled steps leave it."""
        from . import serde

        state: dict[str, Any] = {}
        for entry in self.steps:
            if entry.kind == "state" and entry.ok:
                change = serde.decode(entry.result)
                if "set" in change:
                    state[entry.name] = change["set"]
                else:
                    state.pop(entry.name, None)
        return state

    def to_dict(self) -> dict[str, Any]:
        """JSON data for ``durable-nb show --json``."""
        data = {f.name: getattr(self, f.name) for f in fields(RunRecord)}
        data["status"] = self.status.value
        data["executing"] = self.executing
        data["state"] = self.state
        data["steps"] = [
            {"position": e.position, "name": e.name, "kind": e.kind, "ok": e.ok,
             "result": e.result, "error": e.error, "started_at": e.started_at,
             "finished_at": e.finished_at, "prompt_tokens": e.prompt_tokens,
             "completion_tokens": e.completion_tokens, "meta": e.meta}
            for e in self.steps]
        return data


def lease_holder(run_id: str, *, journal: Journal | str | None = None) -> dict | None:
    """Who executes the run now (pid, host, heartbeat), or None: one read, no steps loaded."""
    journal = open_journal(journal)
    holder = journal.read_json(f"lease:{run_id}")
    return holder if holder and holder_alive(holder) else None


def runs(status: Status | str | None = None, *, journal: Journal | str | None = None
         ) -> list[RunRecord]:
    """All runs (oldest first), or those with ``status``."""
    journal = open_journal(journal)
    wanted = Status(status) if status is not None else None
    records = [journal.find_run(run_id) for run_id in journal.run_ids()]
    return [r for r in records if r is not None and (wanted is None or r.status is wanted)]


def get_run(run_id: str, *, journal: Journal | str | None = None) -> RunInfo:
    """The run with its steps; :class:`UnknownRun` if there is none."""
    journal = open_journal(journal)
    record = journal.get_run(run_id)
    info = RunInfo(**{f.name: getattr(record, f.name) for f in fields(RunRecord)})
    info.steps = list(journal.steps(run_id))
    info.executing = lease_holder(run_id, journal=journal) is not None
    return info


def _decide(run_id: str, approved: bool, note: str | None, by: str | None,
            journal: Journal | str | None) -> Decision:
    journal = open_journal(journal)
    record = journal.get_run(run_id)
    pending = record.pending_approval
    if pending is None:
        raise NoPendingApproval(
            f"run {run_id!r} is not waiting for an approval (status {record.status}). "
            f"See `durable-nb show {run_id}`.")
    target = pending.get("run_id", run_id)
    by = by or f"{getpass.getuser()}@{this_host()}"
    journal.write_json(f"decision:{target}", {
        "position": pending["position"], "approved": approved, "note": note, "by": by,
        "at": time.time()})
    for waiting in (live_execution(target), live_execution(run_id)):
        if waiting is not None:
            waiting.wake_event.set()
    return Decision(approved, note, by)


def approve(run_id: str, note: str | None = None, *, by: str | None = None,
            journal: Journal | str | None = None) -> Decision:
    """Approve the run's pending approval. The waiting run goes on (a parked one when it is
    resumed: by the notebook that parked it, or by executing it again)."""
    return _decide(run_id, True, note, by, journal)


def reject(run_id: str, note: str | None = None, *, by: str | None = None,
           journal: Journal | str | None = None) -> Decision:
    """Reject the run's pending approval; ``ctx.approval`` returns ``approved=False``."""
    return _decide(run_id, False, note, by, journal)


def cancel(run_id: str, *, journal: Journal | str | None = None) -> RunRecord:
    """Stop the run cleanly at its next step boundary (journal intact, status CANCELLED).
    Executing it again resumes it."""
    journal = open_journal(journal)
    record = journal.get_run(run_id)
    if record.status is Status.DONE:
        return record
    journal.write_json(f"cancel:{run_id}", {"at": time.time()})
    live = live_execution(run_id)
    if live is not None:
        live.cancel_event.set()
        live.wake_event.set()
    elif lease_holder(run_id, journal=journal) is None:
        record.status = Status.CANCELLED
        record.error = "cancelled"
        journal.put_run(record)
    return record


def _require_idle(journal: Journal, run_id: str, action: str) -> None:
    holder = lease_holder(run_id, journal=journal)
    if holder is not None:
        raise RunLeased(run_id, holder, advice=(
            f"cancel it first (`durable-nb cancel {run_id}` or the panel's Cancel button), "
            f"then {action} it once it has stopped."))


def reset(run_id: str, from_step: int = 0, *, journal: Journal | str | None = None) -> RunRecord:
    """Forget steps ``from_step`` and later, so that they execute again on the next run.

    Tokens and iterations are recounted from the steps that remain. The run must not be
    executing.
    """
    journal = open_journal(journal)
    record = journal.get_run(run_id)
    if from_step < 0:
        raise ValueError(f"from_step must be 0 or more, got {from_step}")
    _require_idle(journal, run_id, "reset")
    with journal.transaction():
        journal.truncate(run_id, from_step)
        kept = list(journal.steps(run_id))
        record.prompt_tokens = sum(e.prompt_tokens for e in kept)
        record.completion_tokens = sum(e.completion_tokens for e in kept)
        record.iteration = sum(1 for e in kept if e.kind == "chat")
        record.step_count = len(kept)
        record.status = Status.RUNNING
        record.error = record.result = record.failed_step = None
        if record.pending_approval and record.pending_approval.get("position", 0) >= from_step:
            record.pending_approval = None
            journal.delete_key(f"decision:{run_id}")
        journal.delete_key(f"cancel:{run_id}")
        journal.put_run(record)
    return record


def delete(run_id: str, *, journal: Journal | str | None = None) -> None:
    """Remove the run and its journal. The run must not be executing."""
    journal = open_journal(journal)
    journal.get_run(run_id)
    _require_idle(journal, run_id, "delete")
    journal.delete_run(run_id)
