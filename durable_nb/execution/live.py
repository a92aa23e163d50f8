"""The executions running in this process, by run id: what lets a cancel or a decision
given here reach the run at once instead of at its next poll of the journal."""

from __future__ import annotations

import threading

from .cursor import Execution

__all__ = ["forget_live", "live_execution", "register_live"]

_live: dict[str, Execution] = {}
_live_lock = threading.Lock()


def register_live(run_id: str, execution: Execution) -> None:
    """``execution`` is the one executing run ``run_id`` in this process now."""
    with _live_lock:
        _live[run_id] = execution


def forget_live(run_id: str, execution: Execution) -> None:
    """``execution`` of run ``run_id`` ended: forgotten, unless another took its place."""
    with _live_lock:
        if _live.get(run_id) is execution:
            del _live[run_id]


def live_execution(run_id: str) -> Execution | None:
    """The execution of run ``run_id`` running in this process, if one is."""
    with _live_lock:
        return _live.get(run_id)
