"""Pydantic AI's MCP toolsets made durable (durable_nb.integrations.pydantic_ai_mcp), with the
real ``pydantic-ai-slim[mcp]`` (its ``MCPToolset`` over fastmcp's client) against the tests'
MCP server written with the ``mcp`` SDK (tests/mcp_server.py), over stdio and streamable
HTTP, the model the loopback server over HTTP; the crashes are real SIGKILLs of a child
process (tests/pydantic_ai_process.py).

Calls are counted by the files the server writes, one per call that reached it, each with
the step id durable_nb sent in ``_meta``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

pytest.importorskip("pydantic_ai")
pytest.importorskip("fastmcp")

from pydantic_ai import Agent  # noqa: E402

import durable_nb  # noqa: E402
import durable_nb.mcp as dmcp  # noqa: E402
from durable_nb import InputChanged, RunOptions, Status  # noqa: E402
from durable_nb.integrations.pydantic_ai import run  # noqa: E402
from durable_nb.runner import Runner  # noqa: E402
from durable_nb.testing import LoopbackServer, Reply, ToolCall  # noqa: E402
from tests import agent_process  # noqa: E402
from tests.harness import wait_until  # noqa: E402
from tests.pydantic_ai_process import MODEL, mcp_child, mcp_toolset  # noqa: E402
from tests.test_mcp import calls, count_dir, http_server  # noqa: E402,F401 - fixtures


def toolset_for(transport: str, count_dir: Path, request: pytest.FixtureRequest,
                **env: str) -> Any:
    if transport in ("stdio", "stdio-2026"):
        return mcp_toolset(count_dir, mode="2026-07-28" if transport == "stdio-2026" else None,
                           **env)
    return mcp_toolset(count_dir, request.getfixturevalue("http_server"))


def execute(run_id: str, agent: Agent, journal: Any, model_url: str, **options: Any) -> Any:
    """One execution of ``run_id``: the agent run through durable_nb, the model the loopback
    server's; the runner's outcome."""
    needs_approval = options.pop("needs_approval", False)

    async def handler(ctx: Any) -> Any:
        return (await run(ctx, agent, "Do it.", needs_approval=needs_approval)).output

    client = openai.AsyncOpenAI(base_url=model_url, api_key="x", max_retries=0)
    return Runner(run_id, handler, journal=journal,
                  options=RunOptions(client=client, model=MODEL, poll_interval=0.05,
                                     **options)).run()


def step_key(journal: Any, run_id: str, name: str) -> str:
    return next(e.key for e in journal.steps(run_id) if e.name == name)


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_each_call_reaches_the_server_once_with_its_step_id_and_the_list_is_a_step(
        transport, count_dir, journal, request):
    agent = Agent(name="ops", toolsets=[toolset_for(transport, count_dir, request)])
    script = [Reply(tool_calls=[ToolCall("count", {"label": "a"})]),
              Reply(tool_calls=[ToolCall("count", {"label": "b"})]), "Done."]
    with LoopbackServer(script) as model:
        first = execute("pai-once", agent, journal, model.url)
        again = execute("pai-once", agent, journal, model.url)
        stats = model.stats()

    assert first.result == again.result == "Done."
    assert stats["by_round"] == {"0": 1, "1": 1, "2": 1}
    recorded = calls(count_dir, "count")
    assert sorted(c["label"] for c in recorded) == ["a", "b"]
    counts = [e for e in journal.steps("pai-once") if e.name == "count"]
    assert sorted(c["step_id"] for c in recorded) == sorted(f"pai-once:{e.key}" for e in counts)
    listed = [e for e in journal.steps("pai-once") if e.name == "tools/list tests"]
    assert len(listed) == 1  # the toolset caches its tools: listed once for the agent.run


@pytest.mark.parametrize("decision", ["edit", "reject"])
def test_a_tool_matching_needs_approval_parks_and_gets_the_decision(decision, count_dir,
                                                                    journal):
    agent = Agent(name="ops", toolsets=[mcp_toolset(count_dir)])
    script = [Reply(tool_calls=[ToolCall("delete_rows", {"table": "users"})]), "Done."]
    with LoopbackServer(script) as model:
        parked = execute("pai-approve", agent, journal, model.url, on_approval="park",
                         needs_approval="delete_*")
        pending = parked.record.pending_approval
        assert parked.record.status is Status.WAITING_APPROVAL
        assert calls(count_dir, "delete_rows") == []
        assert (pending["name"], pending["details"]["arguments"]) == (
            "delete_rows", {"table": "users"})
        if decision == "edit":  # checked against the schema the server gave
            with pytest.raises(durable_nb.InvalidAnswer, match="'table' must be a string"):
                durable_nb.approve("pai-approve", args={"table": 7}, journal=journal)
            durable_nb.approve("pai-approve", args={"table": "staging"}, journal=journal)
        else:
            durable_nb.reject("pai-approve", message="Denied: not prod", journal=journal)
        done = execute("pai-approve", agent, journal, model.url, on_approval="park",
                       needs_approval="delete_*")
        told = model.requests[-1]["messages"][-1]

    assert done.record.status is Status.DONE and done.result == "Done."
    if decision == "edit":
        assert [c["table"] for c in calls(count_dir, "delete_rows")] == ["staging"]
        assert told["content"] == "deleted the rows of staging"
    else:
        assert calls(count_dir, "delete_rows") == []
        assert told["content"] == "Denied: not prod"


@pytest.mark.parametrize("transport", ["stdio", "http", "stdio-2026"])
def test_a_servers_question_parks_the_run_and_the_resumed_call_gets_the_journaled_answer(
        transport, count_dir, journal, request):
    agent = Agent(name="ops", toolsets=[toolset_for(transport, count_dir, request)])
    script = [Reply(tool_calls=[ToolCall("book", {"city": "Oslo"})]), "Booked."]
    with LoopbackServer(script) as model:
        parked = execute("pai-ask", agent, journal, model.url, on_approval="park")
        details = parked.record.pending_approval["details"]
        assert parked.record.status is Status.WAITING_APPROVAL
        assert (details["kind"], details["server"], details["message"]) == (
            "elicitation", "tests", "How many nights in Oslo?")
        dmcp.answer("pai-ask", "accept", {"nights": 4}, journal=journal)
        done = execute("pai-ask", agent, journal, model.url, on_approval="park")
        again = execute("pai-ask", agent, journal, model.url, on_approval="park")
        told = model.requests[-1]["messages"][-1]

    assert done.result == again.result == "Booked."
    assert told["content"] == "booked 4 nights in Oslo"
    # The parked call was cancelled before the tool's body ran; the resumed one got the
    # answer from the journal, and the replay sent nothing.
    assert [(c["action"], c["nights"]) for c in calls(count_dir, "book")] == [("accept", 4)]
    book = step_key(journal, "pai-ask", "book")
    asked = [(e.key, e.name) for e in journal.steps("pai-ask") if e.kind == "approval"]
    assert asked == [(f"{book}.0", "book asks")]


def test_a_server_whose_tools_changed_since_stops_the_replay_as_an_input_change(
        count_dir, journal):
    script = ["Nothing to do."]
    with LoopbackServer(script) as model:
        before = Agent(name="ops", toolsets=[mcp_toolset(count_dir)])
        assert execute("pai-changed", before, journal, model.url).result == "Nothing to do."
        after = Agent(name="ops", toolsets=[mcp_toolset(count_dir, MCP_TEST_EXTRA_TOOL="1")])
        with pytest.raises(InputChanged) as raised:
            execute("pai-changed", after, journal, model.url)

    message = str(raised.value)
    assert "run 'tools/list tests': tools.extra was added" in message
    assert len(message.splitlines()) == 1


def test_sigkill_between_two_calls_resumes_with_each_call_once(tmp_path):
    journal = str(tmp_path / "journal")
    (tmp_path / "calls").mkdir()
    script = [Reply(tool_calls=[ToolCall("count", {"label": "a"})]),
              Reply(tool_calls=[ToolCall("count", {"label": "b"})]), "Done."]
    with LoopbackServer(script) as model:
        for kill in ("count", None):
            child = agent_process.start(mcp_child, journal, model.url, str(tmp_path),
                                        "pai-kill", kill)
            child.join(120)
        stats = model.stats()

    assert (tmp_path / "killed-after-count").exists()
    assert agent_process.read_result(tmp_path) == "Done."
    assert stats["by_round"] == {"0": 1, "1": 1, "2": 1}
    assert sorted(c["label"] for c in calls(tmp_path / "calls", "count")) == ["a", "b"]


def test_sigkill_during_a_call_sends_it_again_with_the_same_step_id(tmp_path):
    journal = str(tmp_path / "journal")
    count_dir = tmp_path / "calls"
    count_dir.mkdir()
    script = [Reply(tool_calls=[ToolCall("slow", {"label": "x"})]), "Done."]
    with LoopbackServer(script) as model:
        child = agent_process.start(mcp_child, journal, model.url, str(tmp_path),
                                    "pai-kill-during", None)
        wait_until(lambda: calls(count_dir, "slow"), 60, "the call to reach the server")
        assert agent_process.kill(child)
        (count_dir / "release").touch()
        child = agent_process.start(mcp_child, journal, model.url, str(tmp_path),
                                    "pai-kill-during", None)
        child.join(120)
        stats = model.stats()

    assert agent_process.read_result(tmp_path) == "Done."
    assert stats["by_round"] == {"0": 1, "1": 1}
    sent = calls(count_dir, "slow")
    slow = step_key(durable_nb.DiskJournal(journal), "pai-kill-during", "slow")
    assert [c["step_id"] for c in sent] == [f"pai-kill-during:{slow}"] * 2


def test_an_agent_with_a_model_of_another_provider_journals_its_mcp_calls_too(count_dir,
                                                                             journal):
    """The same wrapping under Pydantic AI's durability API (a model that is not
    OpenAI-compatible: each request a ``model`` step)."""
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    def model(messages: list, info: Any) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("count", {"label": "a"})])
        return ModelResponse(parts=[TextPart("Counted.")])

    agent = Agent(FunctionModel(model), name="ops", toolsets=[mcp_toolset(count_dir)])

    async def handler(ctx: Any) -> Any:
        return (await run(ctx, agent, "Count.")).output

    runs = [durable_nb.execute("pai-function", handler, journal=journal) for _ in range(2)]

    assert runs == ["Counted."] * 2
    count = step_key(journal, "pai-function", "count")
    assert [c["step_id"] for c in calls(count_dir, "count")] == [f"pai-function:{count}"]
    assert [e.kind for e in journal.steps("pai-function")].count("model") == 2


@pytest.mark.parametrize("transport", ["stdio", "stdio-2026"])
def test_a_servers_question_waits_for_the_answer_given_meanwhile(transport, count_dir,
                                                                  journal, request):
    from tests.test_mcp import decide_in_background

    agent = Agent(name="ops", toolsets=[toolset_for(transport, count_dir, request)])
    script = [Reply(tool_calls=[ToolCall("book", {"city": "Rome"})]), "Booked."]
    decide_in_background(journal, "pai-wait", lambda shown: dmcp.answer(
        "pai-wait", "accept", {"nights": 2}, by="ana", journal=journal))
    with LoopbackServer(script) as model:
        done = execute("pai-wait", agent, journal, model.url)
        told = model.requests[-1]["messages"][-1]

    assert done.result == "Booked." and told["content"] == "booked 2 nights in Rome"
    assert [(c["action"], c["nights"]) for c in calls(count_dir, "book")] == [("accept", 2)]


@pytest.mark.parametrize(("sdk", "transport"), [("mcp2", "stdio"), ("mcp2", "http"),
                                               ("fastmcp", "stdio")])
def test_a_ctx_elicit_question_parks_the_run_the_cli_answers_it_and_a_replay_calls_nothing(
        sdk, transport, count_dir, journal, tmp_path):
    """A server that asks with ``await ctx.elicit(...)`` (tests/mcp_elicit_server.py), behind
    the toolset fastmcp's client connects in its default mode. Failed on 1642cc7: the client
    adopted the 2026 protocol, in which the server's question cannot be sent."""
    import subprocess
    import sys

    from fastmcp.client.transports import StdioTransport
    from pydantic_ai.mcp import MCPToolset

    from tests.test_mcp_elicit import elicit_server

    script = [Reply(tool_calls=[ToolCall("book", {"city": "Oslo"})]), "Booked."]
    with elicit_server(sdk, transport, count_dir) as args, LoopbackServer(script) as model:
        if "stdio" in args:
            command, *rest = args["stdio"]
            toolset = MCPToolset(StdioTransport(command=command, args=rest), id="hotel")
        else:
            toolset = MCPToolset(args["http"], id="hotel")
        agent = Agent(name="travel", toolsets=[toolset])
        parked = execute("pai-elicit", agent, journal, model.url, on_approval="park")
        assert parked.record.status is Status.WAITING_APPROVAL, parked.record.error
        assert parked.record.pending_approval["details"]["message"] == "How many nights in Oslo?"
        answered = subprocess.run(
            [sys.executable, "-m", "durable_nb.cli", "answer", "pai-elicit", "accept",
             "--content", '{"nights": 3}', "--journal", str(journal.directory)],
            capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert answered.returncode == 0, answered.stderr
        done = execute("pai-elicit", agent, journal, model.url, on_approval="park")
        again = execute("pai-elicit", agent, journal, model.url, on_approval="park")
        told = model.requests[-1]["messages"][-1]

    assert done.result == again.result == "Booked."
    assert told["content"] == "booked 3 nights in Oslo"
    book = step_key(journal, "pai-elicit", "book")
    assert [(c["action"], c["nights"], c["step_id"]) for c in calls(count_dir, "book")] == [
        ("accept", 3, f"pai-elicit:{book}")]


def test_sigkill_after_a_question_was_answered_asks_nobody_again(tmp_path):
    """The process dies during a call whose question was answered: the call is sent again on
    resume and the server's question gets the journaled answer; nobody is asked."""
    journal = str(tmp_path / "journal")
    count_dir = tmp_path / "calls"
    count_dir.mkdir()
    (count_dir / "hold").touch()  # the tool waits for "release" after recording the answer
    disk = durable_nb.DiskJournal(journal)
    script = [Reply(tool_calls=[ToolCall("book", {"city": "Oslo"})]), "Booked."]
    with LoopbackServer(script) as model:
        child = agent_process.start(mcp_child, journal, model.url, str(tmp_path),
                                    "pai-kill-ask", None)
        wait_until(lambda: getattr(disk.find_run("pai-kill-ask"), "pending_approval", None),
                   60, "the server's question")
        dmcp.answer("pai-kill-ask", "accept", {"nights": 3}, by="ana", journal=journal)
        wait_until(lambda: calls(count_dir, "book"), 60, "the answer to reach the server")
        assert agent_process.kill(child)
        (count_dir / "release").touch()
        child = agent_process.start(mcp_child, journal, model.url, str(tmp_path),
                                    "pai-kill-ask", None)
        child.join(120)

    assert agent_process.read_result(tmp_path) == "Booked."
    book = step_key(disk, "pai-kill-ask", "book")
    assert [(c["action"], c["nights"], c["step_id"]) for c in calls(count_dir, "book")] == [
        ("accept", 3, f"pai-kill-ask:{book}")] * 2
    asked = [e for e in disk.steps("pai-kill-ask") if e.kind == "approval"]
    assert [(e.key, e.result["by"]) for e in asked] == [(f"{book}.0", "ana")]


@pytest.mark.parametrize("wrong", [5, ["delete_*", 5]])
def test_needs_approval_of_another_kind_is_refused_before_the_run(wrong):
    from durable_nb.integrations.pydantic_ai import JournaledTools

    with pytest.raises(TypeError, match=r"needs_approval takes True, a tool name or glob "
                                        r"pattern, or a list of them"):
        JournaledTools(None, needs_approval=wrong)
