"""LangGraph's own state of a run made durable by the integration, on the run's journal
(durable_nb.integrations.langgraph.state): read back in another process after the run parks,
one history after it resumes (nothing doubled by the replay), and a fork from a checkpoint as
a durable_nb fork, with the real ``langgraph`` and ``langchain-openai`` against the loopback
server."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip("langgraph")
pytest.importorskip("langchain_openai")

from langchain_core.tools import tool  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.prebuilt import create_react_agent  # noqa: E402
from langgraph.types import Command  # noqa: E402

from durable_nb import Status  # noqa: E402
from durable_nb.integrations.langgraph import invoke, state  # noqa: E402
from durable_nb.integrations.langgraph.checkpoint import (  # noqa: E402
    JournalCheckpointer,
    fork_from_checkpoint,
)
from durable_nb.testing import LoopbackServer, Reply, ToolCall  # noqa: E402
from tests.test_langgraph import _cli, chat_model, email_tool, execute  # noqa: E402

EMAIL = ToolCall("send_email", {"to": "team@example.com", "subject": "Q3"})
QUESTION = {"messages": [("user", "Email the team.")]}


def approving_agent(model: Any, effects: list, **options: Any) -> Any:
    """LangChain's ReAct agent asking a person before its tool runs (the human-in-the-loop
    middleware's ``interrupt()``)."""
    from langchain.agents import create_agent
    from langchain.agents.middleware import HumanInTheLoopMiddleware

    return create_agent(model, [email_tool(effects)], middleware=[
        HumanInTheLoopMiddleware(interrupt_on={"send_email": True})], **options)


def _history(journal: Any, run_id: str, graph: Any) -> list[Any]:
    saver = JournalCheckpointer.for_run(run_id, journal)
    return list(graph.copy(update={"checkpointer": saver}).get_state_history(saver.config))


def _shape(history: list[Any]) -> list[tuple[int, tuple, int]]:
    """(superstep, next nodes, message count) of each checkpoint, newest first."""
    return [(s.metadata["step"], s.next, len(s.values.get("messages", []))) for s in history]


READ_STATE = """
import json, sys
from langchain_openai import ChatOpenAI
from durable_nb.integrations.langgraph import state
from tests.test_langgraph_state import approving_agent

graph = approving_agent(ChatOpenAI(model="m", api_key="x"), [])
snapshot = state(sys.argv[2], graph, journal=sys.argv[1])
print(json.dumps({"next": list(snapshot.next),
                  "messages": [[m.type, m.content] for m in snapshot.values["messages"]],
                  "interrupts": [i.value for i in snapshot.interrupts]}))
"""


def test_a_parked_agents_state_is_read_in_another_process_and_its_history_is_one_after_resume(
        tmp_path, journal):
    effects: list[str] = []
    with LoopbackServer([Reply(tool_calls=[EMAIL]), "I emailed the team."]) as server:
        agent = approving_agent(chat_model(server), effects)

        def handler(ctx):
            return invoke(ctx, agent, QUESTION)["messages"][-1].content

        parked = execute("mail", handler, journal)
        assert parked.record.status is Status.WAITING_APPROVAL
        read = subprocess.run([sys.executable, "-c", READ_STATE, str(tmp_path / "journal"),
                               "mail"], capture_output=True, text=True, check=True, timeout=60)
        seen = json.loads(read.stdout)
        assert seen["next"] == ["HumanInTheLoopMiddleware.after_model"]
        assert seen["messages"] == [["human", "Email the team."], ["ai", ""]]
        [asked] = seen["interrupts"]
        assert [(a["name"], a["args"]) for a in asked["action_requests"]] == [
            ("send_email", {"to": "team@example.com", "subject": "Q3"})]
        parked_history = _history(journal, "mail", agent)

        _cli("approve", "mail", journal_dir=tmp_path / "journal")
        done = execute("mail", handler, journal)
        again = execute("mail", handler, journal)
        stats = server.stats()
    assert done.record.status is Status.DONE and again.result == "I emailed the team."
    assert stats["chat"] == 2 and effects == ["team@example.com: Q3"]

    history = _history(journal, "mail", agent)
    ids = [s.config["configurable"]["checkpoint_id"] for s in history]
    assert len(set(ids)) == len(ids) and ids == sorted(ids, reverse=True)
    assert [s.parent_config["configurable"]["checkpoint_id"] for s in history[:-1]] == ids[1:]
    # The same agent under plain LangGraph, resumed with the same decision: the same history.
    plain_effects: list[str] = []
    with LoopbackServer([Reply(tool_calls=[EMAIL]), "I emailed the team."]) as server:
        plain = approving_agent(chat_model(server), plain_effects,
                                checkpointer=InMemorySaver())
        config = {"configurable": {"thread_id": "plain"}}
        plain.invoke(QUESTION, config, durability="sync")
        plain.invoke(Command(resume={"decisions": [{"type": "approve"}]}), config,
                     durability="sync")
        expected = _shape(list(plain.get_state_history(config)))
    assert _shape(history) == expected
    assert _shape(history)[-len(parked_history):] == _shape(parked_history)
    assert state("mail", agent, journal=journal).values["messages"][-1].content == \
        "I emailed the team."


