"""Answers beyond yes or no (issue 34, part 2): approve with edited arguments, reject with a
message for the model. Both are decisions through the one ``decide``: bound to the request,
written once, by whom the request allows, in the history and the export, replayed exactly."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import openai
import pytest

import durable_nb as dn
from durable_nb import Status
from durable_nb.approvals.decide import decide
from durable_nb.approvals.history import history
from durable_nb.approvals.request import find_decision, pending_digest
from durable_nb.export import export_data, export_run
from durable_nb.testing import LoopbackServer, Reply, ToolCall

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def server():
    with LoopbackServer() as s:
        yield s


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="test", max_retries=0)


def _agent(client, log: list):
    @dn.tool(needs_approval=True)
    def query(database: str, sql: str, limit: int = 10) -> str:
        """Run SQL on a database."""
        log.append((database, sql, limit))
        return f"ran on {database}"

    def handler(ctx):
        messages = [{"role": "user", "content": "count the users"}]
        while True:
            message = ctx.chat(client=client, model="gpt-4", messages=messages,
                               tools=[query.schema]).choices[0].message
            messages.append(dn.assistant_message(message))
            if not message.tool_calls:
                return messages
            messages += ctx.call_tools(message, [query])
    return handler


def _script(server):
    server.script = (Reply(tool_calls=[ToolCall("query", {"database": "production",
                                                          "sql": "select count(*) from users"})]),
                     Reply.coerce("done"))


def _park(journal, client, log):
    assert dn.execute("r", _agent(client, log), journal=journal, on_approval="park") is None
    return journal.get_run("r").pending_approval


def test_approve_with_edited_arguments_runs_the_tool_with_them_live_and_on_replay(
        journal, server, client):
    _script(server)
    log: list = []
    pending = _park(journal, client, log)
    assert pending["schema"]["required"] == ["database", "sql"]
    decision = dn.approve("r", args={"database": "staging", "sql": "select 1"}, by="ana",
                          journal=journal)
    assert decision.approved and decision.args == {"database": "staging", "sql": "select 1"}
    messages = dn.execute("r", _agent(client, log), journal=journal, on_approval="park")
    assert log == [("staging", "select 1", 10)]
    assert next(m for m in messages if m["role"] == "tool")["content"] == "ran on staging"
    approval = next(s for s in journal.steps("r") if s.kind == "approval")
    assert approval.result["args"] == {"database": "staging", "sql": "select 1"}
    assert approval.meta["details"]["arguments"]["database"] == "production"  # what was asked
    ran = next(s for s in journal.steps("r") if s.kind == "run")
    assert ran.name == "query"
    # Replay gives the same answers and runs nothing.
    assert dn.execute("r", _agent(client, log), journal=journal) == messages
    assert log == [("staging", "select 1", 10)]
    # The history and the export say it.
    decided = [e for e in history(journal, "r") if e["kind"] == "decided"]
    assert decided[0]["args"] == {"database": "staging", "sql": "select 1"}
    edited = 'with edited arguments {"database": "staging", "sql": "select 1"}'
    assert f"approved {edited} by ana" in decided[0]["text"]
    data = export_data(dn.get_run("r", journal=journal), journal=journal)
    assert any(e.get("args") == {"database": "staging", "sql": "select 1"}
               for e in data["history"])
    export_run("r", journal.directory / "r.ipynb", journal=journal)
    text = (journal.directory / "r.ipynb").read_text()
    assert "approved with edited arguments {\\\"database\\\": \\\"staging\\\"" in text
    assert "Edited arguments" in text and '\\"database\\": \\"staging\\"' in text


@pytest.mark.parametrize("args, wrong", [
    ({"database": "staging"}, "missing required argument 'sql'"),
    ({"database": "staging", "sql": "x", "limit": "ten"}, "argument 'limit' must be an integer"),
    (["staging"], "must be a JSON object, got array"),
])
def test_edited_arguments_that_do_not_fit_the_schema_are_refused_in_one_line(
        journal, server, client, args, wrong):
    _script(server)
    pending = _park(journal, client, [])
    with pytest.raises(dn.InvalidAnswer) as raised:
        dn.approve("r", args=args, by="ana", journal=journal)
    text = str(raised.value)
    assert wrong in text and "'query'" in text and "Nothing was decided" in text
    assert "\n" not in text
    assert find_decision(journal, "r", pending) is None
    assert [e for e in history(journal, "r") if e["kind"] == "decided"] == []


def test_reject_with_a_message_is_the_tools_answer_to_the_model(journal, server, client):
    _script(server)
    log: list = []
    _park(journal, client, log)
    dn.reject("r", message="Denied: use the staging database", by="ana", journal=journal)
    messages = dn.execute("r", _agent(client, log), journal=journal, on_approval="park")
    assert log == []
    tool = next(m for m in messages if m["role"] == "tool")
    assert tool["content"] == "Denied: use the staging database"
    # The model was sent it, and the loop went on.
    last = server.requests[-1]["messages"]
    assert last[-1] == {"role": "tool", "tool_call_id": "call_0_0",
                        "content": "Denied: use the staging database"}
    assert messages[-1]["content"] == "done"
    decided = [e for e in history(journal, "r") if e["kind"] == "decided"]
    assert decided[0]["message"] == "Denied: use the staging database"
    assert dn.execute("r", _agent(client, log), journal=journal) == messages


def test_the_export_says_a_rejections_message_as_written_in_its_history_and_step(
        journal, server, client):
    """Issue 41: the message is shown where the decision is (the history's line, the
    approval's heading), as text: its Markdown and HTML characters do not become markup."""
    _script(server)
    log: list = []
    _park(journal, client, log)
    said = "Denied: <b>use</b> *staging_db* [here](http://x)"
    dn.reject("r", message=said, by="ana", journal=journal)
    dn.execute("r", _agent(client, log), journal=journal, on_approval="park")
    path = export_run("r", journal.directory / "r.ipynb", journal=journal)
    import nbformat

    cells = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells
                      if c.cell_type == "markdown")
    written = (r'with the message "Denied: \<b\>use\</b\> \*staging\_db\* '
               r'\[here\](http://x)" by ana')
    assert f"**decided**: rejected {written} via Python" in cells, cells
    assert f"**Approval `query`**: rejected {written} via Python — step" in cells, cells
    data = export_data(dn.get_run("r", journal=journal), journal=journal)
    assert [e["message"] for e in data["history"] if e["kind"] == "decided"] == [said]


