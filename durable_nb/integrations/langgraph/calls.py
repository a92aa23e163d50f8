"""LangChain model and tool calls as journaled steps of the run that executes them.

:func:`install` wraps four methods once per process, the ones every call of a LangChain chat
model or tool goes through: ``BaseChatModel.generate`` / ``agenerate`` (``invoke``,
``ainvoke``, ``batch`` and LangGraph's streamed model calls all reach them, whatever the
provider: ``ChatOpenAI``, ``ChatAnthropic``, any ``BaseChatModel``) and ``BaseTool.run`` /
``arun`` (``@tool`` functions, ``StructuredTool``, ``ToolNode``'s calls). Outside a durable
run they call through unchanged. Inside one (a ``%%durable_agent`` cell, a
``durable_nb.execute`` handler) each call is a step:

- **A model call** is a ``model`` step named after the model, its inputs the messages (role,
  content, tool calls; not the random ids LangGraph gives new messages), the tools and the
  options that change the answer: an edited prompt or another model or tool list is
  :class:`~durable_nb.errors.InputChanged` naming the first difference. Its result is the
  ``LLMResult`` as data (:mod:`.messages`), with its tokens and cost
  (:func:`~durable_nb.llm.budget.llm_meta`, estimated offline when the provider reported no
  usage); the run's budgets are checked before a live call. A replay rebuilds the
  ``AIMessage`` and calls nothing; LangChain's callbacks see the call start and end at once
  with the journaled reply, tagged ``durable-nb:replayed`` (LangGraph's ``"messages"`` stream
  yields it, LangSmith shows it as a replay). A call
  that fails is not journaled: it is made again when the run goes on. ``model.stream()`` is
  one step too, its reply yielded at once.
- **A tool call** is a ``run`` step named after the tool (the step ``ctx.run`` makes), its
  inputs the arguments the model gave (not those LangGraph injects: state, store, runtime).
  Its result is journaled (a ``ToolMessage``, data, or a ``Command`` of messages); its
  failure too, raised again on replay. ``ctx.step_id`` inside the tool is the step's. A tool
  that stops at its own ``interrupt()`` journals the stop (a replay stops there too) and
  runs again from its start after the decision, as a new step: its effects after the
  ``interrupt()`` happen once.

Inside a graph run with :func:`~durable_nb.integrations.langgraph.invoke`, the steps are keyed
by the LangGraph task that makes them (:mod:`.tasks`); elsewhere by the cell's own order.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ...errors import DurableError, NotJournaled, StepFailed, TerminalError
from ...execution import current_scope, enter, leave
from ...llm.budget import calibration, check_budget, llm_meta
from ...llm.streaming import completion_tokens
from ...llm.tokens import count_message_tokens
from .messages import (decode_result, decode_tool_output, encode_result, encode_tool_output,
                       prompt_messages)
from .tasks import TaskCalls, current_invocation

__all__ = ["MODEL_STEP", "REPLAYED_TAG", "install"]

#: The kind of a LangChain model call's journal entry.
MODEL_STEP = "model"

# generate()'s own keywords and the options that move a request, not change its answer (or
# may carry credentials): never part of the inputs.
_NOT_REQUEST = frozenset({"tags", "metadata", "run_name", "run_id", "callbacks", "stream",
                          "extra_headers", "extra_body", "extra_query", "timeout"})
# A model's own settings that change the answer.
_SETTINGS = ("temperature", "top_p", "max_tokens", "max_completion_tokens", "seed")

_install_lock = threading.Lock()
_installed = False


class _Carried(BaseException):
    """Carries an exception out of a step's function without the journal keeping it: a
    model call's failure (made again on resume) or LangGraph's interrupt and parent-command
    signals (GraphBubbleUp), which are control flow, not outcomes."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Endpoint(NamedTuple):
    """Where a model sends its requests, priced by it."""

    base_url: str


