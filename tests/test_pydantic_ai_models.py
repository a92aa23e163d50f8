"""Pydantic AI on any model (durable_nb.integrations.pydantic_ai_models): every request of a
model that is not OpenAI-compatible is a ``model`` step journaled through Pydantic AI's
durability API. With Pydantic AI's own ``FunctionModel``, and its real ``AnthropicModel`` over
the real ``anthropic`` client to the loopback server's Messages API (``/v1/messages``) over
HTTP; the crashes are real SIGKILLs of a child process (tests/pydantic_ai_process.py)."""

from __future__ import annotations

import pydantic
import pytest

pytest.importorskip("pydantic_ai")
pytest.importorskip("anthropic")

from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart  # noqa: E402
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402

import durable_nb  # noqa: E402
from durable_nb import BudgetExhausted, InputChanged, Price, Status, approve  # noqa: E402
from durable_nb import serde  # noqa: E402
from durable_nb.integrations.pydantic_ai import run  # noqa: E402
from durable_nb.journal import open_journal  # noqa: E402
from durable_nb.runner import RunOptions, Runner  # noqa: E402
from durable_nb.testing import LoopbackServer, Reply, ToolCall  # noqa: E402
from tests import agent_process, openai_agents_process as travel  # noqa: E402
from tests.pydantic_ai_process import anthropic_child, anthropic_model, travel_agent  # noqa: E402


