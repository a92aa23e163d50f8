"""A run's attempts: each execution of a run, journaled with its run record.

An attempt is one execution that held the run's lease: where and when it started, the
position its new steps start at, how many steps it replayed and executed, the source that
ran it, and how it ended. It lives in ``RunRecord.attempts`` as a JSON object, so the CLI,
an export and a Jupyter Server extension read the history without a kernel::

    {"n": 3, "started_at": 1796163262.4, "host": "box", "pid": 4242,
     "via": "kernel", "kernel": "5f0c...",        # or "via": "script", "program": "run.py"
     "from_step": 3,                              # its new steps are positions 3, 4 ...
     "source_hash": "ab12...",                    # the code that ran it (None: unknown)
     "replayed": 3, "executed": 5, "at_step": 8,  # counts, and the journal size at its end
     "end": "completed", "ended_at": 1796163270.1,
     "trace_id": "4bf92f35...", "span_id": "00f067aa..."}  # when traced, from its start

``trace_id`` and ``span_id`` (W3C hex) name the attempt's span when tracing was on
(:mod:`durable_nb.telemetry`), with ``parent_span_id`` when that span had a parent: a later
attempt's trace links to the attempt that executed each step it replays. An attempt that
``died`` traced has its spans sent again by the attempt that closed it (its process took the
spans it had not exported yet with it); ``spans_resent`` (when) says they were, and
``chat_spans_by: "openai-v2"`` that the official openai instrumentation made its chat spans.

``replayed`` is kept up to date while the attempt runs: the record written with a step's
entry holds the replays made before it, so an attempt that dies keeps the count of the
steps it replayed before its last executed step.

How an attempt ended (``end``): ``completed`` (DONE), ``parked`` (waiting for an approval),
``interrupted`` (the kernel's stop button: KeyboardInterrupt), ``kernel-restarted`` (it was
interrupted and its kernel exited within 10 s, which is what Kernel > Restart does: Jupyter
interrupts a kernel before it asks it to shut down; the kernel's exit hook writes it),
``died`` (it never said: killed, crashed, or its kernel restarted while busy past the
interrupt; the next attempt closes it, knowing because the record's last attempt is still
open when it takes the lease), ``input-changed`` (a step's kind, name or inputs changed),
``cancelled``, ``failed``. An attempt that executes the run again from a changed step
(``on_change="rerun"``) keeps going and notes ``rerun_from``. A reset after an attempt
(``registry.reset``: its steps from a position on forgotten) is noted on it in ``resets``
(``{"at", "to_step", "forgot"}``), so that the history says what the reset did. How many
decisions an attempt took is ``decided``: an attempt after one that parked "resumed after the
approval" only if it took one; otherwise it executed again while the approval still waited.
A decision given with ``replace=True`` is noted in ``decisions`` (``{"name", "approved",
"by", "via", "at", "replaced"}``), so that the history keeps both (each approval step has
its own decision; the record, written with every step, stays small).

The record keeps the last :data:`KEEP` attempts and counts the rest in
``attempts_dropped``; a source that differs from the record's own (``RunRecord.source``, the
code that created it) is kept once in ``RunRecord.sources`` by its hash while an attempt
refers to it. Executing a DONE run again only replays it and starts no attempt.
"""

from __future__ import annotations

import atexit
import os
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..errors import JournalError, JournalMismatch, RunCancelled, RunLeased
from ..journal import Journal, RunRecord, Status, this_host
from ..timestamps import format_time
from ..approvals.wording import decision_words
from .lease import Lease

__all__ = ["END_WORDS", "KEEP", "begin", "current", "describe", "end_of", "finish",
           "history_lines", "last_reset", "note_decision", "note_interrupted", "note_replayed",
           "note_rerun", "note_reset", "note_spans_resent", "note_trace", "resumed_words",
           "source_of", "step_sources", "steps_to_retry", "stopped_by_interrupt"]

#: Attempts a record keeps (the older ones are counted in ``attempts_dropped``).
KEEP = 20

