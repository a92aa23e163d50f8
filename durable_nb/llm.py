"""``ctx.chat``: journaled chat completions with usage accounting, budgets and retries."""

from __future__ import annotations

import threading
from typing import Any

import openai
from openai.types.chat import ChatCompletion

from .errors import BudgetExhausted
from .execution import Execution, canonical
from .retry import RetryPolicy
from .tokens import context_window, count_message_tokens

__all__ = ["CHAT_RETRY", "chat", "chat_async", "chat_inputs", "check_budget", "completion_usage",
           "default_client"]

# Keyword arguments that configure transport or carry credentials: never journaled.
_TRANSPORT_KWARGS = ("extra_headers", "extra_query", "extra_body", "timeout")
# Keyword arguments that change how the answer arrives, not what it is.
_DELIVERY_KWARGS = ("stream", "stream_options")

_default_clients: dict[bool, Any] = {}
_default_lock = threading.Lock()

CHAT_RETRY = RetryPolicy(max_attempts=4, initial_delay=1.0, max_delay=20.0,
                         retry_on=(openai.RateLimitError, openai.APIConnectionError,
                                   openai.InternalServerError))


def default_client(*, asynchronous: bool = False) -> Any:
    """``openai.OpenAI()`` (or ``AsyncOpenAI()``) configured from the environment, made once
    per process."""
    with _default_lock:
        if asynchronous not in _default_clients:
            try:
                _default_clients[asynchronous] = (openai.AsyncOpenAI() if asynchronous
                                                  else openai.OpenAI())
            except openai.OpenAIError as exc:
                raise openai.OpenAIError(
                    f"{exc} For an offline run, start the bundled model server "
                    f"(python -m durable_nb.testing) and set OPENAI_BASE_URL to the URL it "
                    f"prints and OPENAI_API_KEY to any value.") from exc
        return _default_clients[asynchronous]


def completion_usage(completion: Any) -> tuple[int, int]:
    """(prompt, completion) tokens of a ChatCompletion's usage; (0, 0) without usage."""
    usage = getattr(completion, "usage", None)
    if usage is None:
        return 0, 0
    return int(usage.prompt_tokens or 0), int(usage.completion_tokens or 0)


def chat_inputs(kwargs: dict) -> dict:
    """What a chat request asks, as canonical data: its fingerprint is compared on replay."""
    return {k: canonical(v) for k, v in kwargs.items()
            if k not in _TRANSPORT_KWARGS and k not in _DELIVERY_KWARGS}


def check_budget(execution: Execution, kwargs: dict) -> None:
    """Raise :class:`BudgetExhausted` (and mark the run to fail) before a call that would
    pass max_iterations, max_tokens or the model's context window."""
    record = execution.record
    problem = None
    if record.max_iterations is not None and execution.iteration >= record.max_iterations:
        problem = (f"max_iterations reached: {execution.iteration} of {record.max_iterations} "
                   f"LLM calls made")
    else:
        model = str(kwargs.get("model", ""))
        estimate = count_message_tokens(kwargs.get("messages") or [], model, kwargs.get("tools"))
        window = context_window(model, execution.options.context_windows)
        used = execution.prompt_tokens + execution.completion_tokens
        if record.max_tokens is not None and used + estimate > record.max_tokens:
            problem = (f"token budget exhausted: used {used} of {record.max_tokens}, and the next "
                       f"request needs about {estimate} more")
        elif estimate > window:
            problem = (f"the request has about {estimate} tokens, more than the context window "
                       f"of {model or 'the model'} ({window}); compact the messages "
                       f"(ctx.compact) or choose a model with a larger window")
    if problem is not None:
        exc = BudgetExhausted(f"run {execution.run_id!r} stopped before its next LLM call: "
                              f"{problem}. Raise the limit (--max-tokens / --max-iterations) "
                              f"and execute again to go on.")
        execution.budget_failure = exc
        raise exc


def _prepare(execution: Execution, kwargs: dict) -> tuple[Any, str, dict]:
    """Split ``client=`` off, apply the run's default model; (client, step name, kwargs)."""
    client = kwargs.pop("client", None) or execution.options.client
    if "model" not in kwargs and execution.options.model:
        kwargs["model"] = execution.options.model
    return client, str(kwargs.get("model") or "chat"), kwargs


def _assemble(stream_manager: Any, on_text: Any) -> Any:
    """Show a streamed reply's text as it arrives; return the whole ChatCompletion."""
    with stream_manager as stream:
        for event in stream:
            if event.type == "content.delta" and on_text is not None:
                on_text(event.delta)
        final = stream.get_final_completion()
    # The stream helper returns a ParsedChatCompletion; journal the plain type.
    return ChatCompletion.model_validate(final.model_dump(mode="json", exclude_none=True))


def chat(execution: Execution, kwargs: dict) -> Any:
    """Replay or make one chat completion for ``ctx.chat(**kwargs)``."""
    client, name, kwargs = _prepare(execution, kwargs)
    streamed = kwargs.pop("stream", False)

    def call() -> Any:
        chosen = client or default_client()
        if streamed:
            kwargs.setdefault("stream_options", {"include_usage": True})
            on_text = getattr(execution.observer, "on_text", None)
            return _assemble(chosen.chat.completions.stream(**kwargs), on_text)
        return chosen.chat.completions.create(**kwargs)

    return execution.step("chat", name, call, retry=CHAT_RETRY, inputs=chat_inputs(kwargs),
                          usage=completion_usage, before_live=lambda: check_budget(execution, kwargs))


async def chat_async(execution: Execution, kwargs: dict) -> Any:
    """Replay or make one chat completion for ``await ctx.chat_async(**kwargs)``."""
    client, name, kwargs = _prepare(execution, kwargs)

    async def call() -> Any:
        return await (client or default_client(asynchronous=True)).chat.completions.create(**kwargs)

    return await execution.step_async("chat", name, call, retry=CHAT_RETRY,
                                      inputs=chat_inputs(kwargs), usage=completion_usage,
                                      before_live=lambda: check_budget(execution, kwargs))
