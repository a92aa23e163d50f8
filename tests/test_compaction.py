"""ctx.compact over the real openai client and the loopback server (which refuses, with 400,
a request whose tool calls and tool results do not pair up, so a bad split fails a test)."""

import openai
import pytest

import durable_nb as dn
from durable_nb.llm.compaction import DEFAULT_THRESHOLD, SUMMARY_PREFIX
from durable_nb.export import export_data, export_notebook
from durable_nb.notebook.panel import RunPanel
from durable_nb.testing import LoopbackServer, Quirks, Reply, ToolCall
from durable_nb.llm.tokens import count_message_tokens, encoding_for
from durable_nb.llm.tools import tool as make_tool

MODEL = "loopback-1"
WINDOW = 3000
SYSTEM = {"role": "system", "content": "You are a careful data agent."}
GOAL = {"role": "user", "content": "Fetch pages until you know the total of every row."}
ITERATIONS = 16
KEEP_LAST = 2


def fetch_page(page: int) -> str:
    """Return one bulky page of rows."""
    return f"page {page}: " + " ".join(f"row{page}-{i}=value{i * 7 % 13}" for i in range(45))


@pytest.fixture
def server():
    # Every reply is one tool call; the handler decides when to stop.
    script = [Reply(tool_calls=[ToolCall("fetch_page", {"page": n})]) for n in range(40)]
    with LoopbackServer(script) as srv:
        yield srv


def agent(log):
    """An agent loop that compacts before every model call; ``log`` gets, per iteration,
    the estimate before compacting and the compacted list."""

    def handler(ctx):
        messages = [SYSTEM, GOAL]
        for _ in range(ITERATIONS):
            before = count_message_tokens(messages, MODEL)
            messages = ctx.compact(messages, keep_last=KEEP_LAST)
            log.append((before, [dict(m) if isinstance(m, dict) else m.model_dump(
                exclude_none=True) for m in messages]))
            reply = ctx.chat(messages=messages).choices[0].message
            messages.append(reply)
            messages.extend(ctx.call_tools(reply, [fetch_page]))
        return [m if isinstance(m, dict) else m.model_dump(exclude_none=True) for m in messages]

    return handler


def options(server, **more):
    client = openai.OpenAI(base_url=server.url, api_key="any", max_retries=0)
    return {"model": MODEL, "client": client, "context_windows": {MODEL: WINDOW}, **more}


#: For tests that log what each execution of the handler saw: no extra verifying execution.
ONE_EXECUTION = {"verify_replay": False}


def is_compacted(messages):
    return any(m["role"] == "user" and m["content"].startswith(SUMMARY_PREFIX)
               for m in messages)


def test_compacts_only_when_the_estimate_passes_the_threshold(journal, server):
    log = []
    dn.execute("r", agent(log), journal=journal, **options(server, **ONE_EXECUTION))
    compacted_at = [i for i, (before, after) in enumerate(log)
                    if before > DEFAULT_THRESHOLD * WINDOW]
    assert compacted_at, "the conversation never reached the threshold"
    assert len(compacted_at) < ITERATIONS
    for i, (before, after) in enumerate(log):
        assert (count_message_tokens(after, MODEL) < before) == (i in compacted_at)
    compactions = [s for s in journal.steps("r") if s.kind == "compact"]
    assert len(compactions) == len(compacted_at) == server.count(kind="summary")
    for step, i in zip(compactions, compacted_at):
        assert step.name == MODEL
        assert step.meta["tokens_before"] == log[i][0]
        assert step.meta["tokens_after"] == count_message_tokens(log[i][1], MODEL)
        assert step.meta["tokens_after"] < DEFAULT_THRESHOLD * WINDOW
        assert step.prompt_tokens > 0 and step.completion_tokens > 0


def test_compacted_messages_keep_system_goal_and_whole_tool_call_rounds(journal, server):
    log = []
    dn.execute("r", agent(log), journal=journal, **options(server))
    assert server.count(kind="invalid") == 0  # every request after a compaction was accepted
    assert server.count(kind="chat") == ITERATIONS
    compacted = [messages for before, messages in log if before > DEFAULT_THRESHOLD * WINDOW]
    assert len(compacted) >= 2
    for messages in compacted:
        assert messages[:2] == [SYSTEM, GOAL]
        assert messages[2]["content"].startswith(SUMMARY_PREFIX)
        rest = messages[3:]
        assert [m["role"] for m in rest] == ["assistant", "tool"] * KEEP_LAST
        for call_message, result in zip(rest[::2], rest[1::2]):
            assert result["tool_call_id"] == call_message["tool_calls"][0]["id"]