#: How a person reads each ending.
END_WORDS = {
    "completed": "completed",
    "parked": "parked for an approval",
    "interrupted": "stopped by the kernel's stop button",
    "kernel-restarted": "stopped by a kernel restart",
    "died": "its process died (killed, crashed, or its kernel restarted)",
    "input-changed": "stopped: a step's input changed",
    "cancelled": "cancelled",
    "failed": "failed",
}

#: "attempt 3: resumed after ..." for each ending of the attempt before.
_AFTER = {
    "completed": "reopened after it completed",
    "parked": "resumed after the approval",
    "interrupted": "resumed after the stop button",
    "kernel-restarted": "resumed after a kernel restart",
    "died": "resumed after its process died",
    "input-changed": "executed again after an input changed",
    "cancelled": "resumed after a cancel",
    "failed": "tried again after a failure",
}

#: Seconds between an interrupt and the kernel's exit for the two to be one restart:
#: Jupyter's restart interrupts the kernel, then asks it to shut down, within a second.
_RESTART_WINDOW = 10.0


def current(record: RunRecord) -> dict | None:
    """The record's latest attempt, or None."""
    return record.attempts[-1] if record.attempts else None


def stopped_by_interrupt(record: RunRecord) -> bool:
    """FAILED by an interrupt (its last attempt ended ``interrupted`` or
    ``kernel-restarted``; a record from before attempts were journaled says so in its
    error)."""
    last = current(record)
    if last is None:
        return (record.error or "").startswith("interrupted at step")
    return last.get("end") in ("interrupted", "kernel-restarted")


def begin(record: RunRecord, from_step: int, source: str | None,
          source_hash: str | None, journal_size: int | None = None) -> dict:
    """Open a new attempt on ``record`` (the caller writes the record, holding the lease).

    A latest attempt still open was left by an executor that died: it is closed as
    ``died`` at ``journal_size`` (what that executor journaled), as of the record's last
    update."""
    last = current(record)
    if last is not None and last.get("end") is None:
        _close_dead(record, last, journal_size)
    attempt: dict[str, Any] = {"n": (last["n"] if last else record.attempts_dropped) + 1,
                               "started_at": time.time(), **_where(), "from_step": from_step,
                               "source_hash": source_hash, "replayed": 0, "executed": 0}
    if source is not None and source_hash != record.source_hash:
        record.sources = {**(record.sources or {}), source_hash: source}
    attempts = [*(record.attempts or ()), attempt]
    if len(attempts) > KEEP:
        record.attempts_dropped += len(attempts) - KEEP
        attempts = attempts[-KEEP:]
    record.attempts = attempts
    _keep_referenced_sources(record)
    return attempt


def _close_dead(record: RunRecord, attempt: dict, journal_size: int | None) -> None:
    """Close an attempt whose executor died (it never said how it ended) at
    ``journal_size`` (what it journaled), as of the record's last update."""
    at_step = journal_size if journal_size is not None else record.step_count
    attempt.update(end="died", ended_at=record.updated_at or None, at_step=at_step,
                   executed=max(0, at_step - attempt.get("from_step", 0)))


def note_reset(record: RunRecord, to_step: int, forgot: int) -> None:
    """Note on the record's latest attempt that the run was reset after it: its steps from
    ``to_step`` on (``forgot`` of them) forgotten, to execute again (the caller writes the
    record, holding the lease). A latest attempt still open, left by an executor that died,
    is closed as ``died`` first. A run journaled before attempts were recorded has none to
    note it on."""
    last = current(record)
    if last is None:
        return
    if last.get("end") is None:
        _close_dead(record, last, None)
    last["resets"] = [*last.get("resets", ()),
                      {"at": time.time(), "to_step": to_step, "forgot": forgot}]


def last_reset(record: RunRecord) -> dict | None:
    """The reset made after the latest attempt (see :func:`note_reset`), if any: nothing
    has executed the run since."""
    last = current(record)
    resets = (last or {}).get("resets")
    return resets[-1] if resets else None


def note_rerun(attempt: dict, position: int, executed: int) -> None:
    """The attempt executes the run again from ``position`` (on_change="rerun"): the steps
    it executed from there are forgotten (kept in the fork) but were executed; the steps
    before are replayed again, and counted once, when it ends."""
    attempt["rerun_from"] = position
    attempt["from_step"] = min(attempt["from_step"], position)
    attempt["executed"] += executed


