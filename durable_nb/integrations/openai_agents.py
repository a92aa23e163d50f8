"""The OpenAI Agents SDK (``openai-agents``), durable in a run: ``await run(ctx, agent, input)``.

In a ``%%durable_agent`` cell (or a ``durable_nb.execute`` handler)::

    from agents import Agent, function_tool
    from durable_nb.integrations.openai_agents import run

    result = await run(ctx, agent, "What is the weather in Oslo?")
    result.final_output

is ``Runner.run(agent, input)`` with these guarantees:

- **Model calls are steps.** Every model the agents name (a model name, or the run's
  ``model=`` when they name none) is the SDK's ``OpenAIChatCompletionsModel`` (or, with
  ``api="responses"``, its ``OpenAIResponsesModel``) over ``ctx.async_openai`` (or
  ``client=``, wrapped): each call is a ``chat`` step like ``ctx.chat`` (a ``respond`` step
  like ``ctx.respond``) with budgets, tokens and cost, retries and input comparison (an
  edited instruction is :class:`~durable_nb.errors.InputChanged` at the first model call),
  replayed after a crash.
- **Function tools are steps.** Each ``FunctionTool`` of the agents, and of the agents they
  hand off to, runs as a ``ctx.run_async`` step named after the tool with its arguments as
  inputs: once, its result journaled. The SDK runs a turn's tool calls in asyncio tasks
  created in call order; durable_nb numbers tasks by creation, so their step keys (and
  replay) do not depend on which tool finishes first. An agent used as a tool
  (``agent.as_tool``) is one such step: its model calls are steps inside it; its own tools
  run again if the process dies in the middle of it.
- **Approvals.** A tool with ``needs_approval`` stops the SDK's run with an interruption;
  each one is asked with ``ctx.approval(tool name, {"agent", "tool", "arguments"})`` (the
  panel's Approve / Reject, ``durable_nb.approve``, the CLI), and the decision is given to
  the SDK as its own ``state.approve(item)`` / ``state.reject(item)`` before the run goes on.
  The decision is journaled: a replay gives it again without asking.
- **Tracing is off** (``RunConfig.tracing_disabled``) unless ``tracing=True``: the SDK's
  exporter sends traces to OpenAI, which fails offline, and a resumed run would export the
  replayed part again.
- **MCP servers** (``mcp_servers=``, connected as the SDK asks: ``async with
  MCPServerStdio(...)``) are wrapped (:class:`DurableMCPServer`): each tool list the SDK asks
  for is a journaled step (a replay offers the model what it saw; a server whose tools changed
  since is an :class:`~durable_nb.errors.InputChanged`), and each tool call a
  ``ctx.run_async`` step named after the tool, its step id sent in ``_meta`` under
  ``durable-nb/step-id`` (with the SDK's own ``tool_meta_resolver`` entries). The server's
  ``require_approval`` asks through ``ctx.approval`` like any tool's ``needs_approval``.
  A server's questions (elicitation) are not asked: the SDK (0.24) opens its
  ``mcp.ClientSession`` without an ``elicitation_callback`` and takes none to pass on, so the
  session does not declare the capability and a server refuses a call that would ask.
- **Refused** with :class:`~durable_nb.errors.NotJournaled`, before anything runs: an agent
  given a ``Model`` object (name a model instead: durable_nb provides it), tools other than
  function tools (shell, computer, apply-patch: they act outside a step), and ``session=``
  (its store would be written again on replay).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

from agents import Agent, FunctionTool, Handoff, RunConfig, Runner
from agents.mcp import MCPServer
from agents.models.default_models import get_default_model
from agents.models.interface import Model, ModelProvider
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
from agents.models.openai_responses import OpenAIResponsesModel

from ..llm.durable_client import DurableAsyncOpenAI
from ..mcp.tools import STEP_ID_META_KEY  # the SDK brings the mcp package
from ..errors import NotJournaled

__all__ = ["DurableMCPServer", "DurableModelProvider", "StreamedRun", "durable_agent", "durable_run_config", "run",
           "run_streamed"]


Api = Literal["chat", "responses"]


class DurableModelProvider(ModelProvider):
    """Resolves model names to the SDK's models over a durable client: its Chat
    Completions model (``api="chat"``, the default: every call a journaled ``chat`` step) or
    its Responses model (``api="responses"``: ``respond`` steps). Without a name, the run's
    ``model=``, else the SDK's default model."""

    def __init__(self, client: DurableAsyncOpenAI, default_model: str | None = None,
                 api: Api = "chat") -> None:
        if api not in ("chat", "responses"):
            raise ValueError(f"api must be 'chat' or 'responses', not {api!r}")
        self.client = client
        self.default_model = default_model
        self.api = api

    def get_model(self, model_name: str | None) -> Model:
        name = model_name or self.default_model or get_default_model()
        model = OpenAIChatCompletionsModel if self.api == "chat" else OpenAIResponsesModel
        return model(model=name, openai_client=self.client)  # type: ignore[arg-type]


