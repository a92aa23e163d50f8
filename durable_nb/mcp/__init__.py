"""MCP servers' tools as durable steps (``pip install "durable-nb[mcp]"``).

In a ``%%durable_agent`` cell::

    import durable_nb.mcp

    files = durable_nb.mcp.stdio("python", "files_server.py")
    tools = ctx.mcp_tools(files, needs_approval=["delete_*"])
    ...
    messages += ctx.call_tools(reply, tools)

- :func:`stdio` and :func:`http` say where a server is; its connection opens on first use and
  stays open for the kernel (``with server:`` closes it at the block's end, :func:`close`
  whenever you like).
- ``ctx.mcp_tools`` lists the server's tools as a journaled step (a replay offers the model
  what it saw; a server whose tools changed since is an
  :class:`~durable_nb.errors.InputChanged`) and returns them as tools for ``ctx.call_tools``:
  each call a journaled step, its step id sent in ``_meta`` under :data:`STEP_ID_META_KEY`.
- A server's question during a call (elicitation) is a request of the run, answered with
  :func:`answer` and journaled (:mod:`durable_nb.mcp.elicitation`). The connection speaks the
  initialize handshake unless told otherwise (``protocol=``), so that a server may ask with
  ``await ctx.elicit(...)`` as well as with the SDK's ``Elicit``/``Resolve`` form.
"""

from __future__ import annotations

from .. import integrations

integrations.require("mcp")

from .connection import ProtocolMode, Server, close, http, stdio  # noqa: E402
from .elicitation import answer, is_elicitation  # noqa: E402
from .tools import STEP_ID_META_KEY, mcp_tools  # noqa: E402

__all__ = ["STEP_ID_META_KEY", "ProtocolMode", "Server", "answer", "close", "http",
           "is_elicitation", "mcp_tools", "stdio"]