def note_decision(record: RunRecord, name: str, decision: dict,
                  replaced: list[dict] | None = None) -> None:
    """The record's open attempt took ``decision`` on approval ``name`` (the caller writes
    the record with the approval step): counted, and kept with ``replaced`` (the decisions
    it replaced) when there are any."""
    last = current(record)
    if last is None or last.get("end") is not None:
        return
    last["decided"] = last.get("decided", 0) + 1
    if replaced:
        noted = {"name": name, **{k: decision.get(k) for k in ("approved", "by", "via", "at")
                                  if decision.get(k) is not None}, "replaced": replaced}
        last["decisions"] = [*last.get("decisions", ()), noted]


def note_trace(attempt: dict, trace_id: str, span_id: str,
               parent_span_id: str | None = None) -> None:
    """The attempt is traced: its span's ids (and its parent's, if it has one), written with
    the record that opens it."""
    attempt.update(trace_id=trace_id, span_id=span_id)
    if parent_span_id:
        attempt["parent_span_id"] = parent_span_id


def note_spans_resent(attempt: dict) -> None:
    """The spans of an attempt that died were sent again (written with the record of the
    attempt that sent them: they are sent once a record says so, never again)."""
    attempt["spans_resent"] = time.time()


def note_replayed(record: RunRecord, replayed: int) -> bool:
    """The record's open attempt has replayed ``replayed`` steps so far; True when that
    changed its count (the caller writes the record with its next entry, so that an attempt
    that dies keeps it)."""
    attempt = record.attempts[-1] if record.attempts else None
    if attempt is None or attempt.get("end") is not None \
            or attempt.get("replayed") == replayed:
        return False
    attempt["replayed"] = replayed
    return True


def finish(attempt: dict, end: str, at_step: int, replayed: int, executed: int,
           error: str | None = None) -> None:
    """Close ``attempt``: how it ended, where, and what it did."""
    attempt.update(end=end, ended_at=time.time(), at_step=at_step, replayed=replayed,
                   executed=attempt["executed"] + executed)
    if error:
        attempt["error"] = error if len(error) <= 300 else error[:299] + "\u2026"


def end_of(status: Status, error: BaseException | None, interrupted: bool) -> str:
    """How an execution ended, from the run's status after it and what it raised."""
    if error is None:
        return {Status.DONE: "completed", Status.WAITING_APPROVAL: "parked",
                Status.CANCELLED: "cancelled"}.get(status, "failed")
    if interrupted or isinstance(error, KeyboardInterrupt):
        return "interrupted"
    if isinstance(error, JournalMismatch):
        return "input-changed"
    if isinstance(error, RunCancelled) or status is Status.CANCELLED:
        return "cancelled"
    return "failed"


# -- reading ---------------------------------------------------------------------------------

def resumed_words(record: RunRecord, attempt: dict | None = None) -> str | None:
    """``attempt 3: resumed after a kernel restart at step 3``; None for a first attempt
    that started from the beginning."""
    attempt = attempt or current(record)
    if attempt is None:
        return None
    attempts = record.attempts or []
    index = next((i for i, a in enumerate(attempts) if a is attempt or a == attempt), None)
    before = attempts[index - 1] if index else None
    step = attempt.get("from_step") or 0
    if before is not None and before.get("resets"):
        return (f"attempt {attempt['n']}: executed again after a reset to step "
                f"{before['resets'][-1]['to_step']}")
    if before is not None:
        after = ("resumed after an interrupt" if _interrupted_outside_kernel(before)
                 else _AFTER.get(str(before.get("end")), "resumed"))
        if before.get("end") == "parked" and not attempt.get("decided"):
            # It took no decision (yet): not "after the approval".
            after = ("resumed after it parked for an approval" if attempt.get("end") is None
                     else "executed again while its approval waited for a decision")
        at = before.get("at_step")
        return f"attempt {attempt['n']}: {after} at step {at if at is not None else step}"
    if attempt["n"] > 1 or step:
        return f"attempt {attempt['n']}: resumed at step {step}"
    return None


