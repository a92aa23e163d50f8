"""``ctx.respond``: journaled calls of the Responses API (``client.responses.create``).

One call is one step of kind ``respond`` named after the model: it counts one iteration,
its usage (input and output tokens; cached and reasoning tokens in the entry's meta) counts
toward the run's tokens and cost, the budget is checked before it is sent, it is retried
like ``ctx.chat`` (:mod:`durable_nb.llm.endpoints`), and the ``Response`` is journaled before it
is returned; a replay returns the same ``openai.types.responses.Response`` without a call.
With ``stream=True`` the text is shown as it arrives and the final ``Response`` (of the
``response.completed`` or ``response.incomplete`` event) is journaled.

The agent loop with tools::

    input = [{"role": "user", "content": "Weather in Oslo?"}]
    while True:
        response = ctx.respond(model="gpt-4.1-mini", input=input, tools=schemas)
        input += response.output
        if not any(item.type == "function_call" for item in response.output):
            break
        input += ctx.call_tools(response, tools)   # function_call_output items
    response.output_text
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Callable

from openai.types.responses.response_usage import (
    InputTokensDetails,
    OutputTokensDetails,
    ResponseUsage,
)

from .budget import calibration, check_budget, llm_meta
from .endpoints import (
    ReplyProblem,
    call_with_retries,
    call_with_retries_async,
    default_client,
    without_retries,
)
from ..execution import Execution
from .chat import chat_inputs, prepare, usage_details
from .streaming import ResponseAssembler, completion_tokens, drain, drain_async
from .tokens import count_message_tokens

__all__ = ["respond", "respond_async", "response_estimate", "response_messages",
           "response_usage"]


def response_usage(response: Any) -> tuple[int, int]:
    """(input, output) tokens of a Response's usage; (0, 0) without usage."""
    usage = getattr(response, "usage", None)
    if usage is None:
        return 0, 0
    return int(usage.input_tokens or 0), int(usage.output_tokens or 0)


def _plain(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json", exclude_none=True)
    return value


def _parts(content: Any) -> Any:
    """Responses content as chat content (its text, or parts with images), for counting."""
    if content is None or isinstance(content, str):
        return content or ""
    parts: list[dict] = []
    for part in content:
        part = _plain(part)
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in ("input_text", "output_text", "text", "summary_text", "refusal"):
            parts.append({"type": "text", "text": part.get("text") or part.get("refusal", "")})
        elif kind == "input_image":
            parts.append({"type": "image_url", "image_url": {"detail": part.get("detail")}})
        else:
            parts.append({"type": "text", "text": json.dumps(part, default=str)})
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def response_messages(kwargs: Mapping[str, Any]) -> list[dict]:
    """A Responses request's ``instructions`` and ``input`` as chat messages, for counting
    its tokens with :func:`durable_nb.llm.tokens.count_message_tokens`: a ``function_call``
    joins the assistant message (or function call) right before it, as one turn."""
    messages: list[dict] = []
    instructions = kwargs.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    items = kwargs.get("input")
    if isinstance(items, str):
        return messages + [{"role": "user", "content": items}]
    joinable = False  # may the next function call join messages[-1]?
    for item in items or ():
        data = _plain(item)
        if not isinstance(data, Mapping):
            messages.append({"role": "user", "content": str(data)})
            joinable = False
            continue
        kind = data.get("type") or ("message" if "role" in data else None)
        if kind == "function_call":
            call = {"id": data.get("call_id", ""), "type": "function",
                    "function": {"name": data.get("name", ""),
                                 "arguments": data.get("arguments", "")}}
            if joinable:
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "tool_calls": [call]})
            joinable = True
            continue
        joinable = False
        if kind == "message":
            role = str(data.get("role") or "user")
            messages.append({"role": role, "content": _parts(data.get("content"))})
            joinable = role == "assistant"
        elif kind == "function_call_output":
            output = data.get("output")
            messages.append({"role": "tool", "tool_call_id": data.get("call_id", ""),
                             "content": output if isinstance(output, str) else _parts(output)})
        elif kind == "reasoning":
            messages.append({"role": "assistant", "content": _parts(data.get("summary"))})
        else:  # other items (tool calls of built-in tools ...): their JSON, an estimate
            messages.append({"role": "user", "content": json.dumps(data, default=str)})
    return messages


def response_estimate(kwargs: Mapping[str, Any]) -> int:
    """Offline estimate of a Responses request's input tokens."""
    return count_message_tokens(response_messages(kwargs), str(kwargs.get("model") or ""),
                                kwargs.get("tools"))


def _generated(response: Any) -> list[str]:
    texts: list[str] = []
    for item in getattr(response, "output", None) or ():
        data = _plain(item)
        kind = data.get("type")
        if kind == "message":
            texts += [p.get("text") or p.get("refusal") or "" for p in data.get("content") or ()]
        elif kind == "function_call":
            texts.append(data.get("name", "") + data.get("arguments", ""))
        elif kind == "reasoning":
            texts += [p.get("text", "") for p in data.get("summary") or ()]
        else:
            texts.append(json.dumps(data, default=str))
    return texts


def _zero_counts(details: type) -> Any:
    """A usage details object with every count the installed openai requires set to 0: the
    required ones differ between releases (openai 3.57 added ``cache_write_tokens`` to the
    input details)."""
    return details.construct(**{name: 0 for name, field in details.model_fields.items()
                                if field.is_required()})


