"""Notifications when a run starts waiting for an approval (then its reminders and its
escalation, :mod:`.followups`), and, when configured, when it is decided, decided by its
deadline or the run fails: a signed webhook, a Slack message, an e-mail, each sent once per
request (or run), event and channel by whichever process sees it first.

:mod:`.config` says where they go, :mod:`.channels` what each sends, :mod:`.delivery` how a
delivery is claimed, retried and recorded in the journal (the audit trail ``durable-nb
show`` prints). :mod:`.start` is what the runner asks when a run starts, and
:class:`.notifier.Notifier` the one listener it registers for the run's events
(:mod:`durable_nb.execution.events`).
"""

from __future__ import annotations

from ..llm.retry import RetryPolicy
from .config import (CHANNELS, EmailConfig, NotifyConfig, NotifySelection, SlackConfig,
                     WebhookConfig, load_config, user_config_path)

__all__ = ["CHANNELS", "EmailConfig", "NotifyConfig", "NotifySelection", "RetryPolicy",
           "SlackConfig", "WebhookConfig", "load_config", "user_config_path"]
