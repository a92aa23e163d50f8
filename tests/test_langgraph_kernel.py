"""LangGraph graphs in a real IPython kernel, SIGKILLed between two model calls of a node,
during a model request and inside a tool after its effect, then resumed by running the cell
again: each model round reaches the loopback server once (plus once for a request in flight
at the kill), each tool's effect happens once (plus once for the tool in flight)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytest.importorskip("langgraph")
pytest.importorskip("langchain_openai")

from durable_nb import DiskJournal, Status  # noqa: E402
from durable_nb.testing import LoopbackServer, Reply, ToolCall  # noqa: E402
from tests.harness import KernelSession, start_kernel, wait_until  # noqa: E402
from tests.test_notebook_kernel import _env  # noqa: E402

pytestmark = pytest.mark.kernel

SETUP = """
import os, time
from pathlib import Path
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, END, MessagesState, StateGraph
from langgraph.prebuilt import create_react_agent
from durable_nb.integrations.langgraph import invoke

model = ChatOpenAI(model="loopback-1", streaming=True, max_retries=0)

def effect(name, arg):
    with open("effects.log", "a") as log:
        log.write(f"{name} {arg}\\n")
    while os.path.exists(f"hold-{name}") and not os.path.exists(f"go-{name}"):
        time.sleep(0.05)  # after the effect, before the step is journaled

@tool
def find_flight(city: str) -> str:
    \"\"\"Find a flight.\"\"\"
    effect("find", city)
    return "SK123"

@tool
def book_flight(flight: str) -> str:
    \"\"\"Book a flight.\"\"\"
    effect("book", flight)
    return f"booked {flight}"

agent = create_react_agent(model, [find_flight, book_flight])

def write(state: MessagesState) -> dict:
    draft = model.invoke(state["messages"])
    while not os.path.exists("go-write"):  # between the node's two model calls
        time.sleep(0.05)
    final = model.invoke([*state["messages"], draft, ("user", "Shorter.")])
    return {"messages": [draft, final]}

builder = StateGraph(MessagesState)
builder.add_node("write", write)
builder.add_edge(START, "write")
builder.add_edge("write", END)
writer = builder.compile()
"""

AGENT_CELL = """%%durable_agent trip
out = invoke(ctx, agent, {"messages": [("user", "Book me a flight to Oslo.")]})
out["messages"][-1].content
"""

WRITER_CELL = """%%durable_agent draft
out = invoke(ctx, writer, {"messages": [("user", "Draft the Q3 note.")]})
out["messages"][-1].content
"""

TRIP = [Reply(tool_calls=[ToolCall("find_flight", {"city": "Oslo"})]),
        Reply(tool_calls=[ToolCall("book_flight", {"flight": "SK123"})]),
        "Booked SK123 to Oslo."]


def _journal(tmp_path: Path) -> DiskJournal:
    return DiskJournal(tmp_path / ".durable_nb")


def _effects(tmp_path: Path) -> list[str]:
    log = tmp_path / "effects.log"
    return log.read_text().splitlines() if log.exists() else []


def _setup(k: KernelSession) -> None:
    k.execute("%load_ext durable_nb").raise_for_error()
    k.execute(SETUP).raise_for_error()


def _resume(k: KernelSession, cell: str) -> str:
    k.restart()
    _setup(k)
    return k.execute(cell, timeout=120).raise_for_error().text


def _steps(tmp_path: Path, run_id: str) -> list[str]:
    return [e.name for e in _journal(tmp_path).steps(run_id)]


def test_killed_between_two_model_calls_of_a_node_each_call_is_made_once(tmp_path):
    with LoopbackServer(["A long draft.", "A short note."]) as server, \
            start_kernel(tmp_path, env=_env(server)) as k:
        _setup(k)
        k.execute_async(WRITER_CELL)
        wait_until(lambda: len(_steps(tmp_path, "draft")) == 1, 60, "the first call journaled")
        k.kill()
        (tmp_path / "go-write").touch()
        text = _resume(k, WRITER_CELL)
        stats = server.stats()
    assert ast.literal_eval(text) == "A short note."
    assert _journal(tmp_path).find_run("draft").status is Status.DONE
    assert stats["by_round"] == {"0": 1, "1": 1}


def test_killed_during_a_model_request_only_that_request_is_sent_again(tmp_path):
    (tmp_path / "hold-find").touch()
    with LoopbackServer(TRIP) as server, start_kernel(tmp_path, env=_env(server)) as k:
        _setup(k)
        k.execute_async(AGENT_CELL)
        wait_until(lambda: _effects(tmp_path) == ["find Oslo"], 60, "the first tool's effect")
        hold = server.hold_streams()
        (tmp_path / "go-find").touch()
        wait_until(lambda: server.count(round=1) == 1, 60, "the second request in flight")
        k.kill()
        hold.release()
        server.hold_streams(timeout=0)  # the resumed requests are not held
        text = _resume(k, AGENT_CELL)
        stats = server.stats()
    assert "Booked SK123 to Oslo." in text
    assert stats["by_round"] == {"0": 1, "1": 2, "2": 1}
    assert _effects(tmp_path) == ["find Oslo", "book SK123"]


def test_killed_inside_a_tool_after_its_effect_only_that_tool_runs_again(tmp_path):
    (tmp_path / "hold-book").touch()
    with LoopbackServer(TRIP) as server, start_kernel(tmp_path, env=_env(server)) as k:
        _setup(k)
        k.execute_async(AGENT_CELL)
        wait_until(lambda: _effects(tmp_path) == ["find Oslo", "book SK123"], 60,
                   "the second tool's effect")
        k.kill()
        (tmp_path / "go-book").touch()
        text = _resume(k, AGENT_CELL)
        stats = server.stats()
    assert "Booked SK123 to Oslo." in text
    assert stats["by_round"] == {"0": 1, "1": 1, "2": 1}
    # The tool in flight at the kill ran again (at least once, guarantees.md); nothing else did.
    assert _effects(tmp_path) == ["find Oslo", "book SK123", "book SK123"]
    assert _journal(tmp_path).find_run("trip").status is Status.DONE
