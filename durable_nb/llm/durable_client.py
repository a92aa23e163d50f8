"""The durable openai client: ``ctx.openai`` and ``ctx.async_openai``.

Objects that stand in for ``openai.OpenAI`` / ``openai.AsyncOpenAI`` where a library takes a
client (an agent framework, code written before durable_nb), so that its calls become steps
without rewriting it. What they journal:

- ``chat.completions.create(...)``: exactly ``ctx.chat`` / ``ctx.chat_async`` (one step of
  kind ``chat``: budgets, token and cost accounting, retries, input comparison, panel row);
- ``responses.create(...)``: exactly ``ctx.respond`` / ``ctx.respond_async``;
- ``chat.completions.parse(...)``: that ``chat`` step, parsed as openai's ``parse`` parses
  (``response_format`` a pydantic model): the journaled completion is the plain one, so a
  replay rebuilds the same typed ``ParsedChatCompletion``.

With ``stream=True`` both return a stream, one way: a live stream yields the server's chunks
(events) as they arrive, while the reply is assembled, and the step is journaled when the
server's stream ends; a replayed stream yields equivalent chunks synthesized from the
journaled reply, at once (:func:`~durable_nb.llm.streaming.completion_chunks`,
:func:`response_events`). A usage chunk is yielded only when the request asked for it
(``stream_options={"include_usage": True}``). The step runs in a flow of its own, numbered
so that its key is stable (``streamed_call#N.0``, the same for both clients): an asyncio task
for the async client, a thread for the sync one. A process that dies mid-stream journaled
nothing for it: the call is made again when the cell is re-run. Closing a stream early waits
for the reply to be journaled, since it is paid for; a stream broken by the server after
chunks were yielded is not sent again (the reader would get a second reply after part of
the first): the step fails, and re-running the cell makes the call anew.

``isinstance(ctx.openai, openai.OpenAI)`` (``AsyncOpenAI`` for ``ctx.async_openai``) is true,
so a library that checks the client's type takes it (instructor's ``from_openai``).
Configuration reads (``base_url``, ``organization``, ``project``, ``timeout``) and
``with_options(...)`` are those of the wrapped client. Everything else (``embeddings``,
``files``, ``with_raw_response``, ``beta`` ...) raises
:class:`~durable_nb.errors.UnsupportedClientCall` instead of reaching the server without a
journaled step; it is an ``AttributeError``, so a library that probes with ``getattr(client,
name, None)`` takes its fallback path.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import queue
import ssl
import threading
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Any, Callable

import openai
from openai import NotGiven, Omit
from openai.types.responses import Response

from .endpoints import default_client
from ..errors import UnsupportedClientCall
from ..execution import Execution
from ..execution.scope import enter, leave
from .chat import chat, chat_async
from .responses import respond, respond_async
from .streaming import completion_chunks

__all__ = ["AsyncReplyStream", "DurableAsyncOpenAI", "DurableOpenAI", "ReplyStream",
           "response_events"]

# Plain configuration of the wrapped client, read by frameworks (the Agents SDK reads
# base_url to tell OpenAI from other servers); never a credential.
_CONFIGURATION = ("base_url", "websocket_base_url", "organization", "project", "timeout")

_END = object()  # the end of a stream's queue


def _given(kwargs: dict) -> dict:
    """The keyword arguments a caller set: openai's ``omit`` / ``NOT_GIVEN`` left out."""
    return {k: v for k, v in kwargs.items() if not isinstance(v, (Omit, NotGiven))}


def _wants_usage(kwargs: dict) -> bool:
    options = kwargs.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


def _chunk_rules(request: dict) -> tuple[Callable[[Any], list[Any]], Callable[[Any], bool]]:
    """How a streamed chat reply reaches the reader: replayed, the chunks of the journaled
    completion; live, the server's chunks, its usage chunk only if the request asked for it
    (durable_nb asks for usage itself)."""
    wants_usage = _wants_usage(request)
    return (lambda completion: completion_chunks(completion, include_usage=wants_usage),
            lambda chunk: wants_usage or bool(getattr(chunk, "choices", None)))


def _refuse(owner: str, name: str) -> UnsupportedClientCall:
    return UnsupportedClientCall(
        f"{owner}.{name} is not journaled by durable_nb: the durable client journals "
        f"chat.completions.create and .parse, and responses.create. Call the real "
        f"client inside a step (ctx.run(...)) if you need {name}.")


class _Refusing:
    """Attribute access that refuses what the durable client does not journal."""

    _owner = "durable client"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        raise _refuse(self._owner, name)