def _described(value: Any) -> Any:
    """``value`` as JSON data for a step's inputs: a pydantic class (structured output) as
    its JSON schema, a function or class by its qualified name."""
    def default(obj: Any) -> Any:
        if isinstance(obj, type) and hasattr(obj, "model_json_schema"):
            return obj.model_json_schema()
        if hasattr(obj, "model_dump"):
            return obj.model_dump(mode="json")
        if callable(obj):
            return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', type(obj).__name__)}"
        return type(obj).__name__

    return json.loads(json.dumps(value, default=default, sort_keys=True))


def _model_name(model: Any) -> str:
    for attribute in ("model_name", "model", "model_id", "deployment_name"):
        value = getattr(model, attribute, None)
        if isinstance(value, str) and value:
            return value
    return type(model).__name__


def _base_url(model: Any) -> str | None:
    client = getattr(model, "root_client", None)  # ChatOpenAI (and its base URL from the env)
    for url in (getattr(client, "base_url", None), getattr(model, "openai_api_base", None),
                getattr(model, "anthropic_api_url", None), getattr(model, "base_url", None)):
        if url:
            return str(url)
    return None


class _ModelCall:
    """One chat model call: its inputs, the budget check before it runs, its entry's usage
    and meta."""

    def __init__(self, execution: Any, model: Any, prompts: Sequence[Sequence[Any]],
                 stop: Any, kwargs: dict) -> None:
        self.execution = execution
        self.name = _model_name(model)
        self.prompts = prompts
        options = {k: v for k, v in kwargs.items()
                   if k not in _NOT_REQUEST and not k.startswith("ls_")}
        options.update({k: v for k in _SETTINGS
                        if isinstance(v := getattr(model, k, None), (int, float)) and k not in options})
        self.tools = options.pop("tools", None)
        self.cap = options.get("max_tokens") or options.get("max_completion_tokens")
        self.inputs: dict[str, Any] = {"model": self.name, "messages": prompt_messages(prompts)}
        if self.tools:
            self.inputs["tools"] = _described(self.tools)
        if stop:
            self.inputs["stop"] = list(stop)
        if options:
            self.inputs["options"] = _described(options)
        url = _base_url(model)
        self.endpoint = _Endpoint(url) if url else None
        self.estimate: int | None = None
        self.estimated = False

    def _estimate(self) -> int:
        from langchain_core.messages import convert_to_openai_messages

        if self.estimate is None:
            tools = self.inputs.get("tools")
            openai_tools = tools if isinstance(tools, list) and all(
                isinstance(t, dict) and t.get("type") == "function" for t in tools) else None
            self.estimate = sum(count_message_tokens(convert_to_openai_messages(list(p)),
                                                     self.name, openai_tools)
                                for p in self.prompts)
        return self.estimate

    def before_live(self) -> None:
        request: dict[str, Any] = {"model": self.name}
        if isinstance(self.cap, int):
            request["max_tokens"] = self.cap
        check_budget(self.execution, request, estimate=self._estimate())

    @staticmethod
    def _messages(data: dict) -> list[dict]:
        return [g["message"].get("data") or {} for prompt in data.get("generations") or []
                for g in prompt]

    def usage(self, data: dict) -> tuple[int, int]:
        """The reply's (input, output) tokens; estimated offline when the provider reported
        none, so that budgets hold with such a server too."""
        usages = [m.get("usage_metadata") or {} for m in self._messages(data)]
        prompt = sum(int(u.get("input_tokens") or 0) for u in usages)
        completion = sum(int(u.get("output_tokens") or 0) for u in usages)
        if prompt or completion:
            return prompt, completion
        self.estimated = True
        texts = [str(m.get("content") or "") for m in self._messages(data)] + [
            c.get("name", "") + json.dumps(c.get("args") or {})
            for m in self._messages(data) for c in m.get("tool_calls") or []]
        return (calibration(self.execution).best_guess(self.name, self._estimate()),
                completion_tokens(self.name, texts))

    def meta(self, data: dict) -> dict[str, Any]:
        messages = self._messages(data)
        first = messages[0] if messages else {}
        usage = first.get("usage_metadata") or {}
        response = first.get("response_metadata") or {}
        prompt, completion = self.usage(data)
        cached = (usage.get("input_token_details") or {}).get("cache_read")
        reasoning = (usage.get("output_token_details") or {}).get("reasoning")
        return llm_meta(self.execution, requested=self.name,
                        model=response.get("model_name") or response.get("model") or self.name,
                        prompt=prompt, completion=completion,
                        cached=cached if isinstance(cached, int) and cached else None,
                        reasoning=reasoning or None, prompt_estimate=self._estimate(),
                        estimated=self.estimated, client=self.endpoint)


