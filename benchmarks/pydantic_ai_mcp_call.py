"""An MCP tool call through durable_nb's Pydantic AI MCP toolset against the same call bare.

``python -m benchmarks.pydantic_ai_mcp_call [--calls N]``: starts the tests' MCP server
(``tests/mcp_server.py``, over stdio) behind one Pydantic AI ``MCPToolset`` and calls its
``count`` tool N times two ways, interleaved call by call, in one run with a disk journal:

- **bare**: ``await MCPToolset.direct_call_tool`` (Pydantic AI's own call, no durable_nb);
- **durable**: the call as an agent's tool call makes it under
  :func:`durable_nb.integrations.pydantic_ai.run`: a journaled step (``ctx.run_async``,
  named after the tool, the arguments its inputs, as ``JournaledTools`` runs it) around
  :meth:`JournaledMCPToolset.call_tool <durable_nb.integrations.pydantic_ai_mcp.
  JournaledMCPToolset.call_tool>` (the step id in ``_meta``, a task of its own so that a
  question the server asks meanwhile can be asked in the run).

Both go through the same toolset, so the same connection and the same server process (whose
``count`` writes a file per call and counts the files: its time grows with N, alike for both
ways). It prints the median and 90th percentile of each and the median overhead of the
durable call over the bare one (the target: at most 0.5 ms). Not a test: the figures depend on the
machine's load, and are reported, not asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import durable_nb as dn
from durable_nb.integrations.pydantic_ai_mcp import JournaledMCPToolset

MCP_SERVER = Path(__file__).resolve().parent.parent / "tests" / "mcp_server.py"


def _toolset(count_dir: str) -> Any:
    from fastmcp.client.transports import StdioTransport
    from pydantic_ai.mcp import MCPToolset

    return MCPToolset(StdioTransport(command=sys.executable,
                                     args=[str(MCP_SERVER), count_dir, "stdio"]), id="tests")


def _run_context() -> Any:
    """What Pydantic AI passes a toolset during ``agent.run`` (the fields a call reads)."""
    from pydantic_ai import RunContext
    from pydantic_ai.models.test import TestModel
    from pydantic_ai.usage import RunUsage

    return RunContext(deps=None, model=TestModel(), usage=RunUsage())


def measure(calls: int, workdir: Path) -> dict[str, list[float]]:
    """Seconds per call of each way, the two interleaved call by call (so that the load of
    a shared machine falls on both alike); the journal and the server's files in
    ``workdir``."""
    journal = dn.open_journal(workdir / "journal")
    count_dir = str(workdir / "calls")
    Path(count_dir).mkdir()
    figures: dict[str, list[float]] = {"bare": [], "durable": []}

    async def calls_of(ctx: Any) -> None:
        toolset = _toolset(count_dir)
        journaled = JournaledMCPToolset(toolset, ctx=ctx)
        run_context = _run_context()
        async with journaled:
            tool = (await journaled.get_tools(run_context))["count"]
            for i in range(calls):
                args = {"label": f"bare {i}"}
                started = time.perf_counter()
                await toolset.direct_call_tool("count", args)
                figures["bare"].append(time.perf_counter() - started)

                async def execute(arguments: dict) -> Any:
                    return await journaled.call_tool("count", arguments, run_context, tool)

                started = time.perf_counter()
                await ctx.run_async("count", execute, {"label": f"durable {i}"})
                figures["durable"].append(time.perf_counter() - started)

    dn.execute("pydantic-ai-mcp-bench", calls_of, journal=journal)  # an async handler
    return figures


def _summary(name: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds[len(seconds) // 10:])  # the first tenth warms up
    p90 = ms[int(len(ms) * 0.9)]
    return f"{name:<8} median {statistics.median(ms):6.3f} ms   p90 {p90:6.3f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dnb-pai-mcp-bench-") as workdir:
        figures = measure(args.calls, Path(workdir))
    print(f"{args.calls} calls of tests/mcp_server.py's count tool over stdio, "
          f"through a Pydantic AI MCPToolset:")
    for name, seconds in figures.items():
        print(_summary(name, seconds))
    medians = {k: statistics.median(v[len(v) // 10:]) * 1000 for k, v in figures.items()}
    print(f"durable_nb over bare: {medians['durable'] - medians['bare']:+.3f} ms per call "
          f"(target: at most +0.500 ms)")


if __name__ == "__main__":
    main()