def describe(attempt: dict, where: bool = True) -> str:
    """One attempt as a line: when, where (the kernel or program; with ``where``, its pid
    and host), what it did, how it ended."""
    ran = (f"kernel {str(attempt['kernel'])[:8]}" if attempt.get("kernel")
           else str(attempt.get("program") or attempt.get("via") or "process"))
    if where:
        ran += f" (pid {attempt.get('pid')} on {attempt.get('host')})"
    head = f"attempt {attempt['n']}  {format_time(attempt.get('started_at'), '?')}  {ran}"
    end = attempt.get("end")
    if end is None:
        return f"{head}: running"  # its counts are written when it ends
    if end == "died" and not attempt.get("replayed") and attempt.get("from_step"):
        # Journaled before an attempt kept its replays as it went (or it died replaying).
        done = f"executed {attempt.get('executed', 0)} (its replays were not counted)"
    else:
        done = f"replayed {attempt.get('replayed', 0)}, executed {attempt.get('executed', 0)}"
    if attempt.get("rerun_from") is not None:
        done += f", executed again from step {attempt['rerun_from']}"
    how = _end_words(attempt)
    if attempt.get("at_step") is not None:
        how += f" at step {attempt['at_step']}"
    if attempt.get("error") and end in ("failed", "input-changed", "cancelled"):
        how += f": {attempt['error']}"
    for taken in attempt.get("decisions", ()):  # those that replaced a decision
        how += f"; took {_decision_line(taken)}"
    for reset in attempt.get("resets", ()):
        how += (f"; then reset to step {reset['to_step']} at {format_time(reset.get('at'), '?')} "
                f"({reset['forgot']} step{'' if reset['forgot'] == 1 else 's'} forgotten)")
    return f"{head}: {done}; {how}"


def _decision_line(decision: dict) -> str:
    """``'deploy' approved by ana via panel at 2026-12-03 10:02:11 (replacing rejected by bo
    via durable-nb at 2026-12-03 10:01:05)``."""
    return f"{decision.get('name')!r} {decision_words(decision, timed=True)}"


def _interrupted_outside_kernel(attempt: dict) -> bool:
    return attempt.get("end") == "interrupted" and attempt.get("via") != "kernel"


def _end_words(attempt: dict) -> str:
    if _interrupted_outside_kernel(attempt):
        return "interrupted (KeyboardInterrupt)"
    return END_WORDS.get(str(attempt["end"]), str(attempt["end"]))


def history_lines(record: RunRecord) -> list[str]:
    """The run's attempts as lines, oldest first, with a line for those no longer kept."""
    lines = []
    if record.attempts_dropped:
        lines.append(f"({record.attempts_dropped} earlier attempts not kept)")
    lines += [describe(a) for a in record.attempts or ()]
    return lines


def source_of(record: RunRecord, attempt: dict) -> str | None:
    """The source that ran ``attempt``, if it was recorded."""
    digest = attempt.get("source_hash")
    if digest is None:
        return None
    if digest == record.source_hash:
        return record.source
    return (record.sources or {}).get(digest)


def step_sources(record: RunRecord) -> list[tuple[int, dict | None, str | None]]:
    """Which code produced which steps: ``(first position, attempt, source)`` for each run
    of consecutive steps made by the same source, in position order. A step belongs to the
    latest attempt whose new steps start at or before it (a later attempt executing from
    an earlier position replaced what came after). Without attempts (a run journaled
    before they were recorded) the whole run is the record's source."""
    attempts = record.attempts or []
    if not attempts:
        return [(0, None, record.source)] if record.source else []
    owners: list[tuple[int, dict]] = []  # (from_step, attempt), from_step increasing
    for attempt in attempts:
        start = attempt.get("from_step") or 0
        if attempt.get("at_step") is not None and attempt["at_step"] <= start:
            continue  # made no step
        while owners and owners[-1][0] >= start:
            owners.pop()
        owners.append((start, attempt))
    segments: list[tuple[int, dict | None, str | None]] = []
    if record.source and (not owners or owners[0][0] > 0):
        segments.append((0, None, record.source))  # executions before attempts were kept
    for start, attempt in owners:
        source = source_of(record, attempt)
        if segments and segments[-1][2] == source:
            continue
        segments.append((start, attempt, source))
    return segments


