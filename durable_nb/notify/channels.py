"""The three channels: what each sends for a parked run's request, and how.

Every message carries the delivery's id (``RUN/REQUEST/CHANNEL``): the webhook in the
``X-Durable-NB-Delivery`` header, the e-mail in the same header and its ``Message-ID``. A
delivery is sent at least once; a receiver that dedupes by that id sees it once (see
:mod:`durable_nb.notify.delivery`).

The webhook is signed: ``X-Durable-NB-Signature: sha256=HEX`` is the HMAC-SHA256, with the
shared secret, of ``TIMESTAMP.BODY`` (the ``X-Durable-NB-Timestamp`` header's text, a dot,
the raw body), so a receiver can verify it and refuse an old one replayed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..approvals.links import choice_url
from ..approvals.wording import verdict_words
from ..timestamps import format_time
from .config import EmailConfig, SlackConfig, WebhookConfig

if TYPE_CHECKING:
    from email.message import EmailMessage

__all__ = ["Notice", "SIGNATURE_HEADER", "TIMESTAMP_HEADER", "DELIVERY_HEADER", "email_message",
           "send", "sign", "slack_payload", "webhook_body"]

SIGNATURE_HEADER = "X-Durable-NB-Signature"
TIMESTAMP_HEADER = "X-Durable-NB-Timestamp"
DELIVERY_HEADER = "X-Durable-NB-Delivery"
_DETAILS_SHOWN = 2500  # characters of the details a Slack message or a subject line shows


#: What a notice tells, by its ``event``: the words its subject line starts with.
HEADLINES = {"approval.requested": "Approval needed",
             "approval.reminder": "Reminder: approval needed",
             "approval.escalated": "Escalated: approval needed",
             "approval.decided": "Decided", "approval.timed_out": "Decided by its deadline",
             "run.failed": "Run failed"}
#: The events that say a request waits (the others tell what became of it or of the run).
WAITING_EVENTS = ("approval.requested", "approval.reminder", "approval.escalated")


@dataclass(frozen=True)
class Notice:
    """What a notification says: a run waits for a decision on a request (``event``: asked,
    a reminder before its deadline, or escalated to other approvers)."""
    delivery_id: str  # RUN/REQUEST/CHANNEL, then /remind-N or /escalated for a follow-up
    run_id: str
    request_id: str
    digest: str
    name: str  # the tool or action the approval is for
    details: Any
    requested_at: float
    timeout_at: float | None
    title: str
    notebook: str | None
    journal: str  # where the run is (a database URL without its password)
    event: str = "approval.requested"
    #: E-mail addresses this notice goes to instead of the channel's (an escalation's).
    recipients: tuple[str, ...] = ()
    approvers: tuple[str, ...] = ()  # who may decide now, once escalated
    #: What became of it: a decision (approved, by, via, note, at) or a failure (error).
    outcome: dict | None = None
    #: Decision links (:mod:`durable_nb.approvals.links`): ``{"to", "url", "expires_at"}`` each;
    #: the e-mail's recipients one each, the webhook and Slack one for the request.
    links: tuple[dict, ...] = ()

    @property
    def headline(self) -> str:
        return f"{HEADLINES.get(self.event, 'Approval needed')}: {self.name}"

    def link_for(self, recipient: str) -> str | None:
        """The decision link sent to ``recipient``, or None."""
        return next((link["url"] for link in self.links if link["to"] == recipient), None)

    def as_json(self) -> dict:
        extra: dict[str, Any] = {"approvers": list(self.approvers)} if self.approvers else {}
        if self.outcome is not None:
            extra["outcome"] = self.outcome
        return {**extra, "event": self.event, "delivery": self.delivery_id,
                "run_id": self.run_id, "request_id": self.request_id, "digest": self.digest,
                "name": self.name, "details": self.details, "requested_at": self.requested_at,
                "timeout_at": self.timeout_at, "title": self.title, "notebook": self.notebook,
                "journal": self.journal, "links": [dict(link) for link in self.links]}


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The signature header's value for ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def webhook_body(notice: Notice) -> bytes:
    return json.dumps(notice.as_json(), sort_keys=True, default=repr).encode()


def _details_text(details: Any) -> str:
    text = details if isinstance(details, str) else json.dumps(
        details, indent=2, sort_keys=True, ensure_ascii=False, default=repr)
    return text if len(text) <= _DETAILS_SHOWN else text[:_DETAILS_SHOWN] + " …"


def slack_payload(notice: Notice) -> dict:
    """A Block Kit message: a header, the run's fields, the request's details, the ids."""
    def field(label: str, value: str) -> dict:
        return {"type": "mrkdwn", "text": f"*{label}*\n{value}"}

    fields = [field("Run", f"`{notice.run_id}`"), field("Tool", f"`{notice.name}`")]
    if notice.notebook:
        fields.append(field("Notebook", notice.notebook))
    if notice.title:
        fields.append(field("Title", notice.title))
    return {
        "text": f"{notice.headline} (run {notice.run_id})",
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "emoji": False,
                                        "text": notice.headline[:150]}},
            {"type": "section", "fields": fields},
            {"type": "section", "text": {"type": "mrkdwn",
                                         "text": "```" + _details_text(notice.details) + "```"}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": (
                f"request {notice.digest[:12]} · approve with `durable-nb approve "
                f"{notice.run_id}` or in JupyterLab · journal {notice.journal}")}]},
            *_slack_buttons(notice),
        ],
    }


def _slack_buttons(notice: Notice) -> list[dict]:
    """URL buttons that open the decision page (the page decides, on its own POST: a
    button's click, like any GET of the link, decides nothing)."""
    url = notice.link_for("slack")
    if url is None:
        return []
    return [{"type": "actions", "elements": [
        {"type": "button", "action_id": f"durable-nb-{choice}", "style": style,
         "url": choice_url(url, choice), "text": {"type": "plain_text", "text": label}}
        for choice, style, label in (("approve", "primary", "Approve…"),
                                     ("reject", "danger", "Reject…"))]}]


def email_message(notice: Notice, config: EmailConfig,
                  recipient: str | None = None) -> EmailMessage:
    """The e-mail for ``notice``: to every recipient, or to ``recipient`` alone with the
    decision link sent to that one (in its text and an HTML part)."""
    from email.message import EmailMessage
    message = EmailMessage()
    message["Subject"] = f"{notice.headline} (run {notice.run_id})"
    message["From"] = config.sender
    message["To"] = recipient or ", ".join(notice.recipients or config.to)
    message_id = notice.delivery_id.replace('/', '.')
    if recipient is not None:  # one message per recipient, each with an id of its own
        message_id += "." + hashlib.sha256(recipient.encode()).hexdigest()[:8]
    message["Message-ID"] = f"<{message_id}@durable-nb>"
    message[DELIVERY_HEADER] = notice.delivery_id
    lines = [_opening(notice), ""]
    if notice.title:
        lines.append(f"Title:    {notice.title}")
    if notice.notebook:
        lines.append(f"Notebook: {notice.notebook}")
    if notice.timeout_at:
        lines.append(f"Deadline: {format_time(notice.timeout_at, '?')}")
    if notice.approvers:
        lines.append(f"Escalated to: {', '.join(notice.approvers)}")
    lines += [f"Request:  {notice.digest[:12]}", f"Journal:  {notice.journal}", "",
              "Details:", _details_text(notice.details)]
    link = notice.link_for(recipient) if recipient is not None else None
    if link is not None:
        lines += ["", f"Approve or reject (a page that asks, then decides once, as "
                      f"{recipient}):", link]
    if notice.event in WAITING_EVENTS:
        lines += ["", f"Approve with `durable-nb approve {notice.run_id}` (or reject), "
                      f"in the notebook's panel or in JupyterLab's approvals inbox."]
    message.set_content("\n".join(lines))
    if link is not None:
        message.add_alternative(_email_html(notice, lines, link), subtype="html")
    return message


def _opening(notice: Notice) -> str:
    outcome = notice.outcome or {}
    if notice.event == "run.failed":
        return f"Run {notice.run_id} failed: {outcome.get('error')}"
    if notice.event in ("approval.decided", "approval.timed_out"):
        note = f" ({outcome['note']})" if outcome.get("note") else ""
        return f"Run {notice.run_id}: {notice.name} was {verdict_words(outcome)}{note}."
    return f"Run {notice.run_id} waits for a decision on {notice.name}."


def _email_html(notice: Notice, lines: list[str], link: str) -> str:
    import html
    text = "\n".join(line for line in lines if line != link)
    return (f"<html><body><pre>{html.escape(text)}</pre>"
            f'<p><a href="{html.escape(link)}">Open the decision page</a> '
            f"(approve or reject, with a note; it decides once)</p>"
            f"<p>{html.escape(link)}</p></body></html>")


def _post(url: str, body: bytes, headers: dict[str, str], timeout: float) -> None:
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            answer.read()
    except urllib.error.HTTPError as exc:
        raise DeliveryFailed(f"HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        raise DeliveryFailed(f"cannot connect: {exc.reason}") from None
    except (TimeoutError, OSError) as exc:
        raise DeliveryFailed(f"{type(exc).__name__}: {exc or 'timed out'}") from None


class DeliveryFailed(Exception):
    """One attempt failed; its message is short and holds no secret (what is recorded)."""


def send(channel: str, config: Any, notice: Notice) -> None:
    """Send ``notice`` over ``channel`` once; :class:`DeliveryFailed` if it did not arrive."""
    if channel == "webhook":
        assert isinstance(config, WebhookConfig)
        body = webhook_body(notice)
        headers = {DELIVERY_HEADER: notice.delivery_id}
        if config.secret:
            timestamp = str(int(time.time()))
            headers[TIMESTAMP_HEADER] = timestamp
            headers[SIGNATURE_HEADER] = sign(config.secret, timestamp, body)
        _post(config.url, body, headers, config.timeout)
    elif channel == "slack":
        assert isinstance(config, SlackConfig)
        _post(config.url, json.dumps(slack_payload(notice), default=repr).encode(), {},
              config.timeout)
    elif channel == "email":
        assert isinstance(config, EmailConfig)
        # Imported here: a journaled smtplib error replays as its nearest loaded base in a
        # process that never imported smtplib, and importing durable_nb must not load it.
        import smtplib
        try:
            with smtplib.SMTP(config.host, config.port, timeout=config.timeout) as smtp:
                if config.starttls:
                    smtp.starttls()
                if config.username:
                    smtp.login(config.username, config.password or "")
                if notice.links:  # each recipient's own link, in a message of its own
                    for recipient in notice.recipients or config.to:
                        smtp.send_message(email_message(notice, config, recipient))
                else:
                    smtp.send_message(email_message(notice, config))
        except smtplib.SMTPResponseException as exc:
            raise DeliveryFailed(f"SMTP {exc.smtp_code}") from None
        except (smtplib.SMTPException, OSError) as exc:
            raise DeliveryFailed(f"{type(exc).__name__}: {exc or 'failed'}"[:200]) from None
    else:
        raise ValueError(f"unknown channel {channel!r}")
