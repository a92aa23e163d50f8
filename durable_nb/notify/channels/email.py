"""E-mail over SMTP: one message per recipient, each with its own decision link.

Outside text reaches a header only through :func:`~.base.header_text` (the subject: a tool's
name, a run id), which flattens line breaks, so it cannot add a header (a ``Bcc:``) or end
the headers; the HTML part escapes everything it shows. Each message carries the delivery id
(``X-Durable-NB-Delivery``) and a ``Message-ID`` made of it and a hash of the address.
"""

from __future__ import annotations

import hashlib
import html
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from ...errors import DeliveryFailed, NotifyConfigError
from ...timestamps import format_time
from ...approvals.wording import verdict_words
from .base import (DEFAULT_TIMEOUT, WAITING_EVENTS, Notice, Section, details_text,
                   header_text, question_lines)
from .webhook import DELIVERY_HEADER

if TYPE_CHECKING:
    from email.message import EmailMessage

__all__ = ["EmailConfig", "email_message"]


@dataclass(frozen=True)
class EmailConfig:
    """The e-mail channel: SMTP to ``to`` from ``sender``; STARTTLS and login when asked."""
    host: str
    sender: str
    to: tuple[str, ...]
    port: int = 25
    starttls: bool = False
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    timeout: float = DEFAULT_TIMEOUT

    name: ClassVar[str] = "email"
    env: ClassVar[Mapping[str, str]] = {
        "DURABLE_NB_NOTIFY_SMTP_HOST": "host", "DURABLE_NB_NOTIFY_SMTP_PORT": "port",
        "DURABLE_NB_NOTIFY_SMTP_STARTTLS": "starttls", "DURABLE_NB_NOTIFY_SMTP_USER": "username",
        "DURABLE_NB_NOTIFY_SMTP_PASSWORD": "password", "DURABLE_NB_NOTIFY_SMTP_FROM": "from",
        "DURABLE_NB_NOTIFY_SMTP_TO": "to", "DURABLE_NB_NOTIFY_SMTP_TIMEOUT": "timeout"}

    @classmethod
    def from_config(cls, section: Mapping[str, Any], where: str) -> "EmailConfig":
        read = Section(section, cls.name, where)
        read.known(("host", "port", "starttls", "username", "password", "from", "to",
                    "timeout"))
        to = read.addresses("to")
        sender = read.text("from")
        if sender != header_text(sender, limit=len(sender)):
            raise NotifyConfigError(f"[email] from must be one line (in {where}).")
        return cls(host=read.text("host"), sender=sender,
                   to=to, port=read.number("port", 25, int),
                   starttls=read.flag("starttls"), username=read.optional("username"),
                   password=read.optional("password"),
                   timeout=read.number("timeout", DEFAULT_TIMEOUT))

    def recipients(self, notice: Notice) -> list[str]:
        """The escalation's approvers that are addresses (``notice.recipients``), else
        ``to``."""
        return list(notice.recipients or self.to)

    def message(self, notice: Notice, recipient: str) -> EmailMessage:
        return email_message(notice, self, recipient)

    def send(self, notice: Notice, recipient: str, *, timeout: float | None = None) -> None:
        # Imported here: a journaled smtplib error replays as its nearest loaded base in a
        # process that never imported smtplib, and importing durable_nb must not load it.
        import smtplib
        message = self.message(notice, recipient)
        try:
            with smtplib.SMTP(self.host, self.port,
                              timeout=self.timeout if timeout is None else timeout) as smtp:
                if self.starttls:
                    smtp.starttls()
                if self.username:
                    smtp.login(self.username, self.password or "")
                smtp.send_message(message, to_addrs=[recipient])
        except smtplib.SMTPRecipientsRefused as exc:
            codes = sorted({code for code, _ in exc.recipients.values()})
            raise DeliveryFailed(f"SMTP {', '.join(map(str, codes))}: {recipient} "
                                 f"refused") from None
        except smtplib.SMTPResponseException as exc:
            raise DeliveryFailed(f"SMTP {exc.smtp_code}") from None
        except (smtplib.SMTPException, OSError) as exc:
            raise DeliveryFailed(f"{type(exc).__name__}: {exc or 'failed'}"[:200]) from None


def email_message(notice: Notice, config: EmailConfig, recipient: str) -> EmailMessage:
    """The e-mail for ``notice`` to ``recipient``, with the decision link sent to that one
    (in its text and an HTML part)."""
    from email.message import EmailMessage
    message = EmailMessage()
    message["Subject"] = header_text(f"{notice.headline} (run {notice.run_id})")
    message["From"] = config.sender
    message["To"] = recipient
    message_id = header_text(notice.delivery_id).replace("/", ".").replace(" ", "_")
    message_id += "." + hashlib.sha256(recipient.encode()).hexdigest()[:8]
    message["Message-ID"] = f"<{message_id}@durable-nb>"
    message[DELIVERY_HEADER] = header_text(notice.delivery_id, limit=900)
    lines = [_opening(notice), ""]
    if notice.title:
        lines.append(f"Title:    {notice.title}")
    if notice.notebook:
        lines.append(f"Notebook: {notice.notebook}")
    if notice.timeout_at:
        lines.append(f"Deadline: {format_time(notice.timeout_at, '?')}")
    if notice.approvers:
        lines.append(f"Escalated to: {', '.join(notice.approvers)}")
    lines += [f"Details digest: {notice.digest[:12]}", f"Journal:  {notice.journal}", ""]
    question = notice.question
    lines += question_lines(question) if question is not None else [
        "Details:", details_text(notice.details)]
    link = notice.link_for(recipient)
    if link is not None:
        lines += ["", f"{'Answer' if question else 'Approve or reject'} (a page that asks, "
                      f"then decides once, as {recipient}):", link]
    if notice.event in WAITING_EVENTS and question is not None:
        lines += ["", f"Answer with `durable-nb answer {notice.run_id} accept --content "
                      f"JSON` (or decline, cancel), in the notebook's panel or in "
                      f"JupyterLab's approvals inbox."]
    elif notice.event in WAITING_EVENTS:
        lines += ["", f"Approve with `durable-nb approve {notice.run_id}` (or reject), "
                      f"in the notebook's panel or in JupyterLab's approvals inbox."]
    message.set_content("\n".join(lines))
    if link is not None:
        message.add_alternative(_html(lines, link, question is not None), subtype="html")
    return message


def _opening(notice: Notice) -> str:
    outcome = notice.outcome or {}
    if notice.event == "run.failed":
        return f"Run {notice.run_id} failed: {outcome.get('error')}"
    if notice.event in ("approval.decided", "approval.timed_out"):
        note = f" ({outcome['note']})" if outcome.get("note") else ""
        return f"Run {notice.run_id}: {notice.name} was {verdict_words(outcome)}{note}."
    return f"Run {notice.run_id} waits for a decision on {notice.name}."


def _html(lines: list[str], link: str, question: bool = False) -> str:
    text = "\n".join(line for line in lines if line != link)
    what = ("answer the question: accept with the fields, decline or cancel" if question
            else "approve or reject, with a note")
    return (f"<html><body><pre>{html.escape(text)}</pre>"
            f'<p><a href="{html.escape(link)}">Open the decision page</a> '
            f"({what}; it decides once)</p>"
            f"<p>{html.escape(link)}</p></body></html>")
