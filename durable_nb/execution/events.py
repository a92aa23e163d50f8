"""What an execution tells the parts that listen to it (notifications): a request waits, a
request was decided or decided by its deadline, a run failed.

The execution emits a typed event to one :class:`ExecutionListener` (the runner registers
one per run: :class:`durable_nb.notify.notifier.Notifier`), after the journal holds what the
event says. A listener runs on the executing flow: it must be quick (hand sending to a
thread of its own) and must not raise. Events carry copies, never the run's live record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Union

from ..journal import RunRecord

__all__ = ["ExecutionEvent", "ExecutionListener", "NullListener", "RequestDecided",
           "RequestTimedOut", "RequestWaiting", "RunFailed", "decision_event", "snapshot"]


@dataclass(frozen=True)
class RequestWaiting:
    """The run waits for a decision on ``record.pending_approval`` (asked for the first time,
    asked again by a new execution, or escalated): written to the journal already."""

    record: RunRecord


@dataclass(frozen=True)
class RequestDecided:
    """The run took ``decision`` on request ``pending`` (``pending["run_id"]``: the run that
    asked): the decision the run goes on with, a replacing one included."""

    record: RunRecord
    pending: dict
    decision: dict


@dataclass(frozen=True)
class RequestTimedOut:
    """The run took the decision its deadline's policy made on request ``pending``."""

    record: RunRecord
    pending: dict
    decision: dict


@dataclass(frozen=True)
class RunFailed:
    """The run ended FAILED; ``record`` is as the journal holds it."""

    record: RunRecord


ExecutionEvent = Union[RequestWaiting, RequestDecided, RequestTimedOut, RunFailed]


class ExecutionListener(Protocol):
    """Receives an execution's :data:`ExecutionEvent` s, in the order they happen."""

    def on_event(self, event: ExecutionEvent) -> None: ...


class NullListener:
    """Listens to nothing (a run with no notifications)."""

    def on_event(self, event: ExecutionEvent) -> None:
        pass


def decision_event(record: RunRecord, pending: dict,
                   decision: dict) -> RequestDecided | RequestTimedOut:
    """The event for a decision the run took: :class:`RequestTimedOut` when its deadline's
    policy made it, else :class:`RequestDecided`."""
    kind = RequestTimedOut if decision.get("via") == "timeout" else RequestDecided
    return kind(snapshot(record), dict(pending), dict(decision))


def snapshot(record: RunRecord) -> RunRecord:
    """A copy of ``record`` that the run's further changes do not reach."""
    return RunRecord.from_json(record.to_json())
