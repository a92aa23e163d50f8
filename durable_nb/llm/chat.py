"""``ctx.chat``: journaled chat completions with usage accounting, budgets and retries.

One call is one step of kind ``chat`` named after the model. Live, the budget is checked
first (:mod:`durable_nb.llm.budget`), then the request is sent through the one retry layer of
:mod:`durable_nb.llm.endpoints` (the client's own retries off), streamed replies are assembled by
:mod:`durable_nb.llm.streaming` (and read no further than a little past the request's token cap,
for servers that ignore it), and the ``ChatCompletion`` is journaled with its usage and meta
(model, cost, cached tokens, ``estimated`` when the server sent no usage) before it is
returned. On replay the journaled completion is returned and nothing is sent.
"""

from __future__ import annotations

from typing import Any, Callable

from openai.types.chat import ChatCompletion
from openai.types.completion_usage import CompletionUsage

from .budget import calibration, chat_estimate, check_budget, completion_cap, llm_meta
from .endpoints import (
    DEFAULT_RETRY,
    call_with_retries,
    call_with_retries_async,
    check_client,
    ReplyProblem,
    default_client,
    without_retries,
)
from ..execution import Execution, canonical
from ..execution.retry import RetryPolicy
from .streaming import ChatAssembler, completion_tokens, drain, drain_async

__all__ = ["CHAT_RETRY", "ChatCall", "chat", "chat_async", "chat_inputs", "check_budget",
           "completion_usage", "default_client", "prepare", "usage_details"]

#: The attempts and backoff of one LLM call (see :mod:`durable_nb.llm.endpoints`).
CHAT_RETRY = DEFAULT_RETRY

# Keyword arguments that configure transport or carry credentials: never journaled.
_TRANSPORT_KWARGS = ("extra_headers", "extra_query", "extra_body", "timeout")
# Keyword arguments that change how the answer arrives, not what it is.
_DELIVERY_KWARGS = ("stream", "stream_options")


def completion_usage(completion: Any) -> tuple[int, int]:
    """(prompt, completion) tokens of a ChatCompletion's usage; (0, 0) without usage."""
    usage = getattr(completion, "usage", None)
    if usage is None:
        return 0, 0
    return int(usage.prompt_tokens or 0), int(usage.completion_tokens or 0)


def usage_details(usage: Any) -> tuple[int | None, int | None]:
    """(cached prompt tokens, reasoning tokens) of a chat or Responses usage, None where
    the server did not report them."""
    if usage is None:
        return None, None
    prompt = (getattr(usage, "prompt_tokens_details", None)
              or getattr(usage, "input_tokens_details", None))
    output = (getattr(usage, "completion_tokens_details", None)
              or getattr(usage, "output_tokens_details", None))
    cached = getattr(prompt, "cached_tokens", None) if prompt is not None else None
    reasoning = getattr(output, "reasoning_tokens", None) if output is not None else None
    return (int(cached) if isinstance(cached, int) else None,
            int(reasoning) if isinstance(reasoning, int) else None)


def chat_inputs(kwargs: dict) -> dict:
    """What a chat request asks, as canonical data: its fingerprint is compared on replay."""
    return {k: canonical(v) for k, v in kwargs.items()
            if k not in _TRANSPORT_KWARGS and k not in _DELIVERY_KWARGS}


def prepare(execution: Execution, kwargs: dict, what: str, *, asynchronous: bool
            ) -> tuple[Any, str, dict, RetryPolicy | None]:
    """Split ``client=`` and ``retry=`` off, check the client's kind, apply the run's default
    model; (client or None, step name, kwargs, retry policy or None)."""
    client = kwargs.pop("client", None) or execution.options.client
    retry = kwargs.pop("retry", None)
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise TypeError(f"{what}(retry=...) takes a durable_nb.RetryPolicy, not "
                        f"{type(retry).__name__}")
    check_client(client, asynchronous=asynchronous, what=what)
    if "model" not in kwargs and execution.options.model:
        kwargs["model"] = execution.options.model
    return client, str(kwargs.get("model") or "chat"), kwargs, retry


def _refuses_stream_options(exc: Exception) -> bool:
    return getattr(exc, "status_code", None) in (400, 422) and "stream_options" in str(exc)


