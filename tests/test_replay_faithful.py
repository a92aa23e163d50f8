"""Replay returns what the first run observed, or refuses before anything diverges: one
regression test per pattern that used to diverge, written as a user writes the code."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
import threading
import time

import openai
import pytest

import durable_nb as dn
from durable_nb import Status
from durable_nb.testing import LoopbackServer


@pytest.fixture
def server():
    with LoopbackServer(["first answer", "second answer", "third answer"]) as s:
        yield s


# 1. Concurrent multi-step tasks ----------------------------------------------------------

def _pages_agent(fetched: list):
    async def fetch_and_upper(ctx, page: int) -> str:
        async def fetch(page: int) -> str:
            await asyncio.sleep(random.random() / 50)  # finish in any order
            fetched.append(page)
            return f"page {page}"

        async def upper(text: str) -> str:
            await asyncio.sleep(random.random() / 50)
            return text.upper()

        text = await ctx.run_async("step", fetch, page)  # equal names in every task
        return await ctx.run_async("step", upper, text)

    async def agent(ctx):
        return await asyncio.gather(*(fetch_and_upper(ctx, page) for page in range(4)))

    return agent


def test_gathered_multi_step_tasks_with_equal_step_names_replay_their_own_results(journal):
    fetched: list = []
    first = dn.execute("r", _pages_agent(fetched), journal=journal)
    assert first == ["PAGE 0", "PAGE 1", "PAGE 2", "PAGE 3"]
    for _ in range(5):  # other timings on every replay
        assert dn.execute("r", _pages_agent(fetched), journal=journal) == first
    assert sorted(fetched) == [0, 1, 2, 3]  # each page fetched once
    keys = {s.key for s in journal.steps("r")}
    assert keys == {f"fetch_and_upper#{t}.{n}" for t in range(4) for n in range(2)}


def test_a_run_killed_mid_gather_resumes_each_task_from_its_own_next_step(journal):
    fetched: list = []
    calls = {"n": 0}

    async def agent(ctx):
        async def task(i: int) -> list:
            out = []
            for n in range(3):
                async def work(i=i, n=n) -> str:
                    calls["n"] += 1
                    if calls["n"] == 7:  # the kernel dies in the middle of the gather
                        raise KeyboardInterrupt
                    await asyncio.sleep(random.random() / 100)
                    fetched.append((i, n))
                    return f"{i}.{n}"
                out.append(await ctx.run_async("w", work))
            return out

        return await asyncio.gather(*(task(i) for i in range(3)))

    with pytest.raises(KeyboardInterrupt):
        dn.execute("r", agent, journal=journal)
    done_before = len(fetched)
    result = dn.execute("r", agent, journal=journal)
    assert result == [[f"{i}.{n}" for n in range(3)] for i in range(3)]
    assert len(fetched) == 9 and len(set(fetched)) == 9  # nothing journaled ran twice
    assert done_before < 9


def test_two_concurrent_conversations_on_one_model_replay_their_own_answers(journal, server):
    async def agent(ctx):
        client = openai.AsyncOpenAI(base_url=server.url, api_key="k", max_retries=0)

        async def converse(topic: str) -> list:
            messages = [{"role": "user", "content": f"tell me about {topic}"}]
            ids = []
            for _ in range(2):
                await asyncio.sleep(random.random() / 50)
                reply = await ctx.chat_async(model="loopback-1", messages=messages,
                                             client=client)
                messages.append({"role": "assistant", "content": reply.choices[0].message.content})
                messages.append({"role": "user", "content": "go on"})
                ids.append(reply.id)
            return ids

        return await asyncio.gather(converse("cats"), converse("dogs"))

    first = dn.execute("r", agent, journal=journal)
    assert first[0] != first[1]  # the ids are digests of each conversation's request
    requests = server.count()
    assert dn.execute("r", agent, journal=journal) == first
    assert server.count() == requests == 4


# 2. ctx inside a step ----------------------------------------------------------------------

def test_steps_made_inside_a_step_are_its_sub_steps_and_replay(journal):
    effects = []

    @dn.tool
    def send(ctx, to: str) -> str:
        """A tool in the README's style: it takes ctx and makes a step of its own."""
        receipt = ctx.run("mail api", lambda: effects.append(to) or f"receipt for {to}")
        return f"{receipt} ({ctx.step_id})"

    def agent(ctx):
        message = {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "send", "arguments": json.dumps({"to": "team"})}}]}
        return ctx.call_tools(message, [send])[0]["content"]

    first = dn.execute("r", agent, journal=journal)
    assert dn.execute("r", agent, journal=journal) == first == "receipt for team (r:0)"
    assert effects == ["team"]
    assert [(s.key, s.name) for s in journal.steps("r")] == [("0.0", "mail api"), ("0", "send")]


