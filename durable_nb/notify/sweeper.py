"""One sweep of a journal: :func:`durable_nb.approvals.tick.tick` with the notification layer
as its listener, so that deadlines and escalations are applied and then every notice due is
sent (requests nobody notified, reminders, escalations, notices whose sender died). The
server extension's sweeper (:mod:`durable_nb.server.notify`) and ``durable-nb sweep`` both
sweep through :func:`sweep_journal`; they differ only in when they sweep again."""

from __future__ import annotations

from ..approvals.tick import Ticked, tick
from ..journal import Journal, RunRecord
from .config import NotifyConfig
from .delivery import sweep

__all__ = ["sweep_journal"]


def sweep_journal(journal: Journal, config: NotifyConfig, *, server_url: str | None = None
                  ) -> tuple[Ticked, dict[str, dict[str, str]]]:
    """Tick ``journal`` and, when ``config`` has channels, send what is due through them
    (decision links to ``server_url`` when no base URL is configured): what the tick did
    (with when something next falls due) and what was sent, by run."""
    sent: dict[str, dict[str, str]] = {}

    def notify(swept: Journal, waiting: list[RunRecord]) -> None:
        sent.update(sweep(swept, config, server_url=server_url, records=waiting))

    return tick(journal, listener=notify if config.channels() else None), sent
