"""An MCP tool call through durable_nb against the same call bare.

``python -m benchmarks.mcp_call [--calls N] [--transport stdio|http] [--protocol MODE]``:
starts a one-line MCP server (``echo``, written with the ``mcp`` SDK) and calls its tool N
times three ways, interleaved call by call, each speaking the protocol ``MODE`` (the
``protocol=`` of ``durable_nb.mcp.stdio``; its default, the handshake, unless told):

- **bare**: ``await ClientSession.call_tool`` on an open ``mcp.Client`` (a connection of its
  own to another process of the same server), timed inside its event loop;
- **connection**: durable_nb's connection from a synchronous caller (the call handed to the
  connection's own loop and thread, as every ``ctx.call_tools`` call is);
- **durable**: ``ctx.call_tools`` in a run with a disk journal: argument checks against the
  schema, the step id in ``_meta``, the connection, the journaled step.

It prints the median and 90th percentile of each, and the median overhead of the durable call
over the bare one (the target: at most 0.5 ms). Not a test: the figures depend on the
machine's load, and are reported, not asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import durable_nb as dn
import durable_nb.mcp as dmcp
from durable_nb.mcp.connection import connection

ECHO_SERVER = '''
import sys
from mcp.server.mcpserver import MCPServer
server = MCPServer("echo")

@server.tool()
def echo(text: str) -> str:
    """Return the text."""
    return text

if sys.argv[1] == "stdio":
    server.run("stdio")
else:
    server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
'''


async def _wait_for(future: asyncio.Future) -> None:
    await future


class BareClient:
    """``mcp.Client`` on an event loop of its own thread; :meth:`timed_call` times one
    ``await ClientSession.call_tool`` inside that loop (no thread hop counted)."""

    def __init__(self, server: dmcp.Server) -> None:
        from mcp import Client
        from mcp.client.stdio import StdioServerParameters

        target = (server.url if server.url else
                  StdioServerParameters(command=server.command or "", args=list(server.args)))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.client = Client(target, mode=server.protocol)
        ready: asyncio.Future = self.loop.create_future()
        self.done = asyncio.Event()

        async def hold() -> None:  # the client is entered and left in this one task
            async with self.client:
                ready.set_result(None)
                await self.done.wait()

        self.holder = asyncio.run_coroutine_threadsafe(hold(), self.loop)
        self._submit(_wait_for(ready))

    def _submit(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(60)

    def timed_call(self, text: str) -> float:
        async def call() -> float:
            started = time.perf_counter()
            await self.client.session.call_tool("echo", {"text": text})
            return time.perf_counter() - started

        return self._submit(call())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.done.set)
        self.holder.result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def measure(server: dmcp.Server, calls: int) -> dict[str, list[float]]:
    """Seconds per call of each way, the three interleaved call by call (so that the load of
    a shared machine falls on all three alike)."""
    journal = dn.open_journal(tempfile.mkdtemp(prefix="dnb-mcp-bench-"))
    figures: dict[str, list[float]] = {"bare": [], "connection": [], "durable": []}
    bare = BareClient(server)

    def agent(ctx: Any) -> None:
        tools = ctx.mcp_tools(server)
        conn = connection(server)
        for i in range(calls):
            figures["bare"].append(bare.timed_call(str(i)))
            started = time.perf_counter()
            conn.call_tool("echo", {"text": str(i)}, {}, lambda message, schema: ("cancel", None))
            figures["connection"].append(time.perf_counter() - started)
            message = {"role": "assistant", "tool_calls": [
                {"id": f"c{i}", "type": "function",
                 "function": {"name": "echo", "arguments": json.dumps({"text": str(i)})}}]}
            started = time.perf_counter()
            ctx.call_tools(message, tools)
            figures["durable"].append(time.perf_counter() - started)

    try:
        dn.execute("mcp-bench", agent, journal=journal)
    finally:
        bare.close()
    return figures


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _summary(name: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds[len(seconds) // 10:])  # the first tenth warms up
    p90 = ms[int(len(ms) * 0.9)]
    return f"{name:<11} median {statistics.median(ms):6.3f} ms   p90 {p90:6.3f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    parser.add_argument("--protocol", choices=("legacy", "auto", "2026-07-28"),
                        default="legacy")
    args = parser.parse_args()
    script = Path(tempfile.mkdtemp(prefix="dnb-mcp-echo-")) / "echo_server.py"
    script.write_text(ECHO_SERVER)
    process = None
    if args.transport == "stdio":
        server = dmcp.stdio(sys.executable, str(script), "stdio", name="echo",
                            protocol=args.protocol)
    else:
        port = _free_port()
        process = subprocess.Popen([sys.executable, str(script), "http", str(port)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        server = dmcp.http(f"http://127.0.0.1:{port}/mcp", name="echo", protocol=args.protocol)
    try:
        figures = measure(server, args.calls)
    finally:
        dmcp.close()
        if process is not None:
            process.terminate()
            process.wait(10)
    print(f"{args.calls} calls of a one-line MCP tool over {args.transport}, protocol "
          f"{args.protocol}:")
    for name, seconds in figures.items():
        print(_summary(name, seconds))
    medians = {k: statistics.median(v[len(v) // 10:]) * 1000 for k, v in figures.items()}
    print(f"durable_nb over bare: {medians['durable'] - medians['bare']:+.3f} ms per call "
          f"(the connection's thread hop: {medians['connection'] - medians['bare']:+.3f} ms)")


if __name__ == "__main__":
    main()