def _tool_arguments(tool: Any, tool_input: Any) -> Any:
    """The arguments the model gave a tool call: ``tool_input`` without the ones LangGraph
    injects (state, store, runtime), which are not the tool's request."""
    if not isinstance(tool_input, dict):
        return tool_input
    schema = tool.tool_call_schema
    if isinstance(schema, dict):
        fields = set((schema.get("properties") or {}).keys())
    else:
        fields = set(getattr(schema, "model_fields", {}) or {})
    return {k: v for k, v in tool_input.items() if k in fields} if fields else {
        k: v for k, v in tool_input.items() if isinstance(v, (str, int, float, bool, list, dict))}


class _Step:
    """Where a call's step is taken: the execution, and the LangGraph task's calls (None
    for a call made in the cell's own order)."""

    def __init__(self, execution: Any, calls: TaskCalls | None, kind: str, name: str,
                 inputs: Any) -> None:
        self.execution = execution
        self.calls = calls
        self.kind = kind
        self.name = name
        self.inputs = inputs
        self.what = (kind, name, inputs)  # compared with ==: cheaper than a fingerprint
        self.ran = False  # whether the call was made (not replayed nor handed back)

    def kept(self) -> tuple[bool, Any] | None:
        return None if self.calls is None else self.calls.take(self.what)

    def enter(self) -> Any:
        return None if self.calls is None else enter(self.calls.scope)

    def leave(self, token: Any) -> None:
        if token is not None:
            leave(token)

    def keep(self, ok: bool, value: Any) -> None:
        if self.calls is None or (ok and _is_interrupted(value)):
            return  # a stop at interrupt() is not handed back: the call is made again
        if ok or not isinstance(value, DurableError) or isinstance(value, (StepFailed,
                                                                           TerminalError)):
            self.calls.keep(self.what, ok, value)


def _where(config: Any, kind: str, name: str, inputs: Any, sub: str | None = None
           ) -> _Step | None:
    """The step a call takes here, or None where no durable run executes (the call is then
    made as LangChain makes it)."""
    scope = current_scope()
    if scope is None:
        return None
    if scope.is_step:  # inside another step: in its order
        return _Step(scope.execution, None, kind, name, inputs)
    if config is None:
        from langchain_core.runnables.config import var_child_runnable_config

        config = var_child_runnable_config.get()
    invocation = current_invocation()
    if invocation is None:
        if "langgraph_step" in ((config or {}).get("metadata") or {}):
            raise NotJournaled(
                f"{kind} {name!r} was called in a LangGraph node of a graph run with "
                f"graph.invoke/stream inside run {scope.execution.run_id!r}: its calls and "
                f"interrupts would not be journaled by node. Run the graph with "
                f"durable_nb.integrations.langgraph.invoke(ctx, graph, input) (or ainvoke, "
                f"stream, astream)")
        return _Step(scope.execution, None, kind, name, inputs)  # the cell's own order
    calls = invocation.task(config, sub)
    return _Step(invocation.execution, calls, kind, name, inputs)


def _settled(kept: tuple[bool, Any]) -> Any:
    ok, value = kept
    if not ok:
        raise value
    return value


