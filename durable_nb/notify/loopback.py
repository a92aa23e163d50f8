"""The receiving side: :func:`verify` (what a webhook receiver must check), a loopback
webhook receiver that uses it, and a loopback SMTP server (:class:`MailSink`), for tests,
notebooks and as a starting point. Both need nothing beyond the standard library.

A webhook receiver checks the signature with its copy of the shared secret (it covers the
timestamp, the delivery id and the body), refuses a timestamp older than it accepts (a
replay), and keeps the delivery ids it verified (a delivery is sent at least once: see
:mod:`durable_nb.notify.delivery`), answering a repeated one with 200 and doing nothing.
"""

from __future__ import annotations

import email
import hmac
import email.policy
import json
import socket
import socketserver
import threading
import time
from collections.abc import Iterable, Mapping
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

from .channels.webhook import DELIVERY_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, sign

__all__ = ["LoopbackReceiver", "MailSink", "WebhookReceiver", "free_port", "verify"]

_Receiver = TypeVar("_Receiver", bound="LoopbackReceiver")


def verify(secret: str, headers: Mapping[str, str], body: bytes, *,
           tolerance: float = 300.0, now: float | None = None) -> str | None:
    """Why the webhook request is refused, or None when it is genuine: signed with
    ``secret`` over its timestamp, its delivery id and its raw body, and no more than
    ``tolerance`` seconds old. Header names in any case (HTTP's are case-insensitive; servers
    give them as ``X-Durable-Nb-...`` or lower-cased). Once it is accepted, its
    ``X-Durable-NB-Delivery`` is the signed id to dedupe on."""
    headers = {k.lower(): v for k, v in headers.items()}
    timestamp = headers.get(TIMESTAMP_HEADER.lower())
    signature = headers.get(SIGNATURE_HEADER.lower())
    delivery = headers.get(DELIVERY_HEADER.lower())
    if not timestamp or not signature or not delivery:
        return "not signed"
    if not hmac.compare_digest(sign(secret, timestamp, delivery, body), signature):
        return "bad signature"
    if not (timestamp.isascii() and timestamp.isdigit()):
        return "bad timestamp"
    age = (time.time() if now is None else now) - int(timestamp)
    if abs(age) > tolerance:
        return "too old (a replay?)"
    return None


def free_port() -> int:
    """A loopback port nothing listens on (a URL there is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LoopbackReceiver:
    """A server on loopback, serving in a daemon thread from construction until
    :meth:`stop` (or the end of its ``with`` block), that keeps what it receives in
    ``received``, in order of arrival, for :meth:`wait_for`. A subclass builds its
    ``server`` (port 0: one the system picks) and appends under :meth:`_keep`."""

    #: How :meth:`wait_for`'s error names the receiver and what it receives.
    noun = "receiver"
    items = "items"

    def __init__(self, server: socketserver.BaseServer) -> None:
        self.received: list[Any] = []
        self._seen = threading.Condition()
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()

    def _keep(self, *items: Any) -> None:
        """Add ``items`` to ``received`` and wake :meth:`wait_for`."""
        with self._seen:
            self.received.extend(items)
            self._seen.notify_all()

    def wait_for(self, count: int, timeout: float = 30.0) -> list[Any]:
        """What was received once at least ``count`` arrived (AssertionError after
        ``timeout`` seconds, naming how many did)."""
        with self._seen:
            if not self._seen.wait_for(lambda: len(self.received) >= count, timeout):
                raise AssertionError(f"the {self.noun} got {len(self.received)} "
                                     f"{self.items}, not {count}, in {timeout:g} s")
            return list(self.received)

    def stop(self) -> None:
        """Stop serving and close the port."""
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self: _Receiver) -> _Receiver:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class WebhookReceiver(LoopbackReceiver):
    """An HTTP server on loopback, in a thread, that keeps every request it gets (its
    ``headers`` with lower-case names).

    ``status``: what it answers (200; 500 to fail every delivery); ``hang``: how many of
    the first requests it never answers (until :meth:`stop`), so that their sender's read
    times out; ``answer_after``: seconds it waits before answering each request (a slow
    receiver: the request has arrived, its sender waits). ``secret``: each request's
    ``verified`` says whether :func:`verify` accepted it."""

    noun, items = "receiver", "requests"

    def __init__(self, secret: str | None = None, *, status: int = 200,
                 hang: int = 0, answer_after: float = 0.0) -> None:
        self.secret = secret
        self.status = status
        self.hang = hang
        self.answer_after = answer_after
        self._stopped = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                refused = verify(receiver.secret, headers, body) if receiver.secret else None
                with receiver._seen:
                    receiver._keep({
                        "path": self.path, "headers": headers, "body": body,
                        "json": json.loads(body or b"null"), "verified": refused is None,
                        "refused": refused, "delivery": headers.get(DELIVERY_HEADER.lower()),
                        "at": time.time()})
                    hangs = len(receiver.requests) <= receiver.hang
                if hangs:
                    receiver._stopped.wait()
                    return
                if receiver.answer_after:
                    receiver._stopped.wait(receiver.answer_after)
                self.send_response(receiver.status)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        super().__init__(server)

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Every request received, in order: ``path``, ``headers``, ``body``, ``json``,
        ``verified``, ``refused``, ``delivery``, ``at``."""
        return self.received

    def stop(self) -> None:
        """Answer the requests held (``hang``, ``answer_after``: their senders go on),
        then stop serving."""
        self._stopped.set()
        super().stop()


