"""Pydantic AI made durable (durable_nb.integrations.pydantic_ai), with the real
``pydantic-ai-slim`` package against the loopback server over HTTP; the crash is a real
SIGKILL of a child process (tests/pydantic_ai_process.py)."""

from __future__ import annotations

import openai
import pydantic
import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent  # noqa: E402

import durable_nb  # noqa: E402
from durable_nb import RunOptions, Status, approve, reject  # noqa: E402
from durable_nb.integrations.pydantic_ai import run  # noqa: E402
from durable_nb.runner import Runner  # noqa: E402
from durable_nb.testing import LoopbackServer, Quirks, Reply, ToolCall  # noqa: E402
from tests import agent_process, openai_agents_process as travel  # noqa: E402
from tests.pydantic_ai_process import anthropic_child, pydantic_child, travel_agent  # noqa: E402


@pytest.mark.parametrize("child_target", [pydantic_child, anthropic_child],
                         ids=["openai-chat-model", "anthropic-model"])
def test_sigkill_after_the_second_tool_resumes_with_each_round_and_effect_once(
        tmp_path, child_target):
    """Killed between requests, after a tool ran, whichever model class the agent has:
    each request is sent once, each tool's effect happens once."""
    journal = str(tmp_path / "journal")
    with LoopbackServer(travel.script()) as server:
        for kill in ("book_flight", None):
            child = agent_process.start(child_target, journal, server.url, str(tmp_path),
                                        "trip", kill)
            child.join(60)
        stats = server.stats()
    assert (tmp_path / "killed-after-book_flight").exists()
    assert agent_process.read_result(tmp_path) == travel.FINAL
    assert stats["by_round"] == {"0": 1, "1": 1, "2": 1}
    assert travel.effects(tmp_path) == ["find Oslo", "book SK123"]


def _execute(run_id, agent, journal, client, **options):
    async def handler(ctx):
        return (await run(ctx, agent, "Book me a flight to Oslo.")).output

    return Runner(run_id, handler, journal=journal,
                  options=RunOptions(client=client, model=travel.MODEL, poll_interval=0.05,
                                     **options)).run()


@pytest.mark.parametrize("approved", [True, False])
def test_a_tool_requiring_approval_parks_and_pydantic_ai_gets_the_decision(
        tmp_path, journal, approved):
    agent = travel_agent(tmp_path)
    script = [Reply(tool_calls=[ToolCall("charge_card", {"amount": 120})]), "Charged."]
    with LoopbackServer(script) as server:
        client = openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0)
        parked = _execute("charge", agent, journal, client, on_approval="park")
        assert parked.record.status is Status.WAITING_APPROVAL
        pending = parked.record.pending_approval
        assert (pending["name"], pending["details"]) == (
            "charge_card", {"tool": "charge_card", "arguments": {"amount": 120}})
        (approve if approved else reject)("charge", journal=journal)
        done = _execute("charge", agent, journal, client, on_approval="park")
        answer = server.requests[-1]["messages"][-1]
    assert done.record.status is Status.DONE and done.result == "Charged."
    assert travel.effects(tmp_path) == (["charge 120"] if approved else [])
    assert answer["role"] == "tool"
    assert (answer["content"] == "charged 120") is approved
    assert server.stats()["by_round"] == {"0": 1, "1": 1}


@pytest.mark.parametrize("answer", ["edit", "message"])
def test_an_edit_is_tool_approved_override_args_and_a_message_is_tool_denied(
        tmp_path, journal, answer):
    """Issue 34: approve with edited arguments reaches Pydantic AI as
    ``ToolApproved(override_args=...)`` (checked against the tool's schema first), a
    rejection's message as ``ToolDenied(message)``: the model receives it."""
    agent = travel_agent(tmp_path)
    script = [Reply(tool_calls=[ToolCall("charge_card", {"amount": 120})]), "Charged."]
    with LoopbackServer(script) as server:
        client = openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0)
        parked = _execute("charge", agent, journal, client, on_approval="park")
        assert parked.record.pending_approval["schema"]["required"] == ["amount"]
        if answer == "edit":
            with pytest.raises(durable_nb.InvalidAnswer, match="'amount' must be an integer"):
                approve("charge", args={"amount": "ninety"}, journal=journal)
            approve("charge", args={"amount": 90}, journal=journal)
        else:
            reject("charge", message="Denied: charge at most 100", journal=journal)
        done = _execute("charge", agent, journal, client, on_approval="park")
        told = server.requests[-1]["messages"][-1]
    assert done.record.status is Status.DONE and done.result == "Charged."
    if answer == "edit":
        assert travel.effects(tmp_path) == ["charge 90"] and told["content"] == "charged 90"
    else:
        assert travel.effects(tmp_path) == [] and told["content"] == "Denied: charge at most 100"


class Trip(pydantic.BaseModel):
    city: str
    days: int


def test_structured_output_replays_to_the_same_typed_object(journal, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "offline")  # Agent("openai:...") wants one
    agent = Agent("openai:loopback-1", output_type=Trip)

    async def handler(ctx):
        return (await run(ctx, agent, "Plan a trip.")).output

    script = [Reply(tool_calls=[ToolCall("final_result", {"city": "Oslo", "days": 3})])]
    with LoopbackServer(script) as server:
        client = openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0)
        runs = [durable_nb.execute("plan", handler, journal=journal, client=client)
                for _ in range(2)]
        requests = server.stats()["chat"]
    assert runs == [Trip(city="Oslo", days=3)] * 2 and isinstance(runs[1], Trip)
    assert requests == 1
    assert [(e.kind, e.name) for e in journal.steps("plan")] == [("chat", "loopback-1")]


