"""MCP servers' tools as journaled steps (durable_nb.mcp), against real servers written with
the ``mcp`` SDK (tests/mcp_server.py) over stdio and streamable HTTP.

Calls are counted by the files the server writes, one per call that reached it, each with
the step id durable_nb sent in ``_meta``.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest

import durable_nb
import durable_nb.mcp as dmcp
from durable_nb import DiskJournal, InputChanged, Status, execute, get_run
from durable_nb.errors import InvalidAnswer, NoPendingApproval
from tests.harness import wait_until

SERVER = Path(__file__).with_name("mcp_server.py")


def calls(count_dir: Path, tool: str) -> list[dict[str, Any]]:
    """The calls of ``tool`` that reached the server, as it recorded them."""
    return [json.loads(p.read_text()) for p in sorted(count_dir.glob(f"{tool}-*.json"))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def count_dir(tmp_path: Path) -> Path:
    path = tmp_path / "calls"
    path.mkdir()
    return path


@pytest.fixture
def http_server(count_dir: Path) -> Iterator[str]:
    """A streamable-HTTP MCP server in a process of its own; its URL."""
    port = free_port()
    process = subprocess.Popen([sys.executable, str(SERVER), str(count_dir), "http", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def listening() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                return True
            except OSError:
                return False

        wait_until(listening, 30, "the MCP HTTP server to listen")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(10)


def server_for(transport: str, count_dir: Path, request: pytest.FixtureRequest,
               **env: str) -> dmcp.Server:
    if transport == "stdio":
        return dmcp.stdio(sys.executable, str(SERVER), str(count_dir), "stdio", name="tests",
                          env=env or None)
    return dmcp.http(request.getfixturevalue("http_server"), name="tests")


@pytest.fixture(autouse=True)
def closed_connections() -> Iterator[None]:
    yield
    dmcp.close()


def tool_calls(*calls_: tuple[str, dict]) -> dict[str, Any]:
    """An assistant message calling each (tool, arguments)."""
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{i}", "type": "function",
         "function": {"name": name, "arguments": json.dumps(arguments)}}
        for i, (name, arguments) in enumerate(calls_)]}


def pending(journal: DiskJournal, run_id: str) -> dict | None:
    record = journal.find_run(run_id)
    return None if record is None else record.pending_approval


def decide_in_background(journal: DiskJournal, run_id: str,
                         decide: Callable[[dict], Any]) -> threading.Thread:
    """A person who decides the run's first request, once it is shown."""
    def person() -> None:
        wait_until(lambda: pending(journal, run_id) is not None, 30, "a request")
        decide(pending(journal, run_id))

    thread = threading.Thread(target=person, daemon=True)
    thread.start()
    return thread


# -- tools and calls ------------------------------------------------------------------------

@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_each_call_reaches_the_server_once_with_its_step_id_and_replays_from_the_journal(
        transport, count_dir, journal, request):
    server = server_for(transport, count_dir, request)

    def agent(ctx):
        tools = ctx.mcp_tools(server)
        return ctx.call_tools(tool_calls(("count", {"label": "a"}), ("count", {"label": "b"})),
                              tools)

    first = execute("mcp-once", agent, journal=journal)
    again = execute("mcp-once", agent, journal=journal)

    assert [m["content"] for m in first] == ["a: call 1", "b: call 2"]
    assert again == first
    steps = {s.key: s for s in get_run("mcp-once", journal=journal).steps}
    assert [(c["label"], c["step_id"]) for c in
            sorted(calls(count_dir, "count"), key=lambda c: c["label"])] == [
        ("a", "mcp-once:1"), ("b", "mcp-once:2")]
    assert (steps["1"].kind, steps["1"].name) == ("run", "count")


def test_the_model_is_offered_each_tool_with_the_schema_the_server_gave(count_dir, journal,
                                                                        request):
    server = server_for("stdio", count_dir, request)
    offered = execute("mcp-schemas", lambda ctx: [t.schema for t in ctx.mcp_tools(server)],
                      journal=journal)

    by_name = {t["function"]["name"]: t["function"] for t in offered}
    assert set(by_name) == {"count", "delete_rows", "slow", "book"}
    assert by_name["count"]["description"] == "Count one call with this label."
    assert by_name["count"]["parameters"] == {
        "type": "object", "properties": {"label": {"title": "Label", "type": "string"}},
        "required": ["label"], "title": "countArguments"}


