"""The loopback HTTP server: routes, faults, counters and streams (see the package's
docstring for what it guarantees)."""

from __future__ import annotations

import json
import math
import re
import socket
import struct
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

from ..llm.tokens import count_message_tokens
from .quirks import Quirks
from . import anthropic, replies
from .requests import Invalid, first_system_text, responses_messages, validate_chat, \
    validate_responses
from .scripts import DEMO_SCRIPT, FINAL_TEXT, Echo, Reply, Script, script_named

__all__ = ["DEFAULT_SUMMARY_MARKER", "ENDPOINTS", "KINDS", "SCRIPT_HEADER", "LoopbackServer",
           "StreamHold"]

DEFAULT_SUMMARY_MARKER = "Summarise the conversation"
#: The response header that names the script answering (``echo``, ``demo`` or ``script``):
#: the replies are scripted, not a model's.
SCRIPT_HEADER = "X-Loopback-Script"
KINDS = ("chat", "summary", "failure", "invalid", "dropped")
ENDPOINTS = {"/v1/chat/completions": "chat/completions", "/v1/responses": "responses",
             "/v1/messages": anthropic.ENDPOINT}
# Where clients send requests: /v1/... (OpenAI, a custom base_url), and Azure OpenAI's
# /openai/deployments/NAME/chat/completions?api-version=... (azure_endpoint), its
# base_url form BASE/deployments/NAME/... and /openai/responses; Anthropic's /v1/messages
# (a client's base_url is the server's root there); the query is ignored.
_ROUTE = re.compile(r"^/(?:v1|openai|openai/v1)(?:/deployments/[^/]+)?/(chat/completions|responses"
                    r"|messages)$")


def _endpoint(path: str) -> str | None:
    match = _ROUTE.match(path.split("?", 1)[0])
    return ENDPOINTS.get(f"/v1/{match.group(1)}") if match else None


