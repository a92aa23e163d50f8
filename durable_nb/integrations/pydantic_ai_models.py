"""Any Pydantic AI model's requests as journaled steps, through Pydantic AI's public durability
API (``pydantic_ai.durable_exec``): :class:`JournaledModelRequests`, a durability capability
whose operation backend runs each model request as one step of kind ``model`` of the run.

What a ``model`` step holds and guarantees:

- **The response in Pydantic AI's own form**: the ``ModelResponse`` reduced to JSON by
  ``JSON_CODEC`` (parts, usage, model and provider names, finish reason), journaled before it is
  returned; a replay rebuilds the same ``ModelResponse`` and sends nothing. The model may be any
  Pydantic AI model: Anthropic, Gemini, Bedrock, Groq, ``FunctionModel`` ...
- **Its request as inputs**: the model's name, the messages (Pydantic AI's serialized
  ``ModelMessage`` list, without the timestamps and run ids that differ at each execution), the
  model settings (without transport settings: headers, query, body, timeout, which can carry
  credentials) and the request parameters (tool definitions, output mode). A replay whose
  request differs stops with the first difference in one line (``messages[0].parts[0].content:
  'Oslo' -> 'Rome'``), as for a changed prompt in ``ctx.chat``.
- **Tokens, cost and budgets**: the response's usage is the step's tokens (estimated offline,
  ``meta["estimated"]``, when the server reported none); its cost is priced
  like a ``chat`` step's (:func:`~durable_nb.llm.budget.llm_meta`: your ``RunOptions(prices=)``,
  then genai-prices by the model's endpoint or name, the database Pydantic AI itself prices
  with); before a live request the run's ``max_iterations``, ``max_tokens`` and ``max_cost`` are
  checked (:func:`~durable_nb.llm.budget.check_budget`) with an offline estimate of the
  request's prompt tokens and its ``max_tokens`` setting.
- **Once**: a request is sent again only when the process died before its response was
  journaled (a request in flight at a crash is sent again on resume, as for any step).

Tools are not wrapped here (``wrapped_toolset_kinds`` is empty): the integration's
``JournaledTools`` capability journals them, with approvals, as for every model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NamedTuple

from pydantic import TypeAdapter
from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    CallableOperationBackend,
    DurabilityEngineSpec,
    DurableOperationBackend,
    DurableOperationId,
    JournalOperationNamer,
    ModelRequestId,
    RoleBasedOperationConfig,
)
from pydantic_ai.messages import ModelMessagesTypeAdapter
from pydantic_ai.models import Model, ModelRequestParameters

from ..execution import canonical
from ..llm.budget import calibration, check_budget, llm_meta
from ..llm.pydantic_ai_messages import model_messages
from ..llm.streaming import completion_tokens
from ..llm.tokens import count_message_tokens

__all__ = ["MODEL_STEP", "JournaledModelRequests", "request_inputs", "response_usage"]

#: The kind of the journal entry of one Pydantic AI model request.
MODEL_STEP = "model"

# Fields of Pydantic AI's serialized messages that differ at each execution of the same run.
_VOLATILE = frozenset({"timestamp", "run_id", "conversation_id"})
# Model settings that configure transport or may carry credentials: never journaled.
_TRANSPORT_SETTINGS = ("extra_headers", "extra_body", "extra_query", "timeout")
_PARAMETERS = TypeAdapter(ModelRequestParameters)


def _without_volatile(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_volatile(v) for k, v in value.items()
                if k not in _VOLATILE and not k.startswith("_")}
    if isinstance(value, list):
        return [_without_volatile(v) for v in value]
    return value


def request_inputs(model_name: str, messages: Sequence[Any], settings: Any,
                   parameters: Any) -> dict[str, Any]:
    """What one model request asks, as canonical JSON data: compared on replay, journaled so
    that a person can read it (see the module docstring)."""
    inputs: dict[str, Any] = {
        "model": model_name,
        "messages": _without_volatile(ModelMessagesTypeAdapter.dump_python(list(messages),
                                                                          mode="json")),
    }
    kept = {k: v for k, v in dict(settings or {}).items() if k not in _TRANSPORT_SETTINGS}
    if kept:
        inputs["settings"] = canonical(kept)
    if parameters is not None:
        inputs["parameters"] = _without_volatile(_PARAMETERS.dump_python(parameters, mode="json",
                                                                         exclude_none=True))
    return inputs


def _response_json(payload: Any) -> dict[str, Any]:
    """The ``ModelResponse`` in a journaled payload (a streamed request recorded by an older
    Pydantic AI holds it under ``response``)."""
    if isinstance(payload, dict) and isinstance(payload.get("response"), dict):
        return payload["response"]
    return payload if isinstance(payload, dict) else {}


def response_usage(payload: Any) -> tuple[int, int]:
    """(input, output) tokens of a journaled ``ModelResponse``."""
    usage = _response_json(payload).get("usage") or {}
    return int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)


def _chat_like(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """Pydantic AI messages as chat messages, for the offline token estimate."""
    return [m for item in ModelMessagesTypeAdapter.dump_python(list(messages), mode="json")
            for m in model_messages(item)]


def _tools(parameters: Any) -> list[dict[str, Any]]:
    definitions = [*getattr(parameters, "function_tools", ()), *getattr(parameters, "output_tools", ())]
    return [{"type": "function", "function": {"name": d.name, "description": d.description or "",
                                               "parameters": d.parameters_json_schema}}
            for d in definitions]


class _Endpoint(NamedTuple):
    """Where a model sends its requests: priced by it (genai-prices knows providers' URLs)."""

    base_url: str


class _ModelCall:
    """The live side of one model step: the budget check and the entry's meta."""

    def __init__(self, execution: Any, model_name: str, messages: Sequence[Any], settings: Any,
                 parameters: Any, base_url: str | None) -> None:
        self.execution = execution
        self.model_name = model_name
        self.messages = messages
        self.settings = dict(settings or {})
        self.parameters = parameters
        self.endpoint = _Endpoint(base_url) if base_url else None
        self.estimate: int | None = None
        self.estimated = False

    def before_live(self) -> None:
        self.estimate = count_message_tokens(_chat_like(self.messages), self.model_name,
                                             _tools(self.parameters))
        request: dict[str, Any] = {"model": self.model_name}
        if isinstance(self.settings.get("max_tokens"), int):
            request["max_tokens"] = self.settings["max_tokens"]
        check_budget(self.execution, request, estimate=self.estimate)

    def usage(self, payload: Any) -> tuple[int, int]:
        """The response's (input, output) tokens; estimated offline when the server reported
        none (the prompt calibrated with the run's earlier replies, the reply's text and tool
        calls counted), so that budgets hold with such a server too."""
        prompt, completion = response_usage(payload)
        if prompt or completion:
            return prompt, completion
        self.estimated = True
        estimate = self.estimate if self.estimate is not None else count_message_tokens(
            _chat_like(self.messages), self.model_name, _tools(self.parameters))
        reply = model_messages(_response_json(payload))
        texts = [str(m.get("content") or "") for m in reply] + [
            c["function"]["name"] + c["function"]["arguments"]
            for m in reply for c in m.get("tool_calls", [])]
        return (calibration(self.execution).best_guess(self.model_name, estimate),
                completion_tokens(self.model_name, texts))

    def meta(self, payload: Any) -> dict[str, Any]:
        response = _response_json(payload)
        usage = response.get("usage") or {}
        prompt, completion = self.usage(payload)
        cached = usage.get("cache_read_tokens")
        meta = llm_meta(self.execution, requested=self.model_name,
                        model=response.get("model_name") or self.model_name, prompt=prompt,
                        completion=completion,
                        cached=cached if isinstance(cached, int) and cached else None,
                        reasoning=usage.get("output_reasoning_tokens") or None,
                        prompt_estimate=self.estimate, estimated=self.estimated,
                        client=self.endpoint)
        if response.get("provider_name"):
            meta["provider"] = response["provider_name"]
        return meta


def _base_url(model: Any) -> str | None:
    try:
        url = getattr(model, "base_url", None)
    except Exception:  # noqa: BLE001 - a model that cannot say where it sends is priced by name
        return None
    return str(url) if url else None


class _StepBackend(CallableOperationBackend[None]):
    """Runs each durable operation of the agent as a step of the run: a model request as a
    ``model`` step, anything else as a step named after the operation."""

    def __init__(self, execution: Any, agent_name: str) -> None:
        super().__init__(namer=JournalOperationNamer(agent_name),
                         config=RoleBasedOperationConfig(model=None, event=None,
                                                         capability=None, tool=None))
        self.execution = execution

    async def execute(self, *, operation_id: DurableOperationId, name: str,
                      body: Callable[[], Awaitable[object]], cache_key: tuple[object, ...],
                      config: None) -> object:
        if not isinstance(operation_id, ModelRequestId):
            return await self.execution.step_async("run", name, body)
        _, messages, settings, parameters, run_context = cache_key[:5]
        model_name = operation_id.model_name
        live = _ModelCall(self.execution, model_name, messages, settings, parameters,  # type: ignore[arg-type]
                          _base_url(getattr(run_context, "model", None)))
        step = self.execution.step_async(
            MODEL_STEP, model_name, body,
            inputs=request_inputs(model_name, messages, settings, parameters),  # type: ignore[arg-type]
            usage=live.usage, meta=live.meta, before_live=live.before_live)
        if not operation_id.streaming:
            return await step
        # Pydantic AI's run_stream sends a streamed request from the task that reads the
        # stream, in the context of the task that runs the agent, whose scope it is: not a
        # flow that may take steps there. The step runs in a task of its own, created (and
        # so numbered) where the request is made, as the durable openai client runs a
        # streamed call: its key is the same at every execution.
        return await asyncio.get_running_loop().create_task(step)


class JournaledModelRequests(BaseDurabilityCapability[Any]):
    """A Pydantic AI durability capability that journals every model request of the agent as
    a ``model`` step of ``ctx``'s run (see the module docstring). Pass it to ``agent.run`` /
    ``agent.run_stream`` / ``agent.iter`` (``capabilities=[JournaledModelRequests(ctx),
    JournaledTools(ctx)]``); :func:`durable_nb.integrations.pydantic_ai.run` does."""

    engine_spec = DurabilityEngineSpec(
        engine_name="durable_nb",
        durable_unit_noun="step",
        durable_container_noun="run",
        codec=JSON_CODEC,  # the journal holds JSON data, never pickled objects
        wrapped_toolset_kinds=frozenset(),  # JournaledTools journals tool calls
        toolset_lifecycles={"function": "enter-always", "mcp": "enter-always",
                            "dynamic": "enter-never"},
        journal_discovery=False,
        sequential_tools_in_durable_context=False,
    )

    def __init__(self, ctx: Any, *, name: str | None = None,
                 models: Mapping[str, Model] | None = None) -> None:
        super().__init__(name=name, models=models)
        self.execution = ctx._ex

    @property
    def in_durable_context(self) -> bool:
        return True

    def get_durable_operation_backend(self) -> DurableOperationBackend[Any]:
        return _StepBackend(self.execution, self.name or "agent")
