"""What an execution reads of the options of its run: the interface the step cursor
(:class:`~durable_nb.execution.cursor.Execution`) and the step kinds built on it take, which
:class:`durable_nb.options.RunOptions` (a layer above, with the run's notifications, prices
and checks) implements. Read-only: an execution never changes its run's options."""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["ExecutionOptions"]


class ExecutionOptions(Protocol):
    """The options an execution reads (see :class:`durable_nb.options.RunOptions` for what
    each means)."""

    @property
    def on_change(self) -> str:
        """``"error"``, ``"rerun"`` or ``"replay"``: what a changed step does."""

    @property
    def on_journal_error(self) -> str:
        """``"stop"`` or ``"continue"``: what a failed journal write does."""

    @property
    def on_approval(self) -> str:
        """``"wait"`` or ``"park"``: what an approval nobody decided yet does."""

    @property
    def poll_interval(self) -> float:
        """Seconds between looks at the journal while waiting."""

    @property
    def stale_after(self) -> float:
        """Seconds after which a lease that was not renewed is stale."""

    @property
    def call_gate(self) -> Any:
        """The limits shared with other runs (:class:`durable_nb.options.CallGate`), or
        None."""

    @property
    def approvers(self) -> list[str] | None:
        """Who may decide the run's approvals; None: anyone."""

    @property
    def four_eyes(self) -> bool:
        """Whether the person who started the run may not decide its approvals."""

    @property
    def model(self) -> str | None:
        """The model a chat step uses when it names none."""

    @property
    def client(self) -> Any:
        """The OpenAI client a chat step uses when it is given none."""

    @property
    def context_windows(self) -> dict[str, int] | None:
        """Context window sizes by model, over the built-in table."""

    @property
    def prices(self) -> dict[str, Any] | None:
        """Prices by model, over the built-in table."""