def test_a_note_with_line_breaks_cannot_start_markdown_of_its_own_in_the_export(
        journal, server, client):
    """A note is outside text on one line of the export: its line breaks cannot start a
    heading, a rule or a quote that would read as the export's own."""
    _script(server)
    _park(journal, client, [])
    dn.reject("r", note="fine\n# Approved by the CEO\n---\n> quoted", by="ana", journal=journal)
    dn.execute("r", _agent(client, []), journal=journal, on_approval="park")
    path = export_run("r", journal.directory / "r.ipynb", journal=journal)
    import nbformat

    # Lines outside fenced blocks: inside one (the tool's result), text is shown as it is.
    lines = [line for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown"
             for line in re.sub(r"(?ms)^(`{3,})[^\n]*\n.*?^\1$", "", c.source).splitlines()]
    assert not [line for line in lines if line.startswith(("# Approved", "---", "> quoted"))]
    assert any("fine \\# Approved by the CEO --- \\> quoted" in line for line in lines), lines


def test_content_that_does_not_go_with_the_decision_is_refused(journal, server, client):
    _script(server)
    pending = _park(journal, client, [])
    seen = {"request_id": pending["id"], "digest": pending_digest(pending), "by": "ana",
            "via": "Python"}
    with pytest.raises(dn.InvalidAnswer, match="go with an approval, not a rejection"):
        decide(journal, "r", approved=False, args={"database": "x", "sql": "y"}, **seen)
    with pytest.raises(dn.InvalidAnswer, match="goes with a rejection"):
        decide(journal, "r", approved=True, message="no", **seen)
    with pytest.raises(dn.InvalidAnswer, match="non-empty"):
        dn.reject("r", message="  ", journal=journal)