def _arguments(text: str) -> Any:
    """A tool call's arguments as the step's inputs: the JSON value, or the text if it is
    not JSON (the tool reports that to the model itself)."""
    try:
        return json.loads(text) if text else {}
    except ValueError:
        return text


class _Durable:
    """Durable copies of an agent graph: tools journaled, handoffs leading to durable
    copies; each agent copied once (graphs may have cycles)."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.copies: dict[int, Agent] = {}

    def agent(self, agent: Agent) -> Agent:
        copy = self.copies.get(id(agent))
        if copy is not None:
            return copy
        if isinstance(agent.model, Model):
            raise NotJournaled(
                f"agent {agent.name!r} has a model object ({type(agent.model).__name__}), whose "
                f"calls durable_nb cannot journal: give it a model name (model='gpt-4.1') and "
                f"durable_nb provides the model over ctx.async_openai")
        copy = agent.clone(tools=[self.tool(agent, t) for t in agent.tools], handoffs=[],
                           mcp_servers=[DurableMCPServer(self.ctx, s) for s in agent.mcp_servers])
        self.copies[id(agent)] = copy
        copy.handoffs = [self.handoff(h) for h in agent.handoffs]
        return copy

    def tool(self, agent: Agent, tool: Any) -> FunctionTool:
        if not isinstance(tool, FunctionTool):
            raise NotJournaled(
                f"agent {agent.name!r}: tool {getattr(tool, 'name', tool)!r} is a "
                f"{type(tool).__name__}, which acts outside a journaled step; only function "
                f"tools are journaled (wrap the action in a @function_tool)")
        ctx, invoke = self.ctx, tool.on_invoke_tool

        async def on_invoke_tool(tool_context: Any, arguments: str) -> Any:
            async def call(inputs: Any) -> Any:
                return await invoke(tool_context, arguments)

            return await ctx.run_async(tool.name, call, _arguments(arguments))

        return dataclasses.replace(tool, on_invoke_tool=on_invoke_tool)

    def handoff(self, target: Agent | Handoff) -> Agent | Handoff:
        if isinstance(target, Agent):
            return self.agent(target)
        invoke = target.on_invoke_handoff

        async def on_invoke_handoff(context: Any, arguments: str) -> Any:
            return self.agent(await invoke(context, arguments))

        return dataclasses.replace(target, on_invoke_handoff=on_invoke_handoff)


class DurableMCPServer(MCPServer):
    """An Agents SDK MCP server whose tool lists and tool calls are journaled steps of
    ``ctx``'s run (see the module docstring); everything else (connecting, prompts,
    approval policy, guardrails) is the wrapped server's."""

    def __init__(self, ctx: Any, server: MCPServer) -> None:
        # Not MCPServer.__init__: every setting is read from the wrapped server.
        self._ctx = ctx
        self._server = server

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)

    @property
    def name(self) -> str:
        return self._server.name

    async def connect(self) -> None:
        await self._server.connect()

    async def cleanup(self) -> None:
        await self._server.cleanup()

    async def list_prompts(self) -> Any:
        return await self._server.list_prompts()

    async def get_prompt(self, name: str, arguments: dict[str, Any] | None = None) -> Any:
        return await self._server.get_prompt(name, arguments)

    async def list_tools(self, run_context: Any = None, agent: Any = None) -> list[Any]:
        """The server's tools now, journaled: keyed by name in the step's inputs, so that a
        change since reads "args[0].tools.NAME was added"."""
        from mcp import Tool as MCPTool

        live = [t.model_dump(mode="json", by_alias=True, exclude_none=True)
                for t in await self._server.list_tools(run_context, agent)]
        described = {t["name"]: {k: v for k, v in t.items() if k != "name"} for t in live}

        async def listed(inputs: Any) -> list[dict[str, Any]]:
            return live

        # ctx.run_async's form of the inputs: journals already written compare against it.
        journaled = await self._ctx.run_async(f"tools/list {self.name}", listed,
                                              {"server": self.name, "tools": described})
        return [MCPTool.model_validate(t) for t in journaled]

    async def call_tool(self, tool_name: str, arguments: dict[str, Any] | None,
                        meta: dict[str, Any] | None = None) -> Any:
        """One journaled step named after the tool, its arguments the inputs."""
        from mcp.types import CallToolResult

        ctx, server = self._ctx, self._server

        async def call(inputs: Any) -> dict[str, Any]:
            sent = {**(meta or {}), STEP_ID_META_KEY: ctx.step_id}
            result = await server.call_tool(tool_name, arguments, meta=sent)
            return result.model_dump(mode="json", by_alias=True, exclude_none=True)

        return CallToolResult.model_validate(
            await ctx.run_async(tool_name, call, arguments or {}))


def durable_agent(ctx: Any, agent: Agent) -> Agent:
    """A copy of ``agent`` (and of the agents it hands off to) whose function tools are
    journaled steps of ``ctx``'s run; for ``Runner`` calls of your own, with
    :func:`durable_run_config`. :func:`run` does this for you."""
    return _Durable(ctx).agent(agent)


