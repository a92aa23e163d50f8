"""The Jupyter Server extension (issue 19): its REST API on a real Jupyter Server (pytest-jupyter's
``jp_serverapp`` / ``jp_fetch``) over real journals, a directory and a PostgreSQL server.

pytest-jupyter's fixtures are imported into this module only (not loaded as a plugin), so its
autouse fixtures and event loop stay out of the rest of the suite; the tests call the server
through :func:`api`, which runs ``jp_fetch`` on the fixtures' loop.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from jupyter_client import BlockingKernelClient

pytest.importorskip("pytest_jupyter")
pytest.importorskip("jupyter_server")

from pytest_jupyter.jupyter_server import *  # noqa: E402,F401,F403 - fixtures for this module

import durable_nb as dn  # noqa: E402
from jupyter_server.auth.identity import IdentityProvider, User  # noqa: E402

from durable_nb import DiskJournal, RunRecord, Status, StepEntry  # noqa: E402
from durable_nb.approvals.request import decision_kind# noqa: E402
from durable_nb.journal import index as index_module  # noqa: E402
from durable_nb.journal.index import (  # noqa: E402
    index_dir,
    journal_id,
    known_locations,
    record_opened,
)
from durable_nb.server import live, views  # noqa: E402
from tests.conftest import run_python  # noqa: E402
from tests.harness import wait_until  # noqa: E402
from tests.test_approvals import _drop  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def jp_server_config():
    return {"ServerApp": {"jpserver_extensions": {"durable_nb.server": True}}}


@pytest.fixture
def index(tmp_path, monkeypatch):
    """An empty journal index of this test's own, and no journal in the environment."""
    folder = tmp_path / "index"
    monkeypatch.setenv("DURABLE_NB_INDEX", str(folder))
    monkeypatch.delenv("DURABLE_NB_JOURNAL", raising=False)
    monkeypatch.delenv("DURABLE_NB_DIR", raising=False)
    return folder


@pytest.fixture
def shared(tmp_path, monkeypatch, index):
    """A directory journal named by ``$DURABLE_NB_JOURNAL`` (as a hub's spawner sets it)."""
    journal = DiskJournal(tmp_path / "shared")
    monkeypatch.setenv("DURABLE_NB_JOURNAL", str(journal.directory))
    yield journal
    journal.close()


@pytest.fixture
def api(jp_fetch, jp_asyncio_loop):
    """``api(path, ...)``: one request to ``durable-nb/api/PATH``; asserts the status code
    (``expect``) and returns the JSON body. ``gather(*calls)`` sends several at once."""
    # The loop tornado's client takes as current: an earlier test's asyncio.run() in this
    # thread leaves none set, and the client would fail to find one.
    asyncio.set_event_loop(jp_asyncio_loop)

    def request(path, *, method="GET", params=None, body=None, headers=None):
        kwargs = {"body": json.dumps(body)} if body is not None else {}
        return jp_fetch("durable-nb", "api", *path.split("/"), method=method,
                        params=params, headers=headers, raise_error=False, **kwargs)

    def call(path, *, expect=200, **kwargs):
        response = jp_asyncio_loop.run_until_complete(request(path, **kwargs))
        assert response.code == expect, (response.code, response.body[:500])
        return json.loads(response.body) if response.body else None

    async def _all(requests):
        return await asyncio.gather(*requests)

    call.request = request
    call.gather = lambda *requests: jp_asyncio_loop.run_until_complete(_all(requests))
    return call


def _done(ctx):
    return ctx.run("step", lambda: 42)


def _failed(ctx):
    ctx.run("boom", lambda: 1 / 0)


def _interrupted(journal, run_id: str) -> None:
    """A run left RUNNING by a process that died: no lease holds it."""
    now = time.time()
    journal.create_run(RunRecord(run_id=run_id, status=Status.RUNNING, created_at=now,
                                 updated_at=now))


def _park(journal, run_id: str, dropped: list[str], db: str = "staging"):
    assert dn.execute(run_id, _drop(db, dropped), journal=journal, on_approval="park") is None
    return journal.get_run(run_id).pending_approval


# -- listing -----------------------------------------------------------------------------------

def _ask_to_drop(db: str):
    def handler(ctx):
        picked = ctx.run("pick", lambda v: v, db)
        return ctx.approval("drop database", {"db": picked}).approved
    return handler


def test_the_fork_of_a_waiting_run_is_listed_with_its_request_and_never_in_the_inbox(
        shared, api):
    assert dn.execute("w", _ask_to_drop("staging"), journal=shared, on_approval="park") is None
    asked = shared.get_run("w").pending_approval
    # The cell edited: executed again from its changed step, the run as it was kept as w@1.
    assert dn.execute("w", _ask_to_drop("scratch"), journal=shared, on_approval="park",
                      on_change="rerun") is None
    assert shared.get_run("w").pending_approval["details"] == {"db": "scratch"}

    inbox = api("runs", params={"status": "waiting_approval"})
    assert [r["run_id"] for r in inbox["runs"]] == ["w"]
    assert inbox["total"] == 1 and inbox["pending_approvals"] == 1
    assert api("summary")["pending_approvals"] == 1
    [fork] = [r for r in api("runs")["runs"] if r["run_id"] == "w@1"]
    assert fork["status"] == "CANCELLED"  # what it waited for is shown, as a cancelled run's
    assert fork["pending_approval"]["digest"] == asked["digest"]
    assert fork["pending_approval"]["run_id"] == "w@1"


