"""Pydantic AI (``pydantic-ai-slim[openai]``), durable in a run: ``await run(ctx, agent, prompt)``.

In a ``%%durable_agent`` cell (or an async ``durable_nb.execute`` handler)::

    from durable_nb.integrations.pydantic_ai import run

    result = await run(ctx, agent, "What is the weather in Oslo?")
    result.output

is ``agent.run(prompt)`` with these guarantees, through Pydantic AI's public extension points
(a per-run model and a capability), without changing the agent:

- **Model calls are steps, whatever the model.** An OpenAI-compatible model (an agent without a
  model, a model name without a provider or with ``openai:``, an ``OpenAIChatModel``) runs as
  the SDK's ``OpenAIChatModel`` over ``ctx.async_openai`` (or ``client=``, wrapped), named as
  the agent's model is (``model=`` to choose another; the run's ``model=`` when the agent has
  none): every request is a ``chat`` step like ``ctx.chat`` (budgets, tokens and cost,
  retries, input comparison), sent through the run's client, not the agent's own provider.
  Any other model (Anthropic, Gemini, Bedrock, Groq, ``FunctionModel`` ..., an instance or a
  ``provider:name`` string, the agent's or ``model=``) is called by Pydantic AI itself, and
  each request is a ``model`` step journaled through Pydantic AI's durability API
  (:mod:`durable_nb.integrations.pydantic_ai_models`): the ``ModelResponse`` in Pydantic AI's
  serialized form, with tokens, cost, budgets and input comparison. Structured output is parsed
  from the journaled response, so a replay gives the same typed object.
- **Refused** with :class:`~durable_nb.errors.NotJournaled`: ``model=`` naming a model that is
  not OpenAI-compatible for an agent without a model of its own (Pydantic AI's durability API
  needs the agent's model; ``Agent(model, ...)``).
- **Tools are steps.** A capability's ``wrap_tool_execute`` runs each tool call as a
  ``ctx.run_async`` step named after the tool with its validated arguments as inputs: once, its
  result journaled. Pydantic AI runs a turn's tool calls as asyncio tasks created in call order;
  durable_nb numbers them, so replay does not depend on which finishes first.
- **Approvals.** A tool with ``requires_approval=True`` ends an ``agent.run`` with
  ``DeferredToolRequests`` (added to the run's output types); each call is asked with
  ``ctx.approval(tool name, {"tool", "arguments"})`` (the panel, ``durable_nb.approve``, the CLI)
  and answered with ``DeferredToolResults`` in the next ``agent.run``, which goes on from the
  message history: approved (``ToolApproved(override_args=...)`` when a person edited the
  arguments, checked against the tool's schema) or ``ToolDenied`` (with their message).
  Calls deferred for external execution are left to the caller: the result with them is
  returned.
- **MCP toolsets** (``MCPToolset``, ``pip install "pydantic-ai-slim[mcp]"``): each server's
  tool list is a journaled step compared on replay, each call a step with its step id in
  ``_meta``, ``needs_approval=`` asks before the matching tools' calls, and the server's
  questions (elicitation) are asked as the run's requests
  (:mod:`durable_nb.integrations.pydantic_ai_mcp`).

For ``agent.run_stream`` / ``agent.iter``, pass ``model=durable_model(ctx, name)`` (an
OpenAI-compatible model) or ``JournaledModelRequests(ctx)`` (any model) with
``JournaledTools(ctx)`` in ``capabilities=`` yourself: model calls and tools are steps the same
way; approvals are then yours to answer.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from pydantic_ai import Agent
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolApproved, ToolDenied

from ..llm.durable_client import DurableAsyncOpenAI
from ..errors import NotJournaled
from .pydantic_ai_models import JournaledModelRequests

if TYPE_CHECKING:
    from ..mcp.tools import NeedsApproval

__all__ = ["JournaledModelRequests", "JournaledTools", "durable_model", "run"]

#: Provider prefixes of model names durable_nb sends through the run's OpenAI client.
_OPENAI_PREFIXES = ("openai", "openai-chat")


class JournaledTools(AbstractCapability):
    """A capability running every tool call of the agent as a journaled step of ``ctx``'s
    run (``ctx.run_async``, named after the tool, its validated arguments as inputs), and
    every MCP toolset's tool list as one
    (:class:`~durable_nb.integrations.pydantic_ai_mcp.JournaledMCPToolset`, whose tools
    matching ``needs_approval`` ask before each call)."""

    def __init__(self, ctx: Any, *, needs_approval: NeedsApproval = False) -> None:
        if needs_approval is not False:  # (durable_nb.mcp needs the mcp extra)
            from ..mcp.tools import approval_test

            approval_test(needs_approval)  # a wrong kind of value is refused before the run
        self.ctx = ctx
        self.needs_approval = needs_approval
        #: The MCP tools' JSON schemas by name, as offered to the model (edits are checked
        #: against them).
        self.mcp_schemas: dict[str, dict] = {}

    def get_wrapper_toolset(self, toolset: Any) -> Any:
        if "pydantic_ai.mcp" not in sys.modules:  # never imported: no MCPToolset among them
            return None
        from .pydantic_ai_mcp import journaled_mcp_toolsets

        return journaled_mcp_toolsets(toolset, self.ctx, self.needs_approval, self.mcp_schemas)

    async def wrap_tool_execute(self, ctx: Any, *, call: Any, tool_def: Any, args: Any,
                                handler: Any) -> Any:
        async def execute(arguments: Any) -> Any:
            return await handler(args)

        return await self.ctx.run_async(call.tool_name, execute, call.args_as_dict())


def _openai_name(name: str) -> str | None:
    """The model of ``name`` when it names an OpenAI-compatible one (no provider, or
    ``openai:``), else None."""
    provider, colon, model = name.partition(":")
    if not colon:
        return name
    return model if provider in _OPENAI_PREFIXES else None


def _openai_model(ctx: Any, agent: Agent, model: Any) -> str | None:
    """The name of the OpenAI-compatible model the run calls through ``ctx.async_openai``,
    or None when the model is another provider's (called by Pydantic AI, journaled as
    ``model`` steps)."""
    if model is not None:
        return _openai_name(model) if isinstance(model, str) else None
    given = agent.model
    if isinstance(given, (OpenAIChatModel, OpenAIResponsesModel)):
        return given.model_name
    if isinstance(given, str):
        return _openai_name(given)
    if given is None and ctx._ex.options.model:
        return str(ctx._ex.options.model)
    return None


def durable_model(ctx: Any, name: str, client: Any = None) -> OpenAIChatModel:
    """Pydantic AI's ``OpenAIChatModel`` named ``name`` over ``ctx.async_openai`` (or over
    ``client``, an ``openai.AsyncOpenAI``): every request a journaled ``chat`` step."""
    durable = DurableAsyncOpenAI(ctx._ex, client) if client is not None else ctx.async_openai
    return OpenAIChatModel(name, provider=OpenAIProvider(openai_client=durable))  # type: ignore[arg-type]


def _with_deferred(output_type: Any) -> Any:
    types = list(output_type) if isinstance(output_type, (list, tuple)) else [output_type]
    return types if DeferredToolRequests in types else [*types, DeferredToolRequests]


def _schemas(agent: Agent) -> dict[str, dict]:
    """The JSON schema of each function tool's arguments, by name (the tools an edit is
    checked against; an MCP server's come from the tool list its
    :class:`JournaledTools` journaled, ``mcp_schemas``; any other toolset that lists no tools
    up front has none, so its calls are approved or rejected as asked)."""
    schemas: dict[str, dict] = {}
    for toolset in agent.toolsets:
        for name, made in (getattr(toolset, "tools", None) or {}).items():
            schemas[name] = made.tool_def.parameters_json_schema
    return schemas


def _decisions(ctx: Any, requests: DeferredToolRequests,
               schemas: dict[str, dict]) -> DeferredToolResults:
    """Each call's approval through ``ctx.approval``, as Pydantic AI takes it: approved
    (``ToolApproved(override_args=...)`` with a person's edited arguments) or
    ``ToolDenied`` (with their message for the model, if they gave one)."""
    approvals: dict[str, Any] = {}
    for call in requests.approvals:
        decision = ctx.approval(call.tool_name, {"tool": call.tool_name,
                                                 "arguments": call.args_as_dict()},
                                schema=schemas.get(call.tool_name))
        if not decision.approved:
            approvals[call.tool_call_id] = (ToolDenied(decision.message) if decision.message
                                            else ToolDenied())
        elif decision.args is not None:
            approvals[call.tool_call_id] = ToolApproved(override_args=decision.args)
        else:
            approvals[call.tool_call_id] = True
    return DeferredToolResults(approvals=approvals)


async def run(ctx: Any, agent: Agent, prompt: Any = None, *, model: Any = None,
              client: Any = None, output_type: Any = None,
              needs_approval: NeedsApproval = False, **run_options: Any) -> Any:
    """``agent.run(prompt, ...)`` as part of ``ctx``'s run (see the module docstring); returns
    the ``AgentRunResult`` of the last ``agent.run`` (after the last approval). ``model``: a
    model name or a Pydantic AI ``Model`` to use instead of the agent's.
    ``needs_approval``: the MCP servers' tools that ask before each call, as
    ``ctx.mcp_tools`` takes it (True, a tool name or glob pattern such as ``"delete_*"``, or
    several), matched against the server's names for them.
    ``run_options`` are ``agent.run``'s (``deps``, ``message_history``, ``usage_limits`` ...)."""
    tools = JournaledTools(ctx, needs_approval=needs_approval)
    capabilities = [*(run_options.pop("capabilities", None) or ()), tools]
    history = run_options.pop("message_history", None)
    openai_name = _openai_model(ctx, agent, model)
    if openai_name is not None:
        chosen = durable_model(ctx, openai_name, client)
    else:
        if agent.model is None and model is None:
            raise NotJournaled(
                f"agent {agent.name!r} has no model, and neither has the run: give one "
                f"(run(..., model='gpt-4.1-mini'), RunOptions(model=...), or Agent(model, ...))")
        if agent.model is None:
            raise NotJournaled(
                f"agent {agent.name!r} has no model of its own, and Pydantic AI journals the "
                f"requests of a model that is not OpenAI-compatible ({model!r}) only for an "
                f"agent built with one: give it as Agent(model, ...); model= may then choose "
                f"another for a run")
        # A Model instance given here crosses Pydantic AI's durable boundary registered.
        models = {"run": model} if model is not None and not isinstance(model, str) else None
        capabilities.append(JournaledModelRequests(ctx, name=agent.name or "agent",
                                                   models=models))
        chosen = model
    options = dict(run_options, capabilities=capabilities, model=chosen,
                   output_type=_with_deferred(output_type or agent.output_type))
    result = await agent.run(prompt, message_history=history, **options)
    while isinstance(result.output, DeferredToolRequests) and result.output.approvals \
            and not result.output.calls:
        result = await agent.run(message_history=result.all_messages(),
                                 deferred_tool_results=_decisions(ctx, result.output,
                                                                  {**tools.mcp_schemas,
                                                                   **_schemas(agent)}),
                                 **options)
    return result
