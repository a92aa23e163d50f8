"""An MCP server for the tests, written with the official ``mcp`` SDK.

    python tests/mcp_server.py COUNT_DIR stdio
    python tests/mcp_server.py COUNT_DIR http PORT

Its tools write a file in COUNT_DIR per call (named by tool, arguments and the step id
durable_nb passed in ``_meta``), so a test counts the calls that reached it:

- ``count(label)``: one file per call, returns the number of calls with that label so far;
- ``delete_rows(table)``: the same, a tool the tests put behind an approval;
- ``slow(label)``: writes its file, then waits for a file ``release`` in COUNT_DIR (the test
  kills the kernel while it waits);
- ``exit_once()``: offered only when $MCP_TEST_EXIT_TOOL is set; its first call ends the
  server's process during the call;
- ``extra(label)``: offered only when $MCP_TEST_EXTRA_TOOL is set (a server whose tools
  changed);
- ``book(city)``: asks the user for the number of nights (elicitation), writes the answer;
  then, while a file ``hold`` is in COUNT_DIR, waits for ``release``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, Field

from mcp.server.mcpserver import Context, Elicit, ElicitationResult, MCPServer, Resolve

COUNT_DIR = Path(sys.argv[1])
STEP_ID_KEY = "durable-nb/step-id"
server = MCPServer("durable-nb-tests")


def _record(tool: str, ctx: Context, **fields: object) -> int:
    meta = ctx.request_context.meta or {}
    step_id = meta.get(STEP_ID_KEY) if isinstance(meta, dict) else getattr(meta, STEP_ID_KEY, None)
    record = {"tool": tool, "step_id": step_id, **fields}
    (COUNT_DIR / f"{tool}-{uuid.uuid4().hex}.json").write_text(json.dumps(record))
    return len(list(COUNT_DIR.glob(f"{tool}-*.json")))


@server.tool()
def count(label: str, ctx: Context) -> str:
    """Count one call with this label."""
    calls = _record("count", ctx, label=label)
    return f"{label}: call {calls}"


@server.tool()
def delete_rows(table: str, ctx: Context) -> str:
    """Delete every row of a table."""
    _record("delete_rows", ctx, table=table)
    return f"deleted the rows of {table}"


def _wait_while_held() -> None:
    while (COUNT_DIR / "hold").exists() and not (COUNT_DIR / "release").exists():
        time.sleep(0.05)


@server.tool()
async def slow(label: str, ctx: Context) -> str:
    """Start, then finish when released."""
    _record("slow", ctx, label=label)
    while not (COUNT_DIR / "release").exists():
        await asyncio.sleep(0.05)
    return f"{label}: done"


class Nights(BaseModel):
    nights: int = Field(description="How many nights")


def ask_nights(city: str) -> Elicit[Nights]:
    return Elicit(f"How many nights in {city}?", Nights)


@server.tool()
def book(city: str, answer: Annotated[ElicitationResult[Nights], Resolve(ask_nights)],
         ctx: Context) -> str:
    """Book a hotel, asking the user how many nights."""
    _record("book", ctx, city=city, action=answer.action,
            nights=answer.data.nights if answer.action == "accept" else None)
    _wait_while_held()
    if answer.action != "accept":
        return f"not booked ({answer.action})"
    return f"booked {answer.data.nights} nights in {city}"


if os.environ.get("MCP_TEST_EXIT_TOOL"):
    @server.tool()
    def exit_once(ctx: Context) -> str:
        """The first call ends the server's process mid-call; later calls answer."""
        calls = _record("exit_once", ctx)
        if calls == 1:
            os._exit(1)
        return "answered"


if os.environ.get("MCP_TEST_EXTRA_TOOL"):
    @server.tool()
    def extra(label: str) -> str:
        """A tool that only some versions of the server have."""
        return label


if __name__ == "__main__":
    if sys.argv[2] == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[3]))
