"""The receiving side of the webhook: :func:`verify` (what a receiver must check), and a
loopback receiver that uses it, for tests, notebooks and as a starting point.

A receiver checks the signature with its copy of the shared secret, refuses a timestamp
older than it accepts (a replay), and keeps the delivery ids it saw (a delivery is sent at
least once: see :mod:`durable_nb.notify.delivery`).
"""

from __future__ import annotations

import hmac
import json
import socket
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .channels import DELIVERY_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, sign

__all__ = ["WebhookReceiver", "free_port", "verify"]


def verify(secret: str, headers: Mapping[str, str], body: bytes, *,
           tolerance: float = 300.0, now: float | None = None) -> str | None:
    """Why the webhook request is refused, or None when it is genuine: signed with
    ``secret`` over its timestamp and raw body, and no more than ``tolerance`` seconds old.
    Header names in any case (HTTP's are case-insensitive)."""
    headers = {k.lower(): v for k, v in headers.items()}
    timestamp = headers.get(TIMESTAMP_HEADER.lower())
    signature = headers.get(SIGNATURE_HEADER.lower())
    if not timestamp or not signature:
        return "not signed"
    if not hmac.compare_digest(sign(secret, timestamp, body), signature):
        return "bad signature"
    try:
        age = (time.time() if now is None else now) - int(timestamp)
    except ValueError:
        return "bad timestamp"
    if abs(age) > tolerance:
        return "too old (a replay?)"
    return None


def free_port() -> int:
    """A loopback port nothing listens on (a URL there is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WebhookReceiver:
    """An HTTP server on loopback, in a thread, that keeps every request it gets (its
    ``headers`` with lower-case names).

    ``status``: what it answers (200; 500 to fail every delivery); ``hang``: how many of
    the first requests it never answers (until :meth:`stop`), so that their sender's read
    times out; ``answer_after``: seconds it waits before answering each request (a slow
    receiver: the request has arrived, its sender waits). ``secret``: each request's
    ``verified`` says whether :func:`verify` accepted it."""

    def __init__(self, secret: str | None = None, *, status: int = 200,
                 hang: int = 0, answer_after: float = 0.0) -> None:
        self.secret = secret
        self.status = status
        self.hang = hang
        self.answer_after = answer_after
        self.requests: list[dict[str, Any]] = []
        self._seen = threading.Condition()
        self._stopped = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                refused = verify(receiver.secret, headers, body) if receiver.secret else None
                with receiver._seen:
                    receiver.requests.append({
                        "path": self.path, "headers": headers, "body": body,
                        "json": json.loads(body or b"null"), "verified": refused is None,
                        "refused": refused, "delivery": headers.get(DELIVERY_HEADER.lower()),
                        "at": time.time()})
                    receiver._seen.notify_all()
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

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hook"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def wait_for(self, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        """The requests once at least ``count`` arrived (AssertionError after ``timeout``)."""
        with self._seen:
            if not self._seen.wait_for(lambda: len(self.requests) >= count, timeout):
                raise AssertionError(f"the receiver got {len(self.requests)} requests, "
                                     f"not {count}, in {timeout:g} s")
            return list(self.requests)

    def stop(self) -> None:
        self._stopped.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "WebhookReceiver":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
