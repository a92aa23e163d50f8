"""A Pydantic AI agent run in a real child process, for the crash tests of
:mod:`durable_nb.integrations.pydantic_ai` (started, killed and read with
:mod:`tests.agent_process`): the travel agent of :mod:`tests.openai_agents_process` written
for Pydantic AI, answering the same :func:`~tests.openai_agents_process.script`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tests.agent_process import _run_child
from tests.openai_agents_process import MODEL, _KillAfterTool


def travel_agent(workdir: Path, *, finish_last: str | None = None, model: Any = None) -> Any:
    """Tools ``find_flight`` and ``book_flight`` append to ``effects.log``; ``charge_card``
    needs approval. With ``finish_last``, a ``find_flight`` for that city, called in parallel
    with another, waits until the other finished (5 s at most, for a call alone). ``model``:
    the agent's own (a Pydantic AI model), else none."""
    import asyncio

    from pydantic_ai import Agent

    # Without model=, no model: the run's model= names it (and no API key is needed to build
    # the agent).
    agent = Agent(model, instructions="Book the trip.", name="travel")

    def effect(line: str) -> None:
        with open(workdir / "effects.log", "a") as f:
            f.write(line + "\n")

    others_done: dict[Any, asyncio.Event] = {}  # per event loop: each run has its own

    @agent.tool_plain
    async def find_flight(city: str) -> str:
        """Find a flight to a city."""
        done = others_done.setdefault(asyncio.get_running_loop(), asyncio.Event())
        if city == finish_last:
            try:
                await asyncio.wait_for(done.wait(), 5)
            except asyncio.TimeoutError:
                pass
        effect(f"find {city}")
        if city != finish_last:
            done.set()
        return f"SK123 to {city}"

    @agent.tool_plain
    async def book_flight(flight: str) -> str:
        """Book a flight."""
        effect(f"book {flight}")
        return f"booked {flight}"

    @agent.tool_plain(requires_approval=True)
    async def charge_card(amount: int) -> str:
        """Charge the card."""
        effect(f"charge {amount}")
        return f"charged {amount}"

    return agent


def pydantic_child(journal_dir: str, url: str, workdir: str, run_id: str,
                   kill_after: str | None) -> None:
    """Process target: run the travel agent as ``run_id``; SIGKILL after the journal write
    of tool ``kill_after`` (once)."""
    import openai

    from durable_nb.integrations.pydantic_ai import run
    from durable_nb.runner import RunOptions, Runner

    root = Path(workdir)
    agent = travel_agent(root)

    async def handler(ctx: Any) -> Any:
        return (await run(ctx, agent, "Book me a flight to Oslo.")).output

    client = openai.AsyncOpenAI(base_url=url, api_key="offline", max_retries=0)
    runner = Runner(run_id, handler, journal=journal_dir,
                    observer=_KillAfterTool(root, kill_after),
                    options=RunOptions(client=client, model=MODEL, poll_interval=0.05))
    _run_child(workdir, lambda: runner.run().result)


def anthropic_model(url: str) -> Any:
    """Pydantic AI's real ``AnthropicModel`` over the real ``anthropic`` client, sending to
    the Messages API at ``url`` (the loopback server's ``/v1`` URL, or a real server's);
    the client's own retries off, so each request the server counts is one the run sent."""
    import anthropic
    from pydantic_ai.models.anthropic import AnthropicModel
    from pydantic_ai.providers.anthropic import AnthropicProvider

    client = anthropic.AsyncAnthropic(base_url=url.removesuffix("/v1"), api_key="offline",
                                      max_retries=0)
    return AnthropicModel("claude-sonnet-4-5",
                          provider=AnthropicProvider(anthropic_client=client))


def anthropic_child(journal_dir: str, url: str, workdir: str, run_id: str,
                    kill_after: str | None) -> None:
    """Process target: :func:`pydantic_child` with Pydantic AI's ``AnthropicModel`` (every
    request a ``model`` step) instead of the run's OpenAI client."""
    from durable_nb.integrations.pydantic_ai import run
    from durable_nb.runner import RunOptions, Runner

    root = Path(workdir)
    agent = travel_agent(root, model=anthropic_model(url))

    async def handler(ctx: Any) -> Any:
        return (await run(ctx, agent, "Book me a flight to Oslo.")).output

    runner = Runner(run_id, handler, journal=journal_dir,
                    observer=_KillAfterTool(root, kill_after),
                    options=RunOptions(poll_interval=0.05))
    _run_child(workdir, lambda: runner.run().result)


MCP_SERVER = Path(__file__).with_name("mcp_server.py")


def mcp_toolset(count_dir: Path, url: str | None = None, *, mode: str | None = None,
                **env: str) -> Any:
    """Pydantic AI's ``MCPToolset`` (id ``tests``) for the tests' MCP server
    (tests/mcp_server.py) over stdio, or at the streamable-HTTP ``url``. ``mode``: the
    protocol its fastmcp client pins (``"2026-07-28"``: a server's question then comes inside
    the call's result, not as a request of its own)."""
    import sys

    from fastmcp import Client
    from fastmcp.client.transports import StdioTransport
    from pydantic_ai.mcp import MCPToolset

    if url is not None:
        return MCPToolset(url, id="tests")
    transport = StdioTransport(command=sys.executable,
                               args=[str(MCP_SERVER), str(count_dir), "stdio"],
                               env={**os.environ, **env} if env else None)
    if mode is not None:
        return MCPToolset(Client(transport, mode=mode), id="tests")
    return MCPToolset(transport, id="tests")


def mcp_child(journal_dir: str, url: str, workdir: str, run_id: str,
              kill_after: str | None) -> None:
    """Process target: a Pydantic AI agent whose tools are the tests' MCP server's (stdio,
    calls recorded in ``workdir/calls``), run as ``run_id``; SIGKILL after the journal write
    of the first live step named ``kill_after`` (once)."""
    import openai
    from pydantic_ai import Agent

    from durable_nb.integrations.pydantic_ai import run
    from durable_nb.runner import RunOptions, Runner

    root = Path(workdir)
    agent = Agent(name="ops", toolsets=[mcp_toolset(root / "calls")])

    async def handler(ctx: Any) -> Any:
        return (await run(ctx, agent, "Count.")).output

    client = openai.AsyncOpenAI(base_url=url, api_key="offline", max_retries=0)
    runner = Runner(run_id, handler, journal=journal_dir,
                    observer=_KillAfterTool(root, kill_after),
                    options=RunOptions(client=client, model=MODEL, poll_interval=0.05))
    _run_child(workdir, lambda: runner.run().result)