def test_a_plain_approval_has_no_arguments_to_edit(journal):
    assert dn.execute("p", lambda ctx: ctx.approval("deploy", {"to": "prod"}).approved,
                      journal=journal, on_approval="park") is None
    with pytest.raises(dn.InvalidAnswer, match="'deploy' has no arguments to edit"):
        dn.approve("p", args={"to": "staging"}, journal=journal)


def test_an_edit_is_a_decision_for_four_eyes_and_the_approvers_list(journal, server, client):
    _script(server)
    os.environ["DURABLE_NB_USER"] = "bo"  # bo starts the run
    try:
        assert dn.execute("r", _agent(client, []), journal=journal, on_approval="park",
                          four_eyes=True, approvers=["ana", "bo"]) is None
    finally:
        del os.environ["DURABLE_NB_USER"]
    with pytest.raises(dn.NotAllowedToDecide):
        dn.approve("r", args={"database": "staging", "sql": "x"}, by="bo", journal=journal)
    with pytest.raises(dn.NotAllowedToDecide):
        dn.reject("r", message="no", by="cy", journal=journal)
    dn.approve("r", args={"database": "staging", "sql": "x"}, by="ana", journal=journal)
    with pytest.raises(dn.DecisionExists):
        dn.reject("r", message="no", by="ana", journal=journal)


def _cli(journal, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "durable_nb.cli", "--journal",
                           str(journal.directory), *args],
                          capture_output=True, text=True, timeout=120, env=env)


def test_the_cli_approves_with_args_and_rejects_with_a_message(journal, server, client):
    _script(server)
    log: list = []
    _park(journal, client, log)
    bad = _cli(journal, "approve", "r", "--args", '{"database": 1, "sql": "x"}')
    assert bad.returncode != 0 and "argument 'database' must be a string" in bad.stderr
    bad = _cli(journal, "approve", "r", "--args", "{nope")
    assert bad.returncode != 0 and "--args" in bad.stderr and "JSON" in bad.stderr
    done = _cli(journal, "approve", "r", "--args", '{"database": "staging", "sql": "x"}')
    assert done.returncode == 0, done.stderr
    # The answer says the edited arguments, the ones the tool runs with (issue 41); the
    # model's are what was asked.
    edited = 'with edited arguments {"database": "staging", "sql": "x"}'
    assert f"approved run r {edited} (by " in done.stdout, done.stdout
    assert "'query' asked {\"tool\": \"query\", \"arguments\": {\"database\": \"production\"" \
        in done.stdout, done.stdout
    assert f"approved {edited} by " in _cli(journal, "show", "r").stdout
    # A second decision is refused, and the history says so in one sentence (issue 41).
    again = _cli(journal, "approve", "r", "--args", '{"database": "test", "sql": "y"}')
    assert again.returncode == 1
    refused = [line for line in _cli(journal, "show", "r").stdout.splitlines()
               if " refused " in line]
    assert len(refused) == 1, refused
    assert re.fullmatch(
        r"  \S+ \S+ refused +a decision by (\S+) via durable-nb to approve with edited "
        r'arguments \{"database": "test", "sql": "y"\} was refused: the request was already '
        rf'approved {re.escape(edited)} by \1 via durable-nb at \S+ \S+', refused[0]), refused
    dn.execute("r", _agent(client, log), journal=journal, on_approval="park")
    assert log == [("staging", "x", 10)]

    _script(server)
    dn.reset("r", journal=journal)
    _park(journal, client, log)
    done = _cli(journal, "reject", "r", "--message", "Denied: use staging")
    assert done.returncode == 0, done.stderr
    said = 'with the message "Denied: use staging"'
    assert f"rejected run r {said} (by " in done.stdout, done.stdout
    assert f"rejected {said} by " in _cli(journal, "show", "r").stdout
    messages = dn.execute("r", _agent(client, log), journal=journal, on_approval="park")
    assert next(m for m in messages if m["role"] == "tool")["content"] == "Denied: use staging"