def test_a_later_compaction_folds_the_previous_summary_in(journal, server):
    log = []
    dn.execute("r", agent(log), journal=journal, **options(server))
    summaries = [s for s in journal.steps("r") if s.kind == "compact"]
    assert len(summaries) >= 2
    requests = [r for r in server.requests
                if "Summarise the conversation" in r["messages"][0]["content"]]
    first = dn.serde.decode(summaries[0].result)["summary"]
    assert first in requests[1]["messages"][1]["content"]
    # The compacted list carries one summary, the newest, never the previous one.
    for before, messages in log:
        assert sum(m["content"].startswith(SUMMARY_PREFIX) for m in messages
                   if m["role"] == "user") <= 1
    last = dn.serde.decode(summaries[-1].result)["summary"]
    assert log[-1][1][2]["content"] == f"{SUMMARY_PREFIX}\n{last}"


def test_the_summary_is_the_runs_context_summary(journal, server):
    dn.execute("r", agent([]), journal=journal, **options(server))
    last = [s for s in journal.steps("r") if s.kind == "compact"][-1]
    info = dn.get_run("r", journal=journal)
    assert info.context_summary == dn.serde.decode(last.result)["summary"]
    assert info.prompt_tokens >= sum(s.prompt_tokens for s in info.steps if s.kind == "compact")


def test_replay_returns_the_same_messages_without_a_summary_call(journal, server):
    first_log, replay_log = [], []
    first = dn.execute("r", agent(first_log), journal=journal,
                       **options(server, **ONE_EXECUTION))
    summaries, chats = server.count(kind="summary"), server.count(kind="chat")
    assert summaries >= 2
    again = dn.execute("r", agent(replay_log), journal=journal, **options(server))
    assert again == first
    assert replay_log == first_log
    assert (server.count(kind="summary"), server.count(kind="chat")) == (summaries, chats)


def test_a_resumed_run_replays_compactions_and_goes_on(journal, server):
    calls = []

    def fetch_page_once_interrupted(page: int) -> str:
        calls.append(page)
        if len(calls) == 10:
            raise KeyboardInterrupt("simulated interrupt of the kernel")
        return fetch_page(page)

    tool = make_tool(fetch_page_once_interrupted, name="fetch_page")

    def handler(ctx):
        messages = [SYSTEM, GOAL]
        for _ in range(ITERATIONS):
            messages = ctx.compact(messages, keep_last=KEEP_LAST)
            reply = ctx.chat(messages=messages).choices[0].message
            messages.append(reply)
            messages.extend(ctx.call_tools(reply, [tool]))
        return len(messages)

    with pytest.raises(KeyboardInterrupt):
        dn.execute("r", handler, journal=journal, **options(server))
    before_resume = server.count(kind="summary")
    assert before_resume >= 1
    dn.execute("r", handler, journal=journal, **options(server))
    compactions = sum(1 for s in journal.steps("r") if s.kind == "compact")
    # The compactions journaled before the interruption were replayed, not made again.
    assert compactions > before_resume
    assert server.count(kind="summary") == compactions
    assert server.count(kind="invalid") == 0


def test_below_the_threshold_nothing_is_journaled(journal, server):
    messages = [SYSTEM, GOAL, {"role": "assistant", "content": "Working on it."}]

    def handler(ctx):
        return ctx.compact(messages) is messages

    assert dn.execute("r", handler, journal=journal, **options(server)) is True
    assert list(journal.steps("r")) == []
    assert server.count(kind="summary") == 0


def test_the_summary_call_fits_a_small_summary_models_window(journal, server):
    small = 900  # far smaller than the conversation being summarised

    def handler(ctx):
        messages = [SYSTEM, GOAL]
        for n in range(12):
            call = {"id": f"c{n}", "type": "function",
                    "function": {"name": "fetch_page", "arguments": f'{{"page": {n}}}'}}
            messages += [{"role": "assistant", "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": f"c{n}", "content": fetch_page(n)}]
        return ctx.compact(messages, keep_last=1, summary_model="loopback-small")

    opts = options(server)
    opts["context_windows"]["loopback-small"] = small
    compacted = dn.execute("r", handler, journal=journal, **opts)
    assert is_compacted(compacted) and len(compacted) == 5
    (request,) = server.requests
    assert request["model"] == "loopback-small"
    assert count_message_tokens(request["messages"], "loopback-small") \
        + request["max_completion_tokens"] <= small
    assert "tokens omitted" in request["messages"][1]["content"]


def test_parallel_tool_calls_stay_with_all_their_results(journal):
    script = [Reply(tool_calls=[ToolCall("fetch_page", {"page": n}),
                                ToolCall("fetch_page", {"page": n + 100})]) for n in range(40)]
    log = []
    with LoopbackServer(script) as srv:
        dn.execute("r", agent(log), journal=journal, **options(srv))
        assert srv.count(kind="summary") >= 2
        assert srv.count(kind="invalid") == 0
        assert srv.count(kind="chat") == ITERATIONS
    for before, messages in log:
        if before > DEFAULT_THRESHOLD * WINDOW:
            assert [m["role"] for m in messages[3:]] == ["assistant", "tool", "tool"] * KEEP_LAST


# --- compaction that always shrinks -------------------------------------------------------------