def _journaled(step: _Step, run: Callable[[], Any], encode: Callable[[Any], Any],
               decode: Callable[[Any], Any], carry: tuple[type, ...], **extra: Any) -> Any:
    kept = step.kept()
    if kept is not None:
        return decode(_settled(kept))

    def function() -> Any:
        step.ran = True
        try:
            return encode(run())
        except carry as exc:
            raise _Carried(exc) from None

    token = step.enter()
    try:
        data = step.execution.step(step.kind, step.name, function, inputs=step.inputs, **extra)
    except _Carried as carried:
        raise carried.error from None
    except Exception as exc:
        step.keep(False, exc)
        raise
    finally:
        step.leave(token)
    step.keep(True, data)
    return decode(data)


async def _journaled_async(step: _Step, run: Callable[[], Any], encode: Callable[[Any], Any],
                           decode: Callable[[Any], Any], carry: tuple[type, ...],
                           **extra: Any) -> Any:
    kept = step.kept()
    if kept is not None:
        return decode(_settled(kept))

    async def function() -> Any:
        step.ran = True
        try:
            return encode(await run())
        except carry as exc:
            raise _Carried(exc) from None

    token = step.enter()
    try:
        data = await step.execution.step_async(step.kind, step.name, function,
                                               inputs=step.inputs, **extra)
    except _Carried as carried:
        raise carried.error from None
    except Exception as exc:
        step.keep(False, exc)
        raise
    finally:
        step.leave(token)
    step.keep(True, data)
    return decode(data)


def _model_step(model: Any, messages: Any, stop: Any, kwargs: dict
                ) -> tuple[_Step, dict] | None:
    scope = current_scope()
    if scope is None:
        return None
    call = _ModelCall(scope.execution, model, messages, stop, kwargs)
    step = _where(None, MODEL_STEP, call.name, call.inputs)
    if step is None:
        return None
    call.execution = step.execution
    return step, {"usage": call.usage, "meta": call.meta, "before_live": call.before_live}


def _tool_step(tool: Any, tool_input: Any, kwargs: dict) -> _Step | None:
    if current_scope() is None:
        return None
    arguments = _tool_arguments(tool, tool_input)
    return _where(kwargs.get("config"), "run", tool.name, {"args": [arguments], "kwargs": {}},
                  sub=kwargs.get("tool_call_id"))


#: The tag of the callback runs of a replayed model call (LangSmith, LangGraph's "messages"
#: stream see the journaled reply, marked as replayed, with no time spent).
REPLAYED_TAG = "durable-nb:replayed"


def _replay_callbacks(model: Any, messages: Any, callbacks: Any, kwargs: dict) -> Any:
    """The callback manager a live ``generate`` would have opened, for a replayed call."""
    from langchain_core.callbacks import CallbackManager

    return CallbackManager.configure(callbacks, model.callbacks, model.verbose,
                                     [*(kwargs.get("tags") or []), REPLAYED_TAG], model.tags,
                                     kwargs.get("metadata"), model.metadata)


def _serialized(model: Any) -> dict:
    return {"lc": 1, "type": "not_implemented",
            "id": [type(model).__module__, type(model).__name__], "name": type(model).__name__}


def _replayed(model: Any, messages: Any, callbacks: Any, kwargs: dict, result: Any) -> None:
    """Tell the callbacks of a replayed call what a live one would have told them: its start
    and its journaled reply, so that LangGraph's "messages" stream yields it on replay too."""
    manager = _replay_callbacks(model, messages, callbacks, kwargs)
    if not manager.handlers:
        return
    runs = manager.on_chat_model_start(_serialized(model), messages,
                                       name=kwargs.get("run_name"), run_id=kwargs.get("run_id"),
                                       batch_size=len(messages))
    for run, generations in zip(runs, result.generations):
        run.on_llm_end(type(result)(generations=[generations], llm_output=result.llm_output))