def test_runs_are_listed_waiting_first_then_running_interrupted_failed_done_and_paged(shared, api):
    dropped: list[str] = []
    dn.execute("done-1", _done, journal=shared)
    _park(shared, "wait-1", dropped)
    with pytest.raises(ZeroDivisionError):
        dn.execute("failed-1", _failed, journal=shared)
    _interrupted(shared, "crashed-1")
    dn.execute("done-2", _done, journal=shared)
    _park(shared, "wait-2", dropped)

    listing = api("runs")
    assert [r["run_id"] for r in listing["runs"]] == [
        "wait-2", "wait-1", "crashed-1", "failed-1", "done-2", "done-1"]
    assert listing["total"] == 6 and listing["pending_approvals"] == 2
    crashed = listing["runs"][2]
    assert crashed["status"] == "RUNNING" and crashed["interrupted"] is True
    waiting = listing["runs"][0]
    assert waiting["pending_approval"]["name"] == "drop database"
    assert waiting["pending_approval"]["digest"] == \
        shared.get_run("wait-2").pending_approval["digest"]
    assert waiting["journal"] == journal_id(str(shared.directory))

    pages = [api("runs", params={"limit": 4, "page": page}) for page in (0, 1, 2)]
    assert [len(p["runs"]) for p in pages] == [4, 2, 0]
    assert [r["run_id"] for p in pages for r in p["runs"]] == \
        [r["run_id"] for r in listing["runs"]]
    assert all(p["total"] == 6 for p in pages)

    only = api("runs", params={"status": "interrupted,done"})
    assert [r["run_id"] for r in only["runs"]] == ["crashed-1", "done-2", "done-1"]
    assert [r["run_id"] for r in api("runs", params={"q": "WAIT"})["runs"]] == ["wait-2", "wait-1"]
    assert [r["run_id"] for r in api("runs", params={"prefix": "done-"})["runs"]] == \
        ["done-2", "done-1"]
    assert "unknown status" in api("runs", params={"status": "later"}, expect=400)["message"]
    api("runs", params={"limit": 0}, expect=400)


def test_a_run_shows_its_steps_as_text_and_its_notebook_relative_to_the_server_root(
        shared, api, jp_root_dir):
    notebook = jp_root_dir / "reports" / "weekly.ipynb"
    dn.execute("nb-run", _done, journal=shared, notebook=str(notebook), cell_id="c0ffee")
    view = api("run", params={"journal": journal_id(str(shared.directory)), "id": "nb-run"})
    assert view["record"]["notebook"] == "reports/weekly.ipynb"
    assert view["record"]["cell_id"] == "c0ffee"
    assert view["record"]["result"] == "42"
    assert [(s["name"], s["kind"], s["answer"]) for s in view["steps"]] == [("step", "run", "42")]
    api("run", params={"journal": journal_id(str(shared.directory)), "id": "nope"}, expect=404)


@pytest.mark.kernel
def test_a_run_started_in_a_notebooks_kernel_is_listed_with_that_notebook_and_cell(
        shared, api, jp_fetch, jp_asyncio_loop, jp_serverapp, jp_root_dir):
    (jp_root_dir / "reports").mkdir()
    session = jp_asyncio_loop.run_until_complete(jp_fetch("api", "sessions", method="POST",
        body=json.dumps({"path": "reports/weekly.ipynb", "name": "weekly.ipynb",
                         "type": "notebook", "kernel": {"name": "python3"}})))
    kernel_id = json.loads(session.body)["kernel"]["id"]
    client = BlockingKernelClient()
    client.load_connection_info(jp_serverapp.kernel_manager.get_kernel(kernel_id)
                                .get_connection_info())
    # No heartbeat: without a manager of its own the client judges the kernel alive by it, and
    # a loaded machine misses a beat ("Kernel died before replying to kernel_info").
    client.start_channels(hb=False)
    try:
        client.wait_for_ready(timeout=60)
        code = "%load_ext durable_nb\n"
        assert client.execute_interactive(code, timeout=60)["content"]["status"] == "ok"
        # An execute request as JupyterLab sends it: the cell's id in its metadata.
        request = client.session.msg("execute_request", {
            "code": "%%durable_agent\nctx.run('a', lambda: 41) + 1", "silent": False,
            "store_history": True, "user_expressions": {}, "allow_stdin": False},
            metadata={"cellId": "5f3c0ffe-0000-4000-8000-000000000001"})
        client.shell_channel.send(request)
        reply = client.get_shell_msg(timeout=120)
        while reply["parent_header"].get("msg_id") != request["header"]["msg_id"]:
            reply = client.get_shell_msg(timeout=120)  # a late kernel_info_reply of the wait
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        client.stop_channels()
        jp_asyncio_loop.run_until_complete(jp_serverapp.kernel_manager.shutdown_kernel(kernel_id))
    listed = api("runs")["runs"]
    assert [(r["run_id"], r["notebook"], r["cell_id"], r["status"]) for r in listed] == [
        ("cell-5f3c0ffe-000", "reports/weekly.ipynb", "5f3c0ffe-0000-4000-8000-000000000001",
         "DONE")]


# -- decisions -------------------------------------------------------------------------------

def test_approve_with_the_digest_shown_and_the_run_goes_on_when_resumed(shared, api):
    dropped: list[str] = []
    pending = _park(shared, "r", dropped)
    shown = api("runs")["runs"][0]["pending_approval"]
    answer = api("run/decision", method="POST", body={
        "journal": journal_id(str(shared.directory)), "id": "r", "approved": True,
        "note": "ship it", "digest": shown["digest"], "request_id": shown["id"]})
    assert answer["ok"] and not answer["taken"]
    assert answer["message"] == "approved; re-run its cell to continue"
    decision = shared.get_request(decision_kind(pending), "r")
    assert decision["approved"] is True and decision["note"] == "ship it"
    assert decision["by"]  # the Jupyter user's name
    listed = api("runs")
    assert listed["pending_approvals"] == 0  # decided: waits for its cell, not for a person
    assert listed["runs"][0]["decision"]["approved"] is True
    assert dn.execute("r", _drop("staging", dropped), journal=shared) == "dropped staging"
    assert dropped == ["staging"]


