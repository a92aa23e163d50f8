"""The durable openai client's cost per call: ``python -m benchmarks.durable_client [N]``.

Side by side on the loopback server (one process, a disk journal in a temporary directory),
each call non-streamed, the median of N calls (default 300) after 20 warm-up calls:

- ``bare``: ``await client.chat.completions.create(...)`` on an ``openai.AsyncOpenAI``;
- ``durable``: the same through ``ctx.async_openai`` in a run (a journaled chat step),
  and ``ctx.chat_async`` (the step it is), alternating call by call with ``bare`` on the
  same event loop (each durable call is a new step: a new question);
- with ``openai-agents`` installed, ``Runner.run`` of a one-tool, two-round agent bare and
  through :func:`durable_nb.integrations.openai_agents.run` in ``durable_nb.execute`` (and an
  empty ``execute``, the cost of a run itself); with ``pydantic-ai`` installed, the same
  agent written for Pydantic AI, bare and through
  :func:`durable_nb.integrations.pydantic_ai.run`.

Prints one line per measure; the overhead is durable minus bare, in time and in CPU time of
the calling thread (which a loaded machine's waits for a core do not inflate).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from typing import Any

import openai

import durable_nb
from durable_nb.testing import LoopbackServer, Reply, ToolCall

MODEL = "loopback-1"
WARMUP = 20


def _messages(i: int) -> list[dict]:
    return [{"role": "user", "content": f"question {i}"}]


def _chat_calls(url: str, n: int, journal: str) -> dict[str, list[tuple[float, float]]]:
    """(seconds, CPU seconds of the calling thread) per call of bare, the durable client
    and ctx.chat_async, alternating call by call on one event loop. The CPU time leaves out
    the server (another thread) and the waits for a core on a loaded machine."""
    calls: dict[str, list[tuple[float, float]]] = {"bare": [], "durable": [], "chat": []}

    async def handler(ctx: Any) -> None:
        client = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0)
        through = ctx.async_openai
        for i in range(WARMUP + n):
            for send, times in ((client.chat.completions.create, calls["bare"]),
                                (through.chat.completions.create, calls["durable"]),
                                (ctx.chat_async, calls["chat"])):
                started, cpu = time.perf_counter(), time.thread_time()
                await send(model=MODEL, messages=_messages(i))
                times.append((time.perf_counter() - started, time.thread_time() - cpu))
        await client.close()

    client = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0)
    durable_nb.execute("bench-client", handler, journal=journal, client=client,
                       verify_replay=False)
    return {name: times[WARMUP:] for name, times in calls.items()}


async def _nothing(ctx: Any) -> None:
    return None


def _agent_runs(url: str, n: int, journal: str
                ) -> tuple[list[float], list[float], list[float]]:
    """(bare Runner.run, durable run with execute(), execute() of an empty async handler)
    seconds."""
    from agents import Agent, RunConfig, Runner, function_tool, set_tracing_disabled
    from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel

    from durable_nb.integrations.openai_agents import run

    @function_tool
    def lookup(city: str) -> str:
        """Look a city up."""
        return f"{city} is sunny"

    agent = Agent(name="bench", model=MODEL, tools=[lookup])
    set_tracing_disabled(True)
    bare_times: list[float] = []
    durable_times: list[float] = []
    empty_times: list[float] = []

    async def bare(client: Any, i: int) -> None:
        model = OpenAIChatCompletionsModel(MODEL, client)
        await Runner.run(agent.clone(model=model), f"weather {i}",
                         run_config=RunConfig(tracing_disabled=True))

    # Each run on a new event loop with a new client, as each durable run has.
    for i in range(n):
        client = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0)
        started = time.perf_counter()
        asyncio.run(bare(client, i))
        bare_times.append(time.perf_counter() - started)
    for i in range(n):
        started = time.perf_counter()
        durable_nb.execute(f"bench-empty-{i}", _nothing, journal=journal, verify_replay=False)
        empty_times.append(time.perf_counter() - started)
    for i in range(n):
        client = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0)

        async def handler(ctx: Any, i: int = i) -> None:
            await run(ctx, agent, f"weather {i}")

        started = time.perf_counter()
        durable_nb.execute(f"bench-agent-{i}", handler, journal=journal, client=client,
                           verify_replay=False)
        durable_times.append(time.perf_counter() - started)
    return bare_times, durable_times, empty_times


def _pydantic_ai_runs(url: str, n: int, journal: str) -> tuple[list[float], list[float]]:
    """(bare ``agent.run``, the same through durable_nb.integrations.pydantic_ai.run in
    durable_nb.execute) seconds, each run on a new event loop with a new client."""
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from durable_nb.integrations.pydantic_ai import run

    agent = Agent(name="bench")

    @agent.tool_plain
    def lookup(city: str) -> str:
        """Look a city up."""
        return f"{city} is sunny"

    bare_times: list[float] = []
    durable_times: list[float] = []
    for i in range(n):
        client = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0)
        model = OpenAIChatModel(MODEL, provider=OpenAIProvider(openai_client=client))
        started = time.perf_counter()
        asyncio.run(agent.run(f"weather {i}", model=model))
        bare_times.append(time.perf_counter() - started)
    for i in range(n):
        client = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0)

        async def handler(ctx: Any, i: int = i) -> None:
            await run(ctx, agent, f"weather {i}")

        started = time.perf_counter()
        durable_nb.execute(f"bench-pydantic-{i}", handler, journal=journal, client=client,
                           model=MODEL, verify_replay=False)
        durable_times.append(time.perf_counter() - started)
    return bare_times, durable_times


def _ms(times: list[float]) -> float:
    return statistics.median(times) * 1000


def main(argv: list[str]) -> None:
    n = int(argv[0]) if argv else 300
    script = [Reply(tool_calls=[ToolCall("lookup", {"city": "Oslo"})]), "Sunny in Oslo."]
    with LoopbackServer(["fine"]) as server, tempfile.TemporaryDirectory() as tmp:
        calls = _chat_calls(server.url, n, f"{tmp}/journal")
        wall = {name: _ms([t for t, _ in times]) for name, times in calls.items()}
        cpu = {name: _ms([c for _, c in times]) for name, times in calls.items()}
        print(f"chat call, bare AsyncOpenAI:     {wall['bare']:.2f} ms, CPU {cpu['bare']:.2f} ms "
              f"(medians of {n})")
        print(f"chat call, ctx.async_openai:     {wall['durable']:.2f} ms, CPU "
              f"{cpu['durable']:.2f} ms")
        print(f"chat call, ctx.chat_async:       {wall['chat']:.2f} ms, CPU {cpu['chat']:.2f} ms")
        print(f"durable client overhead:         {wall['durable'] - wall['bare']:.2f} ms per "
              f"call, CPU {cpu['durable'] - cpu['bare']:.2f} ms")
    try:
        import agents  # noqa: F401
    except ImportError:
        print("openai-agents is not installed: the agent runs are skipped")
        return
    runs = max(10, n // 30)
    with LoopbackServer(script) as server, tempfile.TemporaryDirectory() as tmp:
        bare_runs, durable_runs, empty = _agent_runs(server.url, runs, f"{tmp}/journal")
        print(f"Agents SDK run (2 rounds, 1 tool), bare:     {_ms(bare_runs):.2f} ms "
              f"(median of {runs})")
        print(f"the same in durable_nb.execute (whole run):  {_ms(durable_runs):.2f} ms")
        print(f"durable_nb.execute of an empty async handler: {_ms(empty):.2f} ms")
    try:
        import pydantic_ai  # noqa: F401
    except ImportError:
        print("pydantic-ai is not installed: its runs are skipped")
        return
    with LoopbackServer(script) as server, tempfile.TemporaryDirectory() as tmp:
        bare_runs, durable_runs = _pydantic_ai_runs(server.url, runs, f"{tmp}/journal")
        print(f"Pydantic AI run (2 rounds, 1 tool), bare:    {_ms(bare_runs):.2f} ms "
              f"(median of {runs})")
        print(f"the same in durable_nb.execute (whole run):  {_ms(durable_runs):.2f} ms")


if __name__ == "__main__":
    main(sys.argv[1:])
