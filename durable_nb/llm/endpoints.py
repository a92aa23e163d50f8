"""Calling an OpenAI-compatible endpoint for ``ctx.chat``, ``ctx.respond`` and ``ctx.compact``:
one retry layer, and errors that say where the call went and how the run goes on.

**One retry layer.** durable_nb retries; the openai client does not. Clients durable_nb makes
(:func:`default_client`) have ``max_retries=0``, and a client passed in (``client=``,
``RunOptions(client=...)``) is used through ``client.with_options(max_retries=0)`` (made once
per client), so its own retries never stack on ours. One LLM call is sent at most
:data:`DEFAULT_RETRY` ``.max_attempts`` (4) times, and the waits between attempts add up to at
most :data:`MAX_RETRY_WAIT` seconds (60): 0.5, 1 and 2 s (each +-20 %) unless the server says
how long to wait (``retry-after-ms`` / ``retry-after``, honoured while the total stays within
the limit). A dead endpoint therefore fails after about 3.5 s.

**Which errors are retried** (:func:`is_transient`): connection errors and resets, timeouts,
HTTP 408, 409, 429 (not ``insufficient_quota``), 502, 503, 504 and other 5xx from gateways, a
500 unless its body shows a request the server cannot handle (a template or validation
failure, a context-length error, a traceback), a stream that ended before the reply did, and
whatever the server marks with ``x-should-retry: true``. Everything else fails at once: 400,
401, 403, 404, 422, a context length exceeded, 501, such a 500, ``x-should-retry: false``.

**Errors.** A call that fails for good raises :class:`EndpointError`, naming the URL it was
sent to (without credentials or query), the step, what the server said, and that the run is
kept: re-running the cell (or ``durable_nb.execute``) continues from that step. The openai
exception is its ``__cause__``. An EndpointError is journaled as the step's outcome like any
step failure: caught by the agent loop, it is raised again on replay; failing the run, the
step is tried again when the run resumes.

**First errors** (what a newcomer meets before any call worked) are one short message each,
an EndpointError too: no API key (the default client cannot be made; nothing is sent, and
openai's error is not chained, its frames say nothing more), a refused key (401, 403), an
unreachable endpoint, a model the server does not have (``model_not_found``, or a 404 about
the model: where the server lists its models). Each says how to try durable_nb offline with
the bundled model server (``python -m durable_nb.testing``).
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import re
import threading
import time
import urllib.parse
import weakref
from typing import Any, Awaitable, Callable, TypeVar

import openai

from ..errors import EndpointError
from ..execution.retry import RetryPolicy

__all__ = ["DEFAULT_RETRY", "EndpointError", "MAX_RETRY_WAIT", "ReplyProblem",
           "call_with_retries", "call_with_retries_async", "default_client", "endpoint_url",
           "is_transient", "retry_after", "without_retries"]

T = TypeVar("T")

#: Attempts and backoff of one LLM call: 4 attempts, waiting 0.5, 1, 2 s (+-20 %) between them.
DEFAULT_RETRY = RetryPolicy(max_attempts=4, initial_delay=0.5, max_delay=8.0, multiplier=2.0,
                            jitter=0.2)

#: Seconds all the waits between the attempts of one call may add up to. A server asking
#: (retry-after) for a longer wait than what is left fails the call at once, saying so.
MAX_RETRY_WAIT = 60.0


class ReplyProblem(Exception):
    """A reply that cannot be used: a stream that ended before the reply did or carried
    nothing, a Responses call whose response failed. ``transient`` ones are retried."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


# --- clients ---------------------------------------------------------------------------------

_default_clients: dict[tuple, Any] = {}
_no_retry_clients: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()

_AZURE_VARIABLES = ("AZURE_OPENAI_API_KEY", "AZURE_OPENAI_AD_TOKEN", "AZURE_OPENAI_ENDPOINT")
_CLIENT_VARIABLES = ("OPENAI_API_TYPE", "OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_ORG_ID",
                     "OPENAI_PROJECT_ID", "OPENAI_API_VERSION", *_AZURE_VARIABLES)