def durable_run_config(ctx: Any, given: RunConfig | None = None, *, client: Any = None,
                       api: Api = "chat", tracing: bool = False) -> RunConfig:
    """``given`` (or a default ``RunConfig``) with durable_nb's model provider (see
    :class:`DurableModelProvider`) over ``ctx.async_openai`` (or over ``client``, an
    ``openai.AsyncOpenAI``), and tracing off unless ``tracing``. Refuses a ``Model`` object as
    the run's model."""
    config = given or RunConfig()
    if isinstance(config.model, Model):
        raise NotJournaled("run_config.model is a model object, whose calls durable_nb cannot "
                           "journal: give a model name")
    durable = DurableAsyncOpenAI(ctx._ex, client) if client is not None else ctx.async_openai
    provider = DurableModelProvider(durable, ctx._ex.options.model, api)
    return dataclasses.replace(config, model_provider=provider,
                               tracing_disabled=config.tracing_disabled or not tracing)


def _decide(ctx: Any, state: Any, item: Any) -> None:
    """Ask for the interrupted tool call ``item`` with ``ctx.approval`` and give the decision
    to the SDK's ``state``."""
    tool = item.tool_name or item.name or "tool"
    details = {"agent": item.agent.name, "tool": tool,
               "arguments": _arguments(item.arguments or "")}
    decision = ctx.approval(tool, details)
    if decision.approved:
        state.approve(item)
    else:  # the SDK sends a person's message to the model as the call's answer
        state.reject(item, rejection_message=decision.message)


def _check_options(runner_options: dict) -> None:
    if runner_options.get("session") is not None:
        raise NotJournaled("session= keeps the conversation in a store of its own, which a "
                           "replay would write again: durable_nb's journal keeps the run; "
                           "pass the earlier items as input instead")


def _resumed(ctx: Any, result: Any) -> Any:
    """The SDK's ``RunState`` of an interrupted ``result`` with every interruption decided
    through ``ctx.approval``."""
    state = result.to_state()
    for item in result.interruptions:
        _decide(ctx, state, item)
    return state


async def run(ctx: Any, agent: Agent, input: Any, *, client: Any = None, api: Api = "chat",
              run_config: RunConfig | None = None, tracing: bool = False,
              **runner_options: Any) -> Any:
    """``Runner.run(agent, input, ...)`` as part of ``ctx``'s run (see the module
    docstring): model calls and function tools are journaled steps, approvals go through
    ``ctx.approval``. Returns the SDK's ``RunResult`` of the last leg (after the last
    approval). ``runner_options`` are ``Runner.run``'s (``context``, ``max_turns``,
    ``hooks`` ...), ``session`` excepted."""
    _check_options(runner_options)
    start = durable_agent(ctx, agent)
    config = durable_run_config(ctx, run_config, client=client, api=api, tracing=tracing)
    result = await Runner.run(start, input, run_config=config, **runner_options)
    while result.interruptions:
        result = await Runner.run(start, _resumed(ctx, result), run_config=config,
                                  **runner_options)
    return result


class StreamedRun:
    """What :func:`run_streamed` returns: iterate :meth:`stream_events`, then read
    :attr:`result` (the SDK's ``RunResultStreaming`` of the last leg) or
    :attr:`final_output`."""

    def __init__(self, ctx: Any, start: Agent, input: Any, config: RunConfig,
                 runner_options: dict) -> None:
        self._ctx = ctx
        self._start = start
        self._config = config
        self._options = runner_options
        self.result = Runner.run_streamed(start, input, run_config=config, **runner_options)

    async def stream_events(self) -> Any:
        """The SDK's stream events of the whole run, approvals included: after an
        interrupted leg, its interruptions are decided through ``ctx.approval`` and the
        events of the next leg follow. Model text arrives as the server sends it (live) or
        at once (replayed)."""
        while True:
            async for event in self.result.stream_events():
                yield event
            if not self.result.interruptions:
                return
            self.result = Runner.run_streamed(self._start, _resumed(self._ctx, self.result),
                                              run_config=self._config, **self._options)

    @property
    def final_output(self) -> Any:
        return self.result.final_output


def run_streamed(ctx: Any, agent: Agent, input: Any, *, client: Any = None,
                 api: Api = "chat", run_config: RunConfig | None = None,
                 tracing: bool = False, **runner_options: Any) -> StreamedRun:
    """``Runner.run_streamed(agent, input, ...)`` as part of ``ctx``'s run: :func:`run`'s
    guarantees, the SDK's events yielded by :meth:`StreamedRun.stream_events`. Call it in
    an async handler (the SDK starts its run loop as an asyncio task, numbered like the
    handler's own)."""
    _check_options(runner_options)
    return StreamedRun(ctx, durable_agent(ctx, agent),
                       input, durable_run_config(ctx, run_config, client=client, api=api,
                                                 tracing=tracing), runner_options)
