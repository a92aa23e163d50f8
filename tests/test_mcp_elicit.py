"""MCP servers that ask the way most servers ask, ``await ctx.elicit(message, Model)``
(tests/mcp_elicit_server.py), as real processes: one of the ``mcp`` SDK 2.x (``MCPServer``),
one of the ``mcp`` SDK 1.x (in a venv of its own, :func:`sdk1_python`) and one of FastMCP,
each over stdio and streamable HTTP. Under each, the question reaches the run, which parks;
``durable-nb answer`` in another process answers it; the resumed call gets the answer; and a
replay in a new process (a restart) sends no call again.

Calls are counted by the files the server writes: one when its tool asks, one when the tool
has its answer (with the step id durable_nb sent in ``_meta``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import durable_nb.mcp as dmcp
from durable_nb import Status, execute, get_run
from durable_nb.mcp.connection import connection
from tests.harness import wait_until
from tests.harness.commands import run_setup
from tests.test_cli import cli
from tests.test_mcp import (SERVER as RESOLVE_SERVER, calls, count_dir,  # noqa: F401 - fixture
                            decide_in_background, free_port)

SERVER = Path(__file__).with_name("mcp_elicit_server.py")
REPO_ROOT = Path(__file__).resolve().parents[1]
#: The last release of the ``mcp`` SDK 1.x, the servers written before 2.0.
SDK1 = "mcp==1.30.0"
SDK1_VENV = (Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "durable-nb"
             / SDK1.replace("==", "-"))


def sdk1_python() -> str:
    """The Python of a venv with the ``mcp`` SDK 1.x (:data:`SDK1`), kept between runs in
    :data:`SDK1_VENV` as ``.ci/run`` keeps Phoenix's; built now (about 10 s) when missing.
    An index that cannot be reached skips the calling test, except under ``CI=true``."""
    python = SDK1_VENV / "bin" / "python"
    if python.exists():
        return str(python)
    # Built beside it and moved in whole, should another process build it too (a venv's
    # python finds its packages from where it is; only its scripts name the old path).
    building = SDK1_VENV.with_name(f"{SDK1_VENV.name}.building-{os.getpid()}")
    try:
        run_setup([sys.executable, "-m", "venv", "--clear", str(building)])
        run_setup([str(building / "bin" / "python"), "-m", "pip", "install", "-q", SDK1])
        building.rename(SDK1_VENV)
    except OSError:
        if not python.exists():
            raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return str(python)


def python_for(sdk: str) -> str:
    if sdk == "mcp1":
        return sdk1_python()
    if sdk == "fastmcp":
        try:
            from fastmcp import FastMCP  # noqa: F401 - there, or not installed
        except ImportError:
            why = "FastMCP's server is not installed (pip install 'fastmcp-slim[server]')"
            if os.environ.get("CI") == "true":
                pytest.fail(f"CI=true but {why}; the test extra installs it")
            pytest.skip(why)
    return sys.executable


@contextlib.contextmanager
def elicit_server(sdk: str, transport: str, count_dir: Path) -> Iterator[dict]:
    """How to reach a ctx.elicit server of ``sdk`` over ``transport``: the arguments of
    durable_nb.mcp.stdio (``{"stdio": [command, *args]}``) or .http (``{"http": url}``); an
    HTTP server runs in a process of its own meanwhile."""
    python = python_for(sdk)
    if transport == "stdio":
        yield {"stdio": [python, str(SERVER), sdk, str(count_dir), "stdio"]}
        return
    port = free_port()
    process = subprocess.Popen([python, str(SERVER), sdk, str(count_dir), "http", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def listening() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                return True
            except OSError:
                return process.poll() is not None  # ended: said below

        wait_until(listening, 60, f"the {sdk} MCP server to listen")
        assert process.poll() is None, f"the {sdk} HTTP server ended ({process.returncode})"
        yield {"http": f"http://127.0.0.1:{port}/mcp"}
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture(params=[("mcp2", "stdio"), ("mcp2", "http"), ("mcp1", "stdio"),
                        ("mcp1", "http"), ("fastmcp", "stdio"), ("fastmcp", "http")],
                ids=lambda p: "-".join(p))
def server_args(request: pytest.FixtureRequest, count_dir: Path) -> Iterator[dict]:
    """A ctx.elicit server of each SDK over each transport (:func:`elicit_server`)."""
    with elicit_server(*request.param, count_dir) as args:
        yield args


def describe(args: dict) -> dmcp.Server:
    if "stdio" in args:
        return dmcp.stdio(*args["stdio"], name="hotel")
    return dmcp.http(args["http"], name="hotel")


def book(server: dmcp.Server):
    """The agent: one call of ``book``, the model's message written out."""
    def agent(ctx):
        message = {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function",
             "function": {"name": "book", "arguments": json.dumps({"city": "Oslo"})}}]}
        return ctx.call_tools(message, ctx.mcp_tools(server))[0]["content"]
    return agent


