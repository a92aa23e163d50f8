"""ctx.respond: the Responses API, journaled, streamed and not, with tools through
ctx.call_tools, usage, budgets and replay of the real Response. The real openai client over
HTTP to the loopback server's /v1/responses."""

from __future__ import annotations

import json

import openai
import pytest
from openai.types.responses import Response

import durable_nb as dn
from durable_nb import serde
from durable_nb.export import export_data
from durable_nb.notebook.panel import RunPanel
from durable_nb.runner import Runner
from durable_nb.testing import LoopbackServer, Reply, ToolCall

MODEL = "gpt-4.1-mini"
SCRIPT = [Reply(tool_calls=[ToolCall("get_weather", {"city": "Oslo"})]),
          "It is 21 degrees in Oslo."]


class Shown:
    def __init__(self):
        self.text = []

    def on_step(self, entry, replayed):
        pass

    def on_record(self, record):
        pass

    def on_text(self, delta):
        self.text.append(delta)


@pytest.fixture
def server():
    with LoopbackServer(SCRIPT) as srv:
        yield srv


def make_tool(log):
    @dn.tool
    def get_weather(city: str) -> dict:
        """Weather for a city."""
        log.append(city)
        return {"city": city, "temp": 21}
    return get_weather


def responses_schema(tool):
    function = tool.schema["function"]
    return {"type": "function", "name": function["name"],
            "description": function["description"], "parameters": function["parameters"]}


def loop(client, tool, **options):
    """The README's Responses loop."""
    def handler(ctx):
        input = [{"role": "user", "content": "Weather in Oslo?"}]
        while True:
            response = ctx.respond(client=client, model=MODEL, input=input,
                                   tools=[responses_schema(tool)], **options)
            input += response.output
            if not any(item.type == "function_call" for item in response.output):
                return response
            input += ctx.call_tools(response, [tool])
    return handler


@pytest.mark.parametrize("stream", [False, True])
def test_the_responses_loop_runs_tools_and_replays_the_real_response(journal, server, stream):
    log = []
    client = openai.OpenAI(base_url=server.url, api_key="any", max_retries=0)
    shown = Shown()
    handler = loop(client, make_tool(log), stream=stream)
    first = Runner("r", handler, journal=journal, observer=shown).run().result
    assert isinstance(first, Response) and first.output_text == "It is 21 degrees in Oslo."
    assert log == ["Oslo"]
    assert server.count(endpoint="responses") == 2 and server.count(kind="invalid") == 0
    steps = list(journal.steps("r"))
    assert [(s.kind, s.name) for s in steps] == [("respond", MODEL), ("run", "get_weather"),
                                                 ("respond", MODEL)]
    # The second request carried the function_call and its function_call_output.
    items = server.requests[1]["input"]
    assert [i.get("type", "message") for i in items] == ["message", "function_call",
                                                         "function_call_output"]
    assert items[2] == {"type": "function_call_output", "call_id": "call_0_0",
                        "output": '{"city": "Oslo", "temp": 21}'}
    replayed = dn.execute("r", handler, journal=journal)
    assert type(replayed) is Response and replayed == first
    assert server.count(endpoint="responses") == 2 and log == ["Oslo"]
    record = dn.get_run("r", journal=journal)
    assert record.iteration == 2
    assert record.prompt_tokens == sum(s.prompt_tokens for s in steps) > 0
    assert record.completion_tokens == sum(s.completion_tokens for s in steps) > 0
    if stream:
        assert "".join(shown.text) == "It is 21 degrees in Oslo.\n"
    else:
        assert shown.text == []
    # An export tells the Responses rounds as it tells chat rounds.
    data = export_data(record, journal=journal)
    assert data["run"]["goal"] == "Weather in Oslo?"
    first_round, second_round = data["rounds"]
    assert first_round["chat"]["tool_calls"] == [
        {"id": "call_0_0", "name": "get_weather", "arguments": {"city": "Oslo"}}]
    assert first_round["chat"]["request"]["tools"] == ["get_weather"]
    assert [(s["kind"], s["name"], s.get("tool_call_id")) for s in first_round["steps"]] == \
        [("run", "get_weather", "call_0_0")]
    assert second_round["chat"]["content"] == "It is 21 degrees in Oslo."
    assert second_round["chat"]["finish_reason"] == "completed"
    assert [m["role"] for m in second_round["chat"]["request"]["new_messages"]] == \
        ["assistant", "tool"]  # the function call and its output, new in that request
    # ... and so does the panel's step detail.
    body = RunPanel.load(record, journal=journal).steps.render(steps[2])
    assert "with 3 input items and tools get_weather; 2 new in this request" in body
    assert "1 earlier input items (sent before)" in body
    assert "It is 21 degrees in Oslo." in body and "(completed)" in body


