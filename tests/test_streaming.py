"""Streamed ctx.chat that never loses a paid reply: sync and async, cut at the cap, tool-call
deltas from servers that repeat ids and names, no usage from the server. The real openai
client over HTTP to the loopback server with the quirks of real servers switched on."""

from __future__ import annotations

import openai
import pytest

import durable_nb as dn
from durable_nb.notebook.panel import RunPanel
from durable_nb.runner import Runner
from durable_nb.llm.streaming import ChatAssembler, drain
from durable_nb.llm.endpoints import ReplyProblem
from durable_nb.testing import LoopbackServer, Quirks, Reply, ToolCall
from durable_nb.llm.tokens import count_message_tokens, encoding_for

MODEL = "gpt-4"
USER = {"role": "user", "content": "What is the weather in Oslo and in Bergen?"}
LONG = "The quarterly report shows revenue growing in every region, led by the West."


class Shown:
    """An observer that keeps the streamed text."""

    def __init__(self):
        self.text = []

    def on_step(self, entry, replayed):
        pass

    def on_record(self, record):
        pass

    def on_text(self, delta):
        self.text.append(delta)


def weather_tool(log):
    @dn.tool
    def get_weather(city: str) -> dict:
        """Weather for a city."""
        log.append(city)
        return {"city": city, "temp": 21}
    return get_weather


def tool_loop(client, tool, **options):
    def handler(ctx):
        messages = [USER]
        while True:
            reply = ctx.chat(client=client, model=MODEL, messages=messages,
                             tools=[tool.schema], stream=True, **options)
            message = reply.choices[0].message
            messages.append(dn.assistant_message(message))
            if not message.tool_calls:
                return messages
            messages += ctx.call_tools(message, [tool])
    return handler


TWO_CALLS = [Reply(content="Checking both.", tool_calls=[
    ToolCall("get_weather", {"city": "Oslo"}), ToolCall("get_weather", {"city": "Bergen"})]),
    "Oslo and Bergen are both 21 degrees."]


def test_tool_call_deltas_that_repeat_ids_and_names_are_assembled_once(journal):
    quirks = Quirks(repeat_tool_call_ids=True, no_stream_usage=True)
    log = []
    with LoopbackServer(TWO_CALLS, quirks=quirks) as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="any", max_retries=0)
        # openai's own accumulator concatenates what llama-cpp-python repeats (its stream
        # helper moved from client.beta to client.chat in openai 1.92):
        stream_helper = getattr(client.chat.completions, "stream", None) or \
            client.beta.chat.completions.stream
        with stream_helper(model=MODEL, messages=[USER]) as stream:
            for _ in stream:
                pass
            helper = stream.get_final_completion().choices[0].message.tool_calls[0]
        assert helper.function.name.startswith("get_weatherget_weather")
        messages = dn.execute("r", tool_loop(client, weather_tool(log)), journal=journal)
        assert srv.count(kind="invalid") == 0
    assert log == ["Oslo", "Bergen"]  # both tools really ran
    calls = messages[1]["tool_calls"]
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("call_0_0", "get_weather", '{"city": "Oslo"}'),
        ("call_0_1", "get_weather", '{"city": "Bergen"}')]
    assert messages[1]["content"] == "Checking both."
    assert messages[-1]["content"] == "Oslo and Bergen are both 21 degrees."


def test_without_usage_from_the_server_the_usage_is_estimated_and_marked(journal):
    with LoopbackServer(TWO_CALLS, quirks=Quirks(no_stream_usage=True)) as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="any", max_retries=0)
        dn.execute("r", tool_loop(client, weather_tool([])), journal=journal)
        # What the server would have reported, asked without streaming:
        truth = client.chat.completions.create(model=MODEL, messages=[USER],
                                               tools=[weather_tool([]).schema]).usage
    first = next(s for s in journal.steps("r") if s.kind == "chat")
    assert first.meta["estimated"] is True
    assert (first.prompt_tokens, first.completion_tokens) == (truth.prompt_tokens,
                                                              truth.completion_tokens)
    assert dn.serde.decode(first.result).usage.prompt_tokens == truth.prompt_tokens
    record = dn.get_run("r", journal=journal)
    chats = [s for s in journal.steps("r") if s.kind == "chat"]
    assert record.prompt_tokens == sum(s.prompt_tokens for s in chats) > 0
    assert record.completion_tokens == sum(s.completion_tokens for s in chats) > 0
    # The panel says these counts are ours, in the step's row and its details.
    panel = RunPanel.load(record, journal=journal)
    assert f"~{first.prompt_tokens:,}+{first.completion_tokens:,} tok (estimated)" in \
        panel.timeline.value
    assert "tokens estimated by durable_nb: the server sent no usage" in \
        panel.steps.render(first)