REPLAY = """
import json, sys
import durable_nb
from tests.test_mcp_elicit import book, describe
args, journal = json.loads(sys.argv[1]), durable_nb.DiskJournal(sys.argv[2])
print(json.dumps(durable_nb.execute("hotel", book(describe(args)), journal=journal)))
"""


def test_a_ctx_elicit_question_parks_the_run_the_cli_answers_it_and_a_restart_calls_nothing(
        server_args, count_dir, journal, tmp_path):
    """Failed on 1642cc7 for the SDK-2 and FastMCP servers ("Cannot send
    'elicitation/create': this transport context has no back-channel ...")."""
    agent = book(describe(server_args))

    parked = execute("hotel", agent, journal=journal, on_approval="park")
    record = get_run("hotel", journal=journal)
    assert parked is None and record.status is Status.WAITING_APPROVAL, record.error
    question = record.pending_approval["details"]
    assert (question["kind"], question["server"], question["message"]) == (
        "elicitation", "hotel", "How many nights in Oslo?")
    assert question["schema"]["required"] == ["nights"]

    answered = subprocess.run(
        [sys.executable, "-m", "durable_nb.cli", "answer", "hotel", "accept", "--content",
         '{"nights": 3}', "--journal", str(journal.directory), "--by", "bo"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert answered.returncode == 0, answered.stderr

    assert execute("hotel", agent, journal=journal, on_approval="park") == \
        "booked 3 nights in Oslo"
    assert get_run("hotel", journal=journal).status is Status.DONE
    booked = calls(count_dir, "book")
    # The parked call was cancelled while it asked; the resumed one asked again and got the
    # journaled answer, once.
    assert [(c["action"], c["nights"], c["step_id"]) for c in booked] == [
        ("accept", 3, "hotel:1")]
    assert len(calls(count_dir, "asked")) == 2

    dmcp.close()  # a restart: a new process, a new connection (a new stdio server)
    replayed = subprocess.run([sys.executable, "-c", REPLAY, json.dumps(server_args),
                               str(journal.directory)],
                              capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout) == "booked 3 nights in Oslo"
    assert len(calls(count_dir, "book")) == 1 and len(calls(count_dir, "asked")) == 2


# -- the protocol: the handshake by default, another when pinned -----------------------------

def test_the_default_is_the_handshake_and_a_pinned_2026_protocol_still_asks_in_resolve_form(
        count_dir, journal):
    """A server written with the SDK's Elicit/Resolve form (tests/mcp_server.py) asks under
    either protocol; ``protocol=`` pins the one spoken."""
    default = dmcp.stdio(sys.executable, str(RESOLVE_SERVER), str(count_dir), "stdio")
    pinned = dmcp.stdio(sys.executable, str(RESOLVE_SERVER), str(count_dir), "stdio",
                        protocol="2026-07-28")
    assert connection(default).client.protocol_version < "2026"  # a handshake-era version
    assert connection(pinned).client.protocol_version == "2026-07-28"

    decide_in_background(journal, "pinned", lambda shown: dmcp.answer(
        "pinned", "accept", {"nights": 2}, journal=journal))
    agent = book(pinned)
    assert execute("pinned", agent, journal=journal) == "booked 2 nights in Oslo"
    assert [(c["action"], c["nights"]) for c in calls(count_dir, "book")] == [("accept", 2)]


def test_a_ctx_elicit_server_pinned_to_2026_fails_the_call_and_show_gives_the_servers_words(
        count_dir, journal):
    """The 2026 protocol has no channel for ``ctx.elicit``: the step fails, the model is
    told, and ``durable-nb show`` says why (it said ``FAILED mcp.shared.exceptions.MCPError``
    alone on 1642cc7)."""
    server = dmcp.stdio(sys.executable, str(SERVER), "mcp2", str(count_dir), "stdio",
                        name="hotel", protocol="2026-07-28")

    told = execute("hotel-2026", book(server), journal=journal)

    assert "elicitation/create" in told and calls(count_dir, "book") == []
    shown = cli("--journal", str(journal.directory), "show", "hotel-2026").stdout
    [line] = [line for line in shown.splitlines() if " book " in line]
    assert line.endswith("FAILED mcp.shared.exceptions.MCPError: Cannot send "
                         "'elicitation/create': this transport context has no back-channel "
                         "for server-initiated requests.")


@pytest.mark.parametrize(("protocol", "hint"), [
    ("2025-06-18", "not '2025-06-18' (2025-06-18 is a version of the handshake: "
                   "protocol='legacy' agrees on the newest version both sides know)"),
    ("modern", "takes 'legacy', 'auto', '2026-07-28', not 'modern'")])
def test_a_protocol_the_sdk_cannot_speak_is_refused_when_the_server_is_described(
        protocol, hint):
    with pytest.raises(ValueError, match=re.escape(hint)):
        dmcp.stdio(sys.executable, "server.py", protocol=protocol)
    with pytest.raises(ValueError, match=r"durable_nb\.mcp\.http\(protocol=\.\.\.\)"):
        dmcp.http("http://127.0.0.1:8000/mcp", protocol=protocol)


@pytest.fixture(autouse=True)
def closed_connections() -> Iterator[None]:
    yield
    dmcp.close()