async def _areplayed(model: Any, messages: Any, callbacks: Any, kwargs: dict,
                     result: Any) -> None:
    from langchain_core.callbacks import AsyncCallbackManager

    manager = AsyncCallbackManager.configure(
        callbacks, model.callbacks, model.verbose, [*(kwargs.get("tags") or []), REPLAYED_TAG],
        model.tags, kwargs.get("metadata"), model.metadata)
    if not manager.handlers:
        return
    runs = await manager.on_chat_model_start(_serialized(model), messages,
                                             name=kwargs.get("run_name"),
                                             run_id=kwargs.get("run_id"),
                                             batch_size=len(messages))
    for run, generations in zip(runs, result.generations):
        await run.on_llm_end(type(result)(generations=[generations],
                                          llm_output=result.llm_output))


def _wrap_generate(original: Callable) -> Callable:
    @functools.wraps(original)
    def generate(self: Any, messages: Any, stop: Any = None, callbacks: Any = None,
                 **kwargs: Any) -> Any:
        found = _model_step(self, messages, stop, kwargs)
        if found is None:
            return original(self, messages, stop, callbacks, **kwargs)
        step, extra = found
        result = _journaled(step, lambda: original(self, messages, stop, callbacks, **kwargs),
                            encode_result, decode_result, (Exception,), **extra)
        if not step.ran:
            _replayed(self, messages, callbacks, kwargs, result)
        return result

    return generate


def _wrap_agenerate(original: Callable) -> Callable:
    @functools.wraps(original)
    async def agenerate(self: Any, messages: Any, stop: Any = None, callbacks: Any = None,
                        **kwargs: Any) -> Any:
        found = _model_step(self, messages, stop, kwargs)
        if found is None:
            return await original(self, messages, stop, callbacks, **kwargs)
        step, extra = found
        result = await _journaled_async(
            step, lambda: original(self, messages, stop, callbacks, **kwargs), encode_result,
            decode_result, (Exception,), **extra)
        if not step.ran:
            await _areplayed(self, messages, callbacks, kwargs, result)
        return result

    return agenerate


def _wrap_stream(original: Callable) -> Callable:
    @functools.wraps(original)
    def stream(self: Any, input: Any, config: Any = None, **kwargs: Any) -> Any:
        if current_scope() is None:
            yield from original(self, input, config, **kwargs)
            return
        yield self.invoke(input, config, **kwargs)  # one journaled step, the reply at once

    return stream


def _wrap_astream(original: Callable) -> Callable:
    @functools.wraps(original)
    async def astream(self: Any, input: Any, config: Any = None, **kwargs: Any) -> Any:
        if current_scope() is None:
            async for chunk in original(self, input, config, **kwargs):
                yield chunk
            return
        yield await self.ainvoke(input, config, **kwargs)

    return astream


def _bubbling() -> tuple[type, ...]:
    from langgraph.errors import GraphBubbleUp

    return (GraphBubbleUp,)


# A tool call that stopped at its own interrupt() is journaled, as {_INTERRUPTED: {"value":
# ..., "response_schema": ...}}: its step key is taken, and a replay (a resumed execution, a
# pure replay) must stop there too, or the call after the decision takes another key than in
# the execution that journaled it. Its attempt after the decision is a new step.
_INTERRUPTED = "durable_nb:interrupted"


class _Interrupted:
    """A tool call's stop at interrupt(): the interrupt's value and response schema."""

    def __init__(self, value: Any, response_schema: Any) -> None:
        self.value = value
        self.response_schema = response_schema

    def stop_again(self) -> Any:
        """Stop the tool call where it stopped, as LangGraph's interrupt() does now: the
        interrupts the call made before it get their answers (a call after a decision makes
        them again), the first without one raises GraphInterrupt with this task's id."""
        from langgraph.types import interrupt

        schema = {"response_schema": self.response_schema} if self.response_schema else {}
        while True:  # each answered interrupt consumes its answer: the loop ends raising
            interrupt(self.value, **schema)