def test_update_state_and_time_travel_work_on_the_runs_thread_on_the_journal(journal):
    with LoopbackServer(["Hello."]) as server:
        agent = create_react_agent(chat_model(server), [])
        execute("hello", lambda ctx: invoke(ctx, agent, {"messages": [("user", "Hi.")]}
                                            )["messages"][-1].content, journal)
        saver = JournalCheckpointer.for_run("hello", journal)
        on_journal = agent.copy(update={"checkpointer": saver})
        first = list(on_journal.get_state_history(saver.config))[-1]
        on_journal.update_state(saver.config, {"messages": [("user", "I am Ana.")]})
        assert state("hello", agent, journal=journal).values["messages"][-1].content == \
            "I am Ana."
        # Time travel: from the first checkpoint (the input) again, a branch without the update.
        again = on_journal.invoke(None, first.config)
        assert [m.content for m in again["messages"]] == ["Hi.", "Hello."]
        assert server.stats()["chat"] == 2


def test_a_fork_from_an_earlier_checkpoint_is_shown_and_makes_only_the_later_calls(
        tmp_path, journal):
    effects: list[str] = []
    with LoopbackServer([Reply(tool_calls=[EMAIL]), "I emailed the team."]) as server:
        agent = create_react_agent(chat_model(server), [email_tool(effects)])

        def handler(ctx):
            return invoke(ctx, agent, QUESTION)["messages"][-1].content

        assert execute("fork", handler, journal).result == "I emailed the team."
        after_tool = next(s for s in _history(journal, "fork", agent) if s.next == ("agent",)
                          and s.values["messages"][-1].type == "tool")
        checkpoint_id = after_tool.config["configurable"]["checkpoint_id"]

        fork_id = fork_from_checkpoint("fork", checkpoint_id, journal=journal)
        assert fork_id == "fork@1" and journal.get_run(fork_id).forked_from["position"] == 2
        assert [e.kind for e in journal.steps("fork")] == ["model", "run"]
        shown = _cli("show", fork_id, journal_dir=tmp_path / "journal")
        assert "forked     from fork" in shown and "(step 2)" in shown

        resumed = execute("fork", handler, journal)
        stats = server.stats()
    assert resumed.result == "I emailed the team."
    assert stats["chat"] == 3 and effects == ["team@example.com: Q3"]  # only the last round
    assert [e.kind for e in journal.steps("fork")] == ["model", "run", "model"]
    history = _history(journal, "fork", agent)
    assert [m.type for m in history[0].values["messages"]] == ["human", "ai", "tool", "ai"]
    ids = [s.config["configurable"]["checkpoint_id"] for s in history]
    assert len(set(ids)) == len(ids) and [s.metadata["step"] for s in history] == \
        list(range(len(history) - 2, -2, -1))


@pytest.mark.kernel
def test_a_run_killed_in_a_tool_and_resumed_has_one_history_on_the_journal(tmp_path):
    from langchain_openai import ChatOpenAI

    from tests.harness import start_kernel, wait_until
    from tests.test_langgraph_kernel import AGENT_CELL, TRIP, _effects, _journal, _resume, _setup
    from tests.test_notebook_kernel import _env

    @tool
    def find_flight(city: str) -> str:
        """Find a flight."""

    @tool
    def book_flight(flight: str) -> str:
        """Book a flight."""

    agent = create_react_agent(ChatOpenAI(model="m", api_key="x"), [find_flight, book_flight])
    (tmp_path / "hold-book").touch()
    with LoopbackServer(TRIP) as server, start_kernel(tmp_path, env=_env(server)) as k:
        _setup(k)
        k.execute_async(AGENT_CELL)
        wait_until(lambda: _effects(tmp_path) == ["find Oslo", "book SK123"], 60,
                   "the second tool's effect")
        k.kill()
        # What the killed execution had checkpointed: the model asking to book.
        at_kill = state("trip", agent, journal=_journal(tmp_path))
        assert at_kill.next == ("tools",)
        assert at_kill.values["messages"][-1].tool_calls[0]["name"] == "book_flight"
        (tmp_path / "go-book").touch()
        assert "Booked SK123 to Oslo." in _resume(k, AGENT_CELL)
    history = _history(_journal(tmp_path), "trip", agent)
    ids = [s.config["configurable"]["checkpoint_id"] for s in history]
    assert len(set(ids)) == len(ids) == 7
    assert [(step, nodes) for step, nodes, _ in _shape(history)] == [
        (5, ()), (4, ("agent",)), (3, ("tools",)), (2, ("agent",)), (1, ("tools",)),
        (0, ("agent",)), (-1, ("__start__",))]
    assert [m.type for m in history[0].values["messages"]] == [
        "human", "ai", "tool", "ai", "tool", "ai"]
