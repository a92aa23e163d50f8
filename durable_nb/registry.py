"""The run registry: list, inspect, approve, reject, cancel, reset and delete runs.

These work from any process (another notebook, a terminal via ``durable-nb``); a run executing
elsewhere picks requests up from the journal within its poll interval, one executing in this
process at once.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any

from . import serde
from .errors import JournalError, RunLeased
from .approvals.decide import MIN_DIGEST, decide
from .approvals.decision import Decision
from .approvals.policy import APPROVER_VARIABLE, approver_name
from .approvals.request import (decision_kind, find_decision, find_decisions, pending_digest,
                                taken_decision)
from .journal import (
    Journal,
    JournalSpec,
    RunRecord,
    Status,
    StepEntry,
    copy_run as copy_entries,
    open_journal,
    rerun,
    rewind,
)
from .journal.base import StatusFilter
from .journal.edits import child_runs
from .execution import attempts
from .execution.attempts import stopped_by_interrupt
from .approvals.tick import apply_deadline, write_escalation
from .execution.lease import DEFAULT_STALE_AFTER, Lease, holder_alive
from .execution.live import live_execution

__all__ = ["APPROVER_VARIABLE", "RunInfo", "approve", "approver_name", "batch_rows", "cancel",
           "copy_run", "delete", "get_run", "interrupted_among", "is_interrupted", "lease_holder",
           "recorded_decision", "recorded_decisions", "reject", "rerun_from", "reset",
           "runs", "stopped_by_interrupt"]


@dataclass
class RunInfo(RunRecord):
    """A run record with its steps, as :func:`get_run` returns it."""

    steps: list[StepEntry] = field(default_factory=list)
    executing: bool = False

    @property
    def state(self) -> dict[str, Any]:
        """The run's ``ctx.state`` as its journaled steps leave it."""
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
            {"position": e.position, "key": e.key, "name": e.name, "kind": e.kind, "ok": e.ok,
             "result": e.result, "error": e.error, "started_at": e.started_at,
             "finished_at": e.finished_at, "prompt_tokens": e.prompt_tokens,
             "completion_tokens": e.completion_tokens, "meta": e.meta}
            for e in self.steps]
        return data


def lease_holder(run_id: str, *, journal: JournalSpec = None) -> dict | None:
    """Who executes the run now (pid, host, heartbeat), or None: one read, no steps loaded."""
    holder = open_journal(journal).lease(run_id)
    return holder if holder and holder_alive(holder) else None


def runs(status: StatusFilter = None, *, journal: JournalSpec = None, limit: int | None = None,
         newest_first: bool = False, prefix: str = "") -> list[RunRecord]:
    """All runs (oldest first), or those with ``status`` (any case: ``"done"``; or several:
    ``("running", "waiting_approval")``). ``limit``: at most that many, the first in the
    order asked for (``limit=20, newest_first=True``: the 20 newest); ``prefix``: run ids
    starting with it (a batch's items: ``"BATCH/"``). The journal answers filters and
    limits from an index: a few of 100,000 runs cost what a few runs cost. Reading writes
    nothing: a request past its deadline is listed as it is stored (its effective state:
    :func:`durable_nb.approvals.state.effective_state`); applying the deadline is
    :func:`durable_nb.approvals.tick.tick`'s."""
    journal = open_journal(journal)
    return journal.list_runs_counted(prefix, status=status, limit=limit,
                                     newest_first=newest_first)


def get_run(run_id: str, *, journal: JournalSpec = None) -> RunInfo:
    """The run with its steps; :class:`~durable_nb.errors.UnknownRun` if there is none.
    Reading writes nothing (see :func:`runs`)."""
    journal = open_journal(journal)
    record = journal.get_run(run_id)
    info = RunInfo(**{f.name: getattr(record, f.name) for f in fields(RunRecord)})
    info.steps = list(journal.steps(run_id))
    info.step_count = len(info.steps)
    info.executing = lease_holder(run_id, journal=journal) is not None
    return info