def test_a_summary_is_held_to_its_cap_when_the_server_ignores_it(journal):
    # llama-cpp-python ignores max_completion_tokens: summaries of 160-570 tokens for a cap
    # of 125. The loopback summary quotes the start of the goal: here 63 characters of 4
    # tokens each, twice the cap.
    goal = {"role": "user", "content": "\N{LINEAR B SYLLABLE B008 A}" * 80}
    page = make_tool(lambda page: f"page {page}: ok", name="fetch_page")
    script = [Reply(tool_calls=[ToolCall("fetch_page", {"page": n})]) for n in range(40)]
    with LoopbackServer(script, quirks=Quirks(ignore_completion_caps=True)) as srv:
        def handler(ctx):
            messages = [SYSTEM, goal]
            for _ in range(ITERATIONS):
                messages = ctx.compact(messages, keep_last=KEEP_LAST, summary_model="small-1")
                reply = ctx.chat(messages=messages).choices[0].message
                messages += [dn.assistant_message(reply), *ctx.call_tools(reply, [page])]
            return messages

        opts = options(srv)
        # The summary cap is max(64, min(1000, window // 8)): 125 tokens, as in the issue.
        opts["context_windows"] = {MODEL: 1000, "small-1": 1000}
        dn.execute("r", handler, journal=journal, **opts)
        assert srv.count(kind="summary") >= 1
    enc = encoding_for("small-1")
    compactions = [s for s in journal.steps("r") if s.kind == "compact"]
    assert compactions
    for step in compactions:
        summary = dn.serde.decode(step.result)["summary"]
        assert step.completion_tokens > 125  # the server sent more than the cap ...
        assert len(enc.encode(summary)) <= 125  # ... and the summary was cut to it
        assert summary.endswith("[...]") and step.meta["summary_truncated"] is True
        assert step.meta["tokens_after"] < step.meta["tokens_before"]


def test_a_compaction_that_would_not_shrink_is_not_applied_and_replays_so(journal, server):
    # Two short rounds to summarise: the summary message would be longer than they are.
    messages = [SYSTEM, GOAL, {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "go on"}, {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "go on"}, {"role": "assistant", "content": "done"}]
    before = count_message_tokens(messages, MODEL)
    seen = []

    def handler(ctx):
        compacted = ctx.compact(messages, keep_last=1, threshold=0.1, summary_model="big-1")
        seen.append(compacted is messages)
        return len(compacted)

    opts = options(server, verify_replay=False)
    opts["context_windows"] = {MODEL: before * 2}  # over the threshold of 0.1
    assert dn.execute("r", handler, journal=journal, **opts) == len(messages)
    (step,) = journal.steps("r")
    after = step.meta["tokens_after"]
    assert step.kind == "compact" and dn.serde.decode(step.result)["applied"] is False
    assert after >= before == step.meta["tokens_before"]
    assert step.meta["skipped"] is True
    assert step.meta["note"] == f"compaction skipped: would not shrink ({before} -> {after} tokens)"
    assert step.prompt_tokens > 0  # the summary call was paid for, and is counted
    assert dn.get_run("r", journal=journal).context_summary is None
    # Replay takes the same path without a call.
    assert dn.execute("r", handler, journal=journal, **opts) == len(messages)
    assert seen == [True, True] and server.count(kind="summary") == 1
    # The panel and an export say it was skipped, not that the context was compacted.
    info = dn.get_run("r", journal=journal)
    row = RunPanel.load(info, journal=journal).timeline.value
    assert f"skipped, would not shrink: {before} &rarr; {after} tok" in row
    report = "\n".join(cell.source for cell in
                       export_notebook(export_data(info, journal=journal)).cells)
    assert "**Compaction skipped**: the summary would not have shrunk the conversation " \
        f"({before} → {after} tokens)" in report
    assert "Context compacted" not in report


def test_a_server_that_will_not_stream_the_summary_model_is_asked_without(journal, server):
    # The summary is streamed (to stop reading at its cap); OpenAI refuses streaming for
    # some models. The compaction must not fail where an unstreamed call works.
    server.fail_next(1, 400, body={"error": {
        "message": "Unsupported value: 'stream' does not support true with this model. Only "
                   "the default (false) value is supported.",
        "type": "invalid_request_error", "param": "stream", "code": "unsupported_value"}})
    messages = [SYSTEM, GOAL, {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "go on"}, {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "go on"}, {"role": "assistant", "content": "done"}]
    opts = options(server)
    opts["context_windows"] = {MODEL: count_message_tokens(messages, MODEL) * 2}
    dn.execute("r", lambda ctx: len(ctx.compact(messages, keep_last=1, threshold=0.1,
                                                summary_model="big-1")),
               journal=journal, **opts)
    assert server.count(kind="failure") == 1 and server.count(kind="summary") == 1
    (asked,) = server.requests  # the one answered: not streamed
    assert not asked.get("stream")
    (step,) = journal.steps("r")
    assert step.kind == "compact" and step.prompt_tokens > 0
    assert "estimated" not in step.meta  # the server's own usage