def response_events(response: Response) -> list[dict]:
    """The events of a Responses API stream that ends in ``response`` (for a replayed
    stream): ``response.created``, per output item ``response.output_item.added``, its text
    as one ``response.output_text.delta``, ``response.output_item.done``, then
    ``response.completed`` (or ``response.incomplete``) with the whole response."""
    data = response.model_dump(mode="json", exclude_none=True)
    events = [{"type": "response.created", "sequence_number": 0,
               "response": dict(data, status="in_progress", output=[])}]
    for index, item in enumerate(data.get("output") or ()):
        events.append({"type": "response.output_item.added", "output_index": index,
                       "item": item})
        for part_index, part in enumerate(item.get("content") or ()):
            if part.get("type") == "output_text" and part.get("text"):
                events.append({"type": "response.output_text.delta", "output_index": index,
                               "content_index": part_index, "item_id": item.get("id", ""),
                               "delta": part["text"], "logprobs": []})
        events.append({"type": "response.output_item.done", "output_index": index,
                       "item": item})
    final = "response.incomplete" if data.get("status") == "incomplete" else "response.completed"
    events.append({"type": final, "response": data})
    for number, event in enumerate(events):
        event["sequence_number"] = number
    return events


def _typed_events(response: Response) -> list[Any]:
    """The events of :func:`response_events` as the openai client builds the events it
    receives (``construct_type``, without validation): the journaled reply is replayed as it
    was received, even when it lacks fields the installed openai requires."""
    from openai._models import construct_type
    from openai.types.responses import ResponseStreamEvent

    return [construct_type(type_=ResponseStreamEvent, value=event)
            for event in response_events(response)]


_loop_clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_loop_lock = threading.Lock()


def _on_this_loop(client: Any) -> Any:
    """A copy of ``client`` with a connection pool of its own for the running event loop
    (made once per loop, gone with it). An httpx pool is bound to the loop that opened its
    connections, and a notebook runs each async cell on a new loop: a pool shared across
    loops fails with "Event loop is closed", and the client's finalizer, closing it on
    whatever loop runs at garbage collection, fails the same way. The copy keeps the
    client's settings (URL, key, headers, timeout) but not a custom ``http_client``."""
    loop = asyncio.get_running_loop()
    with _loop_lock:
        copies = _loop_clients.setdefault(loop, weakref.WeakKeyDictionary())
        copy = copies.get(client)
        if copy is None:
            http = openai.DefaultAsyncHttpxClient(verify=_tls_context())
            copy = copies[client] = client.with_options(http_client=http)
        return copy


@functools.lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    """One TLS context for the copies: making one loads the CA bundle (~20 ms)."""
    try:
        import certifi
    except ImportError:
        return ssl.create_default_context()
    return ssl.create_default_context(cafile=certifi.where())


# -- streams ------------------------------------------------------------------------------

class ReplyStream:
    """What the sync durable client returns for ``stream=True``: chunks (or Responses
    events) as the step's thread hands them on; iteration ends when the step is journaled,
    and raises what the step raised. ``completion`` is the journaled reply, once ended."""

    response = None  # no HTTP response behind it

    def __init__(self, items: queue.SimpleQueue, thread: threading.Thread,
                 outcome: dict) -> None:
        self._items = items
        self._thread = thread
        self._outcome = outcome  # "result" or "error", set by the thread before it ends

    @property
    def completion(self) -> Any:
        return self._outcome.get("result")

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        item = self._items.get()
        if item is _END:
            self._items.put(_END)
            self._thread.join()
            if "error" in self._outcome:
                raise self._outcome["error"]
            raise StopIteration
        return item

    def close(self) -> None:
        """Stop reading; waits for the reply to be journaled (it is paid for)."""
        self._thread.join()

    def __enter__(self) -> ReplyStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncReplyStream:
    """What the async durable client returns for ``stream=True``: chunks (or Responses
    events) as the step's task hands them on; iteration ends when the step is journaled,
    and raises what the step raised. ``completion`` is the journaled reply, once ended."""

    response = None  # no HTTP response behind it

    def __init__(self, queue: asyncio.Queue, task: asyncio.Task) -> None:
        self._queue = queue
        self._task = task

    @property
    def completion(self) -> Any:
        return self._task.result() if self._task.done() else None

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        item = await self._queue.get()
        if item is _END:
            self._queue.put_nowait(_END)
            await self._task  # the step's error, if it failed
            raise StopAsyncIteration
        return item

    async def close(self) -> None:
        """Stop reading; waits for the reply to be journaled (it is paid for)."""
        await asyncio.wait({self._task})

    async def __aenter__(self) -> AsyncReplyStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _Relay:
    """What a streamed step hands on: the server's items that ``hand_on`` keeps, as they
    arrive; for a replayed step (no item came), ``synthesize(result)``."""

    def __init__(self, put: Callable[[Any], None], synthesize: Callable[[Any], list[Any]],
                 hand_on: Callable[[Any], bool]) -> None:
        self._put = put
        self._synthesize = synthesize
        self._hand_on = hand_on
        self._received = 0

    def on_item(self, item: Any) -> None:
        self._received += 1
        if self._hand_on(item):
            self._put(item)

    def ended(self, result: Any) -> None:
        if not self._received:
            for item in self._synthesize(result):
                self._put(item)