def _decide(run_id: str, approved: bool, note: str | None, by: str | None,
            journal: JournalSpec, expect: str | None, via: str, replace: bool,
            request_id: str | None = None, args: dict | None = None,
            message: str | None = None, answer: dict | None = None) -> Decision:
    """Decide the run's pending approval through :func:`~durable_nb.approvals.decide.decide`,
    bound to the request as read here, or to the one ``request_id`` and ``expect`` (the
    digest, or its first 8 or more characters) name: what the person saw. A deadline that
    passed is applied first (:func:`~durable_nb.approvals.tick.apply_deadline`): a late
    decision is refused, or goes to the approvers the request was escalated to."""
    journal = open_journal(journal)
    if expect is not None and len(expect) < MIN_DIGEST:
        raise ValueError(f"expect={expect!r} is too short to name a request: give "
                         f"{MIN_DIGEST} or more characters of its digest (`durable-nb show "
                         f"{run_id}` prints it).")
    record = journal.get_run(run_id)
    pending = record.pending_approval
    if pending is not None and record.status is Status.WAITING_APPROVAL:
        target = pending.get("run_id", run_id)
        applied = apply_deadline(journal, target, pending)
        if applied is not None and applied[0] == "escalated":
            write_escalation(journal, record, applied[1])
    seen_id = request_id if request_id is not None else (pending or {}).get("id")
    if expect is not None:
        seen_digest = expect
    elif pending is not None:
        seen_digest = pending_digest(pending)
    else:  # nothing waits: refused, naming the last decision the run took, if any
        taken = taken_decision(journal.steps(run_id))
        seen_digest = str((taken.result or {}).get("digest") or "") if taken else ""
        seen_digest = seen_digest if len(seen_digest) >= MIN_DIGEST else "-" * MIN_DIGEST
    decision = decide(journal, run_id, request_id=seen_id, digest=seen_digest,
                      approved=approved, note=note, by=by or approver_name(), via=via,
                      replace=replace, args=args, message=message, answer=answer)
    target = (pending or {}).get("run_id", run_id)
    for waiting in (live_execution(target), live_execution(run_id)):
        if waiting is not None:
            waiting.wake_event.set()
    return Decision(approved, note, decision["by"], args=decision.get("args"),
                    message=decision.get("message"), answer=decision.get("answer"))


def approve(run_id: str, note: str | None = None, *, by: str | None = None,
            expect: str | None = None, request_id: str | None = None,
            replace: bool = False, via: str = "Python", args: dict | None = None,
            answer: dict | None = None, journal: JournalSpec = None) -> Decision:
    """Approve the run's pending approval, as it reads now, or only if it is the request
    whose digest is ``expect`` (what the person saw: ``durable-nb show``, the panel). The
    waiting run goes on (a parked one when it is resumed: by the notebook that parked it,
    or by executing it again); if by then it asks something else, the decision is kept in
    the journal but not applied, and the new request waits for its own.

    A decision is written once: a request decided already (anywhere: a panel, the CLI, the
    Jupyter server, another process racing this one) is refused with
    :class:`~durable_nb.errors.DecisionExists`, which names who decided, how and when.
    Only a person the request allows decides it (its approvers' list, four-eyes:
    :mod:`~durable_nb.approvals.policy`): anyone else is refused with
    :class:`~durable_nb.errors.NotAllowedToDecide`. ``by`` (default
    :func:`approver_name`) is who decides. ``replace=True`` changes a decision the run has
    not taken yet (the run's history keeps both); one the run took never changes. ``via``:
    how it was given, as the history and a refusal say it (``"Python"``; the CLI, a panel,
    the server say their own). ``request_id``: the id of the request the person saw (with
    ``expect``, what a view shows; ``""`` for a request asked before requests had ids); a
    decision then never decides another request, however alike. Without it, the decision
    is for the request pending now (``expect`` still checks its digest). Every path decides through :func:`~durable_nb.approvals.decide.decide`.

    ``args``: approve with edited arguments (a tool call's approval): the tool runs with
    them, live and on replay; they must fit the tool's JSON schema, else
    :class:`~durable_nb.errors.InvalidAnswer` names what is wrong and nothing is written.

    ``answer``: ``{"action": "accept", "content": {...}}``, the answer to an MCP server's
    question (:mod:`durable_nb.approvals.question`), checked against its schema the same
    way; ``durable_nb.mcp.answer`` says it shorter."""
    return _decide(run_id, True, note, by, journal, expect, via, replace, request_id,
                   args=args, answer=answer)