def _stopping(run: Callable[[], Any]) -> Callable[[], Any]:
    """``run`` answering its own interrupt's stop as an :class:`_Interrupted` (a graph it ran
    that stopped at several interrupts goes on bubbling up, not journaled)."""
    from langgraph.errors import GraphInterrupt

    def attempt() -> Any:
        try:
            return run()
        except GraphInterrupt as exc:
            interrupts = exc.args[0] if exc.args else ()
            if len(interrupts) != 1:
                raise
            return _Interrupted(interrupts[0].value,
                                getattr(interrupts[0], "response_schema", None))

    return attempt


def _astopping(run: Callable[[], Any]) -> Callable[[], Any]:
    """:func:`_stopping` for a coroutine function."""
    from langgraph.errors import GraphInterrupt

    async def attempt() -> Any:
        try:
            return await run()
        except GraphInterrupt as exc:
            interrupts = exc.args[0] if exc.args else ()
            if len(interrupts) != 1:
                raise
            return _Interrupted(interrupts[0].value,
                                getattr(interrupts[0], "response_schema", None))

    return attempt


def _encode_tool(value: Any) -> Any:
    if isinstance(value, _Interrupted):
        schema = value.response_schema
        return {_INTERRUPTED: {"value": encode_tool_output(value.value),
                               "response_schema": schema if isinstance(schema, dict) else None}}
    return encode_tool_output(value)


def _is_interrupted(data: Any) -> bool:
    return isinstance(data, dict) and set(data) == {_INTERRUPTED}


def _decode_tool(data: Any) -> Any:
    if _is_interrupted(data):
        return _Interrupted(decode_tool_output(data[_INTERRUPTED]["value"]),
                            data[_INTERRUPTED]["response_schema"])
    return decode_tool_output(data)


def _tool_result(output: Any) -> Any:
    if isinstance(output, _Interrupted):
        output.stop_again()
    return output


def _wrap_run(original: Callable) -> Callable:
    @functools.wraps(original)
    def run(self: Any, tool_input: Any, *args: Any, **kwargs: Any) -> Any:
        step = _tool_step(self, tool_input, kwargs)
        if step is None:
            return original(self, tool_input, *args, **kwargs)
        return _tool_result(_journaled(
            step, _stopping(lambda: original(self, tool_input, *args, **kwargs)),
            _encode_tool, _decode_tool, _bubbling()))

    return run


def _wrap_arun(original: Callable) -> Callable:
    @functools.wraps(original)
    async def arun(self: Any, tool_input: Any, *args: Any, **kwargs: Any) -> Any:
        step = _tool_step(self, tool_input, kwargs)
        if step is None:
            return await original(self, tool_input, *args, **kwargs)
        return _tool_result(await _journaled_async(
            step, _astopping(lambda: original(self, tool_input, *args, **kwargs)),
            _encode_tool, _decode_tool, _bubbling()))

    return arun


def install() -> None:
    """Journal LangChain's model and tool calls made inside durable runs (see the module
    docstring); idempotent. Calls made outside a run are not affected."""
    global _installed
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.tools import BaseTool

    with _install_lock:
        if _installed:
            return
        BaseChatModel.generate = _wrap_generate(BaseChatModel.generate)  # type: ignore[method-assign]
        BaseChatModel.agenerate = _wrap_agenerate(BaseChatModel.agenerate)  # type: ignore[method-assign]
        BaseChatModel.stream = _wrap_stream(BaseChatModel.stream)  # type: ignore[method-assign]
        BaseChatModel.astream = _wrap_astream(BaseChatModel.astream)  # type: ignore[method-assign]
        BaseTool.run = _wrap_run(BaseTool.run)  # type: ignore[method-assign]
        BaseTool.arun = _wrap_arun(BaseTool.arun)  # type: ignore[method-assign]
        _installed = True