def test_the_decision_post_takes_edited_args_and_a_message(shared, api):
    """Issue 34: ``args`` approves with edited arguments (checked against the schema: a 400
    naming what is wrong, nothing written), ``message`` rejects with a message."""
    schema = {"type": "object", "properties": {"database": {"type": "string"}},
              "required": ["database"]}

    def query(ctx):
        decision = ctx.approval("query", {"tool": "query", "arguments": {"database": "prod"}},
                                schema=schema)
        return [decision.approved, decision.args, decision.message]

    journal = journal_id(str(shared.directory))
    for run_id in ("a", "b"):
        assert dn.execute(run_id, query, journal=shared, on_approval="park") is None
    shown = {r["run_id"]: r["pending_approval"] for r in api("runs")["runs"]}
    seen = {"journal": journal, "approved": True, "digest": shown["a"]["digest"],
            "request_id": shown["a"]["id"], "id": "a"}
    bad = api("run/decision", method="POST", expect=400, body={**seen, "args": {"db": "x"}})
    assert "missing required argument 'database'" in bad["message"]
    assert shared.get_request(decision_kind(shown["a"]), "a") is None
    done = api("run/decision", method="POST", body={**seen, "args": {"database": "staging"}})
    assert done["message"] == ('approved with edited arguments {"database": "staging"}; '
                               're-run its cell to continue')
    done = api("run/decision", method="POST", body={
        "journal": journal, "id": "b", "approved": False, "digest": shown["b"]["digest"],
        "request_id": shown["b"]["id"], "message": "Denied: use staging"})
    assert done["message"] == ('rejected with the message "Denied: use staging"; re-run its '
                               'cell to continue')
    # GET runs shows each decision with what it says (the sidebar's and the saved view's).
    decided = {r["run_id"]: r["decision"] for r in api("runs")["runs"]}
    assert (decided["a"]["args"], decided["a"]["message"]) == ({"database": "staging"}, None)
    assert (decided["b"]["args"], decided["b"]["message"]) == (None, "Denied: use staging")
    assert dn.execute("a", query, journal=shared) == [True, {"database": "staging"}, None]
    assert dn.execute("b", query, journal=shared) == [False, None, "Denied: use staging"]


_NIGHTS = {"type": "object", "properties": {"nights": {"type": "integer", "minimum": 1}},
           "required": ["nights"]}


def _asked_nights(ctx):
    """A run parked on an MCP server's question, as durable_nb.mcp.elicitation asks it."""
    decision = ctx.approval("book asks", {"kind": "elicitation", "server": "hotels",
                                          "tool": "book", "message": "How many nights?",
                                          "schema": _NIGHTS})
    return [decision.approved, decision.answer]


def test_the_decision_post_answers_a_question_and_refuses_a_malformed_answer_in_one_line(
        shared, api):
    """Issue 34: ``answer: {action, content}`` answers an MCP server's question (the
    content checked against its schema); a malformed answer, or one with what only an
    approval carries, is a 400 in one line and nothing is written."""
    journal = journal_id(str(shared.directory))
    assert dn.execute("q", _asked_nights, journal=shared, on_approval="park") is None
    _park(shared, "plain", [])
    shown = {r["run_id"]: r["pending_approval"] for r in api("runs")["runs"]}
    seen = {"journal": journal, "id": "q", "digest": shown["q"]["digest"],
            "request_id": shown["q"]["id"]}
    refusals = {
        "'answer' must be an object": {"answer": "accept"},
        "'answer.action' must be accept, decline or cancel, not \"maybe\"": {
            "answer": {"action": "maybe"}},
        "'answer.content' must be an object": {"answer": {"action": "accept", "content": 3}},
        "'answer.content' goes with accept only, not decline": {
            "answer": {"action": "decline", "content": {"nights": 2}}},
        "'args' cannot go with 'answer'": {"answer": {"action": "accept"}, "args": {"a": 1}},
        "'message' cannot go with 'answer'": {"answer": {"action": "decline"},
                                              "message": "no"},
        "'approved' is false but the answer is accept": {
            "answer": {"action": "accept", "content": {"nights": 2}}, "approved": False},
        "nights": {"answer": {"action": "accept", "content": {"nights": "three"}}},
    }
    for said, body in refusals.items():
        refused = api("run/decision", method="POST", expect=400, body={**seen, **body})
        assert said in refused["message"] and "\n" not in refused["message"], refused
    assert shared.get_request(decision_kind(shown["q"]), "q") is None
    not_a_question = api("run/decision", method="POST", expect=400, body={
        "journal": journal, "id": "plain", "digest": shown["plain"]["digest"],
        "request_id": shown["plain"]["id"], "answer": {"action": "accept"}})
    assert "is not a question from an MCP server" in not_a_question["message"]
    assert shared.get_request(decision_kind(shown["plain"]), "plain") is None

    reply = api("run/decision", method="POST", body={
        **seen, "answer": {"action": "accept", "content": {"nights": 3}}, "note": "hm"})
    assert reply["message"] == "accepted; re-run its cell to continue"
    decision = shared.get_request(decision_kind(shown["q"]), "q")
    assert (decision["by"], decision["via"]) == (reply["by"], "Jupyter server")
    assert decision["answer"] == {"action": "accept", "content": {"nights": 3}}
    assert decision["note"] == "hm"  # a note goes with an answer, as on the decision page
    listed = next(r for r in api("runs")["runs"] if r["run_id"] == "q")
    assert listed["decision"]["answer"] == {"action": "accept", "content": {"nights": 3}}
    assert listed["decision"]["note"] == "hm"
    again = api("run/decision", method="POST", expect=409, body={
        **seen, "answer": {"action": "cancel"}})
    assert again["decision"]["answer"] == {"action": "accept", "content": {"nights": 3}}
    approved, answer = dn.execute("q", _asked_nights, journal=shared)
    assert approved and answer == {"action": "accept", "content": {"nights": 3}}


def _decide_by(shared, api, run_id: str) -> str:
    """Park ``run_id``, approve it through the API; who the journal says decided."""
    pending = _park(shared, run_id, [])
    shown = api("runs")["runs"][0]["pending_approval"]
    answer = api("run/decision", method="POST", body={
        "journal": journal_id(str(shared.directory)), "id": run_id, "approved": True,
        "digest": shown["digest"], "request_id": shown["id"]})
    recorded = shared.get_request(decision_kind(pending), run_id)["by"]
    assert answer["by"] == recorded
    return recorded


