"""The runner's one listener for notifications: each :mod:`~durable_nb.execution.events`
event of a run becomes its deliveries, sent on a thread of their own."""

from __future__ import annotations

from functools import cached_property

from ..execution.events import (ExecutionEvent, RequestDecided, RequestTimedOut,
                                RequestWaiting, RunFailed)
from ..journal import Journal
from .config import NotifyConfig
from .delivery import deliver_decided, deliver_failed, in_background, notify_in_background

__all__ = ["Notifier", "notify_choice"]


def notify_choice(config: NotifyConfig, skip: tuple[str, ...]) -> dict:
    """What a run records with each request it asks (``pending["notify"]``), so that every
    sender honours it (:func:`~durable_nb.notify.delivery.chosen_channels`): the
    ``channels`` it notifies, by name, and the configured ones it ``skip`` s."""
    return {"channels": sorted(config.channels()), "skip": sorted(skip)}


class Notifier:
    """Sends a run's notifications with its channels ``config`` (``skip``: the configured
    ones its ``notify=`` left out, recorded as skipped): the request it waits for, the
    decision it took (``decided`` / ``timed_out`` in ``config.events``), its failure
    (``failed``). Each delivery runs on a thread of its own, waited for at exit
    (:func:`~durable_nb.notify.delivery.drain`); :meth:`on_event` returns at once and never
    raises. On a hub's journal (one whose decider role this process is not) it sends
    nothing: the hub's service is the team's one sender, and the run's choice travels with
    each request it asks (:attr:`choice`)."""

    def __init__(self, journal: Journal, config: NotifyConfig,
                 skip: tuple[str, ...] = ()) -> None:
        self.journal = journal
        self.config = config
        self.skip = skip

    @property
    def choice(self) -> dict:
        """What the run records with each request it asks (:func:`notify_choice`)."""
        return notify_choice(self.config, self.skip)

    @property
    def listens(self) -> bool:
        """Whether any event of the run would be sent or recorded (else not registered)."""
        return bool(self.config.channels() or self.skip)

    @cached_property
    def sends_elsewhere(self) -> bool:
        """Whether the hub's service sends this run's notifications (the database refuses
        ours)."""
        decider, is_decider, _ = self.journal.decision_authority()
        return decider is not None and not is_decider

    def on_event(self, event: ExecutionEvent) -> None:
        config = self.config
        if self.sends_elsewhere:
            return
        if isinstance(event, RequestWaiting):
            notify_in_background(self.journal, event.record, config, skip=self.skip)
        elif isinstance(event, (RequestDecided, RequestTimedOut)):
            if config.channels():
                in_background(lambda: deliver_decided(self.journal, event.record,
                                                      event.pending, event.decision, config,
                                                      for_the_run=True),
                              name=f"durable-nb-notify-{event.record.run_id}")
        elif isinstance(event, RunFailed):
            if config.channels() and "failed" in config.events:
                in_background(lambda: deliver_failed(self.journal, event.record, config),
                              name=f"durable-nb-notify-{event.record.run_id}")
