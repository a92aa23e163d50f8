"""One sweep of a journal: :func:`durable_nb.approvals.tick.tick` with the notification layer
as its listener, so that deadlines and escalations are applied and then every notice due is
sent (requests nobody notified, reminders, escalations, notices whose sender died); then the
journal's retention policy, when due (:func:`durable_nb.retention.sweep.apply_policy`). The
server extension's sweeper (:mod:`durable_nb.server.notify`), the hub service's
(:mod:`durable_nb.hub.links`) and ``durable-nb sweep`` all sweep through
:func:`sweep_journal`; they differ only in when they sweep again."""

from __future__ import annotations

from ..approvals.tick import Ticked, tick
from ..journal import Journal, RunRecord
from ..retention.sweep import PruneResult, apply_policy
from .config import NotifyConfig
from .delivery import sweep

__all__ = ["sweep_journal"]


def sweep_journal(journal: Journal, config: NotifyConfig, *, server_url: str | None = None
                  ) -> tuple[Ticked, dict[str, dict[str, str]], PruneResult | None]:
    """Tick ``journal`` and, when ``config`` has channels, send what is due through them
    (decision links to ``server_url`` when no base URL is configured), then apply its
    retention policy if due: what the tick did (with when something next falls due), what
    was sent, by run, and what the policy removed (None: not applied)."""
    sent: dict[str, dict[str, str]] = {}

    def notify(swept: Journal, waiting: list[RunRecord]) -> None:
        sent.update(sweep(swept, config, server_url=server_url, records=waiting))

    ticked = tick(journal, listener=notify if config.channels() else None)
    return ticked, sent, apply_policy(journal)