_CHILD = textwrap.dedent("""
    import os, signal, sys
    import openai
    import durable_nb as dn
    url, directory, log_path, marker = sys.argv[1:5]
    client = openai.OpenAI(base_url=url, api_key="t", max_retries=0)

    @dn.tool(needs_approval=True)
    def query(database: str, sql: str, limit: int = 10) -> str:
        "Run SQL on a database."
        with open(log_path, "a") as f:
            f.write(f"{database}|{sql}|{limit}\\n")
        return f"ran on {database}"

    def handler(ctx):
        messages = [{"role": "user", "content": "count the users"}]
        while True:
            message = ctx.chat(client=client, model="gpt-4", messages=messages,
                               tools=[query.schema]).choices[0].message
            messages.append(dn.assistant_message(message))
            if not message.tool_calls:
                return messages[-1]["content"]
            messages += ctx.call_tools(message, [query])
            if not os.path.exists(marker):  # killed once, right after the tool's step
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)

    print(dn.execute("r", handler, journal=directory, poll_interval=0.05))
""")


def test_an_edited_call_runs_once_with_its_edit_across_sigkills(journal, server, tmp_path):
    _script(server)
    log, marker = tmp_path / "log", tmp_path / "marker"
    argv = [sys.executable, "-c", _CHILD, server.url, str(journal.directory), str(log),
            str(marker)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # 1: the child waits for the decision; it is killed while it waits.
    child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 60
        while journal.find_run("r") is None or journal.get_run("r").pending_approval is None:
            assert time.time() < deadline and child.poll() is None, child.stderr.read()
            time.sleep(0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    dn.approve("r", args={"database": "staging", "sql": "select 1", "limit": 3}, by="ana",
               journal=journal)
    # 2: a new process takes the decision, runs the edited call, and is killed after it.
    second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == -signal.SIGKILL, second.stderr
    assert log.read_text() == "staging|select 1|3\n"
    # 3: the run finishes; the call is not made again.
    third = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert third.returncode == 0, third.stderr
    assert third.stdout.strip() == "done"
    assert log.read_text() == "staging|select 1|3\n"
    assert journal.get_run("r").status is Status.DONE
    approval = next(s for s in journal.steps("r") if s.kind == "approval")
    assert approval.result["args"] == {"database": "staging", "sql": "select 1", "limit": 3}


# -- the inbox and the panel: arguments editable in place ---------------------------------

def test_the_inbox_card_edits_the_arguments_in_place(journal, server, client):
    from html import unescape

    from durable_nb.notebook.inbox import ApprovalsInbox

    _script(server)
    log: list = []
    _park(journal, client, log)
    inbox = ApprovalsInbox(journal.directory)
    card = inbox.cards["r"]
    assert json.loads(card.form.arguments.value) == {"database": "production",
                                                     "sql": "select count(*) from users"}
    card.form.arguments.value = '{"database": "staging"}'  # sql left out: refused
    card.approve.click()
    assert "missing required argument 'sql'" in unescape(inbox.notice.value)
    assert "nothing was decided" in inbox.notice.value
    card = inbox.cards["r"]
    card.form.arguments.value = '{"database": "staging", "sql": "select 1"}'
    card.approve.click()
    assert 'approved with edited arguments {"database": "staging", "sql": "select 1"} by' \
        in unescape(inbox.notice.value)
    dn.execute("r", _agent(client, log), journal=journal, on_approval="park")
    assert log == [("staging", "select 1", 10)]


_PANEL_CELLS = (
    "%load_ext durable_nb",
    # A tool call's approval, with the tool's schema: its arguments are editable.
    "%%durable_agent edit-1\n"
    "schema = {'type': 'object', 'properties': {'database': {'type': 'string'}},\n"
    "          'required': ['database'], 'additionalProperties': False}\n"
    "d = ctx.approval('query', {'tool': 'query', 'arguments': {'database': 'prod'}},\n"
    "                 schema=schema)\n"
    "ctx.run('query', lambda: open('ran.log', 'a').write(d.args['database'] + '\\n'))",
    # The arguments are shown once, in the box to edit, not also above it (issue 41).
    "from durable_nb.notebook import active_run\n"
    "panel = active_run('edit-1').panel\n"
    "print('prod' in panel.approval_text.value, 'prod' in panel.answer_form.arguments.value)",
    # What a person does in the panel: edits the JSON in place and clicks Approve (nbclient
    # has no browser; Button.click runs the on_click callbacks). A wrong edit first.
    "from durable_nb.notebook import active_run\n"
    "session = active_run('edit-1')\npanel = session.panel\n"
    "panel.answer_form.arguments.value = '{\"db\": \"staging\"}'\n"
    "panel.approve_button.click()\n"
    "print(panel._log_kept)\n"
    "panel.answer_form.arguments.value = '{\"database\": \"staging\"}'\n"
    "panel.approve_button.click()\n"
    "print(session.wait(60))",
)


def test_the_panel_in_a_real_kernel_approves_with_arguments_edited_in_place(tmp_path):
    import nbformat
    from nbclient import NotebookClient

    journal_dir = tmp_path / "journal"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in _PANEL_CELLS])
    env_before = dict(os.environ)
    os.environ.update(DURABLE_NB_JOURNAL=str(journal_dir), PYTHONPATH=os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    try:
        NotebookClient(nb, timeout=120, kernel_name="python3",
                       resources={"metadata": {"path": str(tmp_path)}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    assert nb.cells[2].outputs[0]["text"] == "False True\n"
    said = nb.cells[3].outputs[0]["text"]
    assert "unknown argument 'db'" in said and "Nothing was decided" in said
    assert nb.cells[3].outputs[-1]["text"].strip() == "True"
    assert (tmp_path / "ran.log").read_text() == "staging\n"
    journal = dn.DiskJournal(journal_dir)
    try:
        approval = next(s for s in journal.steps("edit-1") if s.kind == "approval")
        assert approval.result["args"] == {"database": "staging"}
        assert approval.result["via"] == "panel"
        assert journal.get_run("edit-1").status is Status.DONE
    finally:
        journal.close()


_LAB_AGENT_CELL = """\
%%durable_agent lab-edit --title "Query, approved with edited arguments"
schema = {"type": "object", "properties": {"database": {"type": "string"},
          "sql": {"type": "string"}}, "required": ["database", "sql"]}
d = ctx.approval("query", {"tool": "query", "arguments": {"database": "production",
                 "sql": "select count(*) from users"}}, schema=schema)
ctx.run("query", lambda: open("ran.log", "a").write(d.args["database"] + "\\n"))"""


def test_in_jupyterlab_the_panels_arguments_are_edited_in_place_and_approved(
        tmp_path_factory, tmp_path):
    from tests.harness.lab import JupyterLab, LabPage, require_chromium, write_notebook

    require_chromium()
    shots = Path(os.environ.get("DURABLE_NB_SHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    journal_dir = tmp_path_factory.mktemp("journal") / "journal"
    env = {"DURABLE_NB_JOURNAL": str(journal_dir),
           "HOME": str(tmp_path_factory.mktemp("home")),
           "DURABLE_NB_INDEX": str(tmp_path_factory.mktemp("index"))}
    root = tmp_path_factory.mktemp("lab")
    write_notebook(root / "edit.ipynb", ["%load_ext durable_nb\nprint('setup ok')",
                                         _LAB_AGENT_CELL])
    with JupyterLab(root, env=env) as lab, LabPage(lab, timeout=60) as page:
        page.open_notebook("edit.ipynb")
        page.wait_kernel_idle()
        page.run_cell(0)
        page.wait_for_text("setup ok", cell_index=0)
        page.run_cell(1)
        page.wait_for_text("Approval needed", cell_index=1)
        output = page.cell(1).locator(".jp-Cell-outputArea")
        area = output.locator("textarea").first
        area.wait_for(state="visible")
        assert json.loads(area.input_value())["database"] == "production"
        area.fill('{"database": "staging", "sql": "select 1"}')
        output.screenshot(path=str(shots / "answers-lab-edited.png"))
        page.click_button("Approve", cell_index=1)

        def done() -> bool:
            journal = dn.DiskJournal(journal_dir)
            try:
                return journal.get_run("lab-edit").status is Status.DONE
            finally:
                journal.close()

        from tests.harness import wait_until
        wait_until(done, 60, "the kernel ran the approved call")
        output.screenshot(path=str(shots / "answers-lab-approved.png"))
    assert (root / "ran.log").read_text() == "staging\n"


def _ask_query(ctx) -> list:
    schema = {"type": "object", "properties": {"database": {"type": "string"}},
              "required": ["database"], "additionalProperties": False}
    decision = ctx.approval("query", {"tool": "query", "arguments": {"database": "prod"}},
                            schema=schema)
    return [decision.approved, decision.args, decision.message]


def test_the_lab_sidebars_inbox_edits_arguments_and_rejects_with_a_message(
        tmp_path_factory, tmp_path):
    from tests.harness.lab import LabPage
    from tests.test_sidebar import _open_lab, sidebar_lab

    shots = Path(os.environ.get("DURABLE_NB_SHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    journal_dir = tmp_path_factory.mktemp("journal") / "journal"
    journal = dn.DiskJournal(journal_dir)
    try:
        for run_id in ("sb-edit", "sb-deny"):
            assert dn.execute(run_id, _ask_query, journal=journal, on_approval="park") is None
        with sidebar_lab(tmp_path_factory, journal_dir) as lab, \
                LabPage(lab, timeout=60) as page:
            _open_lab(page)
            page.page.locator(".dnr-inbox-button").click()
            inbox = page.page.locator(".dnr-inbox")
            edit = inbox.locator(".dnr-card[data-run='sb-edit']")
            args = edit.locator(".dnr-args")
            args.wait_for(state="visible")
            assert json.loads(args.input_value()) == {"database": "prod"}
            # Shown once, in the box to edit (issue 41): no read-only copy above it.
            assert "prod" not in edit.locator(".dnr-pending").inner_text()
            args.fill('{"db": "staging"}')
            edit.locator(".dnr-approve").click()
            refused = inbox.locator(".dnr-error")
            refused.wait_for(state="visible")
            assert "unknown argument 'db'" in refused.inner_text()
            assert "nothing was decided" in refused.inner_text()
            edit = inbox.locator(".dnr-card[data-run='sb-edit']")
            edit.locator(".dnr-args").fill('{"database": "staging"}')
            page.page.screenshot(path=str(shots / "answers-sidebar-edited.png"))
            edit.locator(".dnr-approve").click()
            inbox.locator(".dnr-ok").filter(
                has_text='sb-edit: approved with edited arguments {"database": "staging"}; '
            ).wait_for(state="visible")
            deny = inbox.locator(".dnr-card[data-run='sb-deny']")
            deny.locator(".dnr-message").fill("Denied: use staging")
            deny.locator(".dnr-reject").click()
            inbox.locator(".dnr-ok").filter(
                has_text='sb-deny: rejected with the message "Denied: use staging"; '
            ).wait_for(state="visible")
            page.page.screenshot(path=str(shots / "answers-sidebar-decided.png"))
        assert dn.execute("sb-edit", _ask_query, journal=journal) == [
            True, {"database": "staging"}, None]
        assert dn.execute("sb-deny", _ask_query, journal=journal) == [
            False, None, "Denied: use staging"]
    finally:
        journal.close()


_RACER = """
import pathlib, sys, time
import durable_nb as dn
url, go, who = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]
journal = dn.open_journal(url)
journal.get_run("r")  # connected, and the run read: ready to race
print("ready", flush=True)
while not go.exists():
    time.sleep(0.001)
try:
    if int(who) % 2:
        dn.approve("r", args={"database": f"db{who}"}, by=f"racer {who}", journal=journal)
    else:
        dn.reject("r", message=f"no, says {who}", by=f"racer {who}", journal=journal)
    print("won", flush=True)
except dn.DecisionExists as exc:
    print("refused:", exc, flush=True)
"""


@pytest.mark.postgres
def test_edits_and_messages_racing_on_postgresql_exactly_one_is_the_decision(
        postgres_server, tmp_path):
    import uuid

    url = f"{postgres_server.url}?schema=answers_{uuid.uuid4().hex[:10]}"
    journal = dn.open_journal(url)
    assert dn.execute("r", _ask_query, journal=journal, on_approval="park") is None
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    racers = [subprocess.Popen([sys.executable, "-c", _RACER, url, str(go), str(i)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env) for i in range(6)]
    for racer in racers:
        assert racer.stdout.readline().strip() == "ready", racer.stderr.read()
    go.touch()
    said = [racer.communicate(timeout=120)[0].strip() for racer in racers]
    winners = [i for i, s in enumerate(said) if s == "won"]
    assert len(winners) == 1 and all(s.startswith("refused:") for i, s in enumerate(said)
                                     if i not in winners), said
    [winner] = winners
    expected = ([True, {"database": f"db{winner}"}, None] if winner % 2
                else [False, None, f"no, says {winner}"])
    assert dn.execute("r", _ask_query, journal=journal) == expected


def test_an_mcp_tools_call_approved_with_edited_arguments_reaches_the_server_edited(
        tmp_path):
    """An MCP server's tool (the real ``mcp`` SDK over stdio) is edited like any tool: its
    input schema checks the edit, and the server receives the edited arguments, once."""
    import durable_nb.mcp as dmcp
    from tests.test_mcp import SERVER, calls, tool_calls

    count_dir = tmp_path / "calls"
    count_dir.mkdir()
    journal = dn.DiskJournal(tmp_path / "journal")
    server = dmcp.stdio(sys.executable, str(SERVER), str(count_dir), "stdio", name="tests")

    def agent(ctx):
        tools = ctx.mcp_tools(server, needs_approval=["delete_*"])
        return ctx.call_tools(tool_calls(("delete_rows", {"table": "users"})), tools)

    try:
        assert dn.execute("mcp-edit", agent, journal=journal, on_approval="park") is None
        with pytest.raises(dn.InvalidAnswer, match="argument 'table' must be a string"):
            dn.approve("mcp-edit", args={"table": 1}, journal=journal)
        dn.approve("mcp-edit", args={"table": "staging_users"}, journal=journal)
        answers = dn.execute("mcp-edit", agent, journal=journal)
        assert [c["table"] for c in calls(count_dir, "delete_rows")] == ["staging_users"]
        assert answers[0]["content"] == "deleted the rows of staging_users"
        assert dn.execute("mcp-edit", agent, journal=journal) == answers  # replayed
        assert len(calls(count_dir, "delete_rows")) == 1
    finally:
        dmcp.close()
        journal.close()