def test_a_token_logins_anonymous_user_is_recorded_as_the_configured_approver(
        shared, api, monkeypatch):
    """A token login makes Jupyter invent "Anonymous <moon>" per browser: the journal gets
    $DURABLE_NB_USER instead, else the OS user who runs the server."""
    monkeypatch.setenv("DURABLE_NB_USER", "Ada Lovelace")
    assert _decide_by(shared, api, "named") == "Ada Lovelace"
    monkeypatch.delenv("DURABLE_NB_USER")
    by = _decide_by(shared, api, "os-user")
    assert by == f"{getpass.getuser()}@{socket.gethostname()}" and "Anonymous" not in by


class _NamedIdentity(IdentityProvider):
    """An identity provider that knows its users (as JupyterHub's does): the token still
    authenticates the request, the user is named."""

    async def get_user(self, handler):
        anonymous = await super().get_user(handler)
        return User("gh-1815", name="Grace Hopper") if anonymous else None


@pytest.mark.parametrize("jp_server_config", [{"ServerApp": {
    "jpserver_extensions": {"durable_nb.server": True},
    "identity_provider_class": _NamedIdentity}}])
def test_a_named_identity_providers_user_stays_the_approver(shared, api, monkeypatch):
    monkeypatch.setenv("DURABLE_NB_USER", "Ada Lovelace")
    assert _decide_by(shared, api, "hub") == "Grace Hopper"


def test_the_saved_panels_decide_here_markup_decides_through_the_server_bound_to_its_digest(
        shared, api):
    """What a dead kernel's panel shows (its saved view) names the run and the digest of the
    request shown; the lab extension posts exactly those, and who decided comes back."""
    from durable_nb.notebook.panel import RunPanel

    dropped: list[str] = []
    _park(shared, "saved", dropped)
    view = RunPanel(shared.get_run("saved"), journal=shared).static_html()
    found = re.search(r"class='dnb-decide-here' data-durable-nb-decide='([^']*)' "
                      r"data-durable-nb-digest='([0-9a-f]+)' data-durable-nb-request='([^']*)'",
                      view)
    assert found and found.group(1) == "saved"
    _park(shared, "saved", dropped, db="production")  # the request changed since it was drawn
    changed = api("run/decision", method="POST", expect=409, body={
        "journal": journal_id(str(shared.directory)), "id": "saved", "approved": True,
        "digest": found.group(2), "request_id": found.group(3)})
    assert "saved" in changed["message"]
    view = RunPanel(shared.get_run("saved"), journal=shared).static_html()
    found = re.search(r"data-durable-nb-digest='([0-9a-f]+)' data-durable-nb-request='([^']*)'",
                      view)
    answer = api("run/decision", method="POST", body={
        "journal": journal_id(str(shared.directory)), "id": "saved", "approved": True,
        "digest": found.group(1), "request_id": found.group(2)})
    assert answer["by"] and answer["message"] == "approved; re-run its cell to continue"
    assert dn.execute("saved", _drop("production", dropped), journal=shared) == \
        "dropped production"
    assert dropped == ["production"]


def test_a_decision_taken_at_once_by_a_waiting_executor_says_the_run_resumes(shared, api):
    dropped: list[str] = []
    outcome: list = []
    worker = threading.Thread(target=lambda: outcome.append(dn.execute(
        "w", _drop("staging", dropped), journal=shared, on_approval="wait")))
    worker.start()
    deadline = time.monotonic() + 60
    while (record := shared.find_run("w")) is None or not record.pending_approval:
        assert time.monotonic() < deadline and worker.is_alive(), "the run never asked"
        time.sleep(0.02)
    answer = api("run/decision", method="POST", body={
        "journal": journal_id(str(shared.directory)), "id": "w", "approved": True,
        "digest": record.pending_approval["digest"],
        "request_id": record.pending_approval["id"]})
    worker.join(60)
    assert answer["taken"] and answer["message"] == "approved; the run resumes in its kernel"
    assert outcome == ["dropped staging"] and dropped == ["staging"]


def test_a_decision_on_a_request_that_changed_since_it_was_shown_is_refused(shared, api):
    dropped: list[str] = []
    _park(shared, "r", dropped, "staging")
    shown = api("runs")["runs"][0]["pending_approval"]
    shared.delete_run("r")
    _park(shared, "r", dropped, "production")  # the cell was edited: it asks something else
    refused = api("run/decision", method="POST", expect=409, body={
        "journal": journal_id(str(shared.directory)), "id": "r", "approved": True,
        "digest": shown["digest"], "request_id": shown["id"]})
    assert "production" in refused["message"] and "nothing was decided" in refused["message"]
    assert api("runs")["pending_approvals"] == 1
    api("run/decision", method="POST", expect=400, body={
        "journal": journal_id(str(shared.directory)), "id": "r", "approved": True})


def test_reject_with_a_note_and_the_run_takes_the_rejection(shared, api):
    dropped: list[str] = []
    _park(shared, "r", dropped)
    shown = api("runs")["runs"][0]["pending_approval"]
    digest, request_id = shown["digest"], shown["id"]
    api("run/decision", method="POST", body={
        "journal": journal_id(str(shared.directory)), "id": "r", "approved": False,
        "note": "not today", "digest": digest, "request_id": request_id})
    assert dn.execute("r", _drop("staging", dropped), journal=shared) == "kept"
    assert dropped == []
    api("run/decision", method="POST", expect=409, body={
        "journal": journal_id(str(shared.directory)), "id": "r", "approved": True,
        "digest": digest, "request_id": request_id})  # DONE: nothing pending any more


