"""The OpenAI Agents SDK made durable (durable_nb.integrations.openai_agents), with the real
``openai-agents`` package against the loopback server over HTTP; crashes are real SIGKILLs of
child processes (tests/openai_agents_process.py)."""

from __future__ import annotations

import importlib.util
from importlib.metadata import version
from pathlib import Path

import openai
import pytest

pytest.importorskip("agents")

from agents import Agent, ModelSettings, function_tool  # noqa: E402

import durable_nb  # noqa: E402
from durable_nb import InputChanged, NotJournaled, RunOptions, Status, approve, reject  # noqa: E402
from durable_nb.integrations.openai_agents import run  # noqa: E402
from durable_nb.runner import Runner  # noqa: E402
from durable_nb.testing import LoopbackServer, Quirks, Reply, ToolCall  # noqa: E402

from tests import agent_process, openai_agents_process as travel  # noqa: E402

FINAL_WORDS = "".join(travel.FINAL.split())


def _crash_and_resume(tmp_path: Path, script: list[Reply], kill_after: str,
                      slow: dict[str, float] | None = None, streamed: bool = False
                      ) -> tuple[object, dict, list[str]]:
    """Run the travel agent in a child killed after ``kill_after``'s step, then in a second
    child that resumes it: (final output, server stats, effects)."""
    journal = str(tmp_path / "journal")
    with LoopbackServer(script) as server:
        for kill in (kill_after, None):
            child = agent_process.start(travel.agents_child, journal, server.url,
                                        str(tmp_path), "trip", kill, slow, streamed)
            child.join(60)
        assert (tmp_path / f"killed-after-{kill_after}").exists()
        return agent_process.read_result(tmp_path), server.stats(), travel.effects(tmp_path)


def _uninterrupted(tmp_path: Path, script: list[Reply]) -> object:
    work = tmp_path / "uninterrupted"
    work.mkdir()
    with LoopbackServer(script) as server:
        child = agent_process.start(travel.agents_child, str(work / "journal"), server.url,
                                    str(work), "trip", None, None)
        child.join(60)
    return agent_process.read_result(work)


def test_sigkill_after_the_second_tool_resumes_with_each_round_and_effect_once(tmp_path):
    output, stats, effects = _crash_and_resume(tmp_path, travel.script(), "book_flight")
    assert stats["by_round"] == {"0": 1, "1": 1, "2": 1}
    assert effects == ["find Oslo", "book SK123"]
    assert output == travel.FINAL == _uninterrupted(tmp_path, travel.script())


def test_a_streamed_run_killed_after_the_second_tool_resumes_the_same_way(tmp_path):
    output, stats, effects = _crash_and_resume(tmp_path, travel.script(), "book_flight",
                                               streamed=True)
    assert stats["by_round"] == {"0": 1, "1": 1, "2": 1}
    assert effects == ["find Oslo", "book SK123"]
    assert output == travel.FINAL
    # the final text streamed live after the resume, in pieces (the killed child never got
    # there; the always-replay check streams it once more, synthesized: one piece)
    pieces = (tmp_path / "deltas.log").read_text().splitlines()
    assert "".join("".join(pieces).split()) == FINAL_WORDS * 2 and len(pieces) > 2


def test_parallel_tool_calls_replay_whatever_order_they_finished_in(tmp_path):
    # Oslo is called first but finishes last: the kill comes after Rome's step, with
    # Oslo's still running. The resumed run replays Rome and runs Oslo, once each.
    output, stats, effects = _crash_and_resume(
        tmp_path, travel.parallel_script(), "find_flight", slow={"Oslo": 1.0})
    assert effects == ["find Rome", "find Oslo"]
    assert stats["by_round"] == {"0": 1, "1": 1}
    assert output == travel.FINAL


# --- in-process runs -----------------------------------------------------------------------

def _execute(run_id, agent, journal, client, **options):
    async def handler(ctx):
        return (await run(ctx, agent, "Book me a flight to Oslo.")).final_output

    return Runner(run_id, handler, journal=journal,
                  options=RunOptions(client=client, poll_interval=0.05, **options)).run()


@pytest.fixture
def charge_script():
    return [Reply(tool_calls=[ToolCall("charge_card", {"amount": 120})]), "Charged."]


