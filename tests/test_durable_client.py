"""The durable openai client (ctx.openai, ctx.async_openai) against the loopback server."""

from __future__ import annotations

import openai
import pydantic
import pytest

import durable_nb
from durable_nb import UnsupportedClientCall
from durable_nb.journal import open_journal
from durable_nb.llm.streaming import ChatAssembler
from durable_nb.testing import LoopbackServer, Reply, ToolCall
from tests import agent_process
from tests import durable_client_process as streaming_child

MESSAGES = [{"role": "user", "content": "hi"}]


def _assembled(chunks):
    assembler = ChatAssembler()
    for chunk in chunks:
        assembler.add(chunk)
    return assembler.completion()


def test_a_live_async_stream_yields_chunks_before_the_reply_is_journaled(journal):
    async def handler(ctx):
        stream = await ctx.async_openai.chat.completions.create(
            model="loopback-1", messages=MESSAGES, stream=True)
        first, journaled_at_first = None, None
        chunks = []
        async for chunk in stream:
            if first is None:
                first, journaled_at_first = chunk, len(list(journal.steps("live")))
            chunks.append(chunk.model_dump(mode="json"))
        return [journaled_at_first, len(list(journal.steps("live"))), len(chunks)]

    with LoopbackServer(["one two three four five six"]) as server:
        client = openai.AsyncOpenAI(base_url=server.url, api_key="x")
        # what a live stream returns here differs from a replay's on purpose
        seen = durable_nb.execute("live", handler, journal=journal, client=client,
                                  verify_replay=False)
    assert seen[0] == 0 and seen[1] == 1 and seen[2] > 3


def test_a_replayed_stream_is_synthesized_from_the_journal_without_a_request(journal):
    async def handler(ctx):
        stream = await ctx.async_openai.chat.completions.create(
            model="loopback-1", messages=MESSAGES, stream=True,
            stream_options={"include_usage": True}, tools=openai.NOT_GIVEN)
        chunks = [chunk async for chunk in stream]
        return [_assembled(chunks).model_dump(mode="json"), len(chunks)]

    script = [Reply(content="checking", tool_calls=[ToolCall("f", {"a": 1})])]
    with LoopbackServer(script) as server:
        client = openai.AsyncOpenAI(base_url=server.url, api_key="x")
        live = durable_nb.execute("s", handler, journal=journal, client=client,
                                  verify_replay=False)
        replayed = durable_nb.execute("s", handler, journal=journal, client=client,
                                      verify_replay=False)
        requests = server.stats()["chat"]
    assert replayed[0] == live[0]
    assert replayed[0]["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "f"
    assert replayed[1] == 3 < live[1]  # the message, its finish reason, the usage
    assert requests == 1


def test_the_sync_client_journals_chat_steps_and_replays_its_stream(journal):
    def handler(ctx):
        plain = ctx.openai.chat.completions.create(model="loopback-1", messages=MESSAGES)
        stream = ctx.openai.chat.completions.create(model="loopback-1", messages=MESSAGES,
                                                    stream=True)
        return [plain.choices[0].message.content,
                _assembled(list(stream)).choices[0].message.content]

    with LoopbackServer(["same answer"]) as server:
        client = openai.OpenAI(base_url=server.url, api_key="x")
        for _ in range(2):
            assert durable_nb.execute("sync", handler, journal=journal,
                                      client=client) == ["same answer"] * 2
        assert server.stats()["chat"] == 2
    # the stream's step has the key the async client's would have
    assert [(e.key, e.kind) for e in journal.steps("sync")] == [
        ("0", "chat"), ("streamed_call#0.0", "chat")]


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_a_live_sync_stream_yields_chunks_while_the_server_still_sends(journal, api):
    def open_stream(ctx):
        if api == "chat":
            return ctx.openai.chat.completions.create(model="loopback-1", messages=MESSAGES,
                                                      stream=True)
        return ctx.openai.responses.create(model="loopback-1", input="hi", stream=True)

    def handler(ctx):
        items = iter(open_stream(ctx))
        next(items)
        # the server holds the rest of its stream until released: nothing could be
        # journaled yet, and this chunk came before the server finished
        seen = [hold.released, len(list(journal.steps("live")))]
        hold.release()
        rest = list(items)
        return seen + [len(rest) > 2, len(list(journal.steps("live")))]

    def text(ctx):
        items = list(open_stream(ctx))
        if api == "chat":
            return _assembled(items).choices[0].message.content
        return items[-1].response.output_text

    with LoopbackServer(["one two three four five six"]) as server:
        hold = server.hold_streams()
        client = openai.OpenAI(base_url=server.url, api_key="x")
        # what a live stream returns here differs from a replay's on purpose
        seen = durable_nb.execute("live", handler, journal=journal, client=client,
                                  verify_replay=False)
        replayed = durable_nb.execute("live", text, journal=journal, client=client)
        requests = server.stats()["total"]
    assert seen == [False, 0, True, 1]
    assert replayed == "one two three four five six" and requests == 1


def test_a_process_killed_mid_stream_journaled_nothing_and_calls_again(tmp_path):
    journal_dir = str(tmp_path / "journal")
    with LoopbackServer([streaming_child.ANSWER]) as server:
        hold = server.hold_streams()  # the first child dies while the server still sends
        child = agent_process.start(streaming_child.stream_child, journal_dir, server.url,
                                    str(tmp_path))
        child.join(60)
        assert (tmp_path / "killed-mid-stream").exists() and child.exitcode == -9
        assert list(open_journal(journal_dir).steps("stream")) == []
        hold.release()
        child = agent_process.start(streaming_child.stream_child, journal_dir, server.url,
                                    str(tmp_path))
        child.join(60)
        calls = server.stats()["by_round"]
    assert agent_process.read_result(tmp_path) == streaming_child.ANSWER
    assert calls == {"0": 2}
    assert [e.kind for e in open_journal(journal_dir).steps("stream")] == ["chat"]


def test_responses_create_is_a_respond_step(journal):
    async def handler(ctx):
        response = await ctx.async_openai.responses.create(model="loopback-1", input="hi")
        events = await ctx.async_openai.responses.create(model="loopback-1", input="hi",
                                                         stream=True)
        return [response.output_text, [e.type async for e in events][-1]]

    with LoopbackServer(["hello"]) as server:
        client = openai.AsyncOpenAI(base_url=server.url, api_key="x")
        for _ in range(2):
            assert durable_nb.execute("r", handler, journal=journal, client=client) == [
                "hello", "response.completed"]
        assert server.stats()["responses"] == 2
    assert [e.kind for e in journal.steps("r")] == ["respond", "respond"]


def test_what_is_not_journaled_is_refused_and_probing_falls_back(journal):
    def handler(ctx):
        client = ctx.openai
        with pytest.raises(UnsupportedClientCall, match="embeddings is not journaled"):
            client.embeddings
        assert getattr(client.responses, "with_streaming_response", None) is None
        with pytest.raises(AttributeError):
            client.chat.completions.with_raw_response
        return str(client.base_url)

    client = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="x")
    assert durable_nb.execute("refuse", handler, journal=journal,
                              client=client) == "http://127.0.0.1:9/v1/"


