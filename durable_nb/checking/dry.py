"""A dry replay: a run's handler executed with every step answered from the journal and
nothing else.

:class:`DryExecution` is the step cursor in pure replay (``strict``), which never runs a
step's function: a journaled step returns (or raises) its journaled outcome, and the first
step the journal cannot answer, or answers for other inputs, stops the handler with
:class:`DryStop` (a ``BaseException``, so the handler's ``except Exception`` does not keep it
going) and is noted as the run's finding. So no model request is sent, no tool runs, no
approval is asked, no sleep waits. It holds no lease, has no observer, writes nothing: the
only journal calls it makes are reads (its writer never gets an entry), and :func:`dry_replay`
is given a journal opened read-only where it can be.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from .. import serde
from ..approvals.request import pending_digest, request_digest
from ..errors import DurableError, InputChanged, JournalMismatch
from ..execution import Execution, NullObserver, canonical, first_difference, load_request
from ..execution.attempts import steps_to_retry
from ..journal import Journal, RunRecord, Status, StepEntry
from ..options import RunOptions
from ..runner import call_handler
from .results import DIVERGES, REPLAYS, WOULD_EXECUTE, RunCheck

__all__ = ["DryExecution", "DryStop", "dry_replay"]


class DryStop(BaseException):
    """Unwinds the handler at the first step a dry replay cannot answer."""


class DryExecution(Execution):
    """An execution of a run in pure replay that stops, instead of raising, at the first
    step the journal does not answer, and keeps what it found in :attr:`finding`."""

    def __init__(self, journal: Journal, record: RunRecord, options: RunOptions) -> None:
        super().__init__(_BlobsReadOnce(journal), record, options,  # type: ignore[arg-type]
                         NullObserver(), token="", start_child=_no_child, strict=True)
        #: The first step not answered, as the fields of its RunCheck (``verdict``,
        #: ``change``, ``position``, ``key``, ``step``, and ``journaled``/``asked`` for the
        #: diff, ``approval``); None while every step was answered.
        self.finding: dict[str, Any] | None = None

    def check_live(self) -> None:
        if self.finding is not None:
            raise DryStop()

    def not_journaled(self, key: str, kind: str, name: str, inputs: Any) -> None:
        step = f"{kind} {name!r}"
        finding = {"verdict": WOULD_EXECUTE, "key": key, "step": step,
                   "position": self.replay_log.size}
        retried = self._retried(key)
        if self.record.status is Status.DONE:  # as executing it would: JournalMismatch
            finding.update(verdict=DIVERGES, journaled={"step": "the end of the run"},
                           asked={"step": step}, change=(
                               f"step {self.replay_log.size}: the run is DONE with "
                               f"{self.replay_log.size} steps, but the code now asks for a "
                               f"new step {key} ({step})"))
        elif kind == "approval":
            finding["approval"] = name
            finding["change"] = self._approval_words(key, name, (inputs or {}).get("details"))
        elif retried is not None:
            finding["change"] = (f"step {retried.position} ({step}) failed the run; resuming "
                                 f"executes it again")
            finding["position"] = retried.position
        else:
            finding["change"] = f"step {self.replay_log.size} ({step}) is new: resuming executes it"
        self._stop(finding)

    def diverged(self, entry: StepEntry, error: JournalMismatch, inputs: Any) -> None:
        step = f"{entry.kind} {entry.name!r}"
        finding = {"verdict": DIVERGES, "key": entry.key, "position": entry.position,
                   "step": step}
        if isinstance(error, InputChanged):
            finding["change"] = f"step {entry.position} ({step}): {error.change}"
            finding["journaled"] = self._journaled_inputs(entry)
            finding["asked"] = canonical(inputs) if inputs else None
        else:
            finding["change"] = (f"step {entry.position}: the journal holds {error.journaled}, "
                                 f"the code now asks for {error.requested}")
            finding["journaled"] = {"step": error.journaled}
            finding["asked"] = {"step": error.requested}
        self._stop(finding)

    def check_all_replayed(self) -> None:
        """At the handler's return: a diverging finding if journaled steps were never
        asked for (the code now makes fewer or other steps)."""
        rest = self.replay_log.rest()
        if not rest:
            return
        first = rest[0]
        keys = ", ".join(f"{e.key} ({e.kind} {e.name!r})" for e in rest[:3]) + (
            f" and {len(rest) - 3} more" if len(rest) > 3 else "")
        self.finding = {
            "verdict": DIVERGES, "key": first.key, "position": first.position,
            "step": f"{first.kind} {first.name!r}",
            "change": (f"step {first.position}: the code ended without asking for journaled "
                       f"steps {keys}"),
            "journaled": [{"key": e.key, "step": f"{e.kind} {e.name!r}"} for e in rest],
            "asked": []}

    def sleep(self, seconds: float) -> None:
        """The journaled wake-up time, not slept: nothing waits in a dry replay."""
        self.step("sleep", "sleep", _never, inputs={"seconds": seconds})

    def _stop(self, finding: dict[str, Any]) -> None:
        if self.finding is None:
            self.finding = finding
        raise DryStop()

    def _retried(self, key: str) -> StepEntry | None:
        failed = self.record.failed_step
        if failed is None or failed not in (self.record.retried_steps or ()):
            return None
        entry = self.journal.get_step(self.run_id, failed)
        return entry if entry is not None and entry.key == key else None

    def _approval_words(self, key: str, name: str, details: Any) -> str:
        pending = self.record.pending_approval
        step = f"step {self.replay_log.size} (approval {name!r})"
        if not pending or pending.get("key") != key:
            return f"{step} is new: resuming asks for it"
        if pending_digest(pending) == request_digest(name, details):
            return f"{step}: parked, waiting for approval of {name!r}; resuming goes on from it"
        return (f"{step}: parked, waiting for approval of {pending.get('name')!r}, but the "
                f"code now asks it with other details; resuming asks again (a decision given "
                f"for the pending request is not applied)")

    def _journaled_inputs(self, entry: StepEntry) -> Any:
        if entry.request is None:
            return None
        return load_request(entry.request,
                            lambda digest: self.journal.get_blob(self.run_id, digest))


class _BlobsReadOnce:
    """The journal, its blobs read once: the change's one line and its diff load the same
    inputs, and on PostgreSQL every read is a round trip. Everything else is the journal's."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self._blobs: dict[tuple[str, str], str | None] = {}

    def get_blob(self, run_id: str, digest: str) -> str | None:
        if (run_id, digest) not in self._blobs:
            self._blobs[run_id, digest] = self._journal.get_blob(run_id, digest)
        return self._blobs[run_id, digest]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._journal, name)


