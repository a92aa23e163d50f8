"""Agent-loop essentials over the real openai client and the loopback server: tool calls,
approvals inside them, budgets, async steps and streaming."""

import asyncio
import threading
import time

import openai
import pytest

import durable_nb as dn
from durable_nb import Status
from durable_nb.runner import RunOptions, Runner
from durable_nb.testing import LoopbackServer, Quirks, Reply, ToolCall


def _script(server, *replies):
    server.script = tuple(Reply.coerce(r) for r in replies)


@pytest.fixture
def server():
    with LoopbackServer() as s:
        yield s


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="test", max_retries=0)


def _loop(ctx, client, tools, model="gpt-4"):
    messages = [{"role": "user", "content": "go"}]
    schemas = [t.schema for t in tools]
    while True:
        message = ctx.chat(client=client, model=model, messages=messages,
                           tools=schemas).choices[0].message
        messages.append(dn.assistant_message(message))
        if not message.tool_calls:
            return messages
        messages += ctx.call_tools(message, tools)


def _tools(log):
    @dn.tool
    def lookup(city: str) -> dict:
        """Weather for a city."""
        log.append(("lookup", city))
        return {"city": city, "temp": 21}

    @dn.tool(needs_approval=lambda args: args["amount"] > 100)
    def pay(amount: int, to: str) -> str:
        """Pay someone."""
        log.append(("pay", amount))
        return f"paid {amount} to {to}"

    @dn.tool
    def explode() -> str:
        """Always fails."""
        raise RuntimeError("kaboom")

    return [lookup, pay, explode]