def test_a_step_interrupted_after_its_sub_step_replays_the_sub_step_when_run_again(journal):
    effects = []
    interrupt = [True]

    def outer(ctx):
        paid = ctx.run("charge", lambda: effects.append("charged") or "charge-1")
        if interrupt.pop() if interrupt else False:
            raise KeyboardInterrupt  # the kernel dies after the sub-step was journaled
        return f"shipped after {paid}"

    def agent(ctx):
        return ctx.run("order", outer, ctx)

    with pytest.raises(KeyboardInterrupt):
        dn.execute("r", agent, journal=journal)
    assert dn.execute("r", agent, journal=journal) == "shipped after charge-1"
    assert effects == ["charged"]


# 3. Exceptions replay as themselves -----------------------------------------------------------

class QuotaError(Exception):
    def __init__(self, service: str, remaining: int) -> None:
        super().__init__(service, remaining)
        self.service = service
        self.remaining = remaining


def test_a_step_exception_replays_with_its_type_args_and_attributes(journal):
    def lookup(key):
        raise KeyError(key)

    def call_service():
        raise QuotaError("search", 0)

    def agent(ctx):
        seen = []
        try:
            ctx.run("lookup", lookup, "missing")
        except KeyError as exc:  # the branch a replay must take again
            seen.append(["KeyError", exc.args[0]])
        try:
            ctx.run("search", call_service)
        except QuotaError as exc:
            seen.append(["QuotaError", exc.service, exc.remaining])
        return seen

    first = dn.execute("r", agent, journal=journal)
    assert first == [["KeyError", "missing"], ["QuotaError", "search", 0]]
    assert dn.execute("r", agent, journal=journal) == first


# 4. One error policy for a tool's TerminalError -------------------------------------------------

@pytest.mark.parametrize("parallel", [False, True])
def test_a_terminal_error_from_a_tool_fails_the_run_live_and_on_every_resume(journal, parallel):
    @dn.tool
    def charge(amount: int) -> str:
        """Charge a card."""
        raise dn.TerminalError(f"card declined for {amount}")

    @dn.tool
    def note(text: str) -> str:
        """Write a note."""
        return text

    def agent(ctx):
        message = {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "note",
                                                          "arguments": '{"text": "hi"}'}},
            {"id": "c2", "type": "function", "function": {"name": "charge",
                                                          "arguments": '{"amount": 5}'}}]}
        return ctx.call_tools(message, [note, charge], parallel=parallel)

    for _ in range(2):
        with pytest.raises(dn.TerminalError, match="card declined for 5"):
            dn.execute("r", agent, journal=journal)
        assert dn.get_run("r", journal=journal).status is Status.FAILED


# 5. Fencing: a stalled executor cannot write over the one that took its run over -----------

_STALLED = """
import os, signal, sys, time, durable_nb as dn
directory, marker = sys.argv[1], sys.argv[2]
def slow(i):
    if i == 3:
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGSTOP)  # stalls here, past its lease
    return f"stalled executor {i}"
try:
    dn.execute("shared", lambda ctx: [ctx.run(f"s{i}", slow, i) for i in range(6)],
               journal=directory, stale_after=1.0, heartbeat_interval=0.2)
    print("FINISHED")
except dn.RunLeased as exc:
    print("FENCED", exc)
"""


