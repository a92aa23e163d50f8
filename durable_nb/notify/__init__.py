"""Notifications when a run starts waiting for an approval (then its reminders and its
escalation: :func:`~durable_nb.approvals.policy.due_followups`), and, when configured, when it is decided, decided by its
deadline or the run fails: a signed webhook, a Slack message, an e-mail, each sent once per
request (or run), event and channel by whichever process sees it first.

:mod:`.config` says where they go, :mod:`.channels` what each sends (one module per
channel, plug-ins found through the entry-point group ``durable_nb.channels``), :mod:`.delivery` how a
delivery is claimed, retried and recorded in the journal (the audit trail ``durable-nb
show`` prints). :mod:`.start` is what the runner asks when a run starts, and
:class:`.notifier.Notifier` the one listener it registers for the run's events
(:mod:`durable_nb.execution.events`).
"""

from __future__ import annotations

from ..execution.retry import RetryPolicy
from .channels import Channel, Notice, channel_names
from .config import (EmailConfig, NotifyConfig, NotifySelection, SlackConfig, WebhookConfig,
                     load_config, user_config_path)

__all__ = ["Channel", "EmailConfig", "Notice", "NotifyConfig", "NotifySelection", "RetryPolicy",
           "SlackConfig", "WebhookConfig", "channel_names", "load_config", "user_config_path"]