def test_usage_and_meta_of_a_response(journal, server):
    client = openai.OpenAI(base_url=server.url, api_key="any", max_retries=0)
    prices = {MODEL: dn.Price(1.0, 0.5, 4.0)}
    response = dn.execute("r", lambda ctx: ctx.respond(client=client, model=MODEL,
                                                       input="Weather in Oslo?"),
                          journal=journal, prices=prices)
    (step,) = journal.steps("r")
    usage = response.usage
    assert (step.prompt_tokens, step.completion_tokens) == (usage.input_tokens,
                                                            usage.output_tokens)
    assert step.meta["model"] == MODEL and step.meta["cached"] == 0
    assert step.meta["cost"] == pytest.approx((usage.input_tokens * 1.0
                                               + usage.output_tokens * 4.0) / 1e6)
    assert dn.get_run("r", journal=journal).cost == pytest.approx(step.meta["cost"])


def test_an_incomplete_response_is_returned_not_raised(journal):
    long = "A long answer that the output cap of sixteen tokens will cut short. " * 3
    with LoopbackServer([long]) as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="any", max_retries=0)
        for stream in (False, True):
            response = dn.execute(f"r{stream}", lambda ctx: ctx.respond(
                client=client, model=MODEL, input="hi", max_output_tokens=16, stream=stream),
                journal=journal)
            assert response.status == "incomplete" and response.usage.output_tokens == 16


def test_async_respond_streamed_and_not(journal, server):
    aclient = openai.AsyncOpenAI(base_url=server.url, api_key="any", max_retries=0)
    log = []
    tool = make_tool(log)

    async def handler(ctx):
        input = [{"role": "user", "content": "Weather in Oslo?"}]
        first = await ctx.respond_async(client=aclient, model=MODEL, input=input,
                                        tools=[responses_schema(tool)])
        input += first.output
        input += ctx.call_tools(first, [tool])
        second = await ctx.respond_async(client=aclient, model=MODEL, input=input, stream=True)
        return second.output_text

    assert dn.execute("r", handler, journal=journal) == "It is 21 degrees in Oslo."
    assert dn.execute("r", handler, journal=journal) == "It is 21 degrees in Oslo."
    assert server.count(endpoint="responses") == 2 and log == ["Oslo"]


def test_the_budget_counts_the_input_and_the_output_cap(journal, server):
    client = openai.OpenAI(base_url=server.url, api_key="any", max_retries=0)
    tool = make_tool([])
    with pytest.raises(dn.BudgetExhausted, match=r"used (\d+) of 150") as caught:
        dn.execute("r", loop(client, tool, max_output_tokens=60), journal=journal,
                   max_tokens=150)
    record = dn.get_run("r", journal=journal)
    used = record.prompt_tokens + record.completion_tokens
    assert f"used {used} of 150" in str(caught.value) and used <= 150
    assert server.count(endpoint="responses") == 1


def test_respond_errors_name_the_endpoint_and_are_retried_when_transient(journal, server):
    client = openai.OpenAI(base_url=server.url, api_key="any", max_retries=0)
    server.fail_next(2, 503, retry_after=0.01)
    assert dn.execute("ok", lambda ctx: ctx.respond(client=client, model=MODEL, input="hi")
                      .status, journal=journal) == "completed"
    server.fail_next(1, 400)
    with pytest.raises(dn.EndpointError) as caught:
        dn.execute("bad", lambda ctx: ctx.respond(client=client, model=MODEL, input="hi"),
                   journal=journal)
    assert f"ctx.respond failed at step 0 (model '{MODEL}'): {server.url}/responses answered " \
           f"HTTP 400" in str(caught.value)
    assert server.count(kind="failure") == 3


def test_a_response_round_trips_through_the_journal_even_when_the_server_leaves_fields_out():
    # What llama.cpp's server answers: many fields the model class requires are missing,
    # so it does not validate; the journal keeps it as sent and rebuilds the same object.
    sent = {"completed_at": 1796125416, "created_at": 1796125416, "id": "resp_x",
            "model": "smollm2-135m-instruct", "object": "response", "status": "completed",
            "output": [{"content": [{"type": "output_text", "annotations": [], "logprobs": [],
                                     "text": "Hello there!"}],
                        "id": "msg_x", "role": "assistant", "status": "completed",
                        "type": "message"}],
            "usage": {"input_tokens": 31, "output_tokens": 4, "total_tokens": 35,
                      "input_tokens_details": {"cached_tokens": 30}}}
    with pytest.raises(Exception):
        Response.model_validate(sent)
    live = Response.model_construct(**sent)  # as the openai client builds it
    back = serde.decode(json.loads(serde.dumps(serde.encode(live))))
    assert type(back) is Response and back == live and back.output_text == "Hello there!"
    assert back.model_dump(exclude_unset=True) == live.model_dump(exclude_unset=True)


def test_call_tools_answers_a_response_with_function_call_outputs(journal):
    script = [Reply(tool_calls=[ToolCall("get_weather", {"city": "Oslo"}),
                                ToolCall("nope", {})]), "done"]
    with LoopbackServer(script) as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="any", max_retries=0)

        def handler(ctx):
            response = ctx.respond(client=client, model=MODEL, input="go")
            return ctx.call_tools(response, [make_tool([])])

        answers = dn.execute("r", handler, journal=journal)
    assert answers[0] == {"type": "function_call_output", "call_id": "call_0_0",
                          "output": '{"city": "Oslo", "temp": 21}'}
    assert answers[1]["call_id"] == "call_0_1" and "no tool named 'nope'" in answers[1]["output"]