class _RespondCall:
    """The live side of one ``ctx.respond`` step; ``on_event`` is handed each event of a
    streamed reply as it arrives (the durable client's live stream)."""

    def __init__(self, execution: Execution, kwargs: dict, name: str,
                 on_event: Callable[[Any], Any] | None = None) -> None:
        self.execution = execution
        self.kwargs = kwargs
        self.model = str(kwargs.get("model") or "")
        self.estimate: int | None = None
        self.estimated = False
        self.client: Any = None  # the client that makes the call: its endpoint is journaled
        self.on_event = on_event
        self.events_handed_on = 0

    def assembler(self) -> ResponseAssembler:
        """The assembler of one streamed attempt; refused once an earlier attempt handed
        events on (sending again would hand the reader a second reply after part of the
        first)."""
        if self.events_handed_on:
            raise ReplyProblem(f"the stream broke after {self.events_handed_on} events were "
                               f"passed on to the reader; run the cell again to make this "
                               f"call anew", transient=False)
        return ResponseAssembler(on_text=self.on_text(),
                                 on_event=self._hand_on if self.on_event is not None else None)

    def _hand_on(self, event: Any) -> None:
        self.events_handed_on += 1
        self.on_event(event)

    def before_live(self) -> None:
        self.estimate = response_estimate(self.kwargs)
        check_budget(self.execution, self.kwargs, estimate=self.estimate)

    def on_text(self) -> Any:
        return getattr(self.execution.observer, "on_text", None)

    def finish(self, response: Any) -> Any:
        """The response to journal; a failed one raised (retried when the server says its
        failure was transient); usage estimated when the server sent none."""
        if getattr(response, "status", None) == "failed":
            error = getattr(response, "error", None)
            code = getattr(error, "code", None)
            raise ReplyProblem(f"the response failed ({code}: {getattr(error, 'message', '')})",
                               transient=code in (None, "server_error", "rate_limit_exceeded"))
        if getattr(response, "usage", None) is not None:
            return response
        estimate = self.estimate if self.estimate is not None else response_estimate(self.kwargs)
        prompt = calibration(self.execution).best_guess(self.model, estimate)
        output = completion_tokens(self.model, _generated(response))
        self.estimated = True
        usage = ResponseUsage.construct(
            input_tokens=prompt, input_tokens_details=_zero_counts(InputTokensDetails),
            output_tokens=output, output_tokens_details=_zero_counts(OutputTokensDetails),
            total_tokens=prompt + output)
        return response.model_copy(update={"usage": usage})

    def meta(self, response: Any) -> dict:
        prompt, output = response_usage(response)
        cached, reasoning = usage_details(getattr(response, "usage", None))
        return llm_meta(self.execution, requested=self.model,
                        model=getattr(response, "model", None), prompt=prompt, completion=output,
                        cached=None if self.estimated else cached, reasoning=reasoning,
                        estimated=self.estimated, prompt_estimate=self.estimate,
                        client=self.client)


def respond(execution: Execution, kwargs: dict, *,
            on_event: Callable[[Any], Any] | None = None) -> Any:
    """Replay or make one Responses API call for ``ctx.respond(**kwargs)``; a live streamed
    one hands its events to ``on_event`` as they arrive, and is not sent again once it
    handed one on."""
    client, name, kwargs, retry = prepare(execution, kwargs, "ctx.respond", asynchronous=False)
    streamed = bool(kwargs.pop("stream", False))
    live = _RespondCall(execution, kwargs, name, on_event)

    def call() -> Any:
        chosen = live.client = without_retries(client or default_client())

        def attempt() -> Any:
            if not streamed:
                return live.finish(chosen.responses.create(**kwargs))
            assembler = live.assembler()
            drain(lambda: chosen.responses.create(stream=True, **kwargs), assembler)
            return live.finish(assembler.response())

        return call_with_retries(execution, "ctx.respond", name, chosen, attempt, retry)

    return execution.step("respond", name, call, inputs=chat_inputs(kwargs), usage=response_usage,
                          meta=live.meta, before_live=live.before_live)


async def respond_async(execution: Execution, kwargs: dict, *,
                        on_event: Callable[[Any], Any] | None = None) -> Any:
    """Replay or make one Responses API call for ``await ctx.respond_async(**kwargs)``; a
    live streamed one hands its events to ``on_event`` as they arrive, and is not sent again
    once it handed one on."""
    client, name, kwargs, retry = prepare(execution, kwargs, "ctx.respond", asynchronous=True)
    streamed = bool(kwargs.pop("stream", False))
    live = _RespondCall(execution, kwargs, name, on_event)

    async def call() -> Any:
        chosen = live.client = without_retries(client or default_client(asynchronous=True))

        async def attempt() -> Any:
            if not streamed:
                return live.finish(await chosen.responses.create(**kwargs))
            assembler = live.assembler()
            await drain_async(lambda: chosen.responses.create(stream=True, **kwargs), assembler)
            return live.finish(assembler.response())

        return await call_with_retries_async(execution, "ctx.respond", name, chosen, attempt,
                                             retry)

    return await execution.step_async("respond", name, call, inputs=chat_inputs(kwargs),
                                      usage=response_usage, meta=live.meta,
                                      before_live=live.before_live)
