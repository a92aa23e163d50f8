"""instructor over the durable client: ``instructor.from_openai(ctx.openai)`` makes its
structured calls journaled chat steps that replay to the same typed object.

instructor pins ``jiter<0.15``, which the openai the rest of the test extra resolves to
does not allow, so it is not in the test extra: ``.ci/run`` installs it in a phase of its own
and runs this file there (skipped where instructor is not installed)."""

from __future__ import annotations

import openai
import pydantic
import pytest

import durable_nb
from durable_nb.testing import LoopbackServer, Reply, ToolCall

instructor = pytest.importorskip("instructor")

MESSAGES = [{"role": "user", "content": "Plan three days in Oslo."}]


class Trip(pydantic.BaseModel):
    city: str
    days: int


def _seen(trip: Trip) -> list:
    # instructor returns an instance of a class it derives from Trip: its data is the result
    return [isinstance(trip, Trip), trip.model_dump()]


def _script() -> list[Reply]:
    return [Reply(tool_calls=[ToolCall("Trip", {"city": "Oslo", "days": 3})])]


def test_from_openai_structured_calls_are_chat_steps_replayed_to_the_same_object(journal):
    def handler(ctx):
        client = instructor.from_openai(ctx.openai)
        return _seen(client.chat.completions.create(model="loopback-1", messages=MESSAGES,
                                                    response_model=Trip))

    with LoopbackServer(_script()) as server:
        client = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0)
        runs = [durable_nb.execute("trip", handler, journal=journal, client=client)
                for _ in range(2)]
        sent = server.requests[0]
        calls = server.stats()["chat"]
    assert runs == [[True, {"city": "Oslo", "days": 3}]] * 2
    assert sent["tools"][0]["function"]["name"] == "Trip"  # instructor's own request
    assert calls == 1
    assert [e.kind for e in journal.steps("trip")] == ["chat"]


def test_the_async_client_works_with_from_openai_too(journal):
    async def handler(ctx):
        client = instructor.from_openai(ctx.async_openai)
        return _seen(await client.chat.completions.create(
            model="loopback-1", messages=MESSAGES, response_model=Trip))

    with LoopbackServer(_script()) as server:
        client = openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0)
        runs = [durable_nb.execute("atrip", handler, journal=journal, client=client)
                for _ in range(2)]
        calls = server.stats()["chat"]
    assert runs == [[True, {"city": "Oslo", "days": 3}]] * 2 and calls == 1
