"""Framework runs checked against the current agent (durable_nb.checking): an OpenAI Agents
SDK run and a Pydantic AI run, recorded with the real packages against the loopback server
over HTTP, checked by a dry replay of the same handler (``await run(ctx, agent, ...)``):
unchanged they replay (or would execute, parked), an edited instruction diverges at the
first model call; the server gets no request and no tool runs."""

from __future__ import annotations

import openai
import pytest

import durable_nb
from durable_nb import RunOptions, Status
from durable_nb.runner import Runner
from durable_nb.testing import LoopbackServer, Reply, ToolCall
from tests import openai_agents_process as travel

CHARGE = [Reply(tool_calls=[ToolCall("charge_card", {"amount": 120})]), "Charged."]


def _record(handler, run_id, journal, client, **options):
    return Runner(run_id, handler, journal=journal,
                  options=RunOptions(client=client, on_approval="park", **options)).run()


def _untouched(server, tmp_path):
    return server.stats()["total"], travel.effects(tmp_path)


def test_an_agents_sdk_run_checked_against_the_current_agent(tmp_path, journal):
    pytest.importorskip("agents")
    from durable_nb.integrations.openai_agents import run

    def handler_of(agent):
        async def handler(ctx):
            return (await run(ctx, agent, "Book me a flight to Oslo.")).final_output
        return handler

    agent = travel.travel_agent(tmp_path)
    with LoopbackServer(travel.script()) as server, LoopbackServer(CHARGE) as charging:
        client = openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0)
        charge_client = openai.AsyncOpenAI(base_url=charging.url, api_key="x", max_retries=0)
        assert _record(handler_of(agent), "trip", journal, client).status is Status.DONE
        assert _record(handler_of(agent), "charge", journal, charge_client).status \
            is Status.WAITING_APPROVAL
        before = _untouched(server, tmp_path), charging.stats()["total"]

        same = durable_nb.check(handler_of(agent), journal=journal, client=client)
        edited = durable_nb.check(handler_of(agent.clone(instructions="Book the cheapest trip.")),
                                  journal=journal, client=client)
        assert (_untouched(server, tmp_path), charging.stats()["total"]) == before
    assert same["trip"].verdict == "replays" and same["trip"].matched == 5
    parked = same["charge"]
    assert (parked.verdict, parked.approval) == ("would execute", "charge_card")
    assert "parked, waiting for approval of 'charge_card'" in parked.change
    for checked in edited:
        assert (checked.verdict, checked.position, checked.step) == (
            "diverges", 0, "chat 'loopback-1'")
        assert checked.change.startswith(
            "step 0 (chat 'loopback-1'): messages[0].content changed from 'Book the trip.' to "
            "'Book the cheapest trip.'")


def test_a_pydantic_ai_run_checked_against_the_current_agent(tmp_path, journal):
    pytest.importorskip("pydantic_ai")
    from durable_nb.integrations.pydantic_ai import run
    from tests.pydantic_ai_process import travel_agent

    def handler_of(agent):
        async def handler(ctx):
            return (await run(ctx, agent, "Book me a flight to Oslo.")).output
        return handler

    agent = travel_agent(tmp_path)
    with LoopbackServer(travel.script()) as server:
        client = openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0)
        recorded = _record(handler_of(agent), "trip", journal, client, model=travel.MODEL)
        assert recorded.status is Status.DONE
        before = _untouched(server, tmp_path)
        same = durable_nb.check(handler_of(agent), journal=journal, client=client,
                                model=travel.MODEL)["trip"]
        with agent.override(instructions="Book the cheapest trip."):
            edited = durable_nb.check(handler_of(agent), journal=journal, client=client,
                                      model=travel.MODEL)["trip"]
        assert _untouched(server, tmp_path) == before
    assert same.verdict == "replays"
    assert (edited.verdict, edited.position, edited.step) == ("diverges", 0, "chat 'loopback-1'")
    assert "changed from 'Book the trip.' to 'Book the cheapest trip.'" in edited.change


def test_a_langgraph_run_checked_against_the_current_graph(tmp_path, journal):
    """A react agent recorded through durable_nb.integrations.langgraph replays against the
    same graph (its checkpointer writing nothing to the read-only journal), and diverges at
    its first model call when the agent's prompt is edited; no request, no tool effect."""
    pytest.importorskip("langgraph")
    pytest.importorskip("langchain_openai")
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    from durable_nb.integrations.langgraph import invoke

    effects: list[str] = []

    @tool
    def send_email(to: str, subject: str) -> str:
        """Email someone."""
        effects.append(f"{to}: {subject}")
        return f"sent to {to}"

    email = ToolCall("send_email", {"to": "team@example.com", "subject": "Q3"})
    with LoopbackServer([Reply(tool_calls=[email]), "I emailed the team."]) as server:
        model = ChatOpenAI(model="loopback-1", base_url=server.url, api_key="x", max_retries=0)

        def handler_of(prompt):
            agent = create_react_agent(model, [send_email], prompt=prompt)

            def handler(ctx):
                return invoke(ctx, agent, {"messages": [("user", "Email the team.")]}
                              )["messages"][-1].content
            return handler

        recorded = Runner("lg", handler_of("You are terse."), journal=journal,
                          options=RunOptions(on_approval="park")).run()
        assert recorded.status is Status.DONE
        before = server.stats()["total"], list(effects), len(list(journal.steps("lg")))
        same = durable_nb.check(handler_of("You are terse."), journal=journal)
        edited = durable_nb.check(handler_of("You are chatty."), journal=journal)
        assert (server.stats()["total"], effects, len(list(journal.steps("lg")))) == before
    assert same["lg"].verdict == "replays", same["lg"]
    assert (edited["lg"].verdict, edited["lg"].position) == ("diverges", 0), edited["lg"]
    assert "You are terse." in edited["lg"].change and "You are chatty." in edited["lg"].change