def _api_type() -> str:
    """"openai" or "azure", chosen from the environment the way openai's module client does:
    ``OPENAI_API_TYPE`` if set, else Azure when only Azure credentials are set."""
    chosen = os.environ.get("OPENAI_API_TYPE", "").strip().lower()
    if chosen:
        if chosen not in ("openai", "azure"):
            raise openai.OpenAIError(f"OPENAI_API_TYPE={chosen!r}: durable_nb's default client "
                                     f"is 'openai' or 'azure'; pass client= for another one")
        return chosen
    has_openai = "OPENAI_API_KEY" in os.environ
    has_azure = any(name in os.environ for name in _AZURE_VARIABLES)
    if has_openai and has_azure:
        raise openai.OpenAIError("both OPENAI_API_KEY and Azure OpenAI variables (AZURE_OPENAI_*) "
                                 "are set; set OPENAI_API_TYPE to 'openai' or 'azure' to choose")
    return "azure" if has_azure else "openai"


def default_client(*, asynchronous: bool = False) -> Any:
    """The client ``ctx.chat`` uses when none is given: ``openai.OpenAI()`` (or
    ``AsyncOpenAI()``) configured from the environment as openai does (``OPENAI_API_KEY``,
    ``OPENAI_BASE_URL`` ...), or ``AzureOpenAI()`` when ``OPENAI_API_TYPE=azure`` or only
    Azure variables (``AZURE_OPENAI_API_KEY``, ``AZURE_OPENAI_ENDPOINT``,
    ``OPENAI_API_VERSION``) are set. Always ``max_retries=0``: durable_nb retries. Made
    once per process and environment."""
    key = (asynchronous, *(os.environ.get(name) for name in _CLIENT_VARIABLES))
    with _lock:
        if key not in _default_clients:
            try:
                if _api_type() == "azure":
                    cls = openai.AsyncAzureOpenAI if asynchronous else openai.AzureOpenAI
                else:
                    cls = openai.AsyncOpenAI if asynchronous else openai.OpenAI
                _default_clients[key] = cls(max_retries=0)
            except openai.OpenAIError as exc:
                raise _configuration_error(exc) from None
        return _default_clients[key]


#: What to do to try durable_nb without any account: in every first error (no key, a wrong
#: key, no server, an unknown model), as a newcomer meets one of those first.
_OFFLINE_HINT = ("To try it offline, start the bundled model server (`python -m "
                "durable_nb.testing` in a terminal) and set OPENAI_BASE_URL to the URL it "
                "prints and OPENAI_API_KEY to any value.")