@pytest.mark.parametrize("approved", [True, False])
def test_a_tool_needing_approval_parks_the_run_and_the_sdk_gets_the_decision(
        tmp_path, journal, charge_script, approved):
    agent = travel.travel_agent(tmp_path)
    with LoopbackServer(charge_script) as server:
        client = openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0)
        parked = _execute("charge", agent, journal, client, on_approval="park")
        assert parked.record.status is Status.WAITING_APPROVAL
        pending = parked.record.pending_approval
        assert (pending["name"], pending["details"]) == (
            "charge_card", {"agent": "travel", "tool": "charge_card",
                            "arguments": {"amount": 120}})
        assert travel.effects(tmp_path) == []
        (approve if approved else reject)("charge", journal=journal)
        done = _execute("charge", agent, journal, client, on_approval="park")
        answer = server.requests[-1]["messages"][-1]
    assert done.record.status is Status.DONE and done.result == "Charged."
    assert travel.effects(tmp_path) == (["charge 120"] if approved else [])
    assert answer["role"] == "tool"
    assert (answer["content"] == "charged 120") is approved
    assert server.stats()["by_round"] == {"0": 1, "1": 1}  # round 0 replayed after parking


def test_a_rejection_message_reaches_the_model_through_the_sdks_rejection_message(
        tmp_path, journal, charge_script):
    """Issue 34: ``reject(run, message=...)`` is the Agents SDK's ``rejection_message``."""
    agent = travel.travel_agent(tmp_path)
    with LoopbackServer(charge_script) as server:
        client = openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0)
        _execute("charge", agent, journal, client, on_approval="park")
        reject("charge", message="Denied: charge at most 100", journal=journal)
        done = _execute("charge", agent, journal, client, on_approval="park")
        told = server.requests[-1]["messages"][-1]
    assert done.record.status is Status.DONE and travel.effects(tmp_path) == []
    assert told["role"] == "tool" and told["content"] == "Denied: charge at most 100"


def test_an_edited_instruction_is_input_changed_at_the_first_model_call(tmp_path, journal):
    with LoopbackServer(travel.script()) as server:
        client = openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0)
        agent = travel.travel_agent(tmp_path)
        assert _execute("trip", agent, journal, client).result == travel.FINAL
        edited = agent.clone(instructions="Book the cheapest trip.")
        with pytest.raises(InputChanged) as caught:
            _execute("trip", edited, journal, client)
        assert caught.value.position == 0 and "messages" in caught.value.change
        rerun = _execute("trip", edited, journal, client, on_change="rerun")
    assert rerun.result == travel.FINAL
    assert server.stats()["by_round"] == {"0": 2, "1": 2, "2": 2}


def test_an_agent_with_its_own_model_object_is_refused_before_anything_runs(tmp_path, journal):
    from agents import OpenAIChatCompletionsModel

    raw = openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="x")
    agent = Agent(name="raw", model=OpenAIChatCompletionsModel("m", raw))
    with pytest.raises(NotJournaled, match="model object"):
        _execute("raw", agent, journal, raw)


def test_handoff_targets_have_their_tools_journaled(tmp_path, journal):
    calls = []

    @function_tool
    def lookup(code: str) -> str:
        """Look a code up."""
        calls.append(code)
        return f"{code} is Oslo"

    expert = Agent(name="expert", model="loopback-1", tools=[lookup])
    triage = Agent(name="triage", model="loopback-1", handoffs=[expert],
                   model_settings=ModelSettings(parallel_tool_calls=False))
    script = [Reply(tool_calls=[ToolCall("transfer_to_expert", {})]),
              Reply(tool_calls=[ToolCall("lookup", {"code": "OSL"})]), "OSL is Oslo."]
    with LoopbackServer(script) as server:
        client = openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0)
        first = _execute("handoff", triage, journal, client)
        again = _execute("handoff", triage, journal, client)
    assert first.result == again.result == "OSL is Oslo."
    assert calls == ["OSL"]
    steps = [(e.kind, e.name) for e in journal.steps("handoff")]
    assert ("run", "lookup") in steps and steps.count(("chat", "loopback-1")) == 3


def test_tracing_is_off_unless_asked(tmp_path):
    from durable_nb.integrations.openai_agents import durable_run_config

    async def handler(ctx):
        return [durable_run_config(ctx).tracing_disabled,
                durable_run_config(ctx, tracing=True).tracing_disabled]

    assert durable_nb.execute("tracing", handler, journal=tmp_path / "j") == [True, False]