def test_call_tools_runs_each_call_as_a_journaled_step(journal, server, client):
    _script(server, Reply(tool_calls=[ToolCall("lookup", {"city": "Oslo"}),
                                       ToolCall("pay", {"amount": 5, "to": "bo"})]), "done")
    log = []
    messages = dn.execute("r", lambda ctx: _loop(ctx, client, _tools(log)), journal=journal)
    tool_messages = [m for m in messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["call_0_0", "call_0_1"]
    assert '"temp": 21' in tool_messages[0]["content"] and tool_messages[1]["content"] == "paid 5 to bo"
    assert [(s.kind, s.name) for s in journal.steps("r")] == [
        ("chat", "gpt-4"), ("run", "lookup"), ("run", "pay"), ("chat", "gpt-4")]
    # Replay: same messages, no tool runs, no LLM request.
    requests = server.count()
    assert dn.execute("r", lambda ctx: _loop(ctx, client, _tools(log)), journal=journal) == messages
    assert log == [("lookup", "Oslo"), ("pay", 5)] and server.count() == requests


def _decide_when_waiting(journal, run_id, approve, note):
    def decide():
        deadline = time.time() + 20
        while time.time() < deadline:
            record = journal.find_run(run_id)
            if record is not None and record.pending_approval:
                (dn.approve if approve else dn.reject)(run_id, note, by="ana", journal=journal)
                return
            time.sleep(0.02)
    thread = threading.Thread(target=decide)
    thread.start()
    return thread


@pytest.mark.parametrize("approve", [True, False])
def test_tool_needing_approval_waits_and_a_rejection_is_told_to_the_model(
        journal, server, client, approve):
    _script(server, Reply(tool_calls=[ToolCall("pay", {"amount": 500, "to": "bo"})]), "ok")
    log = []
    decider = _decide_when_waiting(journal, "r", approve, "too much" if not approve else None)
    messages = dn.execute("r", lambda ctx: _loop(ctx, client, _tools(log)), journal=journal)
    decider.join()
    tool_message = next(m for m in messages if m["role"] == "tool")
    steps = list(journal.steps("r"))
    assert steps[1].kind == "approval" and steps[1].result["by"] == "ana"
    if approve:
        assert log == [("pay", 500)] and tool_message["content"] == "paid 500 to bo"
    else:
        assert log == []
        assert "rejected" in tool_message["content"] and "too much" in tool_message["content"]
        assert [s.kind for s in steps] == ["chat", "approval", "chat"]


def test_malformed_tool_calls_become_error_messages_for_the_model(journal, server, client):
    _script(server, Reply(tool_calls=[
        ToolCall("lookup", "{not json"), ToolCall("nope", {}),
        ToolCall("lookup", {"town": "Oslo"}), ToolCall("explode", {})]), "sorry")
    messages = dn.execute("r", lambda ctx: _loop(ctx, client, _tools([])), journal=journal)
    errors = [m["content"] for m in messages if m["role"] == "tool"]
    assert "not valid JSON" in errors[0]
    assert "no tool named 'nope'" in errors[1] and "lookup" in errors[1]
    assert "city" in errors[2] and "town" in errors[2]
    assert "RuntimeError: kaboom" in errors[3]
    assert dn.get_run("r", journal=journal).status is Status.DONE


def test_parallel_tool_calls_run_together_and_replay_by_call_order(journal, server, client):
    _script(server, Reply(tool_calls=[ToolCall("slow", {"n": n}) for n in (3, 1, 2)]), "done")
    all_running = threading.Barrier(3, timeout=10)  # proves the three calls overlap
    ran = []

    @dn.tool
    def slow(n: int) -> int:
        """Sleeps n tenths of a second."""
        all_running.wait()
        time.sleep(n / 10)
        ran.append(n)
        return n

    def handler(ctx):
        message = ctx.chat(client=client, model="gpt-4", messages=[{"role": "user", "content": "go"}],
                           tools=[slow.schema]).choices[0].message
        return [m["content"] for m in ctx.call_tools(message, [slow], parallel=True)]

    assert dn.execute("r", handler, journal=journal) == ["3", "1", "2"]
    steps = list(journal.steps("r"))
    # Entries stand in the order the calls finished; each is keyed by its place in the call.
    assert [s.result for s in steps[1:]] == [1, 2, 3]
    assert {s.key: s.result for s in steps[1:]} == {"1": 3, "2": 1, "3": 2}
    assert dn.execute("r", handler, journal=journal) == ["3", "1", "2"]
    assert sorted(ran) == [1, 2, 3]  # replay ran nothing


def test_token_budget_stops_before_the_call_that_would_pass_it(journal, server, client):
    _script(server, "one", "two")

    def handler(ctx):
        messages = [{"role": "user", "content": "hi"}]
        for _ in range(2):
            reply = ctx.chat(client=client, model="gpt-4", messages=messages, max_tokens=5)
            messages += [dn.assistant_message(reply.choices[0].message),
                         {"role": "user", "content": "more " * 30}]

    with pytest.raises(dn.BudgetExhausted, match=r"token budget exhausted: used \d+ of 40"):
        dn.execute("r", handler, journal=journal, max_tokens=40)
    assert server.count() == 1
    record = dn.get_run("r", journal=journal)
    assert record.status is Status.FAILED and "token budget exhausted" in record.error
    assert record.prompt_tokens + record.completion_tokens <= 40
    # Raising the budget lets the run go on from where it stopped.
    dn.execute("r", handler, journal=journal, max_tokens=10_000)
    assert server.count() == 2


def test_request_larger_than_the_context_window_fails_before_sending(journal, server, client):
    def handler(ctx):
        ctx.chat(client=client, model="gpt-4", messages=[{"role": "user", "content": "word " * 9000}])

    with pytest.raises(dn.BudgetExhausted, match=r"more than the context window of gpt-4 \(8192\)"):
        dn.execute("r", handler, journal=journal)
    assert server.count() == 0


def test_async_steps_run_concurrently_and_replay_in_order(journal, server):
    aclient = openai.AsyncOpenAI(base_url=server.url, api_key="test", max_retries=0)
    _script(server, "async reply")
    calls = []

    async def fetch(i):
        calls.append(i)
        await asyncio.sleep(0.2)
        return i * 10

    async def handler(ctx):
        values = await asyncio.gather(*[ctx.run_async(f"fetch {i}", fetch, i) for i in range(4)])
        reply = await ctx.chat_async(client=aclient, model="gpt-4",
                                     messages=[{"role": "user", "content": "hi"}])
        return values, reply.choices[0].message.content

    started = time.monotonic()
    assert dn.execute("r", handler, journal=journal) == ([0, 10, 20, 30], "async reply")
    assert time.monotonic() - started < 0.75  # concurrent: 4 x 0.2 s would be 0.8 s
    assert [s.name for s in journal.steps("r")][:4] == [f"fetch {i}" for i in range(4)]
    assert dn.execute("r", handler, journal=journal) == ([0, 10, 20, 30], "async reply")
    assert sorted(calls) == [0, 1, 2, 3] and server.count() == 1


def test_streamed_chat_shows_text_as_it_arrives_and_journals_the_whole_reply(
        journal, server, client):
    _script(server, "a streamed answer in pieces")
    shown = []

    class Watcher:
        def on_step(self, entry, replayed):
            pass

        def on_record(self, record):
            pass

        def on_text(self, delta):
            shown.append(delta)

    def handler(ctx):
        reply = ctx.chat(client=client, model="gpt-4", stream=True,
                         messages=[{"role": "user", "content": "hi"}])
        return reply.choices[0].message.content, reply.usage.completion_tokens

    first = Runner("r", handler, journal=journal, observer=Watcher()).run().result
    assert first[0] == "a streamed answer in pieces" and first[1] > 0
    # The text arrives in pieces, ended with a newline so that the next print starts afresh.
    assert len([d for d in shown if d]) > 2 and "".join(shown) == first[0] + "\n"
    assert dn.get_run("r", journal=journal).completion_tokens == first[1]
    assert Runner("r", handler, journal=journal,
                  options=RunOptions()).run().result == first
    assert server.count() == 1


@pytest.mark.parametrize("append, failures", [
    (dn.assistant_message, 0),
    (lambda m: m.model_dump(exclude_none=True), 1),  # no "content": the template fails
    (lambda m: m.model_dump(), 1),  # "content": null, refusal/audio/...: validation fails
])
def test_the_readme_loop_form_is_accepted_by_servers_that_need_string_content(
        journal, append, failures):
    # llama-cpp-python refuses an assistant message without a string "content" with HTTP 500.
    quirks = Quirks(require_content=True, require_string_content=True)
    with LoopbackServer([Reply(tool_calls=[ToolCall("lookup", {"city": "Oslo"})]), "sunny"],
                        quirks=quirks) as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="test", max_retries=2)
        tools = _tools([])

        def handler(ctx):
            messages = [{"role": "user", "content": "go"}]
            while True:
                message = ctx.chat(client=client, model="gpt-4", messages=messages,
                                   tools=[t.schema for t in tools]).choices[0].message
                messages.append(append(message))
                if not message.tool_calls:
                    return messages
                messages += ctx.call_tools(message, tools)

        if failures:
            with pytest.raises(dn.EndpointError, match="durable_nb.assistant_message"):
                dn.execute("r", handler, journal=journal)
        else:
            messages = dn.execute("r", handler, journal=journal)
            assert messages[1] == {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_0_0", "type": "function",
                 "function": {"name": "lookup", "arguments": '{"city": "Oslo"}'}}]}
            assert messages[-1] == {"role": "assistant", "content": "sunny"}
        # A deterministic 500 is sent once, not retried.
        assert srv.count(kind="failure") == failures and srv.count() == 2 - failures


def test_assistant_message_keeps_what_servers_accept_and_drops_the_rest():
    from openai.types.chat import ChatCompletion
    completion = ChatCompletion.model_validate({
        "id": "c", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {
            "role": "assistant", "content": None, "refusal": None, "audio": None,
            "annotations": None, "function_call": {"name": "old", "arguments": "{}"},
            "reasoning_content": "thinking...",
            "tool_calls": [{"id": "c1", "type": "function",
                            "function": {"name": "f", "arguments": "{}"}}]}}]})
    expected = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    assert dn.assistant_message(completion) == expected
    assert dn.assistant_message(completion.choices[0].message) == expected
    assert dn.assistant_message({"role": "assistant", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}) == {
        "role": "assistant", "content": "ab"}
    with pytest.raises(ValueError, match="not a 'user' one"):
        dn.assistant_message({"role": "user", "content": "hi"})
