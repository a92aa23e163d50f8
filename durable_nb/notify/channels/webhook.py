"""The webhook: a signed JSON POST of the notice to a URL.

Every request carries the delivery's id (``X-Durable-NB-Delivery: RUN/REQUEST/webhook``), the
same on every attempt and takeover, so that a receiver that keeps the ids it saw handles each
once. With a secret it is signed: ``X-Durable-NB-Signature: sha256=HEX`` is the HMAC-SHA256,
with the shared secret, of ``TIMESTAMP\\nDELIVERY\\nBODY`` (the ``X-Durable-NB-Timestamp``
header's text, a line feed, the delivery id, a line feed, the raw body). The delivery id is
signed so that a captured request replayed under another id is refused: a receiver dedupes
on an id it verified. (Header values cannot hold a line feed, so the three parts cannot be
shifted into one another.)
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .base import DEFAULT_TIMEOUT, Notice, Section, post_json

__all__ = ["DELIVERY_HEADER", "SIGNATURE_HEADER", "TIMESTAMP_HEADER", "WebhookConfig",
           "sign"]

SIGNATURE_HEADER = "X-Durable-NB-Signature"
TIMESTAMP_HEADER = "X-Durable-NB-Timestamp"
DELIVERY_HEADER = "X-Durable-NB-Delivery"


def sign(secret: str, timestamp: str, delivery: str, body: bytes) -> str:
    """The signature header's value for ``body`` sent as ``delivery`` at ``timestamp``."""
    signed = timestamp.encode() + b"\n" + delivery.encode() + b"\n" + body
    return "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class WebhookConfig:
    """The webhook channel: a JSON POST of the notice to ``url``, signed with ``secret``
    when there is one."""
    url: str = field(repr=False)  # may hold a token
    secret: str | None = field(default=None, repr=False)
    timeout: float = DEFAULT_TIMEOUT

    name: ClassVar[str] = "webhook"
    env: ClassVar[Mapping[str, str]] = {
        "DURABLE_NB_NOTIFY_WEBHOOK": "url", "DURABLE_NB_NOTIFY_WEBHOOK_SECRET": "secret",
        "DURABLE_NB_NOTIFY_WEBHOOK_TIMEOUT": "timeout"}

    @classmethod
    def from_config(cls, section: Mapping[str, Any], where: str) -> "WebhookConfig":
        read = Section(section, cls.name, where)
        read.known(("url", "secret", "timeout"))
        return cls(url=read.url("url"), secret=read.optional("secret"),
                   timeout=read.number("timeout", DEFAULT_TIMEOUT))

    def recipients(self, notice: Notice) -> list[str]:
        return [self.name]

    def message(self, notice: Notice, recipient: str) -> dict:
        """The JSON document posted."""
        return notice.as_json()

    def send(self, notice: Notice, recipient: str, *, timeout: float | None = None) -> None:
        body = json.dumps(self.message(notice, recipient), sort_keys=True,
                          default=repr).encode()
        headers = {DELIVERY_HEADER: notice.delivery_id}
        if self.secret:
            timestamp = str(int(time.time()))
            headers[TIMESTAMP_HEADER] = timestamp
            headers[SIGNATURE_HEADER] = sign(self.secret, timestamp, notice.delivery_id, body)
        post_json(self.url, body, headers, self.timeout if timeout is None else timeout)