def test_model_calls_are_chat_steps_with_the_runs_accounting(tmp_path, journal):
    with LoopbackServer(travel.script()) as server:
        client = openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0)
        outcome = _execute("trip", travel.travel_agent(tmp_path), journal, client)
    record = outcome.record
    chats = [e for e in journal.steps("trip") if e.kind == "chat"]
    assert len(chats) == 3 and record.iteration == 3
    assert record.prompt_tokens == sum(e.prompt_tokens for e in chats) > 0


def test_streamed_runs_yield_the_sdks_events_and_replay(tmp_path, journal):
    from durable_nb.integrations.openai_agents import run_streamed

    async def handler(ctx):
        streamed = run_streamed(ctx, travel.travel_agent(tmp_path), "Book me a flight to Oslo.")
        kinds = [event.type async for event in streamed.stream_events()]
        return [streamed.final_output, "raw_response_event" in kinds]

    with LoopbackServer(travel.script()) as server:
        client = openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0)
        for _ in range(2):
            result = durable_nb.execute("streamed", handler, journal=journal, client=client)
            assert result == [travel.FINAL, True]
    assert server.stats()["by_round"] == {"0": 1, "1": 1, "2": 1}
    assert travel.effects(tmp_path) == ["find Oslo", "book SK123"]



def test_an_agent_used_as_a_tool_is_one_step_with_its_model_calls_inside(tmp_path, journal):
    # The loopback server answers by round, so the inner agent's first request gets the
    # outer one's reply too: a call of "translate", which the inner agent has as well.
    calls = []

    @function_tool
    def translate(input: str) -> str:
        """Translate a text."""
        calls.append(input)
        return "hello"

    translator = Agent(name="translator", model="loopback-1", tools=[translate])
    boss = Agent(name="boss", model="loopback-1",
                 tools=[translator.as_tool("translate", "Translate a text.")])
    script = [Reply(tool_calls=[ToolCall("translate", {"input": "hei"})]), "It says hello."]
    with LoopbackServer(script) as server:
        client = openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0)
        first = _execute("boss", boss, journal, client)
        again = _execute("boss", boss, journal, client)
        requests = server.stats()["chat"]
    assert first.result == again.result == "It says hello."
    entries = list(journal.steps("boss"))
    step = next(e for e in entries if (e.kind, e.name) == ("run", "translate"))
    assert step.result == "It says hello."  # the inner agent's final output
    inner = [e for e in entries if e.kind == "chat" and e.key.startswith(step.key + ".")]
    assert len(inner) == 2 and requests == 4 and calls == ["hei"]


#: The step keys of the scenario below, the same on Python 3.10, 3.11 and 3.13 with
#: The SDK's task names under durable_nb's numbering (checked by hand).
_TOOLS = "execute_function_tool_calls#{}._run_single_tool#{}._invoke_tool_and_run_post_invoke#0.0"
# The SDK runs the first turn in a task named after one of its functions, which it renamed
# between releases: pinned for the ones tested (CI runs pyproject's floor and the newest).
_FIRST_TURN_TASK = {"0.18.1": "run_single_turn", "0.19.0": "run_single_turn",
                    "0.24.0": "preserve_tool_task_cancellation"}
_FIRST = f"{_FIRST_TURN_TASK.get(version('openai-agents'))}#0."
EXPECTED_KEYS = sorted([
    (_FIRST + "0", "chat"), (_FIRST + _TOOLS.format(0, 0), "find_flight"),
    (_FIRST + _TOOLS.format(0, 1), "find_flight"), ("0", "chat"),
    (_TOOLS.format(0, 0), "book_flight"), ("1", "chat"), ("2", "charge_card"),
    (_TOOLS.format(2, 0), "charge_card"), ("3", "chat")])