def _configuration_error(exc: openai.OpenAIError) -> EndpointError:
    """The default client cannot be made (no key, conflicting variables): one short
    message naming the endpoint and what to do; nothing was sent. openai's own error is left
    out of the chain: its frames say nothing the message does not."""
    try:
        azure = _api_type() == "azure"
    except openai.OpenAIError:  # conflicting variables: the message says which
        azure = False
    if azure:
        endpoint = os.environ.get("AZURE_OPENAI_ENDPOINT")
        url = endpoint_url(endpoint) if endpoint else "Azure OpenAI (AZURE_OPENAI_ENDPOINT unset)"
    else:
        url = endpoint_url(os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1")
    text = str(exc)
    if "missing credentials" in text.lower() or "api_key client option must be set" in text:
        variable = "AZURE_OPENAI_API_KEY" if azure else "OPENAI_API_KEY"
        text = f"no API key for {url}: set {variable}, or pass client= with an api_key"
    else:
        text = f"cannot make a client for {url}: {text.rstrip('.')}"
    return EndpointError(f"{text}. Nothing was sent. {_OFFLINE_HINT}", url=url,
                         type_name=f"{type(exc).__module__}.{type(exc).__qualname__}")


def without_retries(client: Any) -> Any:
    """``client`` with the openai client's own retries off (``with_options(max_retries=0)``,
    made once per client), so that durable_nb's retries are the only ones."""
    if getattr(client, "max_retries", 0) == 0 or not callable(getattr(client, "with_options", None)):
        return client
    with _lock:
        try:
            copy = _no_retry_clients.get(client)
        except TypeError:  # not weak-referenceable: make a copy each time
            return client.with_options(max_retries=0)
        if copy is None:
            copy = _no_retry_clients[client] = client.with_options(max_retries=0)
        return copy


def check_client(client: Any, *, asynchronous: bool, what: str) -> None:
    """Refuse, before anything is sent, a client of the wrong kind for the call."""
    if client is None:
        return
    if asynchronous and isinstance(client, openai.OpenAI):
        raise TypeError(f"{what}_async needs an async client (openai.AsyncOpenAI or "
                        f"AsyncAzureOpenAI), got {type(client).__name__}: use {what} with it")
    if not asynchronous and isinstance(client, openai.AsyncOpenAI):
        raise TypeError(f"{what} needs a sync client (openai.OpenAI or AzureOpenAI), got "
                        f"{type(client).__name__}: use `await {what}_async(...)` with it")


def endpoint_url(url: Any) -> str:
    """``url`` without credentials, query or fragment: safe to show and to journal."""
    try:
        parts = urllib.parse.urlsplit(str(url))
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<an invalid URL>"
    return urllib.parse.urlunsplit((parts.scheme, host + port, parts.path, "", ""))


def _request_url(exc: BaseException, client: Any) -> str:
    request = getattr(exc, "request", None)
    url = getattr(request, "url", None)
    if url is not None:
        return endpoint_url(url)
    base = getattr(client, "base_url", None)
    return endpoint_url(base) if base is not None else "the endpoint"


# --- which errors are transient ------------------------------------------------------------

# A 500 whose body says this is about the request, which the same request hits again:
# llama-cpp-python's chat-template and pydantic validation errors (sent as 500 with a piece of
# traceback), context-length errors, refusals of a parameter.
_BAD_REQUEST = re.compile(
    r"has no attribute|undefined|template|jinja|validation error|field required|input should be"
    r"|invalid|not supported|unsupported|bad request|context length|context window"
    r"|maximum context|too long|too many tokens|exceed|failed to parse|schema|missing"
    r"|must be|Traceback|File \"", re.I)
_DETERMINISTIC_CODES = ("context_length_exceeded", "invalid_request_error", "insufficient_quota",
                        "invalid_prompt", "invalid_api_key", "model_not_found")


def _server_text(exc: BaseException) -> str:
    """What the server said: its error message, else the body, shortened."""
    body = getattr(exc, "body", None)
    message = None
    if isinstance(body, dict):
        inner = body.get("error") if isinstance(body.get("error"), dict) else body
        message = inner.get("message") if isinstance(inner.get("message"), str) else None
        if message is None:
            message = json.dumps(body, default=str)[:300]
    elif isinstance(body, str) and body.strip():
        message = re.sub(r"<[^>]+>", " ", body)
    if message is None:
        message = getattr(exc, "message", None) or str(exc)
    message = re.sub(r"\s+", " ", message).strip()
    return message[:500] + ("..." if len(message) > 500 else "") if message else "(no message)"


def _codes(exc: BaseException) -> set[str]:
    values = {getattr(exc, "code", None), getattr(exc, "type", None)}
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error") if isinstance(body.get("error"), dict) else body
        values |= {inner.get("code"), inner.get("type")}
    return {str(v) for v in values if v is not None}


def _looks_like_bad_request(exc: BaseException) -> bool:
    if _codes(exc) & set(_DETERMINISTIC_CODES):
        return True
    body = getattr(exc, "body", None)
    text = json.dumps(body, default=str) if isinstance(body, (dict, list)) else str(body or "")
    return bool(_BAD_REQUEST.search(f"{getattr(exc, 'message', '')} {text}"))


def _is_transport_error(exc: BaseException) -> bool:
    """httpx / httpcore transport errors an older openai lets escape from a stream."""
    return any(c.__name__ in ("TransportError", "NetworkError", "ProtocolError")
               and c.__module__.split(".")[0] in ("httpx", "httpx2", "httpcore", "httpcore2")
               for c in type(exc).__mro__)


def _headers(exc: BaseException) -> Any:
    response = getattr(exc, "response", None)
    return getattr(response, "headers", None) or {}


def retry_after(exc: BaseException) -> float | None:
    """Seconds the server asks to wait (``retry-after-ms``, ``retry-after`` in seconds or as
    an HTTP date), or None."""
    headers = _headers(exc)
    try:
        value = headers.get("retry-after-ms")
        if value is not None:
            return max(0.0, float(value) / 1000)
        value = headers.get("retry-after")
        if value is None:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            when = email.utils.parsedate_to_datetime(value)
            return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError, OverflowError):
        return None


