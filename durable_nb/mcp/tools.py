"""An MCP server's tools as durable_nb tools: ``ctx.mcp_tools(server)``.

The tool list is a journaled step whose inputs are the list the server gives now, so a
replay offers the model what it saw, and a server whose tools changed since stops the replay
with :class:`~durable_nb.errors.InputChanged` naming the first change, as an edited prompt
does. Each tool is a :class:`~durable_nb.llm.tools.Tool` with the server's JSON schema, for
``ctx.call_tools``: every call is one journaled step named after the tool (approval first
where ``needs_approval`` matches it), and the step's id travels to the server in the
request's ``_meta`` under :data:`STEP_ID_META_KEY`, for a server that wants to apply a call
once even when it is sent again (a crash during the call).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable
from typing import Any

from ..execution import Execution
from ..llm.tools import Tool
from .connection import Server, connection
from .elicitation import ask

__all__ = ["STEP_ID_META_KEY", "NeedsApproval", "approval_test", "call_value", "mcp_tools",
           "step_id_meta"]

#: The ``_meta`` key of a tool call that carries durable_nb's step id
#: (``RUN_ID:STEP_KEY``, the same on every attempt of that step).
STEP_ID_META_KEY = "durable-nb/step-id"

#: True (every tool), a tool name or glob pattern (``"delete_*"``), or several.
NeedsApproval = bool | str | Iterable[str]

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def step_id_meta(execution: Execution) -> dict[str, str]:
    """The ``_meta`` of a call made in the step now executing."""
    return {STEP_ID_META_KEY: f"{execution.run_id}:{execution.step_key()}"}


def mcp_tools(execution: Execution, server: Server, *, needs_approval: NeedsApproval = False,
              prefix: str = "") -> list[Tool]:
    """The tools ``server`` offers, listed now and journaled (see the module docstring).

    ``needs_approval``: True for every tool, or a tool name or glob pattern (``"delete_*"``),
    or several; the matching tools ask ``ctx.approval`` before each call. ``prefix`` goes
    before every tool's name (for two servers with tools of the same name)."""
    if not isinstance(server, Server):
        raise TypeError(f"ctx.mcp_tools needs a server from durable_nb.mcp.stdio(...) or "
                        f"durable_nb.mcp.http(...), not {type(server).__name__}")
    asks = approval_test(needs_approval)
    live = connection(server).list_tools()
    # Keyed by name, so that a change reads "tools.extra was added", not "5 items instead of 4".
    described = {tool["name"]: {k: v for k, v in tool.items() if k != "name"} for tool in live}
    listed = execution.step("run", f"tools/list {server.name}", lambda: live,
                            inputs={"server": server.name, "tools": described})
    return [_tool(execution, server, described, prefix, asks) for described in listed]


def approval_test(needs_approval: NeedsApproval) -> Callable[[str], bool]:
    """Whether a tool of this name needs approval under ``needs_approval``; TypeError, before
    anything runs, for a value of another kind."""
    if isinstance(needs_approval, bool):
        return lambda name: needs_approval
    patterns = (list(needs_approval) if isinstance(needs_approval, Iterable)
                and not isinstance(needs_approval, str) else [needs_approval])
    if not all(isinstance(p, str) for p in patterns):
        raise TypeError("needs_approval takes True, a tool name or glob pattern, or a list of "
                        "them (needs_approval=['delete_*', 'send_email'])")
    return lambda name: any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _tool(execution: Execution, server: Server, described: dict[str, Any], prefix: str,
          asks: Callable[[str], bool]) -> Tool:
    remote = described["name"]
    name = _UNSAFE.sub("_", prefix + remote)[:64]
    schema = described.get("inputSchema") or {"type": "object", "properties": {}}

    def call(**arguments: Any) -> Any:
        conn = connection(server)
        result = conn.call_tool(remote, arguments, step_id_meta(execution),
                                lambda message, requested: ask(execution, server, remote,
                                                               message, requested))
        return call_value(result)

    return Tool(fn=call, name=name,
                description=described.get("description") or described.get("title") or "",
                parameters=schema, needs_approval=asks(remote))


def call_value(result: Any) -> Any:
    """What the model gets of a ``CallToolResult`` (and what is journaled): the text of its
    text blocks; the blocks as JSON data when some are not text; the structured content when
    there are no blocks. A result the server marks as an error is ``"error: TEXT"``."""
    blocks = list(result.content or [])
    texts = [b.text for b in blocks if getattr(b, "type", None) == "text"]
    if len(texts) == len(blocks) and (blocks or result.structured_content is None):
        value: Any = "\n".join(texts)
    elif blocks:
        value = [b.model_dump(mode="json", by_alias=True, exclude_none=True) for b in blocks]
    else:
        value = result.structured_content
    if result.is_error:
        return f"error: {value}"
    return value