# -- where an attempt runs -------------------------------------------------------------------

def _where() -> dict[str, Any]:
    """Where this process runs attempts: a kernel (by id), else the program (``durable-nb``,
    ``pytest``, a script's file name)."""
    kernel = _kernel_id()
    where: dict[str, Any] = {"host": this_host(), "pid": os.getpid()}
    if kernel:
        where.update(via="kernel", kernel=kernel)
    else:
        program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
        where.update(via="script", program=program if program not in ("", "-", "-c")
                     else "python")
    return where


def _kernel_id() -> str | None:
    """The id of the Jupyter kernel this process is, from its connection file's name."""
    app_module = sys.modules.get("ipykernel.kernelapp")
    if app_module is None or not app_module.IPKernelApp.initialized():
        return None
    name = Path(str(app_module.IPKernelApp.instance().connection_file or "")).stem
    return name.removeprefix("kernel-") or None


def _keep_referenced_sources(record: RunRecord) -> None:
    if not record.sources:
        return
    used = {a.get("source_hash") for a in record.attempts or ()}
    record.sources = {h: s for h, s in record.sources.items() if h in used} or None


# -- a kernel restart --------------------------------------------------------------------------

_interrupted_here: list[tuple[Journal, str, int, float]] = []
_exit_lock = threading.Lock()
_exit_hooked = False


def note_interrupted(journal: Journal, run_id: str, n: int) -> None:
    """Attempt ``n`` of the run was interrupted in this kernel: if the kernel exits right
    after (a restart interrupts first), it is marked ``kernel-restarted`` on the way out."""
    global _exit_hooked
    if _kernel_id() is None:
        return  # only a kernel is interrupted by a restart
    with _exit_lock:
        _interrupted_here.append((journal, run_id, n, time.monotonic()))
        if not _exit_hooked:
            atexit.register(_mark_restarts)
            _exit_hooked = True


def _mark_restarts() -> None:
    """At the kernel's exit: the attempts it interrupted within the window were stopped by
    a restart. Written holding the run's lease; a run someone else executes is left alone
    (their attempt already closed ours)."""
    now = time.monotonic()
    for journal, run_id, n, at in _interrupted_here:
        if now - at > _RESTART_WINDOW:
            continue
        try:
            lease = Lease.acquire(journal, run_id)
        except (RunLeased, JournalError, OSError, sqlite3.Error):
            continue
        try:
            record = journal.get_run(run_id)
            last = current(record)
            if last is not None and last["n"] == n and last.get("end") == "interrupted":
                last["end"] = "kernel-restarted"
                journal.put_run(record, token=lease.token)
        except (RunLeased, JournalError, OSError, sqlite3.Error):
            pass  # the process is exiting: the attempt stays "interrupted"
        finally:
            try:
                lease.release()
            except (JournalError, OSError, sqlite3.Error):
                pass  # a dead lease is taken over by the next executor anyway


def steps_to_retry(journal: Journal, record: RunRecord) -> list[int]:
    """The positions of the entries a resume of ``record`` tries again, ascending: for a
    FAILED run, the step whose unhandled failure failed it and the steps that enclosed it
    and failed because of it; none when the run did not fail at a step or the step declared
    its failure terminal. The one choice both a resume (:mod:`durable_nb.runner`) and a dry
    replay (:mod:`durable_nb.checking.dry`) make."""
    if record.status is not Status.FAILED or record.failed_step is None:
        return []
    first = journal.get_step(record.run_id, record.failed_step)
    if first is None or first.ok or (first.error or {}).get("terminal"):
        return []
    retry = [first.position]
    for entry in journal.steps(record.run_id, first.position + 1):
        if not entry.ok and first.key.startswith(entry.key + "."):
            retry.append(entry.position)  # a step that enclosed it, failed by it
    return retry