def test_arguments_that_do_not_fit_the_schema_go_back_to_the_model_not_to_the_server(
        count_dir, journal, request):
    server = server_for("stdio", count_dir, request)
    answers = execute("mcp-bad-args", lambda ctx: ctx.call_tools(
        tool_calls(("count", {"lable": "a"})), ctx.mcp_tools(server)), journal=journal)

    assert "missing required argument 'label'" in answers[0]["content"]
    assert calls(count_dir, "count") == []


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_a_tool_matching_needs_approval_waits_and_a_rejected_call_never_reaches_the_server(
        transport, count_dir, journal, request):
    server = server_for(transport, count_dir, request)

    def agent(ctx):
        tools = ctx.mcp_tools(server, needs_approval=["delete_*"])
        return ctx.call_tools(tool_calls(("delete_rows", {"table": "users"}),
                                         ("count", {"label": "a"})), tools)

    decide_in_background(journal, "mcp-approval",
                         lambda shown: durable_nb.reject("mcp-approval", "not prod", by="ana",
                                                         journal=journal))
    answers = execute("mcp-approval", agent, journal=journal)

    assert "The user rejected this call to delete_rows" in answers[0]["content"]
    assert answers[1]["content"] == "a: call 1"
    assert calls(count_dir, "delete_rows") == []
    approvals = [s for s in get_run("mcp-approval", journal=journal).steps
                 if s.kind == "approval"]
    assert [(a.name, a.result["approved"]) for a in approvals] == [("delete_rows", False)]


def test_a_server_whose_tools_changed_since_stops_the_replay_as_an_input_change(
        count_dir, journal, request):
    before = server_for("stdio", count_dir, request)
    execute("mcp-changed", lambda ctx: len(ctx.mcp_tools(before)), journal=journal)
    dmcp.close()
    after = server_for("stdio", count_dir, request, MCP_TEST_EXTRA_TOOL="1")

    with pytest.raises(InputChanged) as raised:
        execute("mcp-changed", lambda ctx: len(ctx.mcp_tools(after)), journal=journal)

    message = str(raised.value)
    assert "run 'tools/list tests': tools.extra was added" in message
    assert len(message.splitlines()) == 1


def test_a_server_that_cannot_start_is_a_clear_error_and_nothing_is_journaled(journal):
    broken = dmcp.stdio(sys.executable, "-c", "import sys; sys.exit(3)", name="broken")

    with pytest.raises(durable_nb.errors.McpServerUnavailable, match="'broken'"):
        execute("mcp-broken", lambda ctx: ctx.mcp_tools(broken), journal=journal)

    assert get_run("mcp-broken", journal=journal).steps == []


def test_a_server_that_dies_during_a_call_stops_the_run_with_nothing_journaled_for_it(
        count_dir, journal, request):
    server = server_for("stdio", count_dir, request, MCP_TEST_EXIT_TOOL="1")

    def agent(ctx):
        return ctx.call_tools(tool_calls(("exit_once", {})), ctx.mcp_tools(server))

    with pytest.raises(durable_nb.errors.McpServerUnavailable, match="tools/call exit_once"):
        execute("mcp-died", agent, journal=journal)
    assert [e.name for e in journal.steps("mcp-died")] == ["tools/list tests"]

    answers = execute("mcp-died", agent, journal=journal)  # a new connection, the call again

    assert answers[0]["content"] == "answered"
    assert [c["step_id"] for c in calls(count_dir, "exit_once")] == ["mcp-died:1"] * 2


# -- elicitation ------------------------------------------------------------------------------

@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_a_servers_question_waits_as_a_request_with_its_schema_and_the_answer_reaches_it(
        transport, count_dir, journal, request):
    server = server_for(transport, count_dir, request)
    shown: list[dict] = []

    def person(request_: dict) -> None:
        shown.append(request_)
        dmcp.answer("mcp-ask", "accept", {"nights": 3}, by="ana", journal=journal)

    decide_in_background(journal, "mcp-ask", person)
    answers = execute("mcp-ask", lambda ctx: ctx.call_tools(
        tool_calls(("book", {"city": "Oslo"})), ctx.mcp_tools(server)), journal=journal)

    assert answers[0]["content"] == "booked 3 nights in Oslo"
    details = shown[0]["details"]
    assert details["kind"] == "elicitation" and details["message"] == "How many nights in Oslo?"
    assert details["schema"]["required"] == ["nights"]
    assert [(c["action"], c["nights"]) for c in calls(count_dir, "book")] == [("accept", 3)]
    asked = [s for s in get_run("mcp-ask", journal=journal).steps if s.kind == "approval"]
    assert [(a.key, a.name) for a in asked] == [("1.0", "book asks")]


def test_an_answer_that_does_not_fit_the_schema_is_refused_and_decline_reaches_the_server(
        count_dir, journal, request):
    server = server_for("stdio", count_dir, request)
    refusals: list[str] = []

    def person(request_: dict) -> None:
        for wrong in ({"nights": "three"}, {}):
            try:
                dmcp.answer("mcp-decline", "accept", wrong, journal=journal)
            except InvalidAnswer as exc:
                refusals.append(str(exc))
        dmcp.answer("mcp-decline", "decline", journal=journal)

    decide_in_background(journal, "mcp-decline", person)
    answers = execute("mcp-decline", lambda ctx: ctx.call_tools(
        tool_calls(("book", {"city": "Oslo"})), ctx.mcp_tools(server)), journal=journal)

    assert answers[0]["content"] == "not booked (decline)"
    assert "field 'nights' must be an integer" in refusals[0]
    assert "missing required field 'nights'" in refusals[1]


