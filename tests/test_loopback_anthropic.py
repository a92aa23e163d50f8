"""The loopback server's Anthropic Messages API (``/v1/messages``), driven by the real
``anthropic`` client over HTTP: scripted rounds as Messages API replies, whole and streamed,
and a request the API refuses."""

from __future__ import annotations

import pytest

anthropic = pytest.importorskip("anthropic")

from durable_nb.testing import LoopbackServer, Reply, ToolCall  # noqa: E402

SCRIPT = [Reply(content="Looking.", tool_calls=[ToolCall("find_flight", {"city": "Oslo"})]),
          "SK123 at 07:10."]
TOOLS = [{"name": "find_flight", "description": "Find a flight.",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]


def _client(server: LoopbackServer) -> "anthropic.Anthropic":
    return anthropic.Anthropic(base_url=server.url.removesuffix("/v1"), api_key="offline",
                               max_retries=0)


def _rounds(client: "anthropic.Anthropic", streamed: bool) -> list:
    messages = [{"role": "user", "content": "A flight to Oslo?"}]
    replies = []
    for _ in range(2):
        request = dict(model="claude-sonnet-4-5", max_tokens=100, tools=TOOLS,
                       system="Find flights.", messages=messages)
        if streamed:
            with client.messages.stream(**request) as stream:
                reply = stream.get_final_message()
        else:
            reply = client.messages.create(**request)
        replies.append(reply)
        calls = [b for b in reply.content if b.type == "tool_use"]
        messages = [*messages, {"role": "assistant", "content": reply.content},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": c.id, "content": "SK123"}
                        for c in calls]}]
    return replies


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_scripted_rounds_answer_as_messages_api_replies(streamed):
    with LoopbackServer(SCRIPT) as server:
        first, second = _rounds(_client(server), streamed)
        stats = server.stats()
    assert [b.type for b in first.content] == ["text", "tool_use"]
    assert first.content[0].text == "Looking."
    assert (first.content[1].name, first.content[1].input) == ("find_flight", {"city": "Oslo"})
    assert first.stop_reason == "tool_use" and first.usage.input_tokens > 0
    assert first.usage.output_tokens > 0
    assert second.content[0].text == "SK123 at 07:10." and second.stop_reason == "end_turn"
    assert stats["by_round"] == {"0": 1, "1": 1}


def test_a_request_without_max_tokens_is_refused_with_400():
    with LoopbackServer(SCRIPT) as server:
        with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
            _client(server).post("/v1/messages", cast_to=object, body={
                "model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "hi"}]})
        assert server.stats()["invalid"] == 1