def reject(run_id: str, note: str | None = None, *, by: str | None = None,
           expect: str | None = None, request_id: str | None = None,
           replace: bool = False, via: str = "Python", message: str | None = None,
           answer: dict | None = None, journal: JournalSpec = None) -> Decision:
    """Reject the run's pending approval (``expect``, ``request_id``, ``replace`` and
    ``via`` as for :func:`approve`: written once); ``ctx.approval`` returns
    ``approved=False``. ``message``: what the model receives as the rejected tool call's
    answer (``"Denied: use the staging database"``), so that its loop goes on with it.
    ``answer``: ``{"action": "decline"}`` or ``{"action": "cancel"}`` to an MCP server's
    question."""
    return _decide(run_id, False, note, by, journal, expect, via, replace, request_id,
                   message=message, answer=answer)


def cancel(run_id: str, *, journal: JournalSpec = None) -> RunRecord:
    """Stop the run cleanly at its next step boundary (journal intact, status CANCELLED).
    Executing it again resumes it. A run nobody executes is marked CANCELLED under its
    lease, so an executor starting meanwhile is never overwritten."""
    journal = open_journal(journal)
    record = journal.get_run(run_id)
    if record.status is Status.DONE:
        return record
    journal.put_request("cancel", run_id, {"at": time.time()})
    live = live_execution(run_id)
    if live is not None:
        live.cancel_event.set()
        live.wake_event.set()
        return record
    try:
        with _holding(journal, run_id, "cancel") as token:
            record = journal.get_run(run_id)
            if record.status is not Status.DONE:
                record.status = Status.CANCELLED
                record.error = "cancelled"
                journal.put_run(record, token=token)
    except RunLeased:
        pass  # its executor reads the request at its next step
    return record


@contextmanager
def _holding(journal: Journal, run_id: str, action: str) -> Iterator[str]:
    """Hold the run's lease while it is edited: yields the token every write of the edit
    carries, so the edit is all done under the lease or refused (RunLeased) once it moved."""
    try:
        lease = Lease.acquire(journal, run_id)
    except RunLeased as exc:
        raise RunLeased(run_id, exc.holder, advice=(
            f"cancel it first (`durable-nb cancel {run_id}` or the panel's Cancel button), "
            f"then {action} it once it has stopped.")) from None
    stop = threading.Event()
    heartbeat = threading.Thread(target=_renew_until, args=(lease, stop), daemon=True,
                                 name=f"durable-nb-edit-{run_id}")
    heartbeat.start()
    try:
        yield lease.token
    finally:
        stop.set()
        heartbeat.join()
        try:
            lease.release()
        except (OSError, JournalError):
            pass  # a dead lease is taken over by the next executor anyway


def _renew_until(lease: Lease, stop: threading.Event) -> None:
    """Renew ``lease`` until ``stop`` is set, so that a long edit (a copy) keeps it; once it
    is lost, the edit's fenced writes are refused."""
    while not stop.wait(DEFAULT_STALE_AFTER / 3):
        try:
            if not lease.renew():
                return
        except (OSError, JournalError):
            pass  # tried again at the next beat


def _entries_before(journal: Journal, record: RunRecord, from_step: int,
                    action: str) -> list[StepEntry]:
    """The run's entries before ``from_step``, which must be one of its steps."""
    count = journal.count_steps(record.run_id, record.step_count)
    if not isinstance(from_step, int) or not 0 <= from_step < count:
        last = f"0 to {count - 1}" if count else "none: the run has no steps"
        raise ValueError(f"cannot {action} run {record.run_id!r} from step {from_step}: its "
                         f"steps are numbered {last}. See `durable-nb show {record.run_id}`.")
    # Only these are read: a step that cannot be read is reset by resetting from it.
    return list(itertools.islice(journal.steps(record.run_id), from_step))


