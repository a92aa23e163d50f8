"""Slack: a Block Kit message to an incoming webhook (its URL holds the token: a secret).

Everything from outside (a tool's name and arguments, a run's title, its notebook) is
escaped as Slack documents for text it formats (``&``, ``<``, ``>``: "Escaping text" in
Slack's formatting reference), so that a ``<https://…|Approve…>`` link or a ``<!channel>``
in a tool argument shows as text and is never a live link or mention beside the real
buttons. The request's details go in a ``plain_text`` object, which Slack never formats: no
code fence in them can close anything.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ...approvals.links import choice_url
from .base import DEFAULT_TIMEOUT, Notice, Section, details_text, post_json, question_lines

__all__ = ["SlackConfig", "mrkdwn_code", "mrkdwn_text", "slack_payload"]

_HEADER_CHARS = 150  # Slack's limit for a header block's text


def mrkdwn_text(text: str) -> str:
    """``text`` escaped for a Slack ``mrkdwn`` field: ``&``, ``<`` and ``>`` as entities
    (so no link, mention or ``<!channel>`` can be formed from it)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def mrkdwn_code(text: str) -> str:
    """``text`` as inline code in a ``mrkdwn`` field: escaped, its backticks and line breaks
    replaced so it cannot end the code span (a grave accent ˋ looks the same)."""
    flat = " ".join(text.split())
    return "`" + mrkdwn_text(flat).replace("`", "ˋ") + "`"


def slack_payload(notice: Notice) -> dict:
    """A Block Kit message: a header, the run's fields, the request's details, the ids, the
    decision link's buttons."""
    def mrkdwn_field(label: str, value: str) -> dict:
        return {"type": "mrkdwn", "text": f"*{label}*\n{value}"}

    fields = [mrkdwn_field("Run", mrkdwn_code(notice.run_id)),
              mrkdwn_field("Tool", mrkdwn_code(notice.name))]
    if notice.notebook:
        fields.append(mrkdwn_field("Notebook", mrkdwn_text(notice.notebook)))
    if notice.title:
        fields.append(mrkdwn_field("Title", mrkdwn_text(notice.title)))
    return {
        "text": mrkdwn_text(f"{notice.headline} (run {notice.run_id})"),
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "emoji": False,
                                        "text": notice.headline[:_HEADER_CHARS]}},
            {"type": "section", "fields": fields},
            _details_block(notice),
            {"type": "context", "elements": [{"type": "mrkdwn", "text": (
                f"details digest {notice.digest[:12]} · approve with `durable-nb approve "
                f"{mrkdwn_text(notice.run_id).replace('`', 'ˋ')}` or in JupyterLab · "
                f"journal {mrkdwn_text(notice.journal)}")}]},
            *_buttons(notice),
        ],
    }


def _details_block(notice: Notice) -> dict:
    """The request's details (``plain_text``, never formatted); for a server's question, its
    message and fields, escaped for ``mrkdwn``."""
    question = notice.question
    if question is None:
        return {"type": "section", "text": {"type": "plain_text", "emoji": False,
                                            "text": details_text(notice.details) or " "}}
    head, message, _, *fields = question_lines(question)
    text = f"*{mrkdwn_text(head)}*\n>{mrkdwn_text(' '.join(message.split()))}"
    if fields:
        text += "\n" + "\n".join(mrkdwn_text(line) for line in fields)
    return {"type": "section", "text": {"type": "mrkdwn", "text": text[:2900]}}


def _buttons(notice: Notice) -> list[dict]:
    """URL buttons that open the decision page (the page decides, on its own POST: a
    button's click, like any GET of the link, decides nothing); for a question, one button
    that opens its form."""
    url = notice.link_for(SlackConfig.name)
    if url is None:
        return []
    if notice.question is not None:
        return [{"type": "actions", "elements": [
            {"type": "button", "action_id": "durable-nb-answer", "style": "primary",
             "url": url, "text": {"type": "plain_text", "text": "Answer…"}}]}]
    return [{"type": "actions", "elements": [
        {"type": "button", "action_id": f"durable-nb-{choice}", "style": style,
         "url": choice_url(url, choice), "text": {"type": "plain_text", "text": label}}
        for choice, style, label in (("approve", "primary", "Approve…"),
                                     ("reject", "danger", "Reject…"))]}]


@dataclass(frozen=True)
class SlackConfig:
    """The Slack channel: a Slack-compatible incoming webhook (its URL is a secret: it
    holds the token)."""
    url: str = field(repr=False)
    timeout: float = DEFAULT_TIMEOUT

    name: ClassVar[str] = "slack"
    env: ClassVar[Mapping[str, str]] = {"DURABLE_NB_NOTIFY_SLACK_WEBHOOK": "url",
                                        "DURABLE_NB_NOTIFY_SLACK_TIMEOUT": "timeout"}

    @classmethod
    def from_config(cls, section: Mapping[str, Any], where: str) -> "SlackConfig":
        read = Section(section, cls.name, where)
        read.known(("url", "timeout"))
        return cls(url=read.url("url"), timeout=read.number("timeout", DEFAULT_TIMEOUT))

    def recipients(self, notice: Notice) -> list[str]:
        return [self.name]

    def message(self, notice: Notice, recipient: str) -> dict:
        """The Block Kit payload posted."""
        return slack_payload(notice)

    def send(self, notice: Notice, recipient: str, *, timeout: float | None = None) -> None:
        body = json.dumps(self.message(notice, recipient), default=repr).encode()
        post_json(self.url, body, {}, self.timeout if timeout is None else timeout)
