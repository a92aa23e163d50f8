"""Assembling streamed replies ourselves, so that no paid reply is lost.

openai's ``chat.completions.stream()`` helper raises ``LengthFinishReasonError`` for a reply
cut by its token cap (the paid reply is lost) and concatenates the ``id`` and ``name`` of a
tool call when a server repeats them in every delta, as llama-cpp-python does
(``get_weatherget_weather...``). :class:`ChatAssembler` reads the raw
``chat.completion.chunk`` stream instead:

- a reply cut at the cap comes back like the non-streamed one, ``finish_reason="length"``;
- tool-call ids and types are set once and never concatenated; names are set once too, and
  only a name that is not yet one of the request's tools is extended by a following piece
  (for a server that sends a name in pieces); arguments are concatenated;
- with ``stop_after_pieces`` (:mod:`durable_nb.llm.chat` sets it from the request's token cap),
  reading stops after that many pieces of generated text and the stream is closed: the reply
  comes back cut, ``finish_reason="length"``, from a server that ignores the cap;
- without usage from the server (llama-cpp-python never sends it), the usage is estimated
  with :mod:`durable_nb.llm.tokens` from the request and the assembled reply (the caller marks
  the entry ``estimated``);
- text is handed to ``on_text`` as it arrives, ended with a newline.

:func:`completion_chunks` goes the other way, for a replayed stream: the chunks that assemble
into a journaled completion. :class:`ResponseAssembler` does the assembling for a Responses
API event stream.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable
from typing import Any, Callable

from openai.types.chat import ChatCompletion, ChatCompletionChunk

from .endpoints import ReplyProblem
from .messages import tool_names
from .tokens import encoding_for

__all__ = ["ChatAssembler", "ResponseAssembler", "completion_chunks", "completion_tokens", "drain",
           "drain_async"]

OnText = Callable[[str], Any]
OnChunk = Callable[[Any], Any]


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def completion_tokens(model: str, texts: Iterable[str]) -> int:
    """Tokens of the generated texts (the reply text, each tool call's name and arguments),
    counted as the loopback server and the API count completions."""
    enc = encoding_for(model)
    return sum(len(enc.encode(t, disallowed_special=())) for t in texts if t)


class _Text:
    """Streamed text shown through ``on_text``, ended with a newline."""

    def __init__(self, on_text: OnText | None) -> None:
        self.on_text = on_text
        self.last = ""

    def show(self, delta: Any) -> None:
        if self.on_text is not None and isinstance(delta, str) and delta:
            self.on_text(delta)
            self.last = delta

    def end(self) -> None:
        if self.on_text is not None and self.last and not self.last.endswith("\n"):
            self.on_text("\n")
        self.last = ""


class _Call:
    __slots__ = ("id", "type", "name", "arguments")

    def __init__(self) -> None:
        self.id: str | None = None
        self.type: str | None = None
        self.name: str | None = None
        self.arguments: list[str] = []


def _merge_name(current: str | None, piece: Any, known: set[str]) -> str | None:
    """A tool call's name after one more delta ``piece`` (see the module docstring)."""
    if not isinstance(piece, str) or not piece:
        return current
    if not current:
        return piece
    if current in known or piece == current:
        return current  # set once: a repeated name is never appended
    joined = current + piece
    if any(name.startswith(joined) for name in known):
        return joined  # a name sent in pieces
    return current


class _Choice:
    def __init__(self, index: int) -> None:
        self.index = index
        self.role: str | None = None
        self.content: list[str] = []
        self.saw_content = False
        self.refusal: list[str] = []
        self.calls: dict[int, _Call] = {}
        self.function_call = _Call()  # the deprecated single-call form
        self.finish_reason: str | None = None
        self.logprobs: dict[str, list] = {}


class ChatAssembler:
    """Feed it the chunks of one streamed chat completion; :meth:`completion` gives the
    ``ChatCompletion`` the non-streamed call would have returned."""

    def __init__(self, *, tools: Iterable[Any] | None = None, on_text: OnText | None = None,
                 stop_after_pieces: int | None = None, on_chunk: OnChunk | None = None) -> None:
        self.known = set(tool_names(tools))
        self.text = _Text(on_text)
        self.on_chunk = on_chunk  # handed every chunk as it arrives, before it is assembled
        self.chunks = 0
        # For a server that ignores the request's token cap: once this many pieces of
        # generated text have come (about one token each), reading stops and the stream is
        # closed, which ends the generation on servers that stop when the client goes.
        self.pieces_left = stop_after_pieces
        self.done = False
        self.head: dict[str, Any] = {}
        self.choices: dict[int, _Choice] = {}
        self.usage: Any = None

    def add(self, chunk: Any) -> None:
        if self.on_chunk is not None:
            self.on_chunk(chunk)
        self.chunks += 1
        for field in ("id", "created", "model", "system_fingerprint", "service_tier"):
            value = _get(chunk, field)
            if value is not None and field not in self.head:
                self.head[field] = value
        usage = _get(chunk, "usage")
        if usage is not None:
            self.usage = usage
        for choice in _get(chunk, "choices") or ():
            self._add_choice(choice)

    def _add_choice(self, choice: Any) -> None:
        index = _get(choice, "index") or 0
        state = self.choices.setdefault(index, _Choice(index))
        delta = _get(choice, "delta")
        if delta is not None:
            state.role = state.role or _get(delta, "role")
            content = _get(delta, "content")
            if content is not None:
                state.saw_content = True
                if content:
                    self._count_piece()
                    state.content.append(content)
                    if index == 0:
                        self.text.show(content)
            refusal = _get(delta, "refusal")
            if refusal:
                state.refusal.append(refusal)
            for piece in _get(delta, "tool_calls") or ():
                self._add_call(state, piece)
            function_call = _get(delta, "function_call")
            if function_call is not None:
                self._merge(state.function_call, function_call)
        logprobs = _get(choice, "logprobs")
        for kind in ("content", "refusal"):
            items = _get(logprobs, kind) if logprobs is not None else None
            if items:
                state.logprobs.setdefault(kind, []).extend(items)
        finish = _get(choice, "finish_reason")
        if finish is not None:
            state.finish_reason = finish

    def _add_call(self, state: _Choice, piece: Any) -> None:
        index = _get(piece, "index")
        piece_id = _get(piece, "id")
        if index is None:  # servers that leave the index out: a new id starts a new call
            last = max(state.calls) if state.calls else None
            same = last is not None and (not piece_id or state.calls[last].id in (None, piece_id))
            index = last if same else (0 if last is None else last + 1)
        call = state.calls.setdefault(index, _Call())
        if piece_id and not call.id:
            call.id = piece_id
        kind = _get(piece, "type")
        if kind and not call.type:
            call.type = kind
        self._merge(call, _get(piece, "function"))

    def _merge(self, call: _Call, function: Any) -> None:
        if function is None:
            return
        call.name = _merge_name(call.name, _get(function, "name"), self.known)
        arguments = _get(function, "arguments")
        if isinstance(arguments, str) and arguments:
            self._count_piece()
            call.arguments.append(arguments)

    def _count_piece(self) -> None:
        if self.pieces_left is not None:
            self.pieces_left -= 1
            self.done = self.pieces_left <= 0

    def completion(self) -> ChatCompletion:
        """The assembled reply; :class:`ReplyProblem` when the stream held none, or ended
        before the reply did (no ``finish_reason``: a cut connection, retried)."""
        self.text.end()
        if not self.chunks:
            raise ReplyProblem("the stream ended without sending anything (llama-cpp-python "
                               "sometimes does this for tool_choice='auto' with stream=True; "
                               "call without stream=True there)", transient=True)
        if self.done:  # we stopped reading: the reply is cut, as by the cap
            for state in self.choices.values():
                state.finish_reason = state.finish_reason or "length"
        if not self.choices or any(c.finish_reason is None for c in self.choices.values()):
            raise ReplyProblem("the stream ended before the reply was finished (no "
                               "finish_reason)", transient=True)
        choices = []
        for index in sorted(self.choices):
            state = self.choices[index]
            calls = [{"id": c.id or f"call_{index}_{i}", "type": c.type or "function",
                      "function": {"name": c.name or "", "arguments": "".join(c.arguments)}}
                     for i, c in (sorted(state.calls.items()))]
            text = "".join(state.content)
            message: dict[str, Any] = {
                "role": state.role or "assistant",
                "content": text if text or (state.saw_content and not calls) else None,
                "refusal": "".join(state.refusal) or None,
            }
            if calls:
                message["tool_calls"] = calls
            elif state.function_call.name:
                message["function_call"] = {"name": state.function_call.name,
                                            "arguments": "".join(state.function_call.arguments)}
            choices.append({"index": index, "message": message,
                            "finish_reason": state.finish_reason,
                            "logprobs": ({k: [_plain(x) for x in v]
                                          for k, v in state.logprobs.items()} or None)})
        data = {"id": self.head.get("id") or "chatcmpl-streamed", "object": "chat.completion",
                "created": self.head.get("created") or 0, "model": self.head.get("model") or "",
                "choices": choices}
        for field in ("system_fingerprint", "service_tier"):
            if self.head.get(field) is not None:
                data[field] = self.head[field]
        if self.usage is not None:
            data["usage"] = _plain(self.usage)
        # Built as the openai client builds a non-streamed reply (without validation): a
        # server's finish reason or usage that the installed openai does not list is kept.
        return ChatCompletion.construct(**data)

    def generated_texts(self) -> list[str]:
        """Everything the model generated, for estimating completion tokens."""
        texts = []
        for state in self.choices.values():
            texts += ["".join(state.content), "".join(state.refusal)]
            for call in [*state.calls.values(), state.function_call]:
                texts.append((call.name or "") + "".join(call.arguments))
        return texts


def _plain(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    return dump(mode="json", exclude_none=True) if callable(dump) else value


def completion_chunks(completion: ChatCompletion, *, include_usage: bool = False
                      ) -> list[ChatCompletionChunk]:
    """The chunks of a stream that :class:`ChatAssembler` assembles into ``completion``:
    per choice, one chunk with the whole message (role, text, refusal, tool calls) and one
    with its finish reason; then, with ``include_usage``, the usage chunk without choices,
    as servers send it for ``stream_options={"include_usage": True}``. For a replayed
    stream, which has no chunks of its own; built without validation, as the openai client
    builds the chunks it receives, so a reply replays whatever the installed openai
    requires."""
    head = {"id": completion.id, "object": "chat.completion.chunk",
            "created": completion.created, "model": completion.model}
    for field in ("system_fingerprint", "service_tier"):
        if getattr(completion, field, None) is not None:
            head[field] = getattr(completion, field)
    chunks = []
    for choice in completion.choices:
        message = choice.message
        delta: dict[str, Any] = {"role": message.role, "content": message.content}
        if message.refusal is not None:
            delta["refusal"] = message.refusal
        if message.tool_calls:
            delta["tool_calls"] = [dict(_plain(call), index=i)
                                   for i, call in enumerate(message.tool_calls)]
        elif message.function_call is not None:
            delta["function_call"] = _plain(message.function_call)
        logprobs = _plain(choice.logprobs) if choice.logprobs is not None else None
        chunks.append(dict(head, choices=[{"index": choice.index, "delta": delta,
                                           "logprobs": logprobs, "finish_reason": None}]))
        chunks.append(dict(head, choices=[{"index": choice.index, "delta": {},
                                           "finish_reason": choice.finish_reason}]))
    if include_usage and completion.usage is not None:
        chunks.append(dict(head, choices=[], usage=_plain(completion.usage)))
    return [ChatCompletionChunk.construct(**chunk) for chunk in chunks]


class ResponseAssembler:
    """Feed it the events of one streamed Responses API call; :meth:`response` gives the
    final ``Response`` (from ``response.completed`` / ``response.incomplete``)."""

    done = False  # a Responses stream is read to its end

    def __init__(self, *, on_text: OnText | None = None, on_event: OnChunk | None = None
                 ) -> None:
        self.text = _Text(on_text)
        self.on_event = on_event  # handed every event as it arrives
        self.events = 0
        self.final: Any = None
        self.error: str | None = None
        self.error_transient = True

    def add(self, event: Any) -> None:
        if self.on_event is not None:
            self.on_event(event)
        self.events += 1
        kind = _get(event, "type")
        if kind == "response.output_text.delta":
            self.text.show(_get(event, "delta"))
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            self.final = _get(event, "response")
        elif kind == "error":
            self.error = f"{_get(event, 'code') or 'error'}: {_get(event, 'message') or ''}"
            self.error_transient = _get(event, "code") in (None, "server_error",
                                                           "rate_limit_exceeded")

    def response(self) -> Any:
        self.text.end()
        if self.error is not None:
            raise ReplyProblem(f"the stream reported an error ({self.error})",
                               transient=self.error_transient)
        if self.final is None:
            if not self.events:
                raise ReplyProblem("the stream ended without sending anything",
                                   transient=True)
            raise ReplyProblem("the stream ended before the response was finished (no "
                               "response.completed event)", transient=True)
        return self.final


def drain(open_stream: Callable[[], Any], assembler: Any) -> None:
    """Hand the events of the stream ``open_stream()`` opens to ``assembler.add`` until the
    stream or ``assembler.done`` ends, then close it; if anything fails, the streamed text is
    ended (its newline) before the error goes on."""
    try:
        stream = open_stream()
        try:
            for event in stream:
                assembler.add(event)
                if assembler.done:
                    break
        finally:
            close = getattr(stream, "close", None)
            if callable(close):
                close()
    except BaseException:
        assembler.text.end()
        raise


async def drain_async(open_stream: Callable[[], Awaitable[Any]], assembler: Any) -> None:
    """:func:`drain` for an ``AsyncStream``."""
    try:
        stream = await open_stream()
        try:
            async for event in stream:
                assembler.add(event)
                if assembler.done:
                    break
        finally:
            close = getattr(stream, "close", None)
            if callable(close):
                await close()
    except BaseException:
        assembler.text.end()
        raise