def _no_child(*_: Any) -> Any:
    raise AssertionError("a dry replay never starts a child run")  # new steps stop first


def _never() -> Any:
    raise AssertionError("a dry replay never runs a step's function")


def dry_replay(journal: Journal, record: RunRecord, handler: Callable[[Any], Any],
               options: RunOptions) -> RunCheck:
    """Execute ``handler(ctx)`` against run ``record``'s journal, every step answered from
    it and nothing executed or written; how the run fits the handler."""
    record = RunRecord.from_json(record.to_json())  # the check's own copy
    _skip_failed_steps(journal, record)
    execution = DryExecution(journal, record, options)
    raised: BaseException | None = None
    value: Any = None
    try:
        value = call_handler(handler, execution)
    except DryStop:
        pass
    except Exception as exc:  # noqa: BLE001 - what the handler raises is the run's outcome
        raised = exc
    if execution.finding is None and raised is None:
        execution.check_all_replayed()
    matched = execution.replay_log.taken
    found = execution.finding
    if found is not None:
        if found["verdict"] == DIVERGES:
            matched = min(matched, found["position"])
        return RunCheck(record.run_id, found["verdict"], record.status, matched,
                        found["change"], position=found.get("position"), key=found["key"],
                        step=found["step"], approval=found.get("approval"),
                        **{k: found[k] for k in ("journaled", "asked") if k in found})
    if raised is not None:
        return _ended_by(record, raised, matched)
    return _returned(record, value, matched)


def _skip_failed_steps(journal: Journal, record: RunRecord) -> None:
    """The entries a resume of a FAILED run tries again (the runner removes them), passed
    over here without changing the journal: the code asks for the failed step again."""
    retry = steps_to_retry(journal, record)
    if retry:
        record.retried_steps = sorted({*(record.retried_steps or ()), *retry})


def _ended_by(record: RunRecord, exc: BaseException, matched: int) -> RunCheck:
    said = f"{type(exc).__name__}: {exc}"
    if record.status is Status.FAILED and record.error == said:
        return RunCheck(record.run_id, REPLAYS, record.status, matched,
                        f"every step replays ({matched}); it fails as recorded")
    first_line = said.splitlines()[0]
    journaled = record.result if record.status is Status.DONE else record.error
    return RunCheck(record.run_id, DIVERGES, record.status, matched,
                    f"the code raised {first_line} after {matched} journaled steps",
                    journaled={"ended": journaled}, asked={"raised": said})


def _returned(record: RunRecord, value: Any, matched: int) -> RunCheck:
    if record.status is not Status.DONE:
        return RunCheck(record.run_id, WOULD_EXECUTE, record.status, matched,
                        f"every step replays ({matched}); resuming ends the run DONE, no "
                        f"step executed")
    try:
        encoded = serde.encode(value)
    except DurableError as exc:
        return RunCheck(record.run_id, DIVERGES, record.status, matched,
                        f"the result cannot be journaled: {exc}")
    if _same(encoded, record.result):
        return RunCheck(record.run_id, REPLAYS, record.status, matched,
                        f"every step replays ({matched}) and the result is the recorded one")
    change = first_difference(record.result, encoded, "result") or "the result changed"
    return RunCheck(record.run_id, DIVERGES, record.status, matched,
                    f"its result: {change}", journaled=record.result, asked=encoded)


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