def test_concurrent_decisions_one_wins_per_request_and_each_run_gets_its_own(shared, api):
    dropped: list[str] = []
    asked = {f"item-{i}": _park(shared, f"item-{i}", dropped, f"db{i}") for i in range(12)}
    jid = journal_id(str(shared.directory))
    responses = api.gather(*[api.request("run/decision", method="POST", body={
        "journal": jid, "id": run_id, "approved": True, "digest": pending["digest"],
        "request_id": pending["id"]})
        for run_id, pending in asked.items()])
    assert [r.code for r in responses] == [200] * 12
    assert api("summary")["pending_approvals"] == 0
    for i in range(12):
        assert dn.execute(f"item-{i}", _drop(f"db{i}", dropped), journal=shared) == f"dropped db{i}"
    assert sorted(dropped) == sorted(f"db{i}" for i in range(12))

    pending = _park(shared, "contested", dropped, "main")
    both = api.gather(*[api.request("run/decision", method="POST", body={
        "journal": jid, "id": "contested", "approved": approved, "digest": pending["digest"],
        "request_id": pending["id"]})
        for approved in (True, False)])
    assert sorted(r.code for r in both) == [200, 409]
    winner = json.loads(next(r.body for r in both if r.code == 200))["message"].split(";")[0]
    refused = json.loads(next(r.body for r in both if r.code == 409))["message"]
    assert f"already {winner}" in refused
    expected = "dropped main" if winner == "approved" else "kept"
    assert dn.execute("contested", _drop("main", dropped), journal=shared) == expected
    assert dropped.count("main") == (winner == "approved")


def test_a_second_decision_is_refused_naming_the_first_and_replace_changes_it(shared, api):
    """Decided in a terminal first: the server refuses another decision (409) with who, how
    and when, in words and as data; ``"replace": true`` changes it until the run takes it,
    never after."""
    dropped: list[str] = []
    pending = _park(shared, "r", dropped)
    _cli(str(shared.directory), "approve", "r", "fine", "--by", "ana")
    body = {"journal": journal_id(str(shared.directory)), "id": "r", "digest": pending["digest"],
            "request_id": pending["id"]}
    refused = api("run/decision", method="POST", expect=409, body={**body, "approved": False})
    assert re.fullmatch(r"run 'r': 'drop database' was already approved by ana via durable-nb "
                        r"at \d{4}-\d\d-\d\d [\d:]+; nothing was changed\. To change it before "
                        r"the run takes it, decide again with --replace \(replace=True in "
                        r"Python\)\.", refused["message"]), refused["message"]
    assert refused["taken"] is False
    assert {k: refused["decision"][k] for k in ("approved", "by", "via", "note")} == \
        {"approved": True, "by": "ana", "via": "durable-nb", "note": "fine"}
    assert shared.get_request(decision_kind(pending), "r")["by"] == "ana"

    api("run/decision", method="POST", expect=400, body={**body, "approved": False,
                                                          "replace": "yes"})
    replaced = api("run/decision", method="POST", body={**body, "approved": False,
                                                         "note": "not now", "replace": True})
    assert replaced["ok"]
    decision = shared.get_request(decision_kind(pending), "r")
    assert (decision["approved"], decision["via"]) == (False, "Jupyter server")
    assert [(d["by"], d["via"]) for d in decision["replaced"]] == [("ana", "durable-nb")]
    assert api("runs")["runs"][0]["decision"]["via"] == "Jupyter server"

    assert dn.execute("r", _drop("staging", dropped), journal=shared) == "kept"
    taken = api("run/decision", method="POST", expect=409, body={**body, "approved": True,
                                                                  "replace": True})
    assert taken["taken"] is True and "can never change" in taken["message"]
    assert dropped == []


def test_cancel_a_waiting_run_and_refuse_to_cancel_a_done_one(shared, api):
    dropped: list[str] = []
    _park(shared, "r", dropped)
    dn.execute("finished", _done, journal=shared)
    jid = journal_id(str(shared.directory))
    answer = api("run/cancel", method="POST", body={"journal": jid, "id": "r"})
    assert answer["status"] == "CANCELLED" and shared.get_run("r").status is Status.CANCELLED
    api("run/cancel", method="POST", body={"journal": jid, "id": "finished"}, expect=409)


# -- security --------------------------------------------------------------------------------

def test_every_endpoint_refuses_a_request_without_a_token(shared, api):
    no_token = {"Authorization": ""}
    for path in ("journals", "runs", "run", "batch", "batches", "summary", "version"):
        api(path, headers=no_token, expect=403)
    for path in ("run/decision", "run/cancel"):
        api(path, method="POST", body={}, headers=no_token, expect=403)


def test_a_cookie_authenticated_post_without_the_xsrf_token_is_refused(shared, api):
    dropped: list[str] = []
    pending = _park(shared, "r", dropped)
    # A browser's session: the login cookie the server sets on a token-authenticated
    # request, and its _xsrf cookie; no token on the POST itself.
    first = api.request("version")
    response = api.gather(first)[0]
    cookies = "; ".join(c.split(";")[0] for c in response.headers.get_list("Set-Cookie"))
    assert cookies
    body = {"journal": journal_id(str(shared.directory)), "id": "r", "approved": True,
            "digest": pending["digest"], "request_id": pending["id"]}
    api("run/decision", method="POST", body=body, expect=403,
        headers={"Authorization": "", "Cookie": cookies})
    assert shared.get_request(decision_kind(pending), "r") is None
    # With the XSRF token, as JupyterLab sends it (the _xsrf cookie repeated in a header):
    token = "d0ubl3-subm1t-t0ken"
    api("run/decision", method="POST", body=body,
        headers={"Authorization": "", "Cookie": f"{cookies}; _xsrf={token}",
                 "X-XSRFToken": token})
    assert shared.get_request(decision_kind(pending), "r")["approved"] is True


