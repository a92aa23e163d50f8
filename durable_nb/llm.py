"""``ctx.chat``: journaled chat completions with usage accounting, budgets and retries."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from .errors import BudgetExhausted
from .retry import RetryPolicy

if TYPE_CHECKING:
    from .execution import Execution

__all__ = ["CHAT_RETRY", "chat", "chat_async", "chat_step_options", "check_budget",
           "completion_usage", "default_client"]

# Keyword arguments that configure transport or carry credentials: never part of a fingerprint.
_TRANSPORT_KWARGS = ("extra_headers", "extra_query", "extra_body", "timeout")

_default_clients: dict[bool, Any] = {}
_default_lock = threading.Lock()


def _transient_errors() -> tuple[type[BaseException], ...]:
    import openai

    return (openai.RateLimitError, openai.APIConnectionError, openai.InternalServerError)


CHAT_RETRY = RetryPolicy(max_attempts=4, initial_delay=1.0, max_delay=20.0)


def default_client(*, asynchronous: bool = False) -> Any:
    """``openai.OpenAI()`` (or ``AsyncOpenAI()``) configured from the environment, made once
    per process."""
    with _default_lock:
        if asynchronous not in _default_clients:
            import openai

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


def check_budget(execution: "Execution", kwargs: dict) -> None:
    """Raise :class:`BudgetExhausted` (and mark the run to fail) before a call that would
    pass max_iterations, max_tokens or the model's context window."""
    from .tokens import context_window, count_message_tokens

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
        exc = BudgetExhausted(f"run {execution.run_id!r} stopped before step "
                              f"{execution.position}: {problem}. Raise the limit "
                              f"(--max-tokens / --max-iterations) and execute again to go on.")
        execution.budget_failure = exc
        raise exc


def _prepare(execution: "Execution", kwargs: dict) -> tuple[Any, str, dict]:
    """Split ``client=`` off, apply the run's default model; (client, step name, kwargs)."""
    client = kwargs.pop("client", None) or execution.options.client
    if "model" not in kwargs and execution.options.model:
        kwargs["model"] = execution.options.model
    return client, str(kwargs.get("model") or "chat"), kwargs


def chat_step_options(kwargs: dict) -> dict:
    """Step options of a chat call: retry of transient API errors, fingerprint, usage."""
    from .execution import fingerprint

    public = {k: v for k, v in kwargs.items() if k not in _TRANSPORT_KWARGS}
    return {"retry": RetryPolicy(**{**CHAT_RETRY.__dict__, "retry_on": _transient_errors()}),
            "fingerprint_": fingerprint(public), "usage": completion_usage}


def _assemble(stream_manager: Any, on_text: Any) -> Any:
    """Show a streamed reply's text as it arrives; return the whole ChatCompletion."""
    from openai.types.chat import ChatCompletion

    with stream_manager as stream:
        for event in stream:
            if event.type == "content.delta" and on_text is not None:
                on_text(event.delta)
        final = stream.get_final_completion()
    # The stream helper returns a ParsedChatCompletion; journal the plain type.
    return ChatCompletion.model_validate(final.model_dump(mode="json", exclude_none=True))


def chat(execution: "Execution", kwargs: dict) -> Any:
    """Replay or make one chat completion for ``ctx.chat(**kwargs)``."""
    client, name, kwargs = _prepare(execution, kwargs)
    entry = execution.replay("chat", name)
    if entry is not None:
        return execution.outcome(entry)
    check_budget(execution, kwargs)
    client = client or default_client()
    options = chat_step_options(kwargs)
    if kwargs.pop("stream", False):
        kwargs.setdefault("stream_options", {"include_usage": True})
        on_text = getattr(execution.observer, "on_text", None)
        return execution.perform(
            "chat", name, lambda: _assemble(client.chat.completions.stream(**kwargs), on_text),
            **options)
    return execution.perform("chat", name, client.chat.completions.create, (), kwargs,
                             **options)


async def chat_async(execution: "Execution", kwargs: dict) -> Any:
    """Replay or make one chat completion for ``await ctx.chat_async(**kwargs)``."""
    client, name, kwargs = _prepare(execution, kwargs)
    entry = execution.replay("chat", name)
    if entry is not None:
        return execution.outcome(entry)
    check_budget(execution, kwargs)
    client = client or default_client(asynchronous=True)
    return await execution.perform_async("chat", name, client.chat.completions.create, (),
                                         kwargs, **chat_step_options(kwargs))