class Trip(pydantic.BaseModel):
    city: str
    days: int


@pytest.mark.parametrize("asynchronous", [False, True])
def test_parse_replays_to_the_same_typed_object(journal, asynchronous):
    request = dict(model="loopback-1", messages=MESSAGES, response_format=Trip)

    def handler(ctx):
        return ctx.openai.chat.completions.parse(**request).choices[0].message.parsed

    async def async_handler(ctx):
        parsed = await ctx.async_openai.chat.completions.parse(**request)
        return parsed.choices[0].message.parsed

    with LoopbackServer(['{"city": "Oslo", "days": 3}']) as server:
        client = (openai.AsyncOpenAI if asynchronous else openai.OpenAI)(
            base_url=server.url, api_key="x")
        runs = [durable_nb.execute("trip", async_handler if asynchronous else handler,
                                   journal=journal, client=client) for _ in range(2)]
        sent = server.requests[0]["response_format"]
    assert runs == [Trip(city="Oslo", days=3)] * 2 and isinstance(runs[1], Trip)
    assert sent["type"] == "json_schema" and sent["json_schema"]["name"] == "Trip"
    assert server.stats()["chat"] == 1


def test_with_options_keeps_the_run_and_ignores_max_retries(journal):
    def handler(ctx):
        client = ctx.openai
        assert client.with_options(max_retries=0) is client
        slower = client.with_options(timeout=99.0)
        assert slower.timeout == 99.0 and slower is not client
        return slower.chat.completions.create(model="loopback-1",
                                              messages=MESSAGES).choices[0].message.content

    with LoopbackServer(["through the copy"]) as server:
        client = openai.OpenAI(base_url=server.url, api_key="x")
        assert durable_nb.execute("opts", handler, journal=journal,
                                  client=client) == "through the copy"
    assert [e.kind for e in journal.steps("opts")] == ["chat"]