def _refuses_streaming(exc: Exception) -> bool:
    # OpenAI, for a model that does not stream: 400 "Unsupported value: 'stream' does not
    # support true with this model. Only the default (false) value is supported."
    return getattr(exc, "status_code", None) in (400, 422) and "'stream'" in str(exc)


def _reading_limit(kwargs: dict) -> int | None:
    """How many pieces of a streamed reply are read at most: the request's token cap and
    some slack, or None when it sets no cap. For servers that ignore the cap
    (llama-cpp-python ignores ``max_completion_tokens``), whose reply would otherwise run to
    the end of the model's window, past the run's budget. The slack (a piece is about one
    token) lets a server that keeps the cap send its finish reason and usage."""
    cap, capped = completion_cap(kwargs)
    return cap + max(32, cap // 8) if capped else None


class ChatCall:
    """The live side of one chat completion step (``ctx.chat``, the summary of
    ``ctx.compact``): budget check, streamed or not, usage estimated when the server sends
    none. ``show_text=False`` keeps a streamed reply out of the cell's output; ``on_chunk``
    is handed each chunk of a streamed reply as it arrives (the durable client's live
    stream), and a stream that breaks after a chunk was handed on is not sent again."""

    def __init__(self, execution: Execution, kwargs: dict, name: str, *,
                 show_text: bool = True, on_chunk: Callable[[Any], Any] | None = None) -> None:
        self.execution = execution
        self.kwargs = kwargs
        self.name = name
        self.model = str(kwargs.get("model") or "")
        self.estimate: int | None = None
        self.estimated = False
        self.show_text = show_text
        self.on_chunk = on_chunk
        self.chunks_handed_on = 0
        self.plain = False  # the server refused to stream: see streamed_or_plain
        self.client: Any = None  # the client that makes the call: its endpoint is journaled
        # Asked for unless the caller set stream_options; dropped if the server refuses it.
        self.add_stream_options = "stream_options" not in kwargs

    def before_live(self) -> None:
        self.estimate = chat_estimate(self.kwargs)
        check_budget(self.execution, self.kwargs, estimate=self.estimate)

    def _stream_request(self) -> dict:
        request = dict(self.kwargs, stream=True)
        if self.add_stream_options:
            request["stream_options"] = {"include_usage": True}
        return request

    def _retry_without_stream_options(self, exc: Exception) -> bool:
        if self.add_stream_options and _refuses_stream_options(exc):
            self.add_stream_options = False
            self._send_again()
            return True
        return False

    def _send_again(self) -> None:
        """The request is sent once more (changed for a server that refused it): it passes
        the shared request rate like the first one did."""
        gate = self.execution.options.call_gate
        if gate is not None:
            gate.before_retry()

    def _assembler(self) -> ChatAssembler:
        on_text = getattr(self.execution.observer, "on_text", None) if self.show_text else None
        if self.chunks_handed_on:
            # Sending again would hand the reader a second reply after part of the first.
            raise ReplyProblem(f"the stream broke after {self.chunks_handed_on} chunks were "
                               f"passed on to the reader; run the cell again to make this "
                               f"call anew", transient=False)
        return ChatAssembler(tools=self.kwargs.get("tools"), on_text=on_text,
                             stop_after_pieces=_reading_limit(self.kwargs),
                             on_chunk=self._hand_on if self.on_chunk is not None else None)

    def _hand_on(self, chunk: Any) -> None:
        self.chunks_handed_on += 1
        self.on_chunk(chunk)

    def streamed(self, chosen: Any) -> ChatCompletion:
        """One streamed request through ``chosen``, assembled (again without
        ``stream_options`` if the server refuses them)."""
        while True:
            assembler = self._assembler()
            try:
                drain(lambda: chosen.chat.completions.create(**self._stream_request()),
                      assembler)
            except Exception as exc:
                if self._retry_without_stream_options(exc):
                    continue
                raise
            return self.finish(assembler.completion(), assembler.generated_texts())

    def streamed_or_plain(self, chosen: Any) -> ChatCompletion:
        """:meth:`streamed`, or the request without streaming when the server refuses to
        stream the model; for calls that stream by durable_nb's choice, not the caller's."""
        if not self.plain:
            try:
                return self.streamed(chosen)
            except Exception as exc:
                if not _refuses_streaming(exc):
                    raise
                self.plain = True
                self._send_again()
        return self.finish(chosen.chat.completions.create(**self.kwargs))

    async def streamed_async(self, chosen: Any) -> ChatCompletion:
        """:meth:`streamed` through an async client."""
        while True:
            assembler = self._assembler()
            try:
                await drain_async(lambda: chosen.chat.completions.create(**self._stream_request()),
                                  assembler)
            except Exception as exc:
                if self._retry_without_stream_options(exc):
                    continue
                raise
            return self.finish(assembler.completion(), assembler.generated_texts())

    def finish(self, completion: ChatCompletion, texts: list[str] | None = None
               ) -> ChatCompletion:
        """The completion to journal: with usage estimated when the server sent none."""
        if completion.usage is not None:
            return completion
        if texts is None:
            texts = []
            for choice in completion.choices:
                message = choice.message
                texts += [message.content or "", message.refusal or ""]
                for call in message.tool_calls or []:
                    function = getattr(call, "function", None)
                    if function is not None:
                        texts.append((function.name or "") + (function.arguments or ""))
        estimate = self.estimate if self.estimate is not None else chat_estimate(self.kwargs)
        prompt = calibration(self.execution).best_guess(self.model, estimate)
        completed = completion_tokens(self.model, texts)
        self.estimated = True
        return completion.model_copy(update={"usage": CompletionUsage(
            prompt_tokens=prompt, completion_tokens=completed,
            total_tokens=prompt + completed)})

    def meta(self, completion: Any) -> dict:
        prompt, completed = completion_usage(completion)
        cached, reasoning = usage_details(getattr(completion, "usage", None))
        return llm_meta(self.execution, requested=self.model,
                        model=getattr(completion, "model", None), prompt=prompt,
                        completion=completed, cached=cached, reasoning=reasoning,
                        estimated=self.estimated, prompt_estimate=self.estimate,
                        client=self.client)


def chat(execution: Execution, kwargs: dict, *,
         on_chunk: Callable[[Any], Any] | None = None) -> Any:
    """Replay or make one chat completion for ``ctx.chat(**kwargs)``; a live streamed one
    hands its chunks to ``on_chunk`` as they arrive (see :class:`ChatCall`)."""
    client, name, kwargs, retry = prepare(execution, kwargs, "ctx.chat", asynchronous=False)
    streamed = bool(kwargs.pop("stream", False))
    live = ChatCall(execution, kwargs, name, on_chunk=on_chunk)

    def call() -> Any:
        chosen = live.client = without_retries(client or default_client())

        def attempt() -> Any:
            if streamed:
                return live.streamed(chosen)
            return live.finish(chosen.chat.completions.create(**kwargs))

        return call_with_retries(execution, "ctx.chat", name, chosen, attempt, retry)

    return execution.step("chat", name, call, inputs=chat_inputs(kwargs),
                          usage=completion_usage, meta=live.meta, before_live=live.before_live)


async def chat_async(execution: Execution, kwargs: dict, *,
                     on_chunk: Callable[[Any], Any] | None = None) -> Any:
    """Replay or make one chat completion for ``await ctx.chat_async(**kwargs)``; a live
    streamed one hands its chunks to ``on_chunk`` as they arrive (see :class:`ChatCall`)."""
    client, name, kwargs, retry = prepare(execution, kwargs, "ctx.chat", asynchronous=True)
    streamed = bool(kwargs.pop("stream", False))
    live = ChatCall(execution, kwargs, name, on_chunk=on_chunk)

    async def call() -> Any:
        chosen = live.client = without_retries(client or default_client(asynchronous=True))

        async def attempt() -> Any:
            if streamed:
                return await live.streamed_async(chosen)
            return live.finish(await chosen.chat.completions.create(**kwargs))

        return await call_with_retries_async(execution, "ctx.chat", name, chosen, attempt,
                                             retry)

    return await execution.step_async("chat", name, call, inputs=chat_inputs(kwargs),
                                      usage=completion_usage, meta=live.meta,
                                      before_live=live.before_live)
