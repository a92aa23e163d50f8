"""An MCP server whose tool asks the way most servers ask, ``await ctx.elicit(message,
Model)``, written once for three server libraries:

    python tests/mcp_elicit_server.py SDK COUNT_DIR stdio
    python tests/mcp_elicit_server.py SDK COUNT_DIR http PORT

SDK is ``mcp2`` (the ``mcp`` SDK 2.x, ``MCPServer``), ``mcp1`` (the ``mcp`` SDK 1.x,
``mcp.server.fastmcp.FastMCP``, run with a Python that has ``mcp<2``) or ``fastmcp`` (the
``fastmcp`` package's ``FastMCP``). Its one tool, ``book(city)``, writes a file in COUNT_DIR
when it asks (``asked-*.json``) and one when it has the answer (``book-*.json``, with the
step id durable_nb sent in ``_meta``), so a test counts what reached the server.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

SDK, COUNT_DIR, TRANSPORT = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
PORT = int(sys.argv[4]) if TRANSPORT == "http" else 0
STEP_ID_KEY = "durable-nb/step-id"

if SDK == "mcp2":
    from mcp.server.mcpserver import Context, MCPServer

    server: Any = MCPServer("elicit-tests")
elif SDK == "mcp1":
    from mcp.server.fastmcp import Context, FastMCP

    server = FastMCP("elicit-tests", host="127.0.0.1", port=PORT or 8000)
else:
    from fastmcp import Context, FastMCP

    server = FastMCP("elicit-tests")


class Nights(BaseModel):
    nights: int = Field(description="How many nights")


def _step_id(ctx: Any) -> str | None:
    meta = ctx.request_context.meta
    if isinstance(meta, dict):
        return meta.get(STEP_ID_KEY)
    return ((getattr(meta, "model_extra", None) or {}).get(STEP_ID_KEY)
            or getattr(meta, STEP_ID_KEY, None))


def _record(kind: str, **fields: object) -> None:
    (COUNT_DIR / f"{kind}-{uuid.uuid4().hex}.json").write_text(json.dumps(fields))


@server.tool()
async def book(city: str, ctx: Context) -> str:
    """Book a hotel, asking the user how many nights."""
    _record("asked", city=city)
    answer = await ctx.elicit(f"How many nights in {city}?", Nights)
    nights = answer.data.nights if answer.action == "accept" else None
    _record("book", city=city, action=answer.action, nights=nights, step_id=_step_id(ctx))
    if answer.action != "accept":
        return f"not booked ({answer.action})"
    return f"booked {nights} nights in {city}"


if __name__ == "__main__":
    if SDK == "mcp2":
        server.run("stdio") if TRANSPORT == "stdio" else server.run(
            "streamable-http", host="127.0.0.1", port=PORT)
    elif SDK == "mcp1":
        server.run("stdio" if TRANSPORT == "stdio" else "streamable-http")
    else:
        server.run("stdio", show_banner=False) if TRANSPORT == "stdio" else server.run(
            "http", host="127.0.0.1", port=PORT, show_banner=False)