def test_a_hostile_journal_entry_is_shown_as_text_and_nothing_is_imported(shared, api):
    hostile = "<script>alert('x')</script><img src=x onerror=alert(1)>"
    now = time.time()
    shared.create_run(RunRecord(run_id="evil", title=hostile, status=Status.DONE,
                                created_at=now, updated_at=now, step_count=1,
                                result={"$t": "model", "cls": "dnb_evil_payload.Payload",
                                        "v": {"html": hostile}}))
    shared.append_step("evil", StepEntry(
        0, "0", "fetch", "run", request={"url": hostile},
        result={"$t": "model", "cls": "dnb_evil_payload.Payload", "v": hostile},
        started_at=now, finished_at=now))
    before = set(sys.modules)
    response = api.gather(api.request("run", params={
        "journal": journal_id(str(shared.directory)), "id": "evil"}))[0]
    assert response.code == 200
    assert response.headers["Content-Type"].startswith("application/json")
    view = json.loads(response.body)
    assert view["record"]["title"] == hostile
    assert hostile in view["steps"][0]["answer"] and hostile in view["steps"][0]["asked"]
    assert hostile in view["record"]["result"]
    assert isinstance(view["record"]["result"], str)
    assert api("runs")["runs"][0]["title"] == hostile
    # A record someone else wrote, with an object where the title goes: text in the listing.
    shared.create_run(RunRecord(run_id="odd", title={"$t": "model", "cls": "dnb_evil_payload.X",
                                                     "v": hostile}, created_at=now - 1,
                                status=Status.DONE))
    odd = api("runs", params={"q": "odd"})["runs"]
    assert [r["run_id"] for r in odd] == ["odd"] and odd[0]["title"] == hostile
    assert not [m for m in set(sys.modules) - before if "evil" in m]
    assert "dnb_evil_payload" not in sys.modules


def test_a_journal_outside_the_allowed_ones_is_refused(shared, api, tmp_path):
    dropped: list[str] = []
    other = DiskJournal(tmp_path / "elsewhere")  # never opened through open_journal
    pending = _park(other, "r", dropped)
    for name in (str(other.directory), str(tmp_path / "shared" / ".." / "elsewhere")):
        api("runs", params={"journal": name}, expect=403)
        api("run/decision", method="POST", expect=403, body={
            "journal": name, "id": "r", "approved": True, "digest": pending["digest"],
            "request_id": pending["id"]})
    assert other.get_request(decision_kind(pending), "r") is None
    api("runs", params={"journal": str(tmp_path / "new")}, expect=403)
    assert not (tmp_path / "new").exists()  # nothing created
    api("runs", params={"journal": "j0000000000"}, expect=404)
    # The allowed one, named by its location, is the same as by its id.
    assert api("runs", params={"journal": str(shared.directory)})["total"] == 0


def test_a_journal_opened_by_a_process_is_listed_and_dropped_once_deleted(index, api,
                                                                         jp_root_dir):
    folder = jp_root_dir / "kernel-journal"  # under the server's root: this server's
    run_python("import durable_nb as dn, sys\n"
               "dn.execute('from-kernel', lambda ctx: ctx.run('s', lambda: 1),\n"
               "           journal=sys.argv[1])",
               str(folder), env={"DURABLE_NB_INDEX": str(index), "PYTHONPATH": str(REPO)})
    _age(folder)  # written long ago: what the listing read of it is kept
    journals = api("journals")["journals"]
    assert [(j["id"], j["location"], j["kind"], j["ok"], j["runs"]) for j in journals] == \
        [(journal_id(str(folder)), str(folder), "disk", True, 1)]
    assert [r["run_id"] for r in api("runs")["runs"]] == ["from-kernel"]
    _age(folder)  # opening it made SQLite's log: long ago too
    api("summary")
    assert (index_dir() / f"{journal_id(str(folder))}.json").stat().st_mode & 0o077 == 0
    assert journal_id(str(folder)) in views._facts
    shutil.rmtree(folder)
    assert api("journals")["journals"] == []
    assert list(index.glob("*.json")) == []
    api("summary")
    assert journal_id(str(folder)) not in views._facts  # nothing kept of it


def test_a_listing_shows_this_server_s_journals_and_the_others_on_request(
        shared, index, api, jp_root_dir, tmp_path):
    """Issue 41: by default the journals under the server's root and the configured ones,
    each named by where it is; ``all=true`` adds every other journal a process of the user
    opened (another folder's, another program's), counted only then (on e76e470 the first
    listing held them all, labelled by the end of their paths)."""
    mine = _journal_in_index(jp_root_dir / "project", "journal")
    other = _journal_in_index(tmp_path / "pytest-7", "journal")
    for journal in (shared, mine, other):
        _park(journal, f"ask-{journal.directory.parent.name}", [])
    listed = api("journals")["journals"]
    assert [(j["name"], j["here"]) for j in listed] == [
        (str(shared.directory), True), ("project/journal", True)]
    every = api("journals", params={"all": "true"})["journals"]
    assert [(j["name"], j["here"]) for j in every] == [
        (str(shared.directory), True), ("project/journal", True),
        (str(other.directory), False)]
    waiting = {"status": "waiting_approval"}
    runs = api("runs", params=waiting)
    assert sorted((r["run_id"], r["journal_name"]) for r in runs["runs"]) == [
        ("ask-project", "project/journal"), (f"ask-{tmp_path.name}", str(shared.directory))]
    assert runs["pending_approvals"] == api("summary")["pending_approvals"] == 2
    runs = api("runs", params={**waiting, "all": "true"})
    assert ("ask-pytest-7", str(other.directory)) in [
        (r["run_id"], r["journal_name"]) for r in runs["runs"]]
    assert runs["pending_approvals"] == api("summary", params={"all": "1"})[
        "pending_approvals"] == 3
    assert api("runs", params={"all": "maybe"}, expect=400)["message"] == \
        "all='maybe' must be true or false"
    # Named by its id or location, the other journal is still allowed.
    assert api("runs", params={"journal": str(other.directory)})["total"] == 2


def test_an_unreachable_journal_in_the_index_is_reported_and_the_others_still_listed(
        shared, api, index):
    dn.execute("here", _done, journal=shared)
    gone = "postgresql://nobody@127.0.0.1:1/nowhere?schema=old"  # nothing listens on port 1
    record_opened(gone)
    every = {"all": "true"}  # not this server's: a process of the user opened it
    journals = {j["location"]: j for j in api("journals", params=every)["journals"]}
    assert journals[str(shared.directory)]["ok"] is True
    assert journals["postgresql://nobody@127.0.0.1:1/nowhere?schema=old"]["ok"] is False
    listing = api("runs", params=every)
    assert [r["run_id"] for r in listing["runs"]] == ["here"]
    assert [u["journal"] for u in listing["unavailable"]] == [journal_id(gone)]
    assert api("summary", params=every)["unavailable"] == listing["unavailable"]