def is_transient(exc: BaseException) -> bool:
    """Whether sending the same request again may succeed (see the module docstring)."""
    if isinstance(exc, ReplyProblem):
        return exc.transient
    if isinstance(exc, openai.APIStatusError):
        should = str(_headers(exc).get("x-should-retry", "")).lower()
        if should in ("true", "false"):
            return should == "true"
        status = exc.status_code
        if status in (408, 409):
            return True
        if status == 429:
            return "insufficient_quota" not in _codes(exc)
        if status == 500:
            return not _looks_like_bad_request(exc)
        if status in (501, 505):
            return False
        return status >= 500
    if isinstance(exc, openai.APIConnectionError):  # timeouts included
        return True
    if isinstance(exc, openai.APIError):  # an error event in the middle of a stream
        return not _looks_like_bad_request(exc)
    return _is_transport_error(exc)


def _endpoint_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is about the endpoint (wrapped in EndpointError) rather than a bug
    in the call (a TypeError for a wrong argument is left as it is)."""
    return isinstance(exc, (openai.APIError, ReplyProblem)) or _is_transport_error(exc)


# --- the retry loop -------------------------------------------------------------------------

class _Attempts:
    """The state of one call's attempts; decides after each failure whether to go on."""

    def __init__(self, execution: Any, what: str, name: str, client: Any,
                 policy: RetryPolicy | None) -> None:
        self.execution = execution
        self.what = what
        self.name = name
        self.client = client
        self.policy = policy or DEFAULT_RETRY
        self.attempt = 1
        self.waited = 0.0
        self.started = time.monotonic()

    def next_wait(self, exc: Exception) -> float:
        """Seconds to wait before the next attempt; raises the final error instead."""
        if not _endpoint_failure(exc):
            raise exc
        transient = is_transient(exc) and self.policy.retries(exc)
        if not transient:
            raise self.error(exc, retried=False) from exc
        if self.attempt >= self.policy.max_attempts:
            raise self.error(exc, retried=True) from exc
        asked = retry_after(exc)
        gate = getattr(getattr(self.execution, "options", None), "call_gate", None)
        if asked is not None and gate is not None:
            gate.pause(asked)  # every run sharing the endpoint slows down, not this one alone
        delay = asked if asked is not None else self.policy.delay(self.attempt)
        if self.waited + delay > MAX_RETRY_WAIT:
            raise self.error(exc, retried=True, asked=delay) from exc
        self.waited += delay
        self.attempt += 1
        return delay

    def error(self, exc: BaseException, *, retried: bool, asked: float | None = None
              ) -> EndpointError:
        step = getattr(getattr(self.execution, "writer", None), "next_position", None)
        url = _request_url(exc, self.client)
        status = getattr(exc, "status_code", None)
        server = _server_text(exc)
        if isinstance(exc, openai.APITimeoutError):
            happened = f"{url} did not answer within the client's timeout"
        elif isinstance(exc, openai.APIConnectionError) or _is_transport_error(exc):
            cause = exc.__cause__ or exc.__context__
            reason = str(cause) if cause is not None and str(cause) else str(exc)
            happened = f"cannot reach {url} ({reason})"
        elif isinstance(exc, ReplyProblem):
            happened = f"{url}: {exc}"
        elif status is not None:
            happened = f"{url} answered HTTP {status}: {server}"
        else:
            happened = f"{url} sent an error: {server}"
        if asked is not None:
            retries = (f" The server asks to wait {asked:.0f} s before trying again, longer than "
                       f"durable_nb waits ({MAX_RETRY_WAIT:.0f} s for all the attempts of a call).")
        elif retried:
            elapsed = time.monotonic() - self.started
            retries = f" Tried {self.attempt} times in {elapsed:.1f} s."
        else:
            retries = " Not retried: the same request would fail again."
        where = f"step {step}" if step is not None else "its step"
        message = (f"{self.what} failed at {where} (model {self.name!r}): "
                   f"{happened.rstrip().rstrip('.')}."
                   f"{retries}{_advice(exc, status, server)} The run is kept; re-run the cell "
                   f"(or durable_nb.execute(...)) to continue from {where}.")
        code = getattr(exc, "code", None)
        return EndpointError(message, url=url, status_code=status,
                             code=str(code) if code is not None else None, step=step,
                             attempts=self.attempt, transient=retried,
                             type_name=f"{type(exc).__module__}.{type(exc).__qualname__}")

    def sleep(self, delay: float) -> None:
        cancel = getattr(self.execution, "cancel_event", None)
        if cancel is not None:
            cancel.wait(delay)
            self.execution.check_live()
        else:
            time.sleep(delay)
        self.before_retry()

    def before_retry(self) -> None:
        """The request is sent again: it passes the shared limits like the first one did."""
        gate = getattr(getattr(self.execution, "options", None), "call_gate", None)
        if gate is not None:
            gate.before_retry()