class StreamHold:
    """Holds streamed replies after their first event until :meth:`release`, or for
    ``timeout`` seconds at most (so that a client that waits for the whole stream before
    reading fails its test instead of hanging): :attr:`released` tells which."""

    def __init__(self, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self._released = threading.Event()

    @property
    def released(self) -> bool:
        """Whether :meth:`release` was called (not merely timed out)."""
        return self._released.is_set()

    def release(self) -> None:
        self._released.set()

    def wait(self) -> None:
        self._released.wait(self.timeout)


@dataclass(frozen=True)
class _Fault:
    status: int | None  # None: drop the connection
    retry_after: float | None = None
    body: Mapping[str, Any] | str | None = None


# --- server ---------------------------------------------------------------------------

class LoopbackServer:
    """An OpenAI-compatible chat-completions and responses server on 127.0.0.1 with scripted
    replies, which answers Anthropic's Messages API (``/v1/messages``) from the
    same script (:mod:`durable_nb.testing.anthropic`).

    ``script``: replies taken round by round (:class:`Reply`, plain strings or JSON-form
    dicts), :data:`ECHO` (the generic mode, :class:`Echo`), or the name of one of those
    (``"echo"``, ``"demo"``); ``None`` means :data:`DEMO_SCRIPT`, which the project's tests
    and demo answer from (``python -m durable_nb.testing`` serves :data:`ECHO` unless told).
    ``delay`` seconds are waited before every reply. ``quirks`` turns on behaviours of real
    local servers (:class:`Quirks`). Every response carries ``X-Loopback-Script`` with
    :attr:`script_name`, so that no one takes it for a model. Thread-safe.
    """

    def __init__(self, script: Sequence[Reply | str | Mapping[str, Any]] | Echo | str | None
                 = None, *, model: str = "loopback-1", host: str = "127.0.0.1", port: int = 0,
                 summary_marker: str = DEFAULT_SUMMARY_MARKER, delay: float = 0.0,
                 quirks: Quirks | None = None) -> None:
        if script is None:
            script = DEMO_SCRIPT
        elif isinstance(script, str):
            script = script_named(script)
        self.script: Script = script if isinstance(script, Echo) else tuple(
            Reply.coerce(item) for item in script)
        self.model = model
        self.summary_marker = summary_marker
        self.delay = delay
        self.quirks = quirks or Quirks()
        self._host = host
        self._port = port
        self._lock = threading.Lock()
        self._requests: list[dict] = []
        self._counts: Counter[tuple[str, str, int | None]] = Counter()  # endpoint, kind, round
        self._faults: list[_Fault] = []
        self._loading_left = self.quirks.loading_for
        self._hold: StreamHold | None = None
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._serving = False  # shutdown() would wait forever on a server never served

    @property
    def script_name(self) -> str:
        """``"echo"``, ``"demo"`` or ``"script"`` (replies given by the caller)."""
        if isinstance(self.script, Echo):
            return self.script.name
        return "demo" if tuple(self.script) == DEMO_SCRIPT else "script"

    # lifecycle

    def bind(self) -> LoopbackServer:
        """Open the listening socket without serving yet."""
        if self._httpd is None:
            self._httpd = _HTTPServer((self._host, self._port), _Handler)
            self._httpd.loopback = self
            self._port = self._httpd.server_address[1]
        return self

    def start(self) -> LoopbackServer:
        """Serve in a daemon thread; returns self. The server answers once this returns."""
        self.bind()
        assert self._httpd is not None
        self._serving = True
        # A short poll interval: stop() waits up to one interval for the loop to notice.
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,),
                                        name=f"loopback-{self.port}", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in the calling thread until :meth:`stop` is called or the process ends."""
        self.bind()
        assert self._httpd is not None
        self._serving = True
        self._httpd.serve_forever()

    def stop(self) -> None:
        """Stop serving and close the socket. Safe to call twice."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        if self._serving:
            httpd.shutdown()
            self._serving = False
        httpd.server_close()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> LoopbackServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The bound port (the real one when constructed with port 0); kept after stop(),
        so ``LoopbackServer(port=old.port)`` restarts a server at the same URL."""
        if self._port == 0:
            raise RuntimeError("the loopback server has no port yet; call start() first")
        return self._port

    @property
    def url(self) -> str:
        """Base URL for ``openai.OpenAI(base_url=...)``, ending in ``/v1``."""
        return f"http://{self._host}:{self.port}/v1"

    # fault injection and counters

    def fail_next(self, n: int = 1, status: int = 500, *, retry_after: float | None = None,
                  body: Mapping[str, Any] | str | None = None) -> None:
        """Answer the next ``n`` valid requests (chat or responses) with HTTP ``status``
        instead of a reply, in the order faults were queued (see :meth:`drop_next`).

        ``body`` is sent as the response body: a mapping as JSON, a string as text (a
        proxy's error page). Without it the body is OpenAI's error JSON for the status: 400 is
        a deterministic "context length exceeded" (``code="context_length_exceeded"``), 429
        a rate limit, 408, 409 and 5xx server errors. ``retry_after`` seconds is sent as the
        ``retry-after-ms`` header and as ``retry-after`` (whole seconds, rounded up).
        Failed requests are counted as ``kind="failure"``, not as chat requests."""
        if not 400 <= status <= 599:
            raise ValueError(f"fail_next needs an error status (400-599), got {status}")
        with self._lock:
            self._faults.extend([_Fault(status, retry_after, body)] * n)

    def hold_streams(self, timeout: float = 30.0) -> StreamHold:
        """Make every streamed reply from now on wait after its first event until the
        returned hold is released (see :class:`StreamHold`)."""
        with self._lock:
            self._hold = StreamHold(timeout)
            return self._hold

    def drop_next(self, n: int = 1) -> None:
        """Reset the connection of the next ``n`` valid requests after reading them, without
        answering: the client sees a connection error (``openai.APIConnectionError``), which
        its retries may cover. Counted as ``kind="dropped"``."""
        with self._lock:
            self._faults.extend([_Fault(None)] * n)

    @property
    def requests(self) -> list[dict]:
        """Bodies of the valid requests that were not failed on purpose (chat and summary,
        on both endpoints), oldest first."""
        with self._lock:
            return list(self._requests)

    def count(self, round: int | None = None, *, kind: str = "chat",
              endpoint: str | None = None) -> int:
        """How many requests of ``kind`` ("chat", "summary", "failure", "invalid" or
        "dropped") were received, optionally only those of one ``round`` or one ``endpoint``
        ("chat/completions" or "responses")."""
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}; use one of {', '.join(KINDS)}")
        if endpoint is not None and endpoint not in ENDPOINTS.values():
            raise ValueError(f"unknown endpoint {endpoint!r}; use one of "
                             f"{', '.join(ENDPOINTS.values())}")
        with self._lock:
            return sum(n for (e, k, r), n in self._counts.items()
                       if k == kind and (round is None or r == round)
                       and (endpoint is None or e == endpoint))

    def stats(self) -> dict[str, Any]:
        """The counts served at ``GET /_stats``: total (every request to either endpoint),
        chat, by_round (chat requests per round), summaries, failures, invalid, dropped, and
        responses (how many of the total went to ``/v1/responses``)."""
        with self._lock:
            counts = list(self._counts.items())
        by_round: Counter[str] = Counter()
        totals: Counter[str] = Counter()
        responses = 0
        for (endpoint, kind, rnd), n in counts:
            totals[kind] += n
            responses += n if endpoint == "responses" else 0
            if kind == "chat":
                by_round[str(rnd)] += n
        return {"total": sum(totals.values()), "chat": totals["chat"],
                "by_round": dict(sorted(by_round.items(), key=lambda kv: int(kv[0]))),
                "summaries": totals["summary"], "failures": totals["failure"],
                "invalid": totals["invalid"], "dropped": totals["dropped"],
                "responses": responses}

    # request handling (called from handler threads)

    def _record(self, endpoint: str, kind: str, rnd: int | None, body: dict | None = None) -> None:
        with self._lock:
            self._counts[(endpoint, kind, rnd)] += 1
            if body is not None:
                self._requests.append(body)

    def _take_fault(self) -> _Fault | None:
        with self._lock:
            return self._faults.pop(0) if self._faults else None

    def _still_loading(self) -> bool:
        with self._lock:
            if self._loading_left > 0:
                self._loading_left -= 1
                return True
            return False

    def _answer(self, messages: list[dict], model: str, tools: Any, cap: int | None,
                digest: str, tool_choice: Any = None) -> replies.Answer:
        rnd = sum(1 for m in messages if m["role"] == "assistant")
        offered = [] if tool_choice == "none" or not isinstance(tools, list) else tools
        if self.summary_marker in first_system_text(messages):
            kind, reply = "summary", Reply(content=replies.summary_text(messages))
        elif isinstance(self.script, Echo):
            kind, reply = "chat", self.script.reply(messages, offered)
        else:
            kind = "chat"
            reply = self.script[rnd] if rnd < len(self.script) else Reply(content=FINAL_TEXT)
        reply, completion_tokens, truncated = replies.cap_reply(model, reply, cap)
        call_ids = tuple(f"call_{rnd}_{i}" for i in range(len(reply.tool_calls)))
        # Prompt tokens as the API bills them (durable_nb.llm.tokens follows OpenAI's method).
        prompt = count_message_tokens(messages, model, tools) + self.quirks.extra_prompt_tokens
        return replies.Answer(kind, rnd, reply, call_ids, digest, prompt, completion_tokens,
                              truncated)

    def _answer_chat(self, body: dict) -> replies.Answer:
        caps = [body[k] for k in ("max_tokens", "max_completion_tokens") if body.get(k)]
        cap = None if self.quirks.ignore_completion_caps or not caps else min(caps)
        return self._answer(body["messages"], str(body["model"]), body.get("tools"), cap,
                            replies.digest_of(body.get("model"), body["messages"]),
                            body.get("tool_choice"))

    def _answer_messages(self, body: dict) -> replies.Answer:
        messages, tools = anthropic.as_chat(body)
        cap = None if self.quirks.ignore_completion_caps else body.get("max_tokens")
        return self._answer(messages, str(body["model"]), tools, cap,
                            replies.digest_of(body.get("model"), body.get("system"),
                                              body["messages"]),
                            (body.get("tool_choice") or {}).get("type"))

    def _answer_responses(self, body: dict) -> replies.Answer:
        return self._answer(responses_messages(body), str(body["model"]), body.get("tools"),
                            body.get("max_output_tokens"),
                            replies.digest_of(body.get("model"), body.get("instructions"),
                                              body["input"]), body.get("tool_choice"))


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    loopback: LoopbackServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up mid-stream (a killed kernel) is normal here, not an error.
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the openai client expects
    # Headers and body go out in separate writes: with Nagle's algorithm on, the body waits
    # for the client's delayed ACK, about 40 ms per reply.
    disable_nagle_algorithm = True
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # tests read counts, not access logs

    def do_GET(self) -> None:
        lb = self.server.loopback
        if self.path == "/v1/models":
            self._send_json(200, {"object": "list", "data": [
                {"id": lb.model, "object": "model", "created": 0,
                 "owned_by": f"durable_nb loopback server, scripted ({lb.script_name})"}]})
        elif self.path == "/_stats":
            self._send_json(200, lb.stats())
        else:
            self._not_found("GET")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        endpoint = _endpoint(self.path)
        if endpoint is None:
            self._not_found("POST")
            return
        lb = self.server.loopback
        if lb._still_loading():
            lb._record(endpoint, "failure", None)
            self._send_json(503, replies.LOADING_BODY)
            return
        chat = endpoint == "chat/completions"
        messages = endpoint == anthropic.ENDPOINT
        validate = (validate_chat if chat else anthropic.validate_messages if messages
                    else validate_responses)
        try:
            try:
                body = json.loads(raw)
            except ValueError:
                raise Invalid("We could not parse the JSON body of your request. The OpenAI "
                               "API expects a JSON payload, but what was sent was not valid "
                               "JSON.") from None
            validate(body)
        except Invalid as e:
            lb._record(endpoint, "invalid", None)
            self._send_json(400, replies.error_body(str(e), "invalid_request_error", e.param,
                                                    e.code))
            return

        answer = (lb._answer_chat(body) if chat else lb._answer_messages(body) if messages
                  else lb._answer_responses(body))
        rnd = answer.round if answer.kind == "chat" else None
        fault = lb._take_fault()
        if fault is not None and fault.status is None:
            lb._record(endpoint, "dropped", rnd)
            self._reset_connection()
            return
        if fault is not None:
            lb._record(endpoint, "failure", rnd)
            self._send_failure(fault, replies.default_failure(fault.status, endpoint, answer,
                                                       str(body["model"])))
            return
        if chat and lb.quirks.require_content and any(
                m["role"] == "assistant" and "content" not in m for m in body["messages"]):
            lb._record(endpoint, "failure", rnd)
            self._send_json(500, replies.TEMPLATE_FAILURE)
            return
        if chat and lb.quirks.require_string_content and any(
                m["role"] == "assistant" and "content" in m and not isinstance(m["content"], str)
                for m in body["messages"]):
            lb._record(endpoint, "failure", rnd)
            self._send_json(500, replies.CONTENT_VALIDATION_FAILURE)
            return

        # Counted on receipt, so a client killed during the delay still shows its call.
        lb._record(endpoint, answer.kind, rnd, body)
        wait = lb.delay + answer.reply.delay
        if wait > 0:
            time.sleep(wait)
        model = body["model"]
        if messages and body.get("stream"):
            self._send_events(anthropic.events(answer, model, lb.quirks))
        elif messages:
            self._send_json(200, anthropic.message(answer, model, lb.quirks))
        elif chat and body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            self._send_events((None, c)
                              for c in replies.chunks(answer, model, include_usage, lb.quirks))
            self._send_done()
        elif chat:
            self._send_json(200, replies.completion(answer, model, lb.quirks))
        elif body.get("stream"):
            self._send_events((e["type"], e) for e in replies.response_events(answer, body, lb.quirks))
        else:
            self._send_json(200, replies.response(answer, body, int(time.time()),
                                                  replies.output_items(answer), lb.quirks))

    # responses

    def _send_json(self, status: int, payload: dict,
                   headers: Mapping[str, str] | None = None) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json", headers)

    def _send(self, status: int, data: bytes, content_type: str,
              headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header(SCRIPT_HEADER, self.server.loopback.script_name)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_failure(self, fault: _Fault, default: dict) -> None:
        assert fault.status is not None
        headers = {}
        if fault.retry_after is not None:
            headers = {"retry-after-ms": str(int(fault.retry_after * 1000)),
                       "retry-after": str(math.ceil(fault.retry_after))}
        if isinstance(fault.body, str):
            self._send(fault.status, fault.body.encode(), "text/plain; charset=utf-8", headers)
        else:
            self._send_json(fault.status, dict(fault.body) if fault.body is not None else default,
                            headers)

    def _send_events(self, events: Iterator[tuple[str | None, dict]]) -> None:
        """Server-sent events, each ``data: JSON`` with an ``event:`` line when named."""
        # No length is known up front, so the end of the body is the end of the connection.
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header(SCRIPT_HEADER, self.server.loopback.script_name)
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        hold = self.server.loopback._hold
        for number, (name, data) in enumerate(events):
            if number == 1 and hold is not None:
                hold.wait()
            line = f"event: {name}\n" if name else ""
            self.wfile.write(f"{line}data: {json.dumps(data)}\n\n".encode())
            self.wfile.flush()

    def _send_done(self) -> None:
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _reset_connection(self) -> None:
        # SO_LINGER 0: closing sends a TCP reset instead of an orderly end of stream.
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        self.connection.close()
        self.rfile.close()  # the socket really closes once its last file is closed

    def _not_found(self, method: str) -> None:
        self._send_json(404, replies.error_body(f"Invalid URL ({method} {self.path})",
                                         "invalid_request_error"))
