"""MCP tool calls in a real IPython kernel SIGKILLed between calls and during one, against a
real MCP server (tests/mcp_server.py) over stdio (the kernel's child, which dies with it)
and streamable HTTP (a process of its own, which outlives the kernel). Calls are counted by
the files the server writes, each with the step id sent in ``_meta``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from durable_nb import DiskJournal, Status
from durable_nb.mcp import answer, is_elicitation
from tests.harness import KernelSession, start_kernel, wait_until
from tests.test_mcp import SERVER, calls, http_server  # noqa: F401 - the fixture
from tests.test_notebook_kernel import _env

pytestmark = pytest.mark.kernel

SETUP = """
import json, os, sys, time
import durable_nb.mcp as dmcp
SERVER = {server}

def call(ctx, tools, name, **arguments):
    message = {{"role": "assistant", "content": None, "tool_calls": [
        {{"id": "c", "type": "function",
          "function": {{"name": name, "arguments": json.dumps(arguments)}}}}]}}
    return ctx.call_tools(message, tools)[0]["content"]
"""

CELL = """%%durable_agent mcp-kill
tools = ctx.mcp_tools(SERVER)
call(ctx, tools, "count", label="a")
while not os.path.exists("go"):  # between the calls
    time.sleep(0.05)
call(ctx, tools, "slow", label="x")
call(ctx, tools, "count", label="b")
"""


@pytest.fixture(params=["stdio", "http"])
def server_expr(request: pytest.FixtureRequest, count_dir: Path) -> str:
    if request.param == "stdio":
        return (f"dmcp.stdio(sys.executable, {str(SERVER)!r}, {str(count_dir)!r}, 'stdio', "
                f"name='tests')")
    return f"dmcp.http({request.getfixturevalue('http_server')!r}, name='tests')"


@pytest.fixture
def count_dir(tmp_path: Path) -> Path:
    path = tmp_path / "calls"
    path.mkdir()
    return path


def _status(tmp_path: Path, run_id: str) -> Status | None:
    record = DiskJournal(tmp_path / ".durable_nb").find_run(run_id)
    return None if record is None else record.status


def _setup(k: KernelSession, server_expr: str) -> None:
    k.execute("%load_ext durable_nb").raise_for_error()
    k.execute(SETUP.format(server=server_expr)).raise_for_error()


def _resume(k: KernelSession, server_expr: str, cell: str) -> None:
    k.restart()
    _setup(k, server_expr)
    k.execute(cell, timeout=60).raise_for_error()


def test_killed_between_calls_each_call_reaches_the_server_once(tmp_path, count_dir,
                                                                 server_expr):
    with start_kernel(tmp_path, env=_env()) as k:
        _setup(k, server_expr)
        k.execute_async(CELL)
        wait_until(lambda: len(calls(count_dir, "count")) == 1, 30, "the first call")
        wait_until(lambda: len(list(DiskJournal(tmp_path / ".durable_nb").steps("mcp-kill")))
                   == 2, 30, "the first call journaled")
        k.kill()
        (tmp_path / "go").touch()
        (count_dir / "release").touch()
        _resume(k, server_expr, CELL)

    assert _status(tmp_path, "mcp-kill") is Status.DONE
    assert sorted(c["label"] for c in calls(count_dir, "count")) == ["a", "b"]
    assert [c["step_id"] for c in calls(count_dir, "slow")] == ["mcp-kill:2"]


def test_killed_during_a_call_it_is_sent_again_with_the_same_step_id_and_nothing_else_is(
        tmp_path, count_dir, server_expr):
    (tmp_path / "go").touch()
    with start_kernel(tmp_path, env=_env()) as k:
        _setup(k, server_expr)
        k.execute_async(CELL)
        wait_until(lambda: len(calls(count_dir, "slow")) == 1, 30, "the slow call in flight")
        k.kill()
        (count_dir / "release").touch()
        _resume(k, server_expr, CELL)

    assert _status(tmp_path, "mcp-kill") is Status.DONE
    # The call in flight at the kill was sent again (at most twice), under its step's id.
    assert [c["step_id"] for c in calls(count_dir, "slow")] == ["mcp-kill:2", "mcp-kill:2"]
    assert sorted(c["label"] for c in calls(count_dir, "count")) == ["a", "b"]


ASK_CELL = """%%durable_agent mcp-ask
call(ctx, ctx.mcp_tools(SERVER), "book", city="Oslo")
"""


def test_killed_after_a_question_was_answered_the_call_again_gets_the_journaled_answer(
        tmp_path, count_dir, server_expr):
    journal = DiskJournal(tmp_path / ".durable_nb")
    (count_dir / "hold").touch()  # book waits, after the answer, until released

    def asked() -> bool:
        record = journal.find_run("mcp-ask")
        return record is not None and is_elicitation(record.pending_approval)

    with start_kernel(tmp_path, env=_env()) as k:
        _setup(k, server_expr)
        k.execute(ASK_CELL, timeout=60).raise_for_error()  # parks: the question is pending
        assert asked()
        answer("mcp-ask", "accept", {"nights": 3}, by="ana", journal=journal)
        k.execute_async(ASK_CELL)  # resumed: the server gets the answer, then waits
        wait_until(lambda: len(calls(count_dir, "book")) == 1, 30, "the answered call")
        k.kill()
        (count_dir / "release").touch()
        _resume(k, server_expr, ASK_CELL)

    assert _status(tmp_path, "mcp-ask") is Status.DONE  # nobody was asked again
    assert [(c["action"], c["nights"]) for c in calls(count_dir, "book")] == [
        ("accept", 3), ("accept", 3)]
    assert [e.key for e in journal.steps("mcp-ask") if e.kind == "approval"] == ["1.0"]