def test_step_keys_follow_the_sdks_task_creation_not_timing(tmp_path, journal):
    if version("openai-agents") not in _FIRST_TURN_TASK:
        pytest.skip(f"step keys are pinned for openai-agents {sorted(_FIRST_TURN_TASK)}, "
                    f"not {version('openai-agents')}")
    script = [Reply(tool_calls=[ToolCall("find_flight", {"city": "Oslo"}),
                                ToolCall("find_flight", {"city": "Rome"})]),
              Reply(tool_calls=[ToolCall("book_flight", {"flight": "SK123"})]),
              Reply(tool_calls=[ToolCall("charge_card", {"amount": 5})]), "done"]
    agent = travel.travel_agent(tmp_path, slow={"Oslo": 0.2})  # the first call ends last
    with LoopbackServer(script) as server:
        client = openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0)
        _execute("keys", agent, journal, client, on_approval="park")
        approve("keys", journal=journal)
        _execute("keys", agent, journal, client, on_approval="park")
    entries = list(journal.steps("keys"))
    assert sorted((e.key, "chat" if e.kind == "chat" else e.name) for e in entries) == \
        EXPECTED_KEYS
    # Rome, called second, finished and was journaled first, under the second task's key
    assert travel.effects(tmp_path)[:2] == ["find Rome", "find Oslo"]
    assert entries[1].key == _FIRST + _TOOLS.format(0, 1)


def _steps_run(workdir: Path) -> list[tuple[int, str]]:
    log = workdir / "steps.log"
    return [(int(pid), key) for pid, key in
            (line.split() for line in log.read_text().splitlines())] if log.exists() else []


def _journaled(journal_dir: Path) -> set[str]:
    from durable_nb import DiskJournal

    if not journal_dir.exists():
        return set()
    journal = DiskJournal(journal_dir)
    try:
        return {e.key for e in journal.steps("trip")}
    finally:
        journal.close()


@pytest.mark.parametrize("trial", range(2))
def test_random_sigkills_never_run_a_journaled_tool_again(tmp_path, trial):
    # A run with two parallel tool calls (one slow) and a third tool, SIGKILLed (up to three
    # times) at random moments once it has journaled something new, resumed until DONE. A tool
    # in flight at a kill may run again; one journaled before a process started never does.
    rng = __import__("random").Random(trial)
    journal_dir = tmp_path / "journal"
    journaled_before: dict[int, set[str]] = {}
    with LoopbackServer([
            Reply(tool_calls=[ToolCall("find_flight", {"city": "Oslo"}),
                              ToolCall("find_flight", {"city": "Rome"})]),
            Reply(tool_calls=[ToolCall("book_flight", {"flight": "SK123"})]),
            Reply(content=travel.FINAL)], delay=0.05) as server:
        kills = 0
        while True:
            known = _journaled(journal_dir)
            child = agent_process.start(travel.agents_child, str(journal_dir), server.url,
                                        str(tmp_path), "trip", None, {"Oslo": 0.3})
            journaled_before[child.pid] = known
            if kills == 3:
                break
            while child.is_alive() and len(_journaled(journal_dir)) <= len(known):
                child.join(0.01)
            child.join(rng.uniform(0.0, 0.3))
            if not agent_process.kill(child):
                break  # it finished first
            kills += 1
        child.join(60)
    assert kills >= 1
    assert agent_process.read_result(tmp_path) == travel.FINAL
    for pid, key in _steps_run(tmp_path):
        assert key not in journaled_before[pid], f"step {key} ran again in process {pid}"
    assert set(travel.effects(tmp_path)) == {"find Oslo", "find Rome", "book SK123"}


@pytest.mark.parametrize("streamed", [False, True])
def test_the_responses_model_makes_respond_steps_that_replay(tmp_path, journal, streamed):
    from durable_nb.integrations.openai_agents import run_streamed

    agent = travel.travel_agent(tmp_path)

    async def handler(ctx):
        if not streamed:
            return (await run(ctx, agent, "Book.", api="responses")).final_output
        stream = run_streamed(ctx, agent, "Book.", api="responses")
        async for _ in stream.stream_events():
            pass
        return stream.final_output

    with LoopbackServer(travel.script()) as server:
        client = openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0)
        for _ in range(2):
            assert durable_nb.execute("resp", handler, journal=journal,
                                      client=client) == travel.FINAL
        stats = server.stats()
    assert stats["responses"] == 3 and stats["by_round"] == {"0": 1, "1": 1, "2": 1}
    assert [e.kind for e in journal.steps("resp")].count("respond") == 3
    assert travel.effects(tmp_path) == ["find Oslo", "book SK123"]


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
def test_a_run_over_a_server_that_leaves_fields_out_replays(tmp_path, journal, api, streamed):
    from durable_nb.integrations.openai_agents import run_streamed

    agent = travel.travel_agent(tmp_path)

    async def handler(ctx):
        if not streamed:
            return (await run(ctx, agent, "Book.", api=api)).final_output
        stream = run_streamed(ctx, agent, "Book.", api=api)
        async for _ in stream.stream_events():
            pass
        return stream.final_output

    with LoopbackServer(travel.script(), quirks=Quirks(sparse_replies=True)) as server:
        client = openai.AsyncOpenAI(base_url=server.url, api_key="x", max_retries=0)
        for _ in range(2):
            assert durable_nb.execute("trip", handler, journal=journal,
                                      client=client) == travel.FINAL
        stats = server.stats()
    assert stats["by_round"] == {"0": 1, "1": 1, "2": 1}
    assert travel.effects(tmp_path) == ["find Oslo", "book SK123"]