def _advice(exc: BaseException, status: int | None, server: str) -> str:
    if "no attribute 'content'" in server or "'content'" in server and "string" in server:
        return (" An assistant message in the request has no string 'content', which this "
                "server's chat template needs: append assistant messages with "
                "durable_nb.assistant_message(message).")
    if "context_length_exceeded" in _codes(exc) or re.search(r"context (length|window)", server,
                                                             re.I):
        return " Shorten the messages (ctx.compact) or use a model with a larger window."
    if "insufficient_quota" in _codes(exc):
        return " The account has no quota left."
    if status in (401, 403):
        return (" Check the API key (OPENAI_API_KEY, or the client's api_key) for this "
                f"endpoint. {_OFFLINE_HINT}")
    if _model_missing(exc, status, server):
        return (f" Use a model this server has (GET {_models_url(exc)} lists them): ctx.chat("
                f"model=...), --model, or DURABLE_NB_MODEL in the bundled notebooks.")
    if status == 404:
        return " Check the URL (OPENAI_BASE_URL or the client's base_url) and the model name."
    if isinstance(exc, openai.APIConnectionError) and not isinstance(exc, openai.APITimeoutError):
        return (" Check that the server runs at that URL (OPENAI_BASE_URL or the client's "
                f"base_url). {_OFFLINE_HINT}")
    return ""


def _model_missing(exc: BaseException, status: int | None, server: str) -> bool:
    """The server has no such model: OpenAI's ``model_not_found``, or a 404 about the model
    (vLLM's "The model `x` does not exist", Ollama's "model 'x' not found")."""
    return "model_not_found" in _codes(exc) or (
        status == 404 and re.search(r"\bmodel\b", server, re.I) is not None)


def _models_url(exc: BaseException) -> str:
    """The server's model list: the request's URL with ``/models`` for its last part."""
    url = endpoint_url(getattr(getattr(exc, "request", None), "url", "") or "")
    for suffix in ("/chat/completions", "/responses"):
        if url.endswith(suffix):
            return url[:-len(suffix)] + "/models"
    return "/v1/models"


def call_with_retries(execution: Any, what: str, name: str, client: Any,
                      attempt: Callable[[], T], policy: RetryPolicy | None = None) -> T:
    """``attempt()`` until it returns, retrying transient endpoint failures (see the module
    docstring); the final failure is raised as :class:`EndpointError`."""
    state = _Attempts(execution, what, name, client, policy)
    while True:
        try:
            return attempt()
        except Exception as exc:  # noqa: BLE001 - next_wait re-raises what is not retried
            delay = state.next_wait(exc)
        state.sleep(delay)


async def call_with_retries_async(execution: Any, what: str, name: str, client: Any,
                                  attempt: Callable[[], Awaitable[T]],
                                  policy: RetryPolicy | None = None) -> T:
    """:func:`call_with_retries` for a coroutine function."""
    state = _Attempts(execution, what, name, client, policy)
    while True:
        try:
            return await attempt()
        except Exception as exc:  # noqa: BLE001 - next_wait re-raises what is not retried
            delay = state.next_wait(exc)
        await asyncio.sleep(delay)
        check = getattr(execution, "check_live", None)
        if check is not None:
            check()
        state.before_retry()
