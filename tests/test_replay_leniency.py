"""Replays never depend on the installed openai's strictness: a reply is journaled as it was
received and replayed as the openai client built it live (without validation), chat and
Responses, streamed and not, sync and async, through the durable client (ctx.chat and
ctx.respond underneath; the agent frameworks' model calls are tested in
test_openai_agents.py and test_pydantic_ai.py). The real openai client over HTTP to the loopback server in
its ``sparse_replies`` mode (fields left out, some of them ones the openai types require, as
llama.cpp's server leaves them out) and ``no_usage`` mode; .ci/run runs this file on the
oldest openai the package accepts as well as on the newest."""

from __future__ import annotations

import openai
import pydantic
import pytest
from openai.types.chat import ChatCompletion
from openai.types.responses import Response, ResponseUsage

import durable_nb
from durable_nb.testing import LoopbackServer, Quirks

MODEL = "loopback-1"
TEXT = "The weather in Oslo is mild today."
SPARSE = Quirks(sparse_replies=True)
NO_USAGE = Quirks(no_usage=True)


def _chunk_text(chunks) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def _event_text(events) -> str:
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


def _summary(api: str, reply, items=None) -> dict:
    """What a run returns about one reply, live and replayed alike."""
    if api == "chat" and items is None:
        return {"text": reply.choices[0].message.content, "finish": reply.choices[0].finish_reason,
                "tokens": reply.usage.completion_tokens if reply.usage else None}
    if api == "chat":
        return {"text": _chunk_text(items)}
    if items is None:
        return {"text": reply.output_text, "tokens": reply.usage.output_tokens,
                "status": reply.status}
    final = items[-1]
    return {"text": _event_text(items), "last": final.type,
            "final_text": final.response.output_text}


def _sync_call(ctx, api: str, stream: bool) -> dict:
    if api == "chat":
        reply = ctx.openai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Weather in Oslo?"}],
            stream=stream)
    else:
        reply = ctx.openai.responses.create(model=MODEL, input="Weather in Oslo?", stream=stream)
    return _summary(api, reply, list(reply) if stream else None)


async def _async_call(ctx, api: str, stream: bool) -> dict:
    if api == "chat":
        reply = await ctx.async_openai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Weather in Oslo?"}],
            stream=stream)
    else:
        reply = await ctx.async_openai.responses.create(model=MODEL, input="Weather in Oslo?",
                                                         stream=stream)
    return _summary(api, reply, [item async for item in reply] if stream else None)


def _run_twice(journal, api: str, stream: bool, asynchronous: bool, quirks: Quirks
               ) -> tuple[dict, dict, int]:
    """The call made live, then the run re-run (replayed): (live, replayed, requests)."""
    if asynchronous:
        async def handler(ctx):
            return await _async_call(ctx, api, stream)
        client = openai.AsyncOpenAI
    else:
        def handler(ctx):
            return _sync_call(ctx, api, stream)
        client = openai.OpenAI
    with LoopbackServer([TEXT], quirks=quirks) as server:
        options = dict(journal=journal, client=client(base_url=server.url, api_key="x",
                                                      max_retries=0))
        live = durable_nb.execute("r", handler, **options)
        replayed = durable_nb.execute("r", handler, **options)
        requests = server.count(endpoint="responses" if api == "responses" else "chat/completions")
    return live, replayed, requests


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("api", ["chat", "responses"])
def test_a_sparse_reply_replays_as_it_was_received(journal, api, stream, asynchronous):
    live, replayed, requests = _run_twice(journal, api, stream, asynchronous, SPARSE)
    assert live["text"] == TEXT and replayed == live
    assert requests == 1  # the re-run replayed from the journal
    [step] = journal.steps("r")
    assert step.kind == ("chat" if api == "chat" else "respond")
    assert step.prompt_tokens > 0 and step.completion_tokens > 0


def test_the_sparse_replies_are_ones_the_openai_types_refuse(journal):
    # What makes the test above mean something: validated strictly, as a replay did before,
    # the journaled replies fail on every openai the package accepts.
    with LoopbackServer([TEXT], quirks=SPARSE) as server:
        client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0)
        chat = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}])
        response = client.responses.create(model=MODEL, input="hi")
    assert chat.created is None and response.parallel_tool_calls is None
    with pytest.raises(pydantic.ValidationError):
        ChatCompletion.model_validate(chat.model_dump(mode="json"))
    with pytest.raises(pydantic.ValidationError):
        Response.model_validate(response.model_dump(mode="json"))


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_response_without_usage_gets_an_estimate_any_openai_accepts(journal, stream,
                                                                      asynchronous):
    live, replayed, requests = _run_twice(journal, "responses", stream, asynchronous, NO_USAGE)
    assert live["text"] == TEXT and replayed == live and requests == 1
    [step] = journal.steps("r")
    assert step.meta.get("estimated") and step.prompt_tokens > 0 and step.completion_tokens > 0

    def handler(ctx):
        reply = ctx.openai.responses.create(model=MODEL, input="Weather in Oslo?",
                                            stream=stream)
        if stream:
            list(reply)
            return reply.completion.usage
        return reply.usage

    nowhere = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="x", max_retries=0)
    usage = durable_nb.execute("r", handler, journal=journal, client=nowhere)  # replayed
    # The estimated usage is whole on the installed openai (3.57 requires
    # input_tokens_details.cache_write_tokens, older releases do not know it).
    assert ResponseUsage.model_validate(usage.model_dump(mode="json")) == usage


def test_a_chat_reply_without_usage_is_estimated_and_replays(journal):
    live, replayed, requests = _run_twice(journal, "chat", False, False, NO_USAGE)
    assert live["text"] == TEXT and replayed == live and requests == 1
    [step] = journal.steps("r")
    assert step.meta.get("estimated") and step.completion_tokens > 0