class Calls:
    """A ``FunctionModel`` function: asks for ``add(1, 2)``, then answers with its result;
    counts how often it was really called."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, messages: list, info: AgentInfo) -> ModelResponse:
        self.count += 1
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("add", {"a": 1, "b": 2})])
        return ModelResponse(parts=[TextPart(f"It is {messages[-1].parts[0].content}.")])


def _calculator(model: Calls, effects: list) -> Agent:
    agent = Agent(FunctionModel(model), name="calculator")

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        effects.append((a, b))
        return a + b

    return agent


def _asking(agent: Agent, prompt: str):
    async def handler(ctx):
        return (await run(ctx, agent, prompt)).output

    return handler


def test_a_function_model_run_is_model_steps_that_replay_without_calling_it(journal):
    calls, effects = Calls(), []
    handler = _asking(_calculator(calls, effects), "What is 1 + 2?")
    results = [durable_nb.execute("sum", handler, journal=journal) for _ in range(2)]
    assert results == ["It is 3."] * 2
    assert calls.count == 2 and effects == [(1, 2)]
    steps = list(journal.steps("sum"))
    assert [(e.kind, e.name) for e in steps] == [
        ("model", "function:Calls:"), ("run", "add"), ("model", "function:Calls:")]
    first = steps[0]
    assert first.prompt_tokens > 0 and first.completion_tokens > 0  # FunctionModel's usage
    assert journal.find_run("sum").iteration == 2
    # Pydantic AI's own serialized ModelResponse is the step's result.
    part = serde.decode(first.result)["parts"][0]
    assert (part["part_kind"], part["tool_name"], part["args"]) == ("tool-call", "add",
                                                                    {"a": 1, "b": 2})


def test_a_changed_prompt_is_reported_in_one_line(journal):
    agent = _calculator(Calls(), [])
    durable_nb.execute("sum", _asking(agent, "What is 1 + 2?"), journal=journal)
    with pytest.raises(InputChanged) as caught:
        durable_nb.execute("sum", _asking(agent, "What is 2 + 2?"), journal=journal)
    assert ("messages[0].parts[0].content changed from 'What is 1 + 2?' to 'What is 2 + 2?'"
            in str(caught.value))


def test_max_iterations_stops_before_a_model_request_and_resumes_with_a_higher_limit(journal):
    calls, effects = Calls(), []
    handler = _asking(_calculator(calls, effects), "What is 1 + 2?")
    with pytest.raises(BudgetExhausted, match="max_iterations reached: 1 of 1"):
        durable_nb.execute("sum", handler, journal=journal, max_iterations=1)
    assert calls.count == 1 and effects == [(1, 2)]
    assert durable_nb.execute("sum", handler, journal=journal, max_iterations=2) == "It is 3."
    assert calls.count == 2 and effects == [(1, 2)]


class Trip(pydantic.BaseModel):
    city: str
    days: int


def test_structured_output_of_a_function_model_replays_to_the_same_typed_object(journal):
    calls = []

    def plan(messages: list, info: AgentInfo) -> ModelResponse:
        calls.append(info.output_tools[0].name)
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name,
                                                 {"city": "Oslo", "days": 3})])

    agent = Agent(FunctionModel(plan), name="planner", output_type=Trip)
    runs = [durable_nb.execute("plan", _asking(agent, "Plan a trip."), journal=journal)
            for _ in range(2)]
    assert runs == [Trip(city="Oslo", days=3)] * 2 and isinstance(runs[1], Trip)
    assert len(calls) == 1


def _travel(tmp_path, url, run_id, journal, **options):
    agent = travel_agent(tmp_path, model=anthropic_model(url))

    async def handler(ctx):
        return (await run(ctx, agent, "Book me a flight to Oslo.")).output

    return Runner(run_id, handler, journal=journal,
                  options=RunOptions(poll_interval=0.05, **options)).run()


def test_anthropic_model_requests_are_steps_priced_and_replayed(tmp_path, journal):
    with LoopbackServer(travel.script()) as server:
        first = _travel(tmp_path, server.url, "trip", journal)
        again = _travel(tmp_path, server.url, "trip", journal)
        stats = server.stats()
        sent = server.requests[0]
    assert first.result == again.result == travel.FINAL
    assert stats["by_round"] == {"0": 1, "1": 1, "2": 1}  # none for the replay
    assert travel.effects(tmp_path) == ["find Oslo", "book SK123"]
    assert sent["model"] == "claude-sonnet-4-5" and sent["tools"][0]["name"] == "find_flight"
    models = [e for e in journal.steps("trip") if e.kind == "model"]
    assert [e.name for e in models] == ["claude-sonnet-4-5"] * 3
    record = journal.find_run("trip")
    assert record.prompt_tokens == sum(e.prompt_tokens for e in models) > 0
    meta = models[0].meta
    assert meta["provider"] == "anthropic" and meta["price_source"].startswith("genai-prices")
    assert meta["cost"] > 0 and record.cost == pytest.approx(sum(e.meta["cost"] for e in models))


def test_max_cost_stops_before_a_request_and_resumes_with_a_higher_limit(tmp_path, journal):
    prices = {"claude-sonnet-4-5": Price(1000.0, 1000.0, 1000.0)}  # $0.001 a token
    with LoopbackServer(travel.script()) as server:
        with pytest.raises(BudgetExhausted, match="cost budget exhausted: spent \\$0.000000"):
            _travel(tmp_path, server.url, "trip", journal, max_cost=0.01, prices=prices)
        assert server.stats()["chat"] == 0
        done = _travel(tmp_path, server.url, "trip", journal, max_cost=10.0, prices=prices)
        stats = server.stats()
    assert done.result == travel.FINAL and stats["by_round"] == {"0": 1, "1": 1, "2": 1}
    models = [e for e in journal.steps("trip") if e.kind == "model"]
    assert {e.meta["price_source"] for e in models} == {"override"}
    assert done.record.cost == pytest.approx(sum(
        (e.prompt_tokens + e.completion_tokens) / 1000 for e in models))


def test_an_approval_parks_the_anthropic_run_and_the_tool_runs_once_approved(tmp_path,
                                                                             journal):
    script = [Reply(tool_calls=[ToolCall("charge_card", {"amount": 120})]), "Charged."]
    with LoopbackServer(script) as server:
        parked = _travel(tmp_path, server.url, "charge", journal, on_approval="park")
        assert parked.record.status is Status.WAITING_APPROVAL
        assert parked.record.pending_approval["details"] == {
            "tool": "charge_card", "arguments": {"amount": 120}}
        approve("charge", journal=journal)
        done = _travel(tmp_path, server.url, "charge", journal, on_approval="park")
        answer = server.requests[-1]["messages"][-1]["content"][0]
    assert done.record.status is Status.DONE and done.result == "Charged."
    assert travel.effects(tmp_path) == ["charge 120"]
    assert answer["type"] == "tool_result" and answer["content"][0]["text"] == "charged 120"
    assert server.stats()["by_round"] == {"0": 1, "1": 1}


def test_sigkill_during_an_anthropic_request_sends_only_that_one_again(tmp_path):
    # Round 1 answers after 1.5 s: the child is killed while it waits.
    slow = travel.script()
    slow[1] = Reply(tool_calls=slow[1].tool_calls, delay=1.5)
    journal = str(tmp_path / "journal")
    with LoopbackServer(slow) as server:
        child = agent_process.start(anthropic_child, journal, server.url, str(tmp_path),
                                    "trip", None)
        opened = open_journal(journal)
        exit_code, _ = agent_process.drive(child, opened, "trip", approve_waits=False,
                                           kill_when=lambda: server.count(round=1) >= 1)
        assert exit_code == -9
        assert [e.kind for e in opened.steps("trip")] == ["model", "run"]
        child = agent_process.start(anthropic_child, journal, server.url, str(tmp_path),
                                    "trip", None)
        child.join(60)
        stats = server.stats()
        models = [e for e in opened.steps("trip") if e.kind == "model"]
    assert agent_process.read_result(tmp_path) == travel.FINAL
    # The request in flight at the kill was sent again; the others once.
    assert stats["by_round"] == {"0": 1, "1": 2, "2": 1}
    assert len(models) == 3  # its tokens are counted once
    assert travel.effects(tmp_path) == ["find Oslo", "book SK123"]


def test_the_export_reads_model_steps_as_rounds_with_their_tool_calls(tmp_path, journal):
    import json

    from durable_nb.export.run import export_run

    durable_nb.execute("sum", _asking(_calculator(Calls(), []), "What is 1 + 2?"),
                       journal=journal)
    export_run("sum", tmp_path / "sum.json", journal=journal)
    rounds = json.loads((tmp_path / "sum.json").read_text())["rounds"]
    first, second = (r["chat"] for r in rounds)
    assert [(c["name"], c["arguments"]) for c in first["tool_calls"]] == [("add", {"a": 1, "b": 2})]
    assert first["request"]["new_messages"] == [{"role": "user", "content": "What is 1 + 2?"}]
    assert [s["name"] for s in rounds[0]["steps"]] == ["add"]
    assert second["content"] == "It is 3."


def test_run_stream_with_the_journaled_capabilities_replays_streamed_requests(tmp_path,
                                                                              journal):
    from durable_nb.integrations.pydantic_ai import JournaledModelRequests, JournaledTools

    with LoopbackServer(travel.script()) as server:
        agent = travel_agent(tmp_path, model=anthropic_model(server.url))

        async def handler(ctx):
            async with agent.run_stream("Book.", capabilities=[
                    JournaledModelRequests(ctx), JournaledTools(ctx)]) as result:
                return "".join([piece async for piece in result.stream_text(delta=True)])

        for _ in range(2):
            assert durable_nb.execute("stream", handler, journal=journal) == travel.FINAL
        stats = server.stats()
        streamed = [r.get("stream") for r in server.requests]
    assert stats["by_round"] == {"0": 1, "1": 1, "2": 1} and streamed == [True] * 3
    assert travel.effects(tmp_path) == ["find Oslo", "book SK123"]
    assert [e.kind for e in journal.steps("stream")] == ["model", "run", "model", "run", "model"]


def test_a_server_reporting_no_usage_gets_estimated_tokens_the_run_counts(tmp_path, journal):
    from durable_nb.testing import Quirks

    with LoopbackServer(travel.script(), quirks=Quirks(no_usage=True)) as server:
        done = _travel(tmp_path, server.url, "trip", journal)
    models = [e for e in journal.steps("trip") if e.kind == "model"]
    assert done.result == travel.FINAL
    assert all(e.meta["estimated"] and e.prompt_tokens > 0 and e.completion_tokens > 0
               for e in models)
    assert done.record.prompt_tokens == sum(e.prompt_tokens for e in models)


def test_a_model_given_to_run_replaces_the_agents_own(journal):
    own, asked = Calls(), []

    def other(messages: list, info: AgentInfo) -> ModelResponse:
        asked.append(len(messages))
        return ModelResponse(parts=[TextPart("From the other model.")])

    agent = Agent(FunctionModel(own), name="calculator")

    async def handler(ctx):
        return (await run(ctx, agent, "What is 1 + 2?", model=FunctionModel(other))).output

    assert [durable_nb.execute("other", handler, journal=journal)
            for _ in range(2)] == ["From the other model."] * 2
    assert asked == [1] and own.count == 0
    assert [(e.kind, e.name) for e in journal.steps("other")] == [("model", "function:other:")]