def test_a_stalled_executor_is_fenced_out_and_writes_nothing_after_losing_its_lease(tmp_path):
    directory, marker = tmp_path / "journal", tmp_path / "stalled"
    stalled = subprocess.Popen([sys.executable, "-c", _STALLED, str(directory), str(marker)],
                               stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert time.monotonic() < deadline and stalled.poll() is None
            time.sleep(0.02)
        time.sleep(1.5)  # its heartbeat is now older than stale_after
        takeover = dn.execute("shared", lambda ctx: [
            ctx.run(f"s{i}", lambda i: f"new executor {i}", i) for i in range(6)],
            journal=directory, stale_after=1.0)
    finally:
        stalled.send_signal(signal.SIGCONT)
    out = stalled.communicate(timeout=60)[0]
    assert out.startswith("FENCED") and "fenced out" in out
    journal = dn.open_journal(directory)
    results = [s.result for s in journal.steps("shared")]
    assert results == [f"stalled executor {i}" for i in range(3)] + \
        [f"new executor {i}" for i in range(3, 6)]
    assert takeover == results
    assert dn.execute("shared", lambda ctx: [ctx.run(f"s{i}", lambda i: None, i)
                                             for i in range(6)], journal=directory) == results


# 6. ctx is bound to its execution ------------------------------------------------------------

def test_ctx_kept_after_its_run_ended_refuses_to_write(journal):
    kept = []
    dn.execute("r", lambda ctx: kept.append(ctx) or ctx.run("a", lambda: 1), journal=journal)
    with pytest.raises(dn.ContextNotActive, match="after its execution ended"):
        kept[0].run("late", lambda: 2)
    assert [s.name for s in journal.steps("r")] == ["a"]


def test_ctx_used_from_a_thread_durable_nb_did_not_start_is_refused(journal):
    errors = []

    def agent(ctx):
        def worker():
            try:
                ctx.run("from a thread", lambda: 1)
            except dn.ContextNotActive as exc:
                errors.append(str(exc))
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        return "done"

    assert dn.execute("r", agent, journal=journal) == "done"
    assert errors and "thread that durable_nb did not start" in errors[0]
    assert list(journal.steps("r")) == []


def test_two_runs_in_two_threads_never_mix_steps(journal):
    def agent(name):
        def run(ctx):
            return [ctx.run(f"{name}-{i}", lambda i=i: f"{name} {i}") for i in range(40)]
        return run

    results = {}
    threads = [threading.Thread(target=lambda n=n: results.update(
        {n: dn.execute(n, agent(n), journal=journal)})) for n in ("A", "B")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name in ("A", "B"):
        assert results[name] == [f"{name} {i}" for i in range(40)]
        assert {s.name.split("-")[0] for s in journal.steps(name)} == {name}


# 7. Special tokens -----------------------------------------------------------------------------

def test_a_message_with_special_token_text_is_sent_and_counted(journal, server):
    client = openai.OpenAI(base_url=server.url, api_key="k", max_retries=0)
    readme = "Use <|endoftext|> and <|im_start|> to mark documents."

    def agent(ctx):
        return ctx.chat(model="gpt-4o-mini", client=client,
                        messages=[{"role": "user", "content": readme}]).choices[0].message.content

    assert dn.execute("r", agent, journal=journal, max_tokens=10_000) == "first answer"
    assert dn.get_run("r", journal=journal).prompt_tokens > 0


# 9. Damaged entries ------------------------------------------------------------------------------

@pytest.mark.parametrize("error", [
    {"type": "concurrent.futures.ProcessPoolExecutor", "message": "x", "terminal": False},
    {"type": "no.such.module.Error", "message": "x", "terminal": False},
])
def test_an_error_type_in_an_entry_never_imports_anything(tmp_path, error):
    code = f"""
import json, sys, durable_nb as dn
from durable_nb.journal import StepEntry
j = dn.open_journal({str(tmp_path / 'j')!r})
dn.execute("r", lambda ctx: ctx.run("a", lambda: 1), journal=j)
j._cache.set("step:r:0", StepEntry(0, "0", "a", "run", ok=False, error={error!r}).to_json())
before = set(sys.modules)
try:
    dn.execute("r", lambda ctx: ctx.run("a", lambda: 1), journal=j)
except dn.StepFailed as exc:
    print("StepFailed", exc.type_name)
print(sorted(set(sys.modules) - before))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.splitlines()
    assert out == [f"StepFailed {error['type']}", "[]"]


@pytest.mark.parametrize("result", [
    '{"$t": "date", "v": "10000-01-01"}',
    '{"$t": "set", "v": [[1]]}',
    '{"$t": "model", "cls": "os.system", "v": {}}',
])
def test_a_damaged_result_is_a_corrupt_entry_naming_run_and_step(journal, result):
    dn.execute("r", lambda ctx: ctx.run("a", lambda: 1), journal=journal)
    text = '{"id":"0","n":"a","k":"run","r":' + result + ',"t0":0,"t1":0}'
    journal._cache.set("step:r:0", text)
    with pytest.raises(dn.CorruptEntry, match="run 'r' step 0"):
        dn.execute("r", lambda ctx: ctx.run("a", lambda: 1), journal=journal)


def test_an_entry_nested_deeper_than_any_decoder_follows_is_a_corrupt_entry(journal):
    dn.execute("r", lambda ctx: ctx.run("a", lambda: 1), journal=journal)
    deep = "[" * 100_000 + "]" * 100_000
    journal._cache.set("step:r:0", '{"id":"0","n":"a","k":"run","r":' + deep + ',"t0":0,"t1":0}')
    with pytest.raises(dn.CorruptEntry, match="run 'r' step 0"):
        dn.execute("r", lambda ctx: ctx.run("a", lambda: 1), journal=journal)
    with pytest.raises(dn.CorruptEntry, match="run 'r' step 0"):
        dn.get_run("r", journal=journal)


# 10. The record agrees with the journal after a crash ---------------------------------------------

def test_after_a_sigkill_the_run_list_counts_every_journaled_step(tmp_path):
    code = f"""
import os, signal, durable_nb as dn
def agent(ctx):
    for i in range(6):
        ctx.run(f"s{{i}}", lambda: i)
    os.kill(os.getpid(), signal.SIGKILL)
dn.execute("crashed", agent, journal={str(tmp_path)!r})
"""
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == -signal.SIGKILL
    [record] = dn.runs(journal=tmp_path)
    assert record.step_count == 6
    from durable_nb.notebook import describe_unfinished
    assert describe_unfinished(dn.open_journal(tmp_path)) == [
        "crashed: interrupted at iteration 0 (step 6); re-run its cell to continue"]


# 11. Edited inputs -------------------------------------------------------------------------------

def _chat_agent(client, prompt):
    def agent(ctx):
        messages = [{"role": "system", "content": "You are terse."},
                    {"role": "user", "content": prompt}]
        return ctx.chat(model="loopback-1", messages=messages, client=client).choices[0].message.content
    return agent


def test_an_edited_prompt_stops_before_returning_the_stale_answer(journal, server):
    client = openai.OpenAI(base_url=server.url, api_key="k", max_retries=0)
    dn.execute("r", _chat_agent(client, "Summarise Q3."), journal=journal)
    with pytest.raises(dn.InputChanged) as info:
        dn.execute("r", _chat_agent(client, "Summarise Q4."), journal=journal)
    assert "step 0, chat 'loopback-1': messages[1].content changed" in str(info.value)
    assert server.count() == 1  # nothing was sent


def test_on_change_rerun_pays_only_for_what_changed_and_keeps_the_old_run_as_a_fork(journal,
                                                                                     server):
    client = openai.OpenAI(base_url=server.url, api_key="k", max_retries=0)
    loads = []

    def agent(prompt):
        def run(ctx):
            data = ctx.run("load", lambda: loads.append(1) or "rows")
            return [data, _chat_agent(client, prompt)(ctx)]
        return run

    dn.execute("r", agent("Summarise Q3."), journal=journal)
    assert dn.execute("r", agent("Summarise Q4."), journal=journal, on_change="rerun") == \
        ["rows", "first answer"]
    assert loads == [1] and server.count() == 2  # the load replayed; one new chat request
    fork = dn.get_run("r@1", journal=journal)
    assert fork.forked_from["position"] == 1 and [s.kind for s in fork.steps] == ["run", "chat"]
    assert dn.get_run("r", journal=journal).steps[1].request["messages"] != \
        fork.steps[1].request["messages"]


def test_on_change_replay_returns_the_journaled_result_for_edited_arguments(journal):
    dn.execute("r", lambda ctx: ctx.run("price", lambda n: n * 10, 3), journal=journal)
    with pytest.raises(dn.InputChanged, match=r"args\[0\] changed"):
        dn.execute("r", lambda ctx: ctx.run("price", lambda n: n * 10, 4), journal=journal)
    assert dn.execute("r", lambda ctx: ctx.run("price", lambda n: n * 10, 4), journal=journal,
                      on_change="replay") == 30


def test_verify_replay_catches_a_handler_that_branches_on_data_read_outside_ctx(journal):
    executions = []

    def agent(ctx):
        executions.append(1)
        if len(executions) % 2:  # like a branch on the clock: differs from run to run
            return ctx.run("odd", lambda: 1)
        return ctx.run("even", lambda: 2)

    with pytest.raises(dn.ReplayDiverged, match="another path"):
        dn.execute("r", agent, journal=journal, verify_replay=True)
    assert len(executions) == 2
