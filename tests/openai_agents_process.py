"""An OpenAI Agents SDK agent run in a real child process, for the crash tests of
:mod:`durable_nb.integrations.openai_agents` (started, killed and read with
:mod:`tests.agent_process`).

The travel agent has two function tools, ``find_flight`` and ``book_flight``, each appending
a line to ``effects.log`` in the work directory (and ``PID STEP_KEY`` to ``steps.log``), and a
third, ``charge_card``, that needs approval. :func:`script` is what the loopback server answers: find, book, then the final
text (three rounds); :func:`parallel_script` asks for two flights in one round.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from durable_nb.testing import Reply, ToolCall

from tests.agent_process import _run_child, kill_once

MODEL = "loopback-1"
FINAL = "Booked SK123 to Oslo."


def script() -> list[Reply]:
    return [Reply(tool_calls=[ToolCall("find_flight", {"city": "Oslo"})]),
            Reply(tool_calls=[ToolCall("book_flight", {"flight": "SK123"})]),
            Reply(content=FINAL)]


def parallel_script() -> list[Reply]:
    """One round with two calls of ``find_flight``: Oslo (slow) before Rome (fast)."""
    return [Reply(tool_calls=[ToolCall("find_flight", {"city": "Oslo"}),
                              ToolCall("find_flight", {"city": "Rome"})]),
            Reply(content=FINAL)]


def effects(workdir: Path) -> list[str]:
    log = workdir / "effects.log"
    return log.read_text().splitlines() if log.exists() else []


def travel_agent(workdir: Path, *, slow: dict[str, float] | None = None) -> Any:
    """The agent; ``slow`` maps a city to seconds ``find_flight`` waits for it (to make
    parallel calls finish out of call order)."""
    import asyncio

    from agents import Agent, function_tool

    from durable_nb.context import current_context

    def effect(line: str) -> None:
        with open(workdir / "effects.log", "a") as f:
            f.write(line + "\n")
        with open(workdir / "steps.log", "a") as f:  # which process ran which step
            f.write(f"{os.getpid()} {current_context().step_id.split(':', 1)[1]}\n")

    @function_tool
    async def find_flight(city: str) -> str:
        """Find a flight to a city."""
        await asyncio.sleep((slow or {}).get(city, 0.0))
        effect(f"find {city}")
        return f"SK123 to {city}"

    # Async tools: the SDK runs a sync one on a thread of its own, where ctx (which the
    # steps log reads) is not available.
    @function_tool
    async def book_flight(flight: str) -> str:
        """Book a flight."""
        effect(f"book {flight}")
        return f"booked {flight}"

    @function_tool(needs_approval=True)
    async def charge_card(amount: int) -> str:
        """Charge the card."""
        effect(f"charge {amount}")
        return f"charged {amount}"

    return Agent(name="travel", instructions="Book the trip.", model=MODEL,
                 tools=[find_flight, book_flight, charge_card])


class _KillAfterTool:
    """Observer: SIGKILL right after the journal write of the first live step named
    ``tool``."""

    def __init__(self, workdir: Path, tool: str | None) -> None:
        self.workdir = workdir
        self.tool = tool

    def on_step(self, entry: Any, replayed: bool) -> None:
        if self.tool and not replayed and entry.name == self.tool:
            kill_once(self.workdir / f"killed-after-{self.tool}")

    def on_record(self, record: Any) -> None:
        pass


def agents_child(journal_dir: str, url: str, workdir: str, run_id: str,
                 kill_after: str | None, slow: dict[str, float] | None,
                 streamed: bool = False) -> None:
    """Process target: run the travel agent as ``run_id`` (with ``Runner.run_streamed``
    when ``streamed``, its text deltas appended to ``deltas.log``, one a line); SIGKILL after the journal
    write of tool ``kill_after`` (once)."""
    import openai

    from durable_nb.integrations.openai_agents import run, run_streamed
    from durable_nb.runner import RunOptions, Runner

    root = Path(workdir)
    agent = travel_agent(root, slow=slow)

    async def handler(ctx: Any) -> Any:
        if not streamed:
            return (await run(ctx, agent, "Book me a flight to Oslo.")).final_output
        stream = run_streamed(ctx, agent, "Book me a flight to Oslo.")
        async for event in stream.stream_events():
            data = getattr(event, "data", None)
            if getattr(data, "type", None) == "response.output_text.delta":
                with open(root / "deltas.log", "a") as f:
                    f.write(data.delta + "\n")
        return stream.final_output

    client = openai.AsyncOpenAI(base_url=url, api_key="offline", max_retries=0)
    runner = Runner(run_id, handler, journal=journal_dir,
                    observer=_KillAfterTool(root, kill_after),
                    options=RunOptions(client=client, poll_interval=0.05))
    _run_child(workdir, lambda: runner.run().result)