def _mcp_sdk_2() -> bool:
    try:
        return importlib.util.find_spec("mcp.server.mcpserver") is not None
    except ImportError:
        return False


# tests/mcp_server.py is written with the mcp SDK 2; openai-agents' floor (.ci/run's framework
# floors phase) brings mcp 1, whose server API it does not find.
needs_mcp_sdk_2 = pytest.mark.skipif(not _mcp_sdk_2(), reason="the test MCP server needs the "
                                     "mcp SDK 2 (openai-agents' floor installs mcp 1)")



@needs_mcp_sdk_2
def test_a_servers_question_under_the_agents_sdk_is_refused_by_the_sdk_not_asked(tmp_path,
                                                                               journal):
    """openai-agents 0.24 opens its MCP ClientSession without an elicitation callback (and
    takes none to pass on): the session does not declare the elicitation capability, the
    server refuses the call that would ask, and the run never waits on it. A later
    SDK that takes a callback makes this fail: then wire it to durable_nb.mcp.elicitation.ask
    in DurableMCPServer."""
    import sys

    from agents.mcp import MCPServerStdio

    from tests.test_mcp import SERVER, calls

    count_dir = tmp_path / "calls"
    count_dir.mkdir()
    script = [Reply(tool_calls=[ToolCall("book", {"city": "Oslo"})]), "Done."]

    async def handler(ctx):
        params = {"command": sys.executable, "args": [str(SERVER), str(count_dir), "stdio"]}
        async with MCPServerStdio(params, name="tests") as server:
            agent = Agent(name="ops", model="loopback-1", mcp_servers=[server])
            return (await run(ctx, agent, "Book Oslo.")).final_output

    with LoopbackServer(script) as model:
        client = openai.AsyncOpenAI(base_url=model.url, api_key="x", max_retries=0)
        assert durable_nb.execute("sdk-ask", handler, journal=journal, client=client,
                                  poll_interval=0.05) == "Done."
        told = model.requests[-1]["messages"][-1]["content"]

    book = next(e for e in journal.steps("sdk-ask") if e.name == "book")
    assert "Client did not declare the form elicitation capability" in book.error["message"]
    assert told == "An error occurred while running the tool. Please try again."
    assert calls(count_dir, "book") == []
    assert [e for e in journal.steps("sdk-ask") if e.kind == "approval"] == []


@needs_mcp_sdk_2
def test_an_mcp_server_whose_tools_changed_stops_the_replay_in_one_line(tmp_path, journal):
    import os
    import sys

    from agents.mcp import MCPServerStdio

    from tests.test_mcp import SERVER

    def handler_for(**env: str):
        async def handler(ctx):
            params = {"command": sys.executable, "args": [str(SERVER), str(tmp_path), "stdio"],
                      "env": {**os.environ, **env}}
            async with MCPServerStdio(params, name="tests") as server:
                agent = Agent(name="ops", model="loopback-1", mcp_servers=[server])
                return (await run(ctx, agent, "Anything?")).final_output
        return handler

    with LoopbackServer(["Nothing to do."]) as model:
        client = openai.AsyncOpenAI(base_url=model.url, api_key="x", max_retries=0)
        assert durable_nb.execute("sdk-changed", handler_for(), journal=journal,
                                  client=client) == "Nothing to do."
        with pytest.raises(InputChanged) as raised:
            durable_nb.execute("sdk-changed", handler_for(MCP_TEST_EXTRA_TOOL="1"),
                               journal=journal, client=client)

    message = str(raised.value)
    assert "run 'tools/list tests'" in message and "tools.extra was added" in message
    assert len(message.splitlines()) == 1