class MailSink(LoopbackReceiver):
    """An SMTP server on loopback, in a thread, that keeps every message it accepts: the
    standard library only, so a notebook runs it under ``pip install "durable-nb[lab]"``.

    It speaks what :mod:`smtplib` sends (EHLO/HELO, MAIL, RCPT, DATA, RSET, NOOP, QUIT; no
    STARTTLS, no login). ``messages``: each accepted one, parsed (an
    :class:`~email.message.EmailMessage`); ``envelopes``: its sender and recipients as the
    client gave them. ``refuse``: addresses whose ``RCPT`` it answers 550, as a server does
    for a mailbox that does not exist."""

    noun, items = "mail sink", "messages"

    def __init__(self, *, refuse: Iterable[str] = ()) -> None:
        self.refuse = {address.lower() for address in refuse}
        self.envelopes: list[dict[str, Any]] = []
        sink = self

        class Session(socketserver.StreamRequestHandler):
            def reply(self, *lines: str) -> None:
                text = "".join(f"{line[:3]}{'-' if i < len(lines) - 1 else ' '}{line[4:]}\r\n"
                               for i, line in enumerate(lines))
                self.wfile.write(text.encode())

            def handle(self) -> None:
                self.reply("220 durable-nb mail sink")
                sender: str | None = None
                recipients: list[str] = []
                while line := self.rfile.readline(65536):
                    verb, _, argument = line.decode("utf-8", "replace").strip().partition(" ")
                    verb = verb.upper()
                    if verb == "EHLO":
                        self.reply("250 127.0.0.1", "250 8BITMIME", "250 SMTPUTF8")
                    elif verb == "HELO":
                        self.reply("250 127.0.0.1")
                    elif verb == "MAIL":
                        sender, recipients = _address(argument), []
                        self.reply("250 OK")
                    elif verb == "RCPT":
                        address = _address(argument)
                        if sender is None:
                            self.reply("503 MAIL first")
                        elif address.lower() in sink.refuse:
                            self.reply("550 5.1.1 no such mailbox")
                        else:
                            recipients.append(address)
                            self.reply("250 OK")
                    elif verb == "DATA":
                        if not recipients:
                            self.reply("503 RCPT first")
                            continue
                        self.reply("354 end with <CR><LF>.<CR><LF>")
                        sink._keep_message(sender, recipients, self._data())
                        sender, recipients = None, []
                        self.reply("250 OK")
                    elif verb == "RSET":
                        sender, recipients = None, []
                        self.reply("250 OK")
                    elif verb == "NOOP":
                        self.reply("250 OK")
                    elif verb == "QUIT":
                        self.reply("221 bye")
                        return
                    else:
                        self.reply("502 not implemented")

            def _data(self) -> bytes:
                lines = []
                while (line := self.rfile.readline(65536)) not in (b".\r\n", b".\n", b""):
                    lines.append(line[1:] if line.startswith(b"..") else line)
                return b"".join(lines)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        server = Server(("127.0.0.1", 0), Session)
        self.host, self.port = server.server_address[:2]
        super().__init__(server)

    @property
    def messages(self) -> list[EmailMessage]:
        """Every message accepted, parsed, in order."""
        return self.received

    def _keep_message(self, sender: str | None, recipients: list[str], data: bytes) -> None:
        message = email.message_from_bytes(data.replace(b"\r\n", b"\n"),
                                           policy=email.policy.default)
        with self._seen:  # the envelope first: a waiter woken by the message reads it
            self.envelopes.append({"from": sender, "to": list(recipients), "data": data})
            self._keep(message)


def _address(argument: str) -> str:
    """The address of ``FROM:<a@b> BODY=8BITMIME`` or ``TO:<a@b>``."""
    _, _, rest = argument.partition(":")
    rest = rest.strip()
    if rest.startswith("<"):
        return rest[1:rest.find(">")] if ">" in rest else rest[1:]
    return rest.split(" ")[0]