def reset(run_id: str, from_step: int = 0, *, journal: JournalSpec = None) -> RunRecord:
    """Forget steps ``from_step`` and later, so that they execute again on the next run,
    with the child runs of the child steps forgotten.

    Tokens and iterations are recounted from the steps that remain. The run must not be
    executing (its lease is held for the edit), and ``from_step`` must be one of its steps.
    The run's history notes the reset on its latest attempt (how many steps it forgot, to
    which step): ``show``, the panel and the export say so.
    """
    journal = open_journal(journal)
    journal.get_run(run_id)
    with _holding(journal, run_id, "reset") as token:
        record = journal.get_run(run_id)
        kept = _entries_before(journal, record, from_step, "reset")
        attempts.note_reset(record, from_step, record.step_count - len(kept))
        rewind(journal, record, kept, token=token, child_dropped=_at_or_after(from_step))
    return record


def _at_or_after(from_step: int) -> Callable[[str, float], bool]:
    """A positional cut's test for a child run: an unfinished child step (no entry) counts
    as after every journaled step, so its child run is forgotten with the steps."""
    return lambda key, position: position >= from_step


def rerun_from(run_id: str, from_step: int, *, journal: JournalSpec = None) -> str:
    """Keep the run as it is now as a fork (``RUN@N``, listed and exportable, with its child
    runs), then forget its steps from ``from_step`` on, so that executing it again runs them
    anew (the panel's *Re-run from here*). Returns the fork's run id."""
    journal = open_journal(journal)
    journal.get_run(run_id)
    with _holding(journal, run_id, "re-run") as token:
        record = journal.get_run(run_id)
        kept = _entries_before(journal, record, from_step, "re-run")
        return rerun(journal, record, kept, from_step, token=token,
                     child_dropped=_at_or_after(from_step))


def delete(run_id: str, *, journal: JournalSpec = None) -> None:
    """Remove the run and its journal, with its child runs (``RUN/...``; never another run
    whose id starts the same). The run must not be executing."""
    journal = open_journal(journal)
    journal.get_run(run_id)
    with _holding(journal, run_id, "delete") as token:
        journal.delete_run(run_id, token=token,
                           children=[child.run_id for child in child_runs(journal, run_id)])


def copy_run(run_id: str, to: JournalSpec, *, journal: JournalSpec = None,
             new_id: str | None = None, move: bool = False) -> RunRecord:
    """Copy run ``run_id`` with its steps, inputs and child runs from ``journal`` to the
    journal ``to`` (a directory or a ``postgresql://`` URL, either way), as ``new_id``
    (default: the same id); with ``move=True`` the run is then deleted from ``journal``.
    Executing the run against ``to`` replays what the copy holds and goes on from there.

    All or nothing: the copy becomes a run in one step once everything is written, so a
    copy cut short leaves no run behind. The run's lease is held throughout (the run must
    not be executing: cancel it first), so nothing is appended while it is copied, and a
    move deletes only what was copied. A decision already given for its pending approval
    goes with it. Refused, with nothing written, if ``to`` has a run with that id. Returns
    the copy's record."""
    source = open_journal(journal)
    target = open_journal(to)
    new_id = new_id or run_id
    source.get_run(run_id)
    if source is target and new_id == run_id:
        raise ValueError(f"run {run_id!r} is already in {target.location}: give another "
                         f"journal to copy it to, or another id for the copy.")
    with _holding(source, run_id, "move" if move else "copy") as token:
        copied = copy_entries(source, run_id, target, new_id)
        if copied is None:
            raise JournalError(
                f"{target.location} already has a run {new_id!r}: copy it under another id "
                f"(durable-nb copy {run_id} --as NEW), or delete that run there first.")
        family = [source.get_run(run_id), *child_runs(source, run_id)]
        for record in family:
            if not record.pending_approval:
                continue
            kind = decision_kind(record.pending_approval)
            decision = source.get_request(kind, record.run_id)
            if decision is not None:
                target.put_request(kind, new_id + record.run_id[len(run_id):], decision)
        if move:
            try:
                source.delete_run(run_id, token=token,
                                  children=[record.run_id for record in family[1:]])
            except RunLeased:
                # Taken over while it was copied (this process stalled past its lease): the
                # run goes on in the source, so the copy must not exist as a second one.
                target.delete_run(new_id, children=[
                    child.run_id for child in child_runs(target, new_id)])
                raise
    return copied


