"""A LangChain model call in a LangGraph node through durable_nb's LangGraph integration against
the same call through LangGraph alone, and the replay of a 50-step graph run.

``python -m benchmarks.langgraph_call [--calls N] [--model fake|loopback]``:

- **a call**: one graph whose node makes N model calls in a row, each timed inside the node,
  run two ways, alternating in blocks of 50 calls (so that the load of a shared machine falls
  on both alike): **plain**, ``graph.invoke`` outside any run (LangGraph alone); **durable**,
  :func:`durable_nb.integrations.langgraph.invoke` in a run with a disk journal (each call a
  journaled ``model`` step). The model is LangChain's ``FakeListChatModel`` (``fake``, the
  default: no network, so the difference is durable_nb's own cost: inputs, the step's key, the
  journal write, tokens estimated offline since the fake reports no usage) or ``ChatOpenAI``
  against the bundled loopback server (``loopback``). Target: the durable call within 0.5 ms of
  the plain one (median).
- **a replay**: a ``StateGraph`` looping 25 times through a model node and a tool node (50
  journaled steps) is run once, then executed again as a DONE run (every step answered from
  the journal, nothing called): the time of that second ``durable_nb.execute``, median of 7.
  Target: under 50 ms.

Not a test: the figures depend on the machine's load, and are reported, not asserted.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph

import durable_nb as dn

BLOCK = 50


def _model(kind: str, server: Any) -> Any:
    if kind == "loopback":
        from langchain_openai import ChatOpenAI

        return ChatOpenAI(model="loopback-1", base_url=server.url, api_key="x", max_retries=0)
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    return FakeListChatModel(responses=["The weather in Oslo is mild."])


def _calls_graph(model: Any, calls: int, timings: list[float]) -> Any:
    def ask(state: MessagesState) -> dict:
        for i in range(calls):
            started = time.perf_counter()
            model.invoke(f"Question {i}: the weather in Oslo?")
            timings.append(time.perf_counter() - started)
        return {}

    graph = StateGraph(MessagesState)
    graph.add_node("ask", ask)
    graph.add_edge(START, "ask")
    graph.add_edge("ask", END)
    return graph.compile()


def measure_calls(calls: int, kind: str, workdir: Path, server: Any) -> dict[str, list[float]]:
    """Seconds per model call each way, in alternating blocks."""
    from durable_nb.integrations.langgraph import invoke

    journal = dn.open_journal(workdir / "journal")
    figures: dict[str, list[float]] = {"plain": [], "durable": []}
    model = _model(kind, server)
    for block in range(max(1, calls // BLOCK)):
        graph = _calls_graph(model, BLOCK, figures["plain"])
        graph.invoke({"messages": []})
        durable = _calls_graph(model, BLOCK, figures["durable"])
        dn.execute(f"calls-{block}", lambda ctx: invoke(ctx, durable, {"messages": []}) and None,
                   journal=journal)
    return figures


def _loop_graph(model: Any, rounds: int) -> Any:
    @tool
    def lookup(city: str) -> str:
        """Look a city up."""
        return f"{city}: mild"

    def think(state: MessagesState) -> dict:
        return {"messages": [model.invoke(state["messages"][-2:] or "Start.")]}

    def act(state: MessagesState) -> dict:
        return {"messages": [("user", lookup.invoke({"city": "Oslo"}))]}

    def more(state: MessagesState) -> str:
        return "act" if len(state["messages"]) < 2 * rounds else END

    graph = StateGraph(MessagesState)
    graph.add_node("think", think)
    graph.add_node("act", act)
    graph.add_edge(START, "think")
    graph.add_conditional_edges("think", more, ["act", END])
    graph.add_edge("act", "think")
    return graph.compile()


def measure_replay(kind: str, workdir: Path, server: Any, rounds: int = 25,
                   repeats: int = 7) -> tuple[int, list[float], list[float]]:
    """(steps journaled, seconds of each replay of the DONE run, seconds of each run of the
    same graph by LangGraph alone), the two alternating."""
    from durable_nb.integrations.langgraph import invoke

    journal = dn.open_journal(workdir / "replay")
    graph = _loop_graph(_model(kind, server), rounds)
    config = {"recursion_limit": 4 * rounds + 10}

    def handler(ctx: Any) -> int:
        return len(invoke(ctx, graph, {"messages": []}, config)["messages"])

    dn.execute("loop", handler, journal=journal)
    steps = len(list(journal.steps("loop")))
    replays, plain = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        dn.execute("loop", handler, journal=journal)
        replays.append(time.perf_counter() - started)
        started = time.perf_counter()
        graph.invoke({"messages": []}, config)
        plain.append(time.perf_counter() - started)
    return steps, replays, plain


def _summary(name: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds[len(seconds) // 10:])  # the first tenth warms up
    p90 = ms[int(len(ms) * 0.9)]
    return f"{name:<8} median {statistics.median(ms):6.3f} ms   p90 {p90:6.3f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--model", choices=["fake", "loopback"], default="fake")
    args = parser.parse_args()
    from durable_nb.testing import LoopbackServer

    server = (LoopbackServer(["The weather in Oslo is mild."] * 64).start()
              if args.model == "loopback" else None)
    try:
        with tempfile.TemporaryDirectory(prefix="dnb-langgraph-bench-") as workdir:
            figures = measure_calls(args.calls, args.model, Path(workdir), server)
            steps, replays, plain = measure_replay(args.model, Path(workdir), server)
    finally:
        if server is not None:
            server.stop()
    print(f"{len(figures['plain'])} model calls ({args.model}) in a LangGraph node, each way:")
    for name, seconds in figures.items():
        print(_summary(name, seconds))
    medians = {k: statistics.median(v[len(v) // 10:]) * 1000 for k, v in figures.items()}
    print(f"durable_nb over LangGraph alone: {medians['durable'] - medians['plain']:+.3f} ms per "
          f"call (target: at most +0.500 ms)")
    replay, alone = statistics.median(replays) * 1000, statistics.median(plain) * 1000
    print(f"replay of the DONE {steps}-step graph run: median {replay:.1f} ms of {len(replays)}; "
          f"the same graph run by LangGraph alone (its 51 supersteps, the model faked): "
          f"{alone:.1f} ms; durable_nb's part {replay - alone:+.1f} ms (target: under 50 ms)")


if __name__ == "__main__":
    main()