def test_a_journal_index_that_cannot_be_written_never_fails_a_run(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("DURABLE_NB_INDEX", str(blocker / "index"))
    folder = tmp_path / "journal"
    assert dn.execute("r", _done, journal=str(folder)) == 42
    assert dn.open_journal(str(folder)).get_run("r").status is Status.DONE


def test_a_batch_and_its_items(shared, api):
    dn.map(lambda ctx, item: ctx.run("double", lambda: item * 2), [1, 2, 3], batch_id="b",
           journal=shared)
    jid = journal_id(str(shared.directory))
    view = api("batch", params={"journal": jid, "id": "b"})
    assert view["batch"]["items"] == 3 and view["batch"]["counts"] == {"DONE": 3}
    assert all(item["batch_id"] == "b" for item in view["items"])
    assert api("batches")["batches"][0]["batch_id"] == "b"
    api("batch", params={"journal": jid, "id": "nope"}, expect=404)


def test_summary_version_changes_when_a_run_changes(shared, api):
    dropped: list[str] = []
    first = api("summary")
    assert api("summary") == first
    pending = _park(shared, "r", dropped)
    second = api("summary")
    assert second["pending_approvals"] == 1 and second["version"] != first["version"]
    dn.approve("r", expect=pending["digest"], journal=shared)
    third = api("summary")
    assert third["pending_approvals"] == 0 and third["version"] != second["version"]


# -- the summary pushed: GET events (server-sent events) -------------------------------------

class EventStream:
    """``GET durable-nb/api/events`` read over a raw socket, as a browser's EventSource does:
    :meth:`next` is the next ``summary`` event's data, :meth:`close` ends the connection."""

    def __init__(self, loop, port: int, base_url: str, headers: dict) -> None:
        self._loop = loop
        self._reader, self._writer = loop.run_until_complete(
            asyncio.open_connection("127.0.0.1", port))
        lines = [f"GET {base_url}durable-nb/api/events HTTP/1.1", f"Host: 127.0.0.1:{port}",
                 "Accept: text/event-stream", *(f"{k}: {v}" for k, v in headers.items())]
        self._writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        self.head = loop.run_until_complete(asyncio.wait_for(
            self._reader.readuntil(b"\r\n\r\n"), 60)).decode()

    def next(self) -> dict:
        """The next summary event (a 60 s guard against a hang, not a margin)."""
        return self._loop.run_until_complete(asyncio.wait_for(self._next(), 60))

    async def _next(self) -> dict:
        while True:  # chunked transfer: the events' lines arrive between chunk sizes
            line = (await self._reader.readline()).decode().strip()
            if line.startswith("data: "):
                return json.loads(line[len("data: "):])

    def close(self) -> None:
        self._writer.close()


@pytest.fixture
def events(jp_asyncio_loop, jp_http_port, jp_base_url, jp_auth_header, http_server):
    """``events()`` opens an event stream (``headers=`` instead of the token's); all closed
    at the end of the test."""
    opened: list[EventStream] = []

    def open_stream(headers=None):
        stream = EventStream(jp_asyncio_loop, jp_http_port, jp_base_url,
                             jp_auth_header if headers is None else headers)
        opened.append(stream)
        return stream

    yield open_stream
    for stream in opened:
        stream.close()


def _watcher(jp_serverapp):
    return jp_serverapp.web_app.settings.get("durable_nb_watchers", {}).get(False)


def _cli(journal_location: str, *args: str) -> None:
    """``durable-nb --journal LOCATION ARGS`` in another process."""
    proc = subprocess.run([sys.executable, "-m", "durable_nb.cli", "--journal", journal_location,
                           *args], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_an_approval_from_the_cli_is_pushed_to_every_open_stream_by_one_watcher(
        shared, events, jp_serverapp):
    dropped: list[str] = []
    _park(shared, "r", dropped)
    first, second = events(), events()
    assert "200 OK" in first.head and "text/event-stream" in first.head
    assert first.next()["pending_approvals"] == 1 == second.next()["pending_approvals"]
    _cli(str(shared.directory), "approve", "r", "from a terminal")
    pushed = first.next()
    assert pushed["pending_approvals"] == 0 and second.next() == pushed
    watcher = _watcher(jp_serverapp)  # the server's one watcher serves both streams
    assert watcher.running and len(watcher._streams) == 2


def test_no_open_stream_no_watcher_and_it_stops_with_the_last_stream(
        shared, events, api, jp_serverapp, jp_asyncio_loop):
    api("summary")
    assert _watcher(jp_serverapp) is None  # requests alone start nothing
    stream = events()
    stream.next()
    watcher = _watcher(jp_serverapp)
    assert watcher.running and watcher.checks >= 1
    stream.close()
    jp_asyncio_loop.run_until_complete(asyncio.wait_for(watcher._task, 60))
    assert not watcher.running and watcher.latest is None
    checks = watcher.checks
    api("summary")  # the server keeps answering; nothing looks at the journals on its own
    assert watcher.checks == checks and not watcher.running
    again = events()  # a new stream starts it again, with the current summary
    assert again.next()["pending_approvals"] == 0 and watcher.running


def test_an_event_stream_without_a_token_is_refused(shared, events):
    stream = events(headers={})
    assert stream.head.split()[1] == "403"


@pytest.mark.postgres
def test_a_decision_on_a_postgresql_journal_is_pushed_by_its_notify_not_by_the_period(
        postgres_server, index, monkeypatch, events, jp_serverapp):
    url = f"{postgres_server.password_url}?schema=server_events"
    monkeypatch.setenv("DURABLE_NB_JOURNAL", url)
    journal = dn.open_journal(url)
    dropped: list[str] = []
    pending = _park(journal, "waiting", dropped)
    monkeypatch.setattr(live, "PERIOD", 3600.0)  # a look by the period would come in an hour
    stream = events()
    assert stream.next()["pending_approvals"] == 1
    watcher = _watcher(jp_serverapp)
    wait_until(lambda: any(h._listener is not None and h._listener.listening.is_set()
                           for h in _server_handles()), what="the server's LISTEN", timeout=60)
    checks = watcher.checks
    run_python("import sys, durable_nb as dn; dn.approve('waiting', expect=sys.argv[2], "
               "journal=dn.open_journal(sys.argv[1]))", url, pending["digest"])
    assert stream.next()["pending_approvals"] == 0
    assert watcher.checks <= checks + 2  # woken by the notification (and the LISTEN's start)


def _server_handles():
    from durable_nb.server import journals as server_journals

    return [h for h in server_journals._handles.values() if getattr(h, "notifies", False)]


# -- what listings cost -----------------------------------------------------------------------

def _age(folder: Path) -> None:
    """Date the directory and its files an hour back: as a journal (or the index) looks
    when nothing has written it since long before the server read it."""
    past = time.time() - 3600
    for path in [*folder.iterdir(), folder]:
        os.utime(path, (past, past))


def _journal_in_index(tmp_path: Path, name: str) -> DiskJournal:
    journal = dn.open_journal(tmp_path / name)
    record_opened(str(journal.directory))
    dn.execute(f"{name}-run", _done, journal=journal)
    return journal


def test_a_listing_reads_again_only_the_journals_written_since_the_last_one(index, api,
                                                                           jp_root_dir):
    quiet, busy = (_journal_in_index(jp_root_dir, name) for name in ("quiet", "busy"))
    for journal in (quiet, busy):
        _age(journal.directory)
    assert api("runs")["total"] == 2
    before = {known_id: views._facts[known_id] for known_id in
              (journal_id(str(quiet.directory)), journal_id(str(busy.directory)))}
    dn.execute("busy-run-2", _done, journal=busy)
    listed = api("runs")
    assert listed["total"] == 3 and listed["runs"][0]["run_id"] == "busy-run-2"
    assert views._facts[journal_id(str(quiet.directory))] is \
        before[journal_id(str(quiet.directory))]  # not read again
    assert views._facts.get(journal_id(str(busy.directory))) is not \
        before[journal_id(str(busy.directory))]


_HOLD_A_LEASE = """
import sys, time
from durable_nb.journal import RunRecord, Status, open_journal
from durable_nb.execution.lease import Lease
journal = open_journal(sys.argv[1])
now = time.time()
journal.create_run(RunRecord(run_id="alive", status=Status.RUNNING, created_at=now,
                             updated_at=now))
lease = Lease.acquire(journal, "alive")
print("holding", flush=True)
time.sleep(600)
"""


def test_a_run_whose_process_dies_turns_interrupted_from_its_lease_read_alone(
        index, api, jp_root_dir, monkeypatch):
    """A process that dies writes nothing: its run must turn interrupted all the same. Past
    the reuse time an unchanged journal's RUNNING runs have their leases read again, and the
    journal is read whole only when one of them changed."""
    journal = _journal_in_index(jp_root_dir, "running")
    jid = journal_id(str(journal.directory))
    child = subprocess.Popen([sys.executable, "-c", _HOLD_A_LEASE, str(journal.directory)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "holding"
        _age(journal.directory)
        assert api("runs", params={"status": "running"})["total"] == 1
        cached = views._facts[jid]
        monkeypatch.setattr(views, "SUMMARY_REUSE", 0.0)
        api("summary")
        assert views._facts[jid] is cached  # its holder lives: nothing read but the lease
    finally:
        child.kill()
        child.wait()  # reaped: its pid is gone
    assert api("runs", params={"status": "interrupted"})["total"] == 1
    assert api("runs", params={"status": "running"})["total"] == 0
    assert views._facts[jid] is not cached


def test_the_index_is_read_again_only_when_it_changes_and_gone_journals_are_dropped(
        index, tmp_path):
    kept, gone = (_journal_in_index(tmp_path, name) for name in ("kept", "gone"))
    _age(index)
    both = {str(kept.directory), str(gone.directory)}
    assert set(known_locations()) == both
    assert set(index_module._read[index][1]) == both  # kept: read again only if changed
    shutil.rmtree(gone.directory)
    assert known_locations() == [str(kept.directory)]  # dropped from the cached read too
    assert not (index / f"{journal_id(str(gone.directory))}.json").exists()
    added = _journal_in_index(tmp_path, "added")  # a new file changes the directory's time
    assert known_locations() == [str(kept.directory), str(added.directory)]


# -- PostgreSQL ------------------------------------------------------------------------------

@pytest.mark.postgres
def test_listing_and_deciding_on_a_postgresql_journal(postgres_server, index, monkeypatch, api):
    url = f"{postgres_server.password_url}?schema=server_api"
    monkeypatch.setenv("DURABLE_NB_JOURNAL", url)
    journal = dn.open_journal(url)
    dropped: list[str] = []
    dn.execute("done", _done, journal=journal)
    pending = _park(journal, "waiting", dropped)
    journals = api("journals")["journals"]
    assert len(journals) == 1 and journals[0]["kind"] == "postgres" and journals[0]["ok"]
    assert "s3cret" not in json.dumps(journals)  # the password is never shown
    listing = api("runs")
    assert [r["run_id"] for r in listing["runs"]] == ["waiting", "done"]
    assert listing["pending_approvals"] == 1
    jid = journals[0]["id"]
    api("run/decision", method="POST", expect=409, body={
        "journal": jid, "id": "waiting", "approved": True, "digest": "0123456789abcdef",
        "request_id": pending["id"]})
    api("run/decision", method="POST", body={
        "journal": jid, "id": "waiting", "approved": True, "digest": pending["digest"],
        "request_id": pending["id"]})
    assert dn.execute("waiting", _drop("staging", dropped), journal=journal) == "dropped staging"
    assert api("runs", params={"journal": jid})["runs"][0]["status"] == "DONE"