def _open_stream(make_step: Callable[[Callable[[Any], None]], Any],
                 synthesize: Callable[[Any], list[Any]],
                 hand_on: Callable[[Any], bool]) -> AsyncReplyStream:
    """Start the step ``make_step(on_item)`` in a task of its own and return the stream of
    what its :class:`_Relay` hands on."""
    items: asyncio.Queue = asyncio.Queue()
    relay = _Relay(items.put_nowait, synthesize, hand_on)

    async def streamed_call() -> Any:
        try:
            result = await make_step(relay.on_item)
            relay.ended(result)
            return result
        finally:
            items.put_nowait(_END)

    return AsyncReplyStream(items, asyncio.get_running_loop().create_task(streamed_call()))


def _open_sync_stream(execution: Execution, make_step: Callable[[Callable[[Any], None]], Any],
                      synthesize: Callable[[Any], list[Any]],
                      hand_on: Callable[[Any], bool]) -> ReplyStream:
    """:func:`_open_stream` for the sync client: the step runs in a thread of its own, in a
    scope numbered as the async client's task would be (its key does not depend on when the
    caller reads)."""
    items: queue.SimpleQueue = queue.SimpleQueue()
    relay = _Relay(items.put, synthesize, hand_on)
    outcome: dict = {}

    def streamed_call() -> None:
        scope.owner = threading.get_ident()
        token = enter(scope)
        try:
            result = make_step(relay.on_item)
            relay.ended(result)
            outcome["result"] = result
        except BaseException as exc:  # handed to the reader, raised where it reads
            outcome["error"] = exc
        finally:
            leave(token)
            execution.ended(scope)
            items.put(_END)

    scope = execution.scope().task_scope(streamed_call)
    execution.opened(scope)
    thread = threading.Thread(target=contextvars.copy_context().run, args=(streamed_call,),
                              name=f"durable-nb-{execution.run_id}-{scope.path}", daemon=True)
    thread.start()
    return ReplyStream(items, thread, outcome)


# -- the clients --------------------------------------------------------------------------

class _Client(_Refusing):
    """What the sync and async durable clients share."""

    asynchronous = False

    def __init__(self, execution: Execution, client: Any = None) -> None:
        self._ex = execution
        self._client = client
        self._owner = "ctx.async_openai" if self.asynchronous else "ctx.openai"

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        """``openai.OpenAI`` (``AsyncOpenAI``), so that ``isinstance`` accepts the stand-in
        where a library checks the client's type (instructor's ``from_openai`` does);
        ``type()`` still tells the truth."""
        return openai.AsyncOpenAI if self.asynchronous else openai.OpenAI

    @property
    def wrapped(self) -> Any:
        """The openai client the calls go through (the run's, or one from the
        environment)."""
        return self._client or default_client(asynchronous=self.asynchronous)

    def _sending(self) -> Any:
        """The client a call goes through: :attr:`wrapped`, for an async one its copy for
        the running event loop (see :func:`_on_this_loop`)."""
        return _on_this_loop(self.wrapped) if self.asynchronous else self.wrapped

    def __getattr__(self, name: str) -> Any:
        if name in _CONFIGURATION:
            return getattr(self.wrapped, name)
        return super().__getattr__(name)

    def with_options(self, **options: Any) -> Any:
        """The durable client over ``wrapped.with_options(**options)``; this one for
        ``max_retries`` alone, which changes nothing: durable_nb retries each call itself
        (the Agents SDK asks for ``max_retries=0`` before requests)."""
        if set(options) <= {"max_retries"}:
            return self
        return type(self)(self._ex, self.wrapped.with_options(**options))

    def _request(self, kwargs: dict) -> dict:
        return dict(_given(kwargs), client=self._sending())

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of run {self._ex.run_id!r} over {self.wrapped!r}>"


class _Resource(_Refusing):
    def __init__(self, client: _Client, path: str) -> None:
        self._c = client
        self._owner = f"{client._owner}.{path}"