# -- what a listing shows ---------------------------------------------------------------

def is_interrupted(record: RunRecord, journal: Journal) -> bool:
    """Stopped before it finished, and no live process executes it now: RUNNING in the
    journal but its process died (SIGKILL, a crash), or FAILED by an interrupt (Kernel >
    Restart interrupts the kernel before it exits, the kernel's stop button, Ctrl-C), which
    no step failed in. Either way executing it again resumes it. A run reset since its last
    attempt is RUNNING too, but nothing was interrupted: it is not."""
    return _stopped(record) and lease_holder(record.run_id, journal=journal) is None


def _stopped(record: RunRecord) -> bool:
    """:func:`is_interrupted` as far as the record says (its lease not read)."""
    if record.status is Status.RUNNING:
        return attempts.last_reset(record) is None
    return record.status is Status.FAILED and stopped_by_interrupt(record)


def interrupted_among(records: Iterable[RunRecord], journal: Journal) -> set[str]:
    """The ids of the runs of ``records`` that :func:`is_interrupted` says are, their
    leases read at once (:meth:`~durable_nb.journal.Journal.leases_of`)."""
    stopped = [r.run_id for r in records if _stopped(r)]
    leases = journal.leases_of(stopped) if stopped else {}
    return {run_id for run_id in stopped
            if not (leases.get(run_id) and holder_alive(leases[run_id]))}


def recorded_decisions(records: Iterable[RunRecord], journal: Journal) -> dict[str, dict]:
    """:func:`recorded_decision` for each record, the decisions read at once: by run id, the
    runs that have one."""
    asking = [(r, r.pending_approval) for r in records
              if r.status is Status.WAITING_APPROVAL and r.pending_approval]
    found = find_decisions(journal, [(pending.get("run_id", r.run_id), pending)
                                     for r, pending in asking])
    return {r.run_id: decision for (r, _), decision in zip(asking, found)
            if decision is not None}


def recorded_decision(info: RunRecord, journal: Journal) -> dict | None:
    """The decision given (``durable-nb approve``, a panel, another notebook) on the run's
    pending approval that the run has not taken yet, because no execution of it has
    resumed since: ``{"approved", "by", "via", "at", "note"}`` (and ``replaced``: the
    decisions it replaced); None when there is none."""
    pending = info.pending_approval
    if info.status is not Status.WAITING_APPROVAL or not pending:
        return None
    return find_decision(journal, pending.get("run_id", info.run_id), pending)


def batch_rows(journal: Journal) -> list[dict[str, Any]]:
    """One row per batch (oldest first): id, title, items, counts by status, tokens, cost,
    updated."""
    rows = []
    for record in journal.list_batches():
        runs = {r.run_id: r for r in journal.list_runs(f"{record.batch_id}/")}
        items = [runs.get(f"{record.batch_id}/{key}") for key in record.keys]
        counts = Counter(r.status.value if r is not None else "PENDING" for r in items)
        rows.append({"batch_id": record.batch_id, "title": record.title,
                     "items": len(record.keys), "counts": dict(counts),
                     "tokens": sum(r.tokens for r in items if r is not None),
                     "cost": sum(r.cost for r in items if r is not None),
                     "removed": len(record.removed),
                     "updated_at": max([record.updated_at]
                                       + [r.updated_at for r in items if r is not None])})
    return rows