def test_answer_refuses_a_run_that_waits_for_an_approval_not_a_question(journal):
    def agent(ctx):
        return ctx.approval("deploy", {"to": "prod"}).approved

    decide_in_background(journal, "mcp-not-a-question", lambda shown: (
        pytest.raises(NoPendingApproval, dmcp.answer, "mcp-not-a-question", "decline",
                      journal=journal),
        durable_nb.approve("mcp-not-a-question", journal=journal)))
    assert execute("mcp-not-a-question", agent, journal=journal) is True


def test_the_command_line_answers_a_question(count_dir, journal, request, tmp_path):
    server = server_for("stdio", count_dir, request)
    done: list[subprocess.CompletedProcess] = []

    def person(request_: dict) -> None:
        done.append(subprocess.run(
            [sys.executable, "-m", "durable_nb.cli", "answer", "mcp-cli", "accept",
             "--content", '{"nights": 5}', "--journal", str(journal.directory), "--by", "bo"],
            capture_output=True, text=True, timeout=60))

    person_thread = decide_in_background(journal, "mcp-cli", person)
    answers = execute("mcp-cli", lambda ctx: ctx.call_tools(
        tool_calls(("book", {"city": "Rome"})), ctx.mcp_tools(server)), journal=journal)
    person_thread.join(60)

    assert done[0].returncode == 0, done[0].stderr
    assert answers[0]["content"] == "booked 5 nights in Rome"


def test_a_parked_question_abandons_the_call_and_the_resumed_call_gets_the_answer(
        count_dir, journal, request):
    server = server_for("stdio", count_dir, request)

    def agent(ctx):
        return ctx.call_tools(tool_calls(("book", {"city": "Oslo"})), ctx.mcp_tools(server))

    execute("mcp-park", agent, journal=journal, on_approval="park")
    assert get_run("mcp-park", journal=journal).status is Status.WAITING_APPROVAL
    dmcp.answer("mcp-park", "accept", {"nights": 4}, journal=journal)
    answers = execute("mcp-park", agent, journal=journal, on_approval="park")

    assert answers[0]["content"] == "booked 4 nights in Oslo"
    # The parked call was cancelled before the tool's body ran; the resumed one got the answer.
    assert [(c["action"], c["nights"]) for c in calls(count_dir, "book")] == [("accept", 4)]


# -- the OpenAI Agents SDK's mcp_servers ------------------------------------------------------

def test_an_agents_sdk_agent_with_mcp_servers_runs_each_call_once_and_asks_approvals(
        count_dir, journal):
    """Refused on 953f9b9 (NotJournaled: "uses MCP servers")."""
    pytest.importorskip("agents")
    import openai
    from agents import Agent
    from agents.mcp import MCPServerStdio

    from durable_nb.integrations.openai_agents import run
    from durable_nb.testing import LoopbackServer, Reply, ToolCall

    script = [Reply(tool_calls=[ToolCall("count", {"label": "a"})]),
              Reply(tool_calls=[ToolCall("delete_rows", {"table": "users"})]), "Done."]

    async def handler(ctx):
        params = {"command": sys.executable, "args": [str(SERVER), str(count_dir), "stdio"]}
        async with MCPServerStdio(params, name="tests",
                                  require_approval={"delete_rows": "always"}) as server:
            agent = Agent(name="ops", model="loopback-1", mcp_servers=[server])
            return (await run(ctx, agent, "Count, then clean up.")).final_output

    with LoopbackServer(script) as model:
        client = openai.AsyncOpenAI(base_url=model.url, api_key="x", max_retries=0)
        decide_in_background(journal, "sdk-mcp", lambda shown: durable_nb.approve(
            "sdk-mcp", journal=journal))
        first = execute("sdk-mcp", handler, journal=journal, client=client, poll_interval=0.05)
        again = execute("sdk-mcp", handler, journal=journal, client=client, poll_interval=0.05)

    assert first == again == "Done."
    assert [c["label"] for c in calls(count_dir, "count")] == ["a"]
    assert [c["table"] for c in calls(count_dir, "delete_rows")] == ["users"]
    steps = [(e.kind, e.name) for e in journal.steps("sdk-mcp")]
    assert ("run", "count") in steps and ("approval", "delete_rows") in steps
    assert ("run", "tools/list tests") in steps
    count_step = next(e for e in journal.steps("sdk-mcp") if e.name == "count")
    assert calls(count_dir, "count")[0]["step_id"] == f"sdk-mcp:{count_step.key}"
