"""A loopback OpenAI-compatible chat server with scripted, deterministic replies.

Used by the project's tests and its offline demo through the real ``openai`` client::

    with LoopbackServer([Reply(tool_calls=[ToolCall("read_csv", {"path": "a.csv"})]), "done"]) as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="any")
        client.chat.completions.create(model="loopback-1", messages=[...])

Guarantees:

- The reply depends on the request alone: its *round* is the number of ``assistant``
  messages already in ``messages``, and the reply is ``script[round]`` (past the end of the
  script, a plain final text ``"done"``). Completion ids and tool-call ids
  (``call_{round}_{i}``) are derived from the request too, so a restarted server, or one in
  another process, answers the same request the same way.
- Requests are validated like the real API (missing model or messages, unknown role, tool
  messages that answer no tool call, tool calls left unanswered, invalid JSON) and refused
  with HTTP 400 and the OpenAI error JSON, so the client raises ``openai.BadRequestError``.
- Every response carries ``usage``, counted with :mod:`durable_nb.tokens` for the requested
  model (the API's billing rule, offline).
- ``stream=True`` answers with ``chat.completion.chunk`` server-sent events ending in
  ``data: [DONE]``, with a final usage chunk when ``stream_options.include_usage`` is set.
- A request whose first system (or developer) message contains ``summary_marker`` is a
  summarisation request: it gets a short deterministic summary and is counted apart.

Run ``python -m durable_nb.testing [--port P] [--script FILE.json]`` to serve in the
foreground; the first stdout line is ``LOOPBACK_URL=http://127.0.0.1:PORT/v1``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator, Mapping, Sequence

from .tokens import count_message_tokens, encoding_for

__all__ = [
    "DEMO_SCRIPT",
    "LoopbackServer",
    "Reply",
    "ToolCall",
    "load_script",
    "main",
]

DEFAULT_SUMMARY_MARKER = "Summarise the conversation"
FINAL_TEXT = "done"
ROLES = ("system", "developer", "user", "assistant", "tool", "function")
KINDS = ("chat", "summary", "failure", "invalid")


@dataclass(frozen=True)
class ToolCall:
    """One scripted tool call; ``arguments`` is a dict (sent as JSON) or a JSON string."""

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)

    @property
    def arguments_json(self) -> str:
        """The arguments exactly as the server sends them."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments)


@dataclass(frozen=True)
class Reply:
    """One scripted assistant reply: text, tool calls, or both.

    ``delay`` seconds are waited before answering (on top of the server's own ``delay``),
    so a test can kill a process while a model call is in flight.
    """

    content: str | None = None
    tool_calls: Sequence[ToolCall] = ()
    delay: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "tool_calls", tuple(self.tool_calls))
        if self.content is None and not self.tool_calls:
            raise ValueError("a Reply needs content, tool_calls, or both; got neither")

    @classmethod
    def coerce(cls, item: Reply | str | Mapping[str, Any]) -> Reply:
        """Accept a Reply, a plain string (final text), or the JSON script form
        ``{"content": ..., "tool_calls": [{"name": ..., "arguments": {...}}], "delay": 0}``."""
        if isinstance(item, Reply):
            return item
        if isinstance(item, str):
            return cls(content=item)
        if isinstance(item, Mapping):
            unknown = set(item) - {"content", "tool_calls", "delay"}
            if unknown:
                raise ValueError(f"unknown keys {sorted(unknown)} in script entry {item!r}; "
                                 f"allowed: content, tool_calls, delay")
            calls = [ToolCall(c["name"], c.get("arguments", {})) for c in item.get("tool_calls", [])]
            return cls(content=item.get("content"), tool_calls=calls,
                       delay=float(item.get("delay", 0.0)))
        raise TypeError(f"a script entry must be a Reply, a str or a dict, not {type(item).__name__}")


DEMO_SCRIPT: tuple[Reply, ...] = (
    Reply(tool_calls=[ToolCall("read_csv", {"path": "sales.csv"})]),
    Reply(tool_calls=[ToolCall("analyse", {"column": "revenue"})]),
    Reply(tool_calls=[ToolCall("write_report", {"title": "Q3 sales"})]),
    Reply(tool_calls=[ToolCall("send_email", {"to": "team@example.com",
                                              "subject": "Q3 sales report"})]),
    Reply(content="The Q3 sales report is done: I read sales.csv, analysed the revenue column, "
                  "wrote the report 'Q3 sales' and emailed it to team@example.com."),
)
"""The offline demo's "sales report" agent: four tool calls, then a final answer."""