def _parse_request(request: dict) -> tuple[dict, Any]:
    """A ``parse`` request as the ``create`` request to journal (a pydantic
    ``response_format`` as its JSON schema) and the response format to parse with."""
    from openai.lib._parsing._completions import type_to_response_format_param

    if request.get("stream"):
        raise UnsupportedClientCall("chat.completions.parse does not stream; use create("
                                    "stream=True), or parse without stream")
    response_format = request.get("response_format", openai.NOT_GIVEN)
    if isinstance(response_format, type):
        request = dict(request, response_format=type_to_response_format_param(response_format))
    return request, response_format


def _parsed(completion: Any, request: dict, response_format: Any) -> Any:
    """``completion`` parsed as openai's ``parse`` does: the same typed object live and on
    replay (the plain completion is what is journaled)."""
    from openai.lib._parsing._completions import parse_chat_completion

    return parse_chat_completion(response_format=response_format,
                                 input_tools=request.get("tools", openai.NOT_GIVEN),
                                 chat_completion=completion)


class _SyncCompletions(_Resource):
    def parse(self, **kwargs: Any) -> Any:
        """``create`` with openai's structured-output parsing (``response_format`` a
        pydantic model, strict function tools): one journaled ``chat`` step; the
        ``ParsedChatCompletion`` is rebuilt from the journaled completion on replay."""
        request, response_format = _parse_request(self._c._request(kwargs))
        return _parsed(chat(self._c._ex, dict(request)), request, response_format)

    def create(self, **kwargs: Any) -> Any:
        """``ctx.chat(**kwargs)``; ``stream=True`` returns a :class:`ReplyStream` of the
        chunks as they arrive."""
        request = self._c._request(kwargs)
        if not request.get("stream"):
            return chat(self._c._ex, request)
        return _open_sync_stream(
            self._c._ex, lambda on_chunk: chat(self._c._ex, request, on_chunk=on_chunk),
            *_chunk_rules(request))


class _AsyncCompletions(_Resource):
    async def parse(self, **kwargs: Any) -> Any:
        """:meth:`_SyncCompletions.parse` for the async client."""
        request, response_format = _parse_request(self._c._request(kwargs))
        return _parsed(await chat_async(self._c._ex, dict(request)), request, response_format)

    async def create(self, **kwargs: Any) -> Any:
        """``await ctx.chat_async(**kwargs)``; ``stream=True`` returns an
        :class:`AsyncReplyStream` of the chunks as they arrive."""
        request = self._c._request(kwargs)
        if not request.get("stream"):
            return await chat_async(self._c._ex, request)
        return _open_stream(
            lambda on_chunk: chat_async(self._c._ex, request, on_chunk=on_chunk),
            *_chunk_rules(request))


class _SyncResponses(_Resource):
    def create(self, **kwargs: Any) -> Any:
        """``ctx.respond(**kwargs)``; ``stream=True`` returns a :class:`ReplyStream` of
        Responses events as they arrive."""
        request = self._c._request(kwargs)
        if not request.get("stream"):
            return respond(self._c._ex, request)
        return _open_sync_stream(
            self._c._ex, lambda on_event: respond(self._c._ex, request, on_event=on_event),
            _typed_events, lambda event: True)


class _AsyncResponses(_Resource):
    async def create(self, **kwargs: Any) -> Any:
        """``await ctx.respond_async(**kwargs)``; ``stream=True`` returns an
        :class:`AsyncReplyStream` of Responses events as they arrive."""
        request = self._c._request(kwargs)
        if not request.get("stream"):
            return await respond_async(self._c._ex, request)
        return _open_stream(
            lambda on_event: respond_async(self._c._ex, request, on_event=on_event),
            _typed_events, lambda event: True)


class _Chat(_Resource):
    def __init__(self, client: _Client, completions: _Resource) -> None:
        super().__init__(client, "chat")
        self.completions = completions


class DurableOpenAI(_Client):
    """``ctx.openai``: an ``openai.OpenAI`` stand-in whose calls are journaled steps (see
    the module docstring)."""

    def __init__(self, execution: Execution, client: Any = None) -> None:
        super().__init__(execution, client)
        self.chat = _Chat(self, _SyncCompletions(self, "chat.completions"))
        self.responses = _SyncResponses(self, "responses")


class DurableAsyncOpenAI(_Client):
    """``ctx.async_openai``: an ``openai.AsyncOpenAI`` stand-in whose calls are journaled
    steps (see the module docstring)."""

    asynchronous = True

    def __init__(self, execution: Execution, client: Any = None) -> None:
        super().__init__(execution, client)
        self.chat = _Chat(self, _AsyncCompletions(self, "chat.completions"))
        self.responses = _AsyncResponses(self, "responses")