@pytest.mark.parametrize("separate", [True, False])
def test_usage_sent_by_the_server_is_taken_as_it_is(journal, separate):
    with LoopbackServer(["short answer"],
                        quirks=Quirks(final_empty_choices_usage=separate)) as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="any", max_retries=0)
        reply = dn.execute("r", lambda ctx: ctx.chat(client=client, model=MODEL, messages=[USER],
                                                     stream=True), journal=journal)
        (request,) = srv.requests
    assert request["stream_options"] == {"include_usage": True}
    assert reply.usage.prompt_tokens == count_message_tokens([USER], MODEL)
    assert reply.usage.completion_tokens == len(encoding_for(MODEL).encode("short answer"))
    assert "estimated" not in next(iter(journal.steps("r"))).meta


def test_a_streamed_reply_cut_at_its_cap_comes_back_like_the_non_streamed_one(journal):
    with LoopbackServer([LONG]) as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="any", max_retries=0)
        plain = client.chat.completions.create(model=MODEL, messages=[USER], max_tokens=5)

        def handler(ctx):
            return ctx.chat(client=client, model=MODEL, messages=[USER], max_tokens=5,
                            stream=True)

        shown = Shown()
        streamed = Runner("r", handler, journal=journal, observer=shown).run().result
        assert srv.count() == 2
        replayed = dn.execute("r", handler, journal=journal)
        assert srv.count() == 2
    choice = streamed.choices[0]
    assert choice.finish_reason == "length" == plain.choices[0].finish_reason
    assert choice.message.content == plain.choices[0].message.content != LONG
    assert streamed.usage.completion_tokens == 5
    assert replayed == streamed
    assert "".join(shown.text) == choice.message.content + "\n"
    (step,) = journal.steps("r")
    assert step.ok and step.completion_tokens == 5


def test_async_streaming_is_journaled_and_replayed(journal):
    log = []
    with LoopbackServer(TWO_CALLS, quirks=Quirks(repeat_tool_call_ids=True,
                                                  no_stream_usage=True)) as srv:
        aclient = openai.AsyncOpenAI(base_url=srv.url, api_key="any", max_retries=0)
        tool = weather_tool(log)

        async def handler(ctx):
            messages = [USER]
            while True:
                reply = await ctx.chat_async(client=aclient, model=MODEL, messages=messages,
                                             tools=[tool.schema], stream=True)
                message = reply.choices[0].message
                messages.append(dn.assistant_message(message))
                if not message.tool_calls:
                    return message.content
                messages += ctx.call_tools(message, [tool])

        shown = Shown()
        first = Runner("r", handler, journal=journal, observer=shown).run().result
        assert dn.execute("r", handler, journal=journal) == first
        assert srv.count() == 2
    assert first == "Oslo and Bergen are both 21 degrees."
    assert "".join(shown.text) == "Checking both.\nOslo and Bergen are both 21 degrees.\n"
    assert sorted(log) == ["Bergen", "Oslo"]
    assert all(s.meta["estimated"] for s in journal.steps("r") if s.kind == "chat")


def test_a_server_refusing_stream_options_is_asked_again_without(journal):
    with LoopbackServer(["fine"]) as srv:
        srv.fail_next(1, 400, body={"error": {
            "message": "Unrecognized request argument supplied: stream_options",
            "type": "invalid_request_error", "param": None, "code": None}})
        client = openai.OpenAI(base_url=srv.url, api_key="any", max_retries=0)
        reply = dn.execute("r", lambda ctx: ctx.chat(client=client, model=MODEL, messages=[USER],
                                                     stream=True), journal=journal)
        (request,) = srv.requests
    assert reply.choices[0].message.content == "fine"
    assert "stream_options" not in request and srv.count(kind="failure") == 1


# --- the assembler on chunks no loopback quirk produces ----------------------------------------

