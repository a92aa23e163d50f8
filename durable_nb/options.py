"""How a run executes: :class:`RunOptions`, shared by the runner, the cursor and the step kinds."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from .approvals.policy import approvers_list
from .execution.lease import DEFAULT_STALE_AFTER
from .llm.pricing import Price
from .notify.config import NotifySelection, check_selection

__all__ = ["CallGate", "OnApproval", "OnChange", "OnJournalError", "RunOptions",
           "verify_replay_default"]

#: What to do when the code asks a step differently than the journal holds it: stop with
#: JournalMismatch / InputChanged ("error"), execute again from that step and keep the old
#: steps as a fork of the run ("rerun"), or return the journaled result anyway when only the
#: inputs changed ("replay").
OnChange = Literal["error", "rerun", "replay"]
OnJournalError = Literal["continue", "stop"]
OnApproval = Literal["wait", "park"]


class CallGate(Protocol):
    """What every LLM call of a run passes when several runs share limits (a batch: see
    :class:`durable_nb.batches.limits.BatchLimits`). Called from the runs' threads."""

    def before_call(self, run_id: str, key: str, tokens: int, cost: float) -> None:
        """Before step ``key`` calls the endpoint, taking up to ``tokens`` and ``cost``: wait
        for room under the shared rate, or raise BudgetExhausted."""

    def account(self, run_id: str, entry: Any) -> None:
        """A step of the run was journaled (its tokens and cost are now spent)."""

    def pause(self, seconds: float) -> None:
        """The endpoint asked to slow down (retry-after): every run waits that long."""

    def before_retry(self) -> None:
        """Before sending a call again after a failure: wait out a pause a 429 set, and for
        room under the shared request rate (every request sent counts, retries too)."""


def verify_replay_default() -> bool:
    """``DURABLE_NB_VERIFY_REPLAY=1`` turns :attr:`RunOptions.verify_replay` on by default."""
    return os.environ.get("DURABLE_NB_VERIFY_REPLAY", "") not in ("", "0")


@dataclass
class RunOptions:
    """How a run executes. ``timeout`` counts from the run's creation and is fixed then;
    budgets given on a later execution replace the stored ones (raise them to go on).
    ``max_cost`` is in US dollars, priced with :mod:`durable_nb.llm.pricing` (``prices``
    overrides its table per model).

    ``durability`` (default ``$DURABLE_NB_DURABILITY`` or ``"process"``) is how the journal
    directory is opened when it is given by path: see :mod:`durable_nb.journal.local`.

    ``on_journal_error``: what a failed journal write does (see
    :mod:`durable_nb.execution.writer`): ``"stop"`` (the default) stops the run with
    :class:`~durable_nb.errors.JournalWriteError` once the step in flight is done, and nothing
    is reported DONE that the journal does not hold; ``"continue"`` goes on unjournaled,
    loudly: the run is then not durable until the writes succeed again.

    ``verify_replay``: after an execution that finished the run (DONE) having executed steps,
    execute the handler once more in pure replay and raise
    :class:`~durable_nb.errors.ReplayDiverged` if it does not reproduce the same steps,
    inputs and result (Restate's always-replay check; the test suite runs with it on).

    ``notify``: where a request for approval is sent when the run starts waiting (see
    :mod:`durable_nb.notify`): None, every channel configured for the journal or the user;
    False or ``"none"``, none; channel names (``"webhook,email"`` or a list); or a
    :class:`~durable_nb.notify.NotifyConfig` of its own.

    ``approvers``: who may decide the run's approvals (Jupyter user names or e-mail
    addresses; a list, or one string of comma-separated names), unless a tool
    (``@tool(approvers=...)``) or the request (``ctx.approval(..., approvers=...)``) names its
    own; None, anyone. ``four_eyes``: the person who started the run may not decide its
    approvals. Both are checked wherever a decision is given
    (:mod:`durable_nb.approvals.policy`).
    """

    title: str | None = None
    timeout: float | None = None
    max_iterations: int | None = None
    max_tokens: int | None = None
    max_cost: float | None = None
    prices: dict[str, Price] | None = None
    on_approval: OnApproval = "wait"
    on_change: OnChange = "error"
    on_journal_error: OnJournalError = "stop"
    poll_interval: float = 0.1
    heartbeat_interval: float = 2.0
    stale_after: float = DEFAULT_STALE_AFTER
    source: str | None = None
    model: str | None = None
    client: Any = None
    context_windows: dict[str, int] | None = None
    verify_replay: bool | None = None
    durability: Literal["process", "power"] | None = None
    call_gate: CallGate | None = None
    #: The notebook and cell that start the run, written into a new run's record (for
    #: the Jupyter Server's listing: open the run's notebook at its cell).
    notebook: str | None = None
    cell_id: str | None = None
    notify: NotifySelection = None
    approvers: list[str] | None = None
    four_eyes: bool = False

    def __post_init__(self) -> None:
        check_selection(self.notify)
        self.approvers = approvers_list(self.approvers)
        for name, allowed in (("on_change", ("error", "rerun", "replay")),
                              ("on_journal_error", ("continue", "stop")),
                              ("on_approval", ("wait", "park"))):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, "
                                 f"not {value!r}")
        if self.verify_replay is None:
            self.verify_replay = verify_replay_default()