def load_script(path: str) -> list[Reply]:
    """Read a JSON script: a list whose entries are strings or
    ``{"content": ..., "tool_calls": [{"name": ..., "arguments": {...}}]}``."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, list):
        raise ValueError(f"the script {path} must hold a JSON list of replies, "
                         f"not {type(data).__name__}")
    return [Reply.coerce(item) for item in data]


# --- token counting -------------------------------------------------------------------

def _completion_tokens(model: str, content: str | None, tool_calls: Sequence[ToolCall]) -> int:
    """Completion tokens: the reply text plus each tool call's name and JSON arguments."""
    enc = encoding_for(model)
    total = len(enc.encode(content or "", disallowed_special=()))
    for call in tool_calls:
        total += len(enc.encode(call.name + call.arguments_json, disallowed_special=()))
    return total


# --- validation -----------------------------------------------------------------------

class _Invalid(Exception):
    """A request the real API would refuse with 400."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


def _validate(body: Any) -> None:
    if not isinstance(body, dict):
        raise _Invalid("Invalid body: expected a JSON object.")
    if not body.get("model"):
        raise _Invalid("you must provide a model parameter")
    messages = body.get("messages")
    if messages is None:
        raise _Invalid("Missing required parameter: 'messages'.", "messages",
                       "missing_required_parameter")
    if not isinstance(messages, list) or not messages:
        raise _Invalid("Invalid 'messages': expected a non-empty array of messages.", "messages",
                       "invalid_value")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m:
            raise _Invalid(f"Missing required parameter: 'messages[{i}].role'.",
                           f"messages[{i}].role", "missing_required_parameter")
        if m["role"] not in ROLES:
            raise _Invalid(f"Invalid value: {m['role']!r}. Supported values are: 'system', "
                           f"'assistant', 'user', 'function', 'tool', and 'developer'.",
                           f"messages[{i}].role", "invalid_value")
        calls = m.get("tool_calls") or []
        if not isinstance(calls, list) or not all(isinstance(c, dict) and c.get("id")
                                                  for c in calls):
            raise _Invalid(f"Invalid 'messages[{i}].tool_calls': expected an array of tool calls, "
                           f"each with an 'id'.", f"messages[{i}].tool_calls", "invalid_type")
    _validate_tool_pairs(messages)


def _validate_tool_pairs(messages: list[dict]) -> None:
    last_calls: set[str] | None = None  # ids of the nearest preceding assistant message
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            last_calls = {c.get("id") for c in m.get("tool_calls") or []}
            answered = set()
            for follower in messages[i + 1:]:
                if follower["role"] != "tool":
                    break
                answered.add(follower.get("tool_call_id"))
            missing = [cid for cid in sorted(last_calls) if cid not in answered]
            if missing:
                raise _Invalid("An assistant message with 'tool_calls' must be followed by tool "
                               "messages responding to each 'tool_call_id'. The following "
                               f"tool_call_ids did not have response messages: {', '.join(missing)}",
                               f"messages.[{i}].role")
        elif m["role"] == "tool" and m.get("tool_call_id") not in (last_calls or set()):
            raise _Invalid("Invalid parameter: messages with role 'tool' must be a response to a "
                           "preceding message with 'tool_calls' (tool_call_id "
                           f"{m.get('tool_call_id')!r} matches none of them).",
                           f"messages.[{i}].role")


# --- replies --------------------------------------------------------------------------

def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: only text parts carry text
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _first_system_text(messages: list[dict]) -> str:
    for m in messages:
        if m["role"] in ("system", "developer"):
            return _text_of(m.get("content"))
    return ""


def _summary_text(messages: list[dict]) -> str:
    tools = [c.get("function", {}).get("name", "?")
             for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    first_user = next((_text_of(m.get("content")) for m in messages if m["role"] == "user"), "")
    return (f"Summary of {len(messages)} messages: the user asked {first_user[:80]!r}; "
            f"tools called: {', '.join(tools) or 'none'}.")


def _digest(body: dict) -> str:
    canonical = json.dumps([body.get("model"), body["messages"]], sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:24]


def _pieces(text: str, n: int = 3) -> list[str]:
    """Split text into about n non-empty pieces that join back to it."""
    size = max(1, -(-len(text) // n))
    return [text[i:i + size] for i in range(0, len(text), size)]


@dataclass(frozen=True)
class _Answer:
    kind: str  # "chat" or "summary"
    round: int
    reply: Reply
    call_ids: tuple[str, ...]
    completion_id: str
    usage: dict


# --- server ---------------------------------------------------------------------------

class LoopbackServer:
    """An OpenAI-compatible chat-completions server on 127.0.0.1 with scripted replies.

    ``script`` entries are :class:`Reply`, plain strings or JSON-form dicts; ``None`` means
    :data:`DEMO_SCRIPT`. ``delay`` seconds are waited before every reply. Thread-safe.
    """

    def __init__(self, script: Sequence[Reply | str | Mapping[str, Any]] | None = None, *,
                 model: str = "loopback-1", host: str = "127.0.0.1", port: int = 0,
                 summary_marker: str = DEFAULT_SUMMARY_MARKER, delay: float = 0.0) -> None:
        self.script: tuple[Reply, ...] = tuple(
            Reply.coerce(item) for item in (DEMO_SCRIPT if script is None else script))
        self.model = model
        self.summary_marker = summary_marker
        self.delay = delay
        self._host = host
        self._port = port
        self._lock = threading.Lock()
        self._requests: list[dict] = []
        self._counts: Counter[tuple[str, int | None]] = Counter()
        self._failures: list[tuple[int, float | None]] = []
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._serving = False  # shutdown() would wait forever on a server never served

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

    def fail_next(self, n: int = 1, status: int = 500, *, retry_after: float | None = None) -> None:
        """Answer the next ``n`` valid chat requests with HTTP ``status`` (e.g. 500, 429)
        instead of a reply. ``retry_after`` seconds is sent as ``retry-after-ms`` if given.
        Failed requests are counted as ``kind="failure"``, not as chat requests."""
        if status < 400:
            raise ValueError(f"fail_next needs an error status (>= 400), got {status}")
        with self._lock:
            self._failures.extend([(status, retry_after)] * n)

    @property
    def requests(self) -> list[dict]:
        """Bodies of the valid requests that were not failed on purpose (chat and summary),
        oldest first."""
        with self._lock:
            return list(self._requests)

    def count(self, round: int | None = None, *, kind: str = "chat") -> int:
        """How many requests of ``kind`` ("chat", "summary", "failure" or "invalid") were
        received, optionally only those of one ``round``."""
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}; use one of {', '.join(KINDS)}")
        with self._lock:
            return sum(n for (k, r), n in self._counts.items()
                       if k == kind and (round is None or r == round))

    def stats(self) -> dict[str, Any]:
        """The counts served at ``GET /_stats``: total (every chat-completions request),
        chat, by_round (chat requests per round), summaries, failures, invalid."""
        with self._lock:
            by_round: Counter[str] = Counter()
            for (kind, rnd), n in self._counts.items():
                if kind == "chat":
                    by_round[str(rnd)] += n
            totals = Counter()
            for (kind, _), n in self._counts.items():
                totals[kind] += n
        return {"total": sum(totals.values()), "chat": totals["chat"],
                "by_round": dict(sorted(by_round.items(), key=lambda kv: int(kv[0]))),
                "summaries": totals["summary"], "failures": totals["failure"],
                "invalid": totals["invalid"]}

    # request handling (called from handler threads)

    def _record(self, kind: str, rnd: int | None, body: dict | None = None) -> None:
        with self._lock:
            self._counts[(kind, rnd)] += 1
            if body is not None:
                self._requests.append(body)

    def _take_failure(self) -> tuple[int, float | None] | None:
        with self._lock:
            return self._failures.pop(0) if self._failures else None

    def _answer(self, body: dict) -> _Answer:
        messages = body["messages"]
        rnd = sum(1 for m in messages if m["role"] == "assistant")
        if self.summary_marker in _first_system_text(messages):
            kind, reply = "summary", Reply(content=_summary_text(messages))
        else:
            kind = "chat"
            reply = self.script[rnd] if rnd < len(self.script) else Reply(content=FINAL_TEXT)
        call_ids = tuple(f"call_{rnd}_{i}" for i in range(len(reply.tool_calls)))
        # Prompt tokens as the API bills them (durable_nb.tokens follows OpenAI's method).
        p = count_message_tokens(messages, str(body["model"]), body.get("tools"))
        c = _completion_tokens(str(body["model"]), reply.content, reply.tool_calls)
        usage = {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
        return _Answer(kind, rnd, reply, call_ids, f"chatcmpl-{_digest(body)}", usage)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    loopback: LoopbackServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up mid-stream (a killed kernel) is normal here, not an error.
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


def _error_body(message: str, type_: str, param: str | None = None,
                code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


_FAILURE_MESSAGES = {
    429: ("Rate limit reached (injected by the loopback server).", "requests", "rate_limit_exceeded"),
}


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
                {"id": lb.model, "object": "model", "created": 0, "owned_by": "loopback"}]})
        elif self.path == "/_stats":
            self._send_json(200, lb.stats())
        else:
            self._not_found("GET")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path != "/v1/chat/completions":
            self._not_found("POST")
            return
        lb = self.server.loopback
        try:
            try:
                body = json.loads(raw)
            except ValueError:
                raise _Invalid("We could not parse the JSON body of your request. The OpenAI "
                               "API expects a JSON payload, but what was sent was not valid "
                               "JSON.") from None
            _validate(body)
        except _Invalid as e:
            lb._record("invalid", None)
            self._send_json(400, _error_body(str(e), "invalid_request_error", e.param, e.code))
            return

        answer = lb._answer(body)
        failure = lb._take_failure()
        if failure is not None:
            status, retry_after = failure
            lb._record("failure", answer.round)
            message, type_, code = _FAILURE_MESSAGES.get(status, (
                f"The server had an error while processing your request (injected status "
                f"{status}).", "server_error", None))
            headers = {} if retry_after is None else {"retry-after-ms": str(int(retry_after * 1000))}
            self._send_json(status, _error_body(message, type_, None, code), headers)
            return

        # Counted on receipt, so a client killed during the delay still shows its call.
        lb._record(answer.kind, answer.round if answer.kind == "chat" else None, body)
        wait = lb.delay + answer.reply.delay
        if wait > 0:
            time.sleep(wait)
        model = body["model"]
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            self._send_stream(_chunks(answer, model, include_usage))
        else:
            self._send_json(200, _completion(answer, model))

    # responses

    def _send_json(self, status: int, payload: dict,
                   headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_stream(self, chunks: Iterator[dict]) -> None:
        # No length is known up front, so the end of the body is the end of the connection.
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        for chunk in chunks:
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _not_found(self, method: str) -> None:
        self._send_json(404, _error_body(f"Invalid URL ({method} {self.path})",
                                         "invalid_request_error"))


def _completion(a: _Answer, model: str) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": a.reply.content, "refusal": None}
    if a.reply.tool_calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function",
             "function": {"name": call.name, "arguments": call.arguments_json}}
            for cid, call in zip(a.call_ids, a.reply.tool_calls)]
    return {"id": a.completion_id, "object": "chat.completion", "created": int(time.time()),
            "model": model, "system_fingerprint": "loopback",
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": "tool_calls" if a.reply.tool_calls else "stop"}],
            "usage": a.usage}


def _chunks(a: _Answer, model: str, include_usage: bool) -> Iterator[dict]:
    created = int(time.time())

    def chunk(delta: dict, finish_reason: str | None = None) -> dict:
        c = {"id": a.completion_id, "object": "chat.completion.chunk", "created": created,
             "model": model, "system_fingerprint": "loopback",
             "choices": [{"index": 0, "delta": delta, "logprobs": None,
                          "finish_reason": finish_reason}]}
        if include_usage:
            c["usage"] = None
        return c

    # Like the real API: the role chunk has content "" for text replies, null for tool calls.
    yield chunk({"role": "assistant", "content": "" if a.reply.content is not None else None,
                 "refusal": None})
    for piece in _pieces(a.reply.content or ""):
        yield chunk({"content": piece})
    for i, (cid, call) in enumerate(zip(a.call_ids, a.reply.tool_calls)):
        yield chunk({"tool_calls": [{"index": i, "id": cid, "type": "function",
                                     "function": {"name": call.name, "arguments": ""}}]})
        for piece in _pieces(call.arguments_json):
            yield chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
    yield chunk({}, "tool_calls" if a.reply.tool_calls else "stop")
    if include_usage:
        yield {"id": a.completion_id, "object": "chat.completion.chunk", "created": created,
               "model": model, "system_fingerprint": "loopback", "choices": [],
               "usage": a.usage}


# --- CLI ------------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> None:
    """``python -m durable_nb.testing``: serve in the foreground until killed."""
    parser = argparse.ArgumentParser(prog="python -m durable_nb.testing",
                                     description="Loopback OpenAI-compatible server with "
                                                 "scripted replies (default: the demo script).")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free)")
    parser.add_argument("--script", help="JSON file: a list of replies (strings or "
                                         "{'content': ..., 'tool_calls': [...]})")
    parser.add_argument("--model", default="loopback-1")
    args = parser.parse_args(argv)
    try:
        script = load_script(args.script) if args.script else None
    except (OSError, ValueError, TypeError, KeyError) as e:
        parser.error(f"cannot use the script {args.script}: {e}")
    server = LoopbackServer(script, model=args.model, port=args.port).bind()
    print(f"LOOPBACK_URL={server.url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