def test_a_model_that_is_not_openai_compatible_is_journaled_not_refused(journal):
    from pydantic_ai.models.test import TestModel

    model = TestModel(custom_output_text="Hello.")
    agent = Agent(model)

    async def handler(ctx):
        return (await run(ctx, agent, "hi")).output

    assert [durable_nb.execute("test-model", handler, journal=journal)
            for _ in range(2)] == ["Hello."] * 2
    assert [(e.kind, e.name) for e in journal.steps("test-model")] == [("model", "test")]


def test_another_providers_model_for_an_agent_without_one_is_refused(journal):
    from durable_nb import NotJournaled

    agent = Agent(name="bare")

    async def handler(ctx):
        return (await run(ctx, agent, "hi", model="anthropic:claude-sonnet-4-5")).output

    with pytest.raises(NotJournaled, match=r"agent 'bare' has no model of its own.*Agent\(model"):
        durable_nb.execute("bare", handler, journal=journal)


def test_parallel_tool_calls_are_steps_of_their_own_replayed(tmp_path, journal):
    agent = travel_agent(tmp_path)
    with LoopbackServer(travel.parallel_script()) as server:
        client = openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0)
        first = _execute("both", agent, journal, client)
        again = _execute("both", agent, journal, client)
        requests = server.stats()["chat"]
    assert first.result == again.result == travel.FINAL and requests == 2
    tools = sorted(e.key for e in journal.steps("both") if e.name == "find_flight")
    assert len(tools) == 2 and tools[0] != tools[1]
    assert sorted(travel.effects(tmp_path)) == ["find Oslo", "find Rome"]


def test_parallel_tool_steps_keep_their_keys_whichever_finishes_first(tmp_path, journal):
    # The same run twice, the parallel calls finishing in opposite orders: each call gets
    # the same key both times (keys follow the framework's task creation, not timing), and
    # the first run replayed with the other timing executes nothing again.
    from durable_nb import serde

    keys = []
    with LoopbackServer(travel.parallel_script()) as server:
        client = openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0)
        for run_id, last in (("oslo-last", "Oslo"), ("rome-last", "Rome")):
            work = tmp_path / run_id
            work.mkdir()
            assert _execute(run_id, travel_agent(work, finish_last=last), journal,
                            client).result == travel.FINAL
            assert travel.effects(work)[-1] == f"find {last}"
            keys.append({e.key: serde.decode(e.result) for e in journal.steps(run_id)
                         if e.name == "find_flight"})
        replayed = _execute("oslo-last", travel_agent(tmp_path, finish_last="Rome"), journal,
                            client)
        requests = server.stats()["chat"]
    assert keys[0] == keys[1] and sorted(keys[0].values()) == ["SK123 to Oslo",
                                                               "SK123 to Rome"]
    assert replayed.result == travel.FINAL and travel.effects(tmp_path) == []
    assert requests == 4  # two rounds per run, none for the replay


def test_run_stream_with_the_durable_model_and_journaled_tools_replays(tmp_path, journal):
    from durable_nb.integrations.pydantic_ai import JournaledTools, durable_model

    agent = travel_agent(tmp_path)

    async def handler(ctx):
        async with agent.run_stream("Book.", model=durable_model(ctx, travel.MODEL),
                                    capabilities=[JournaledTools(ctx)]) as result:
            return "".join([piece async for piece in result.stream_text(delta=True)])

    with LoopbackServer(travel.script()) as server:
        client = openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0)
        for _ in range(2):
            assert durable_nb.execute("stream", handler, journal=journal,
                                      client=client) == travel.FINAL
        stats = server.stats()
    assert stats["by_round"] == {"0": 1, "1": 1, "2": 1}
    assert travel.effects(tmp_path) == ["find Oslo", "book SK123"]


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_stream"])
def test_a_run_over_a_server_that_leaves_fields_out_replays(tmp_path, journal, streamed):
    from durable_nb.integrations.pydantic_ai import JournaledTools, durable_model

    agent = travel_agent(tmp_path)

    async def handler(ctx):
        if not streamed:
            return (await run(ctx, agent, "Book.", model=travel.MODEL)).output
        async with agent.run_stream("Book.", model=durable_model(ctx, travel.MODEL),
                                    capabilities=[JournaledTools(ctx)]) as result:
            return "".join([piece async for piece in result.stream_text(delta=True)])

    with LoopbackServer(travel.script(), quirks=Quirks(sparse_replies=True)) as server:
        client = openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0)
        for _ in range(2):
            assert durable_nb.execute("trip", handler, journal=journal,
                                      client=client) == travel.FINAL
        stats = server.stats()
    assert stats["by_round"] == {"0": 1, "1": 1, "2": 1}
    assert travel.effects(tmp_path) == ["find Oslo", "book SK123"]


def test_an_agent_without_a_model_in_a_run_without_one_is_refused(journal):
    from durable_nb import NotJournaled

    agent = Agent(name="bare")

    async def handler(ctx):
        return (await run(ctx, agent, "hi")).output

    with pytest.raises(NotJournaled, match="agent 'bare' has no model, and neither has the run"):
        durable_nb.execute("bare", handler, journal=journal)