def chunk(delta, finish=None, index=0):
    return {"id": "c1", "created": 1, "model": MODEL, "object": "chat.completion.chunk",
            "choices": [{"index": index, "delta": delta, "finish_reason": finish}]}


def test_a_name_sent_in_pieces_is_joined_only_toward_a_known_tool():
    pieces = [{"role": "assistant", "content": None},
              {"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                               "function": {"name": "get_", "arguments": ""}}]},
              {"tool_calls": [{"index": 0, "function": {"name": "weather", "arguments": "{}"}}]}]
    known = ChatAssembler(tools=[{"type": "function", "function": {"name": "get_weather"}}])
    unknown = ChatAssembler(tools=[{"type": "function", "function": {"name": "other"}}])
    for assembler in (known, unknown):
        for delta in pieces:
            assembler.add(chunk(delta))
        assembler.add(chunk({}, "tool_calls"))
    assert known.completion().choices[0].message.tool_calls[0].function.name == "get_weather"
    assert unknown.completion().choices[0].message.tool_calls[0].function.name == "get_"


def test_tool_call_pieces_without_an_index_are_told_apart_by_their_ids():
    assembler = ChatAssembler()
    for call_id, name in (("call_a", "f"), ("call_b", "g")):
        assembler.add(chunk({"tool_calls": [{"id": call_id, "type": "function",
                                             "function": {"name": name, "arguments": "{}"}}]}))
    assembler.add(chunk({}, "tool_calls"))
    calls = assembler.completion().choices[0].message.tool_calls
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        ("call_a", "f", "{}"), ("call_b", "g", "{}")]


def test_a_stream_that_ends_early_or_empty_is_a_reply_problem():
    cut = ChatAssembler()
    cut.add(chunk({"role": "assistant", "content": "half a rep"}))
    with pytest.raises(ReplyProblem, match="before the reply was finished") as early:
        cut.completion()
    assert early.value.transient  # a cut connection: sent again
    with pytest.raises(ReplyProblem, match="without sending anything") as empty:
        ChatAssembler().completion()
    assert empty.value.transient  # llama-cpp-python does it now and then: sent again


def test_reading_stops_after_the_pieces_asked_for_and_closes_the_stream():
    # A server that ignores the request's cap (llama-cpp-python) would go on to the end of
    # the model's window; the summary of ctx.compact stops reading and closes the stream.
    sent = []

    class Stream:
        closed = False

        def __iter__(self):
            yield chunk({"role": "assistant", "content": ""})
            for n in range(1000):
                sent.append(n)
                yield chunk({"content": f" w{n}"})
            yield chunk({}, "stop")

        def close(self):
            self.closed = True

    stream = Stream()
    assembler = ChatAssembler(stop_after_pieces=40)
    drain(lambda: stream, assembler)
    reply = assembler.completion()
    assert len(sent) == 40 and stream.closed
    assert reply.choices[0].finish_reason == "length"  # cut, as a cap cuts
    assert reply.choices[0].message.content == "".join(f" w{n}" for n in range(40))


@pytest.mark.parametrize("ignores_cap", [True, False])
def test_a_streamed_reply_is_read_no_further_than_a_little_past_its_cap(journal, ignores_cap):
    # llama-cpp-python ignores max_completion_tokens: its reply would run to the end of the
    # model's window, past the run's token budget. A server that keeps the cap is read whole.
    long = " ".join(f"word{n}" for n in range(300))
    quirks = Quirks(ignore_completion_caps=ignores_cap, no_stream_usage=ignores_cap,
                    chunk_per_token=True)
    with LoopbackServer([long], quirks=quirks) as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="any", max_retries=0)
        reply = dn.execute("r", lambda ctx: ctx.chat(
            client=client, model=MODEL, messages=[USER], stream=True,
            max_completion_tokens=50), journal=journal, max_tokens=200)
    choice = reply.choices[0]
    assert choice.finish_reason == "length" and long.startswith(choice.message.content)
    if ignores_cap:  # read to the cap and 32 pieces of slack, then the stream was closed
        assert len(encoding_for(MODEL).encode(choice.message.content)) == 50 + 32
        assert reply.usage.completion_tokens == 82
    else:  # the server's own cut, with its usage
        assert reply.usage.completion_tokens == 50
    assert dn.get_run("r", journal=journal).completion_tokens <= 200
