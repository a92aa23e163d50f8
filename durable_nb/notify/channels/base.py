"""What a channel is: the :class:`Channel` protocol, the :class:`Notice` it sends, and the
helpers a channel's module may use (reading its config section, posting JSON, showing a
request's details).

A channel is one class: its ``name`` (its ``notify.toml`` section and ``notify=`` name), the
environment variables that set its fields, ``from_config`` (a configured instance from its
section), and per notice its ``recipients`` (one delivery each), the ``message`` for one of
them and ``send``. A configured instance holds its secrets; it is never written to a journal.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from ...approvals.question import Question, question_of
from ...errors import DeliveryFailed, NotifyConfigError

__all__ = ["DEFAULT_TIMEOUT", "HEADLINES", "WAITING_EVENTS", "Channel", "DeliveryFailed",
           "Notice", "Section", "details_text", "header_text", "post_json",
           "question_lines"]

DEFAULT_TIMEOUT = 10.0  # seconds for one attempt's connect and answer
DETAILS_SHOWN = 2500  # characters of a request's details a message shows

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
    a reminder before its deadline, or escalated to other approvers), or what became of it.
    Everything in it but the ids is outside text (a tool's arguments, a title): a channel
    escapes it for where it goes."""
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
    #: Decision links: ``{"to", "url", "expires_at"}`` each, one per recipient.
    links: tuple[dict, ...] = ()

    @property
    def headline(self) -> str:
        words = HEADLINES.get(self.event, "Approval needed")
        if self.question is not None:  # a server's question waits for an answer
            words = words.replace("Approval needed", "Answer needed").replace(
                "approval needed", "answer needed")
        return f"{words}: {self.name}"

    @property
    def question(self) -> Question | None:
        """The question the request asks (an MCP server's elicitation), or None."""
        return question_of({"details": self.details})

    def link_for(self, recipient: str) -> str | None:
        """The decision link sent to ``recipient``, or None."""
        return next((link["url"] for link in self.links if link["to"] == recipient), None)

    def as_json(self) -> dict:
        extra: dict[str, Any] = {"approvers": list(self.approvers)} if self.approvers else {}
        if self.outcome is not None:
            extra["outcome"] = self.outcome
        question = self.question
        if question is not None:  # the form to show: the message and the answer's schema
            extra["question"] = {"message": question.message, "schema": dict(question.schema),
                                 "server": question.server, "tool": question.tool}
        return {**extra, "event": self.event, "delivery": self.delivery_id,
                "run_id": self.run_id, "request_id": self.request_id, "digest": self.digest,
                "name": self.name, "details": self.details, "requested_at": self.requested_at,
                "timeout_at": self.timeout_at, "title": self.title, "notebook": self.notebook,
                "journal": self.journal, "links": [dict(link) for link in self.links]}


@runtime_checkable
class Channel(Protocol):
    """One way of reaching people, configured. Implement it in one module and register the
    class under the entry-point group ``durable_nb.channels`` (see
    :mod:`durable_nb.notify.channels`).

    The sender (:mod:`durable_nb.notify.delivery`) claims, retries and records one delivery
    per recipient; a channel only says who the recipients are and sends one attempt."""

    #: The channel's name: its ``[section]`` in notify.toml, its ``notify=`` / ``--notify``
    #: name, its part of a delivery id. Lower case, a word.
    name: ClassVar[str]
    #: Environment variables that set fields of its section, by variable name: e.g.
    #: ``{"DURABLE_NB_NOTIFY_TEAMS_URL": "url"}``. A plug-in's must start with
    #: ``DURABLE_NB_NOTIFY_<NAME>_``.
    env: ClassVar[Mapping[str, str]]

    @classmethod
    def from_config(cls, section: Mapping[str, Any], where: str) -> "Channel":
        """The channel configured by its section's fields (from files and the environment
        merged; values may be strings from the environment). :class:`NotifyConfigError`
        naming the field and ``where`` (the files read) when one is missing or wrong."""
        ...

    def recipients(self, notice: Notice) -> list[str]:
        """Who ``notice`` goes to, one delivery (and one decision link) each: e-mail
        addresses; a channel with one destination returns one name (its own)."""
        ...

    def message(self, notice: Notice, recipient: str) -> Any:
        """What :meth:`send` sends to ``recipient`` (a JSON document, an e-mail), with every
        outside text escaped for where it goes. For previews and tests."""
        ...

    def send(self, notice: Notice, recipient: str, *, timeout: float | None = None) -> None:
        """Send ``notice`` to ``recipient`` once (``timeout``: seconds for the attempt; None:
        the channel's own). :class:`~durable_nb.errors.DeliveryFailed`, with a short message
        holding no secret, when it did not arrive."""
        ...


