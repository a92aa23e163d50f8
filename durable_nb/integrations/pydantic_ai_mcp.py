"""Pydantic AI's MCP toolsets (``pydantic_ai.mcp.MCPToolset``) as journaled steps of a run:
:class:`JournaledMCPToolset`, which :class:`~durable_nb.integrations.pydantic_ai.JournaledTools`
puts around every ``MCPToolset`` of the agent for a run, the way Pydantic AI's own durable
engines wrap them (tool listing and tool calls as durable operations), without changing the
agent. It gives an MCP server's tools what ``ctx.mcp_tools`` gives them in a cell:

- **The tool list is a journaled step** (``run`` step ``tools/list ID``, ID the toolset's
  ``id``, else ``mcp``), once per ``agent.run`` while the toolset caches its tools (the
  default; at every model request otherwise). Its inputs are the tool definitions the
  server gives now, keyed by name, and the model is offered the journaled ones: a replay
  offers the model what it saw, and a server whose tools changed since stops it with
  :class:`~durable_nb.errors.InputChanged` in one line (``tools.extra was added``).
- **Each call is a journaled step** (the capability's, named after the tool, its arguments
  the inputs): once, its result journaled; a call in flight at a crash is sent again on
  resume, with the same step id in the request's ``_meta`` under
  :data:`~durable_nb.mcp.tools.STEP_ID_META_KEY` (after what a ``process_tool_call`` hook
  adds), so that a server can apply it once.
- **needs_approval**: the tools whose server name matches (a name, a glob pattern, several,
  or True) are offered as Pydantic AI's ``kind="unapproved"`` tools: a call ends the
  ``agent.run`` with a deferred approval, asked through ``ctx.approval`` and answered with
  ``ToolApproved`` / ``ToolDenied`` as for a function tool with ``requires_approval=True``.
- **Elicitation**: a question the server asks during a call is asked as a request of the run
  (:func:`durable_nb.mcp.elicitation.ask`, a journaled step inside the call's step): it waits
  or parks like an approval, and a call made again after a crash or a park gets the journaled
  answer without asking anyone. durable_nb sets the toolset's client's elicitation callback
  when it connects for the run (the agent connects its toolsets at every ``agent.run``); a
  toolset entered before (``async with toolset``) keeps the callback it connected with.
  The session it opens speaks the initialize handshake (``mode="legacy"``), in which a server
  can ask with ``await ctx.elicit(...)`` too (the 2026 protocol, which fastmcp's client adopts
  by default with a server that offers it, gives a server no channel to ask on but the
  ``Elicit``/``Resolve`` form); a client that pins a version (``fastmcp.Client(transport,
  mode="2026-07-28")``, or ``"legacy"``) keeps it.
  While several calls of one server are in flight, a question the server sends outside a
  call's own request is answered ``cancel`` (nobody can tell which call asks).

A tool with an MCP Apps UI returns its mapped value only (the raw result for the app is not
kept): durable_nb calls the server through ``direct_call_tool`` to send the step id.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

from pydantic import TypeAdapter
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, WrapperToolset

from ..mcp.connection import DEFAULT_PROTOCOL
from ..mcp.elicitation import ask
from ..mcp.tools import STEP_ID_META_KEY, NeedsApproval, approval_test

__all__ = ["JournaledMCPToolset", "journaled_mcp_toolsets"]

_TOOL_DEFINITIONS = TypeAdapter(dict[str, ToolDefinition])
# The fields of a ToolDefinition that come from the server's description of the tool.
_SERVER_FIELDS = ("description", "parameters_json_schema", "return_schema", "metadata")


class _Call:
    """A call in flight: where a question the server asks during it goes (``asked``, a
    future set to ``(message, schema, reply)``), to be asked in the flow that called."""

    def __init__(self) -> None:
        self.asked: asyncio.Future = asyncio.get_running_loop().create_future()


# The call whose task runs this code (a question the 2026 protocol embeds in the call's own
# result is handled in that task).
_CALL: contextvars.ContextVar[_Call | None] = contextvars.ContextVar(
    "durable_nb_pydantic_ai_mcp_call", default=None)


class _ServerName(NamedTuple):
    """What :func:`~durable_nb.mcp.elicitation.ask` shows of the server: its name."""

    name: str


@dataclasses.dataclass
class JournaledMCPToolset(WrapperToolset[Any]):
    """An ``MCPToolset`` whose tool list and tool calls are journaled steps of ``ctx``'s run,
    its server's questions asked as the run's requests (see the module docstring).
    ``needs_approval`` takes what ``ctx.mcp_tools`` takes."""

    ctx: Any = None
    needs_approval: NeedsApproval = False
    #: Each tool's JSON schema by the server's name for it, as offered (for edited arguments).
    schemas: dict[str, dict] = dataclasses.field(default_factory=dict)
    _listed: dict[str, ToolDefinition] | None = dataclasses.field(default=None, init=False)
    _calls: list[_Call] = dataclasses.field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self._asks = approval_test(self.needs_approval)

    @property
    def journal_name(self) -> str:
        """The server's name in the journal and in its questions: the toolset's ``id``."""
        return self.wrapped.id or "mcp"

    def visit_and_replace(self, visitor: Callable[[AbstractToolset[Any]], AbstractToolset[Any]]
                          ) -> AbstractToolset[Any]:
        return self  # already journaled: a leaf to other visitors, never wrapped twice

    async def __aenter__(self) -> JournaledMCPToolset:
        if not self.wrapped.is_running:  # the session opened now asks through this run
            client = self.wrapped.client
            client.set_elicitation_callback(self._elicit)
            if client.mode == "auto":  # fastmcp's default, not a pin (see the module docstring)
                client.mode = DEFAULT_PROTOCOL
        await self.wrapped.__aenter__()
        return self

    # -- the tool list ----------------------------------------------------------------------

    async def get_tools(self, ctx: Any) -> dict[str, Any]:
        if self._listed is None or not self.wrapped.cache_tools:
            self._listed = await self._journaled_list(ctx)
        tools = {}
        for name, definition in self._listed.items():
            self.schemas[name] = definition.parameters_json_schema
            if self._asks(name):
                definition = dataclasses.replace(definition, kind="unapproved")
            tools[name] = self.wrapped.tool_for_tool_def(definition, ctx=ctx)
        return tools

    async def _journaled_list(self, ctx: Any) -> dict[str, ToolDefinition]:
        live = {name: tool.tool_def for name, tool in (await self.wrapped.get_tools(ctx)).items()}
        dumped = _TOOL_DEFINITIONS.dump_python(live, mode="json", exclude_none=True)
        # What the server said of each tool (not the fields Pydantic AI adds, which another
        # version of it may add otherwise), keyed by name, so that a change reads
        # "tools.extra was added".
        described = {name: {k: d[k] for k in _SERVER_FIELDS if k in d}
                     for name, d in dumped.items()}

        async def listed() -> dict[str, Any]:
            return dumped

        journaled = await self.ctx._ex.step_async(
            "run", f"tools/list {self.journal_name}", listed,
            inputs={"server": self.journal_name, "tools": described})
        return _TOOL_DEFINITIONS.validate_python(journaled)

    # -- calls ------------------------------------------------------------------------------

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: Any, tool: Any) -> Any:
        """Call ``name`` on the server (inside the capability's step for this call), the step
        id in ``_meta``; a question the server asks meanwhile is asked in this flow, as a
        step of this call. A question that parks or stops the run cancels the call first
        (the server is told so), so that the tool never goes on with an answer nobody gave."""
        server = self.wrapped
        step_meta = {STEP_ID_META_KEY: self.ctx.step_id}
        use_task = bool((tool.tool_def.metadata or {}).get("task"))

        async def send(tool_name: str, args: dict[str, Any], *,
                       metadata: dict[str, Any] | None = None) -> Any:
            return await server.direct_call_tool(tool_name, args, use_task=use_task,
                                                 metadata={**(metadata or {}), **step_meta})

        async def sending() -> Any:
            if server.process_tool_call is not None:
                return await server.process_tool_call(ctx, send, name, tool_args)
            return await send(name, tool_args)

        call = _Call()
        token = _CALL.set(call)
        try:
            # A task of its own, so that this flow can ask the server's questions meanwhile.
            sent = asyncio.ensure_future(sending())
        finally:
            _CALL.reset(token)
        self._calls.append(call)
        reply: asyncio.Future | None = None
        try:
            while True:
                await asyncio.wait({sent, call.asked}, return_when=asyncio.FIRST_COMPLETED)
                if not call.asked.done():
                    return sent.result()
                message, schema, reply = call.asked.result()
                call.asked = asyncio.get_running_loop().create_future()
                reply.set_result(ask(self.ctx._ex, _ServerName(self.journal_name), name,
                                     message, schema))
        except BaseException:
            sent.cancel()
            await asyncio.gather(sent, return_exceptions=True)
            if call.asked.done():  # a question not taken yet
                reply = call.asked.result()[2]
            if reply is not None and not reply.done():  # asked outside the call: told now
                reply.set_result(("cancel", None))
            raise
        finally:
            self._calls.remove(call)

    async def _elicit(self, message: str, response_type: Any, params: Any,
                      context: Any) -> Any:
        """The client's elicitation callback: the question handed to the flow of the call it
        belongs to (see the module docstring), the answer given back to the server."""
        from fastmcp.client.elicitation import ElicitResult

        call = _CALL.get()
        if call is None and len(self._calls) == 1:
            call = self._calls[0]  # sent by the server outside the call's own request
        if call is None or getattr(params, "mode", "form") != "form" or call.asked.done():
            return ElicitResult(action="cancel")  # nobody to ask, or a URL to open
        reply: asyncio.Future = asyncio.get_running_loop().create_future()
        call.asked.set_result((message, dict(getattr(params, "requested_schema", None) or {}),
                               reply))
        action, content = await reply
        return ElicitResult(action=action, content=content)


def journaled_mcp_toolsets(toolset: AbstractToolset[Any], ctx: Any,
                           needs_approval: NeedsApproval,
                           schemas: dict[str, dict]) -> AbstractToolset[Any]:
    """``toolset`` (an agent's assembled toolset) with every ``MCPToolset`` in it journaled
    (:class:`JournaledMCPToolset`); ``schemas`` collects their tools' schemas."""
    from pydantic_ai.mcp import MCPToolset

    def journaled(leaf: AbstractToolset[Any]) -> AbstractToolset[Any]:
        if isinstance(leaf, MCPToolset):
            return JournaledMCPToolset(leaf, ctx=ctx, needs_approval=needs_approval,
                                       schemas=schemas)
        return leaf

    return toolset.visit_and_replace(journaled)