class Section:
    """A channel's config section, read with errors that name the field and where it was
    set: ``Section(values, "teams", where).url("url")``."""

    def __init__(self, values: Mapping[str, Any], name: str, where: str) -> None:
        self.values, self.name, self.where = values, name, where

    def known(self, fields: Iterable[str]) -> None:
        """Refuse a field not among ``fields`` (a typo would otherwise be ignored)."""
        fields = tuple(fields)
        for key in self.values:
            if key not in fields:
                raise NotifyConfigError(f"[{self.name}] has no field {key!r}: use "
                                        f"{', '.join(fields)} (in {self.where}).")

    def text(self, key: str) -> str:
        """A required field's text."""
        value = self.values.get(key)
        if not value:
            raise NotifyConfigError(f"[{self.name}] needs {key!r} (in {self.where}).")
        if not isinstance(value, str):
            raise NotifyConfigError(f"[{self.name}] {key} must be text, not {value!r} "
                                    f"(in {self.where}).")
        return value

    def optional(self, key: str) -> str | None:
        """An optional field's text, or None."""
        return self.text(key) if self.values.get(key) else None

    def url(self, key: str = "url") -> str:
        """A required http(s) URL."""
        value = self.text(key)
        if not value.startswith(("http://", "https://")):
            raise NotifyConfigError(f"[{self.name}] {key} must be an http(s) URL "
                                    f"(in {self.where}).")
        return value

    def number(self, key: str, default: float, kind: type = float) -> Any:
        """A positive number (``kind`` int or float), ``default`` when absent."""
        value = self.values.get(key, default)
        try:
            value = kind(value)
        except (TypeError, ValueError):
            raise NotifyConfigError(f"[{self.name}] {key} must be a number, not {value!r} "
                                    f"(in {self.where}).") from None
        if value <= 0:
            raise NotifyConfigError(f"[{self.name}] {key} must be positive (in {self.where}).")
        return value

    def flag(self, key: str, default: bool = False) -> bool:
        """A yes/no field: a TOML boolean, or 1/0, true/false, yes/no, on/off as text."""
        value = self.values.get(key, default)
        if isinstance(value, str):
            return value.strip().lower() in ("1", "true", "yes", "on")
        return bool(value)

    def addresses(self, key: str) -> tuple[str, ...]:
        """A required list of addresses (a TOML list, or text with commas)."""
        value = self.values.get(key)
        items = value.split(",") if isinstance(value, str) else value
        if not items or not isinstance(items, (list, tuple)) \
                or not all(isinstance(a, str) for a in items):
            raise NotifyConfigError(f"[{self.name}] needs {key!r}: a list of addresses "
                                    f"(in {self.where}).")
        found = tuple(a.strip() for a in items if a.strip())
        for address in found:
            if any(c in address for c in "\r\n,<>\"") or any(ord(c) < 32 for c in address):
                raise NotifyConfigError(f"[{self.name}] {key} holds {address!r}: give bare "
                                        f"addresses (ana@example.org), as a list or with "
                                        f"commas (in {self.where}).")
        return found


def question_lines(question: Question) -> list[str]:
    """A question as plain lines (outside text, to be escaped by the caller): its message,
    then each field with what it takes and its description."""
    lines = [f"Question from {question.server or 'an MCP server'} (during "
             f"{question.tool or 'a call'}):", question.message, ""]
    if question.fields:
        lines.append("Fields of the answer:")
    for field in question.fields:
        about = f": {field.description}" if field.description else ""
        lines.append(f"  - {field.title} [{field.name}] ({field.hint()}){about}")
    return lines


def details_text(details: Any) -> str:
    """A request's details as text (JSON, indented), cut after :data:`DETAILS_SHOWN`
    characters."""
    text = details if isinstance(details, str) else json.dumps(
        details, indent=2, sort_keys=True, ensure_ascii=False, default=repr)
    return text if len(text) <= DETAILS_SHOWN else text[:DETAILS_SHOWN] + " …"


def header_text(text: str, limit: int = 200) -> str:
    """Outside text made safe for one header line (an e-mail's subject): every line break
    and control character becomes a space, so it cannot start a header of its own."""
    flat = "".join(" " if ord(c) < 32 or c in "\x7f\u2028\u2029\x85" else c for c in text)
    flat = " ".join(flat.split())
    return flat if len(flat) <= limit else flat[:limit] + " …"


def post_json(url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> None:
    """POST ``body`` (JSON) to ``url``; :class:`DeliveryFailed` unless it is answered 2xx
    within ``timeout``. The error names the status or the cause, never the URL (which may
    hold a token)."""
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
