"""Answers beyond yes or no in the browser extension (issue 34), as a person gives them: a
real JupyterLab (and Notebook 7) in headless Chromium, the real server extension over a
directory journal, real kernels, the extension as built into durable_nb/labextension/.

- A run in a kernel calls a real MCP server's tool (tests/mcp_server.py over stdio, with the
  official ``mcp`` SDK) that asks how many nights (elicitation); the run parks on the
  question; the inbox (and the run view) shows it as a form (the server's message as text,
  even when it holds markup), Accept with the required field empty is said and sends
  nothing, and Accept with 3 sends the answer:
  the kernel watching the parked run takes it, the tool call is made again and the server
  gets ``accept`` with 3 nights, once, without asking anybody again.
- A kernel's panel is shut down with two tool calls waiting (a tool with a JSON schema): the
  saved view shows each call's arguments editable in place; an edit that does not fit the
  schema is refused in the server's one line, nothing decided; Approve with edited arguments
  then runs the tool with them, and Reject with a message gives the model that message as the
  tool's answer, once the cells are run again.
- The kernel is shut down while a run waits on the server's question: the saved view shows
  the form; a value the browser can tell is wrong is said and nothing is sent; Accept writes
  the answer, and the cell run again makes the call with it.
- A question with every kind of property MCP allows shows each as its schema says (title,
  description, default, limits, choices); Accept sends the content typed as the schema
  types it, Decline sends none.

Each runs in JupyterLab and in Notebook 7 where it involves a notebook.

Screenshots go to $DURABLE_NB_SHOTS, else the test's tmp dir.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from durable_nb import Status
from durable_nb.approvals.request import find_decision
from durable_nb.journal import DiskJournal
from durable_nb.mcp import is_elicitation
from tests.harness import wait_until
from tests.harness.lab import LabPage, notebook7_available, write_notebook
from tests.test_mcp import SERVER, calls
from tests.test_sidebar import HOSTILE, _show_sidebar, sidebar_lab

pytestmark = pytest.mark.browser
pytest.importorskip("durable_nb.server", reason="durable_nb.server (the REST API) is missing")

_CALL = """
def call(ctx, tools, name, **arguments):
    message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function",
         "function": {"name": name, "arguments": json.dumps(arguments)}}]}
    return ctx.call_tools(message, tools)[0]["content"]
"""


def _shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("DURABLE_NB_SHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(params=["lab", "notebook"])
def front_end(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """JupyterLab, then Notebook 7, over a journal of the test's own: ``(server, journal)``."""
    if request.param == "notebook" and not notebook7_available():
        pytest.skip("Jupyter Notebook 7 is not installed (pip install 'notebook>=7')")
    journal_dir = tmp_path_factory.mktemp("journal") / "journal"
    with sidebar_lab(tmp_path_factory, journal_dir, app=request.param) as server:
        yield server, journal_dir


def _run(journal_dir: Path, run_id: str):
    journal = DiskJournal(journal_dir)
    try:
        return journal.find_run(run_id)
    finally:
        journal.close()


def _decision(journal_dir: Path, run_id: str) -> dict | None:
    """The decision given on the run's pending request, or None."""
    journal = DiskJournal(journal_dir)
    try:
        return find_decision(journal, run_id, journal.get_run(run_id).pending_approval)
    finally:
        journal.close()


def _open_inbox(page: LabPage, app: str) -> None:
    """The Durable runs sidebar's inbox, as a person opens it in each front end."""
    if app == "lab":
        _show_sidebar(page)
    else:  # Notebook 7: View, Left Sidebar, Show Durable runs
        from tests.test_sidebar_notebook7 import _show_sidebar as show_in_notebook7
        show_in_notebook7(page)
    page.page.locator(".dnr-inbox-button").click()
    page.page.locator(".dnr-inbox").wait_for(state="visible")


def _asking_notebook(root: Path, name: str, run_id: str, city: str) -> Path:
    """A notebook whose second cell books a hotel through the MCP test server (stdio), which
    asks how many nights; the folder where the server records its calls."""
    count_dir = root / f"calls-{run_id}"
    count_dir.mkdir()
    setup = ("%load_ext durable_nb\nimport json, sys\nimport durable_nb.mcp as dmcp\n"
             f"SERVER = dmcp.stdio(sys.executable, {str(SERVER)!r}, {str(count_dir)!r}, "
             "'stdio', name='hotels')\n" + _CALL + "print('setup ok')")
    ask = (f"%%durable_agent {run_id}\n"
           f"print(call(ctx, ctx.mcp_tools(SERVER), 'book', city={city!r}))")
    write_notebook(root / name, [setup, ask])
    return count_dir


def test_the_inbox_answers_an_mcp_servers_question_with_its_form_and_the_run_goes_on(
        front_end, tmp_path: Path) -> None:
    server, journal_dir = front_end
    shots = _shots(tmp_path)
    app = server.app
    run_id = f"{app}-ask"
    count_dir = _asking_notebook(server.root_dir, "ask.ipynb", run_id, HOSTILE)
    with LabPage(server, timeout=60) as page:
        page.open_notebook("ask.ipynb")
        page.wait_kernel_idle()
        page.run_cell(0)
        page.wait_for_text("setup ok", cell_index=0)
        page.run_cell(1)

        def asked() -> bool:
            record = _run(journal_dir, run_id)
            return record is not None and is_elicitation(record.pending_approval)

        wait_until(asked, 60, "the server's question pending")
        _open_inbox(page, app)
        card = page.page.locator(f".dnr-inbox .dnr-card[data-run='{run_id}']")
        nights = card.locator(".dnr-field[data-name='nights']")
        nights.wait_for(state="visible")
        # The server's message holds the hostile city: shown as its characters, run never.
        message = card.locator(".dnr-question-message").inner_text()
        assert message == f"How many nights in {HOSTILE}?"
        assert card.locator(".dnr-field-title").inner_text() == "Nights *"
        assert "How many nights" in card.locator(".dnr-field-hint").inner_text()
        assert (nights.get_attribute("type"), nights.get_attribute("step")) == ("number", "1")
        # Required and empty: the browser says so, and nothing is sent.
        card.locator(".dnr-accept").click()
        refused = page.page.locator(".dnr-inbox .dnr-error")
        refused.wait_for(state="visible")
        assert f"{run_id}: nothing was decided: Nights: " in refused.inner_text()
        assert _decision(journal_dir, run_id) is None
        # The run view shows the same form (the card is shared), then back to the inbox.
        card.locator(".dnr-run-link").click()
        view = page.page.locator(".dnr-runview .dnr-card")
        view.locator(".dnr-field[data-name='nights']").wait_for(state="visible")
        assert view.locator(".dnr-question-message").inner_text() == message
        assert view.locator(".dnr-accept, .dnr-decline, .dnr-cancel-answer").count() == 3
        page.page.locator(".dnr-inbox-button").click()
        nights.wait_for(state="visible")
        nights.fill("3")
        page.page.screenshot(path=str(shots / f"question-{app}-inbox.png"))
        card.locator(".dnr-accept").click()
        page.page.locator(".dnr-inbox .dnr-ok").filter(
            has_text=f"{run_id}: accepted").wait_for(state="visible")
        wait_until(lambda: _run(journal_dir, run_id).status is Status.DONE, 60,
                   "the run going on with the answer in its kernel")
        page.page.screenshot(path=str(shots / f"question-{app}-answered.png"))
        assert page.page.evaluate("window.dnbPwned") is None
    assert [(c["action"], c["nights"]) for c in calls(count_dir, "book")] == [("accept", 3)]
    journal = DiskJournal(journal_dir)
    try:  # the answer, as the run journaled it
        decision = next(s.result for s in journal.steps(run_id) if s.kind == "approval")
    finally:
        journal.close()
    assert decision["via"] == "Jupyter server"
    assert decision["answer"] == {"action": "accept", "content": {"nights": 3}}


_TOOL_SETUP = """%load_ext durable_nb
import json
import durable_nb as dn

@dn.tool(needs_approval=True)
def query(database: str, sql: str) -> str:
    \"\"\"Run SQL on a database.\"\"\"
    open("ran.log", "a").write(database + "\\n")
    return f"ran on {database}"
""" + _CALL + "print('setup ok')"


def _tool_cell(run_id: str) -> str:
    """A run whose model asks for a query on production, and writes the tool's answer."""
    return (f"%%durable_agent {run_id}\n"
            "said = call(ctx, [query], 'query', database='production', sql='select 1')\n"
            f"ctx.run('say', lambda: open('said.log', 'a').write({run_id!r} + ': ' + said"
            " + '\\n'))\n"
            "print('finished:', said)")


def test_the_saved_view_approves_with_edited_arguments_and_rejects_with_a_message(
        front_end, tmp_path: Path) -> None:
    server, journal_dir = front_end
    shots = _shots(tmp_path)
    app = server.app
    edit, deny = f"{app}-edit", f"{app}-deny"
    write_notebook(server.root_dir / "tools.ipynb",
                   [_TOOL_SETUP, _tool_cell(edit), _tool_cell(deny)])
    with LabPage(server, timeout=60) as page:
        page.open_notebook("tools.ipynb")
        page.wait_kernel_idle()
        page.run_cell(0)
        page.wait_for_text("setup ok", cell_index=0)
        for index in (1, 2):
            page.run_cell(index)
            page.wait_for_text("Approval needed", cell_index=index)
        page.shut_down_kernel()

        here = page.cell(1).locator(".dnb-decide-here")
        args = here.locator(".dnr-args")
        args.wait_for(state="visible")
        assert json.loads(args.input_value()) == {"database": "production", "sql": "select 1"}
        # Shown once: the saved view's read-only copy of the arguments goes (issue 41).
        assert page.cell(1).locator(".dnb-saved pre.dnb-details").count() == 1
        assert not page.cell(1).locator(".dnb-saved pre.dnb-details").is_visible()
        args.fill('{"db": "staging", "sql": "select 1"}')
        here.locator(".dnr-approve").click()
        refused = here.locator(".dnr-error")
        refused.wait_for(state="visible")
        said = refused.inner_text()
        assert said.startswith("Nothing was decided: ") and "unknown argument 'db'" in said
        assert "\n" not in said.strip()
        args.fill('{"database": "staging", "sql": "select 1"}')
        page.cell(1).screenshot(path=str(shots / f"saved-view-{app}-edited.png"))
        here.locator(".dnr-approve").click()
        here.locator(".dnr-decided").wait_for(state="visible")
        assert 'approved with edited arguments {"database": "staging", "sql": "select 1"} by ' \
            in here.inner_text()

        there = page.cell(2).locator(".dnb-decide-here")
        there.locator(".dnr-message").fill("Denied: use staging")
        there.locator(".dnr-reject").click()
        there.locator(".dnr-decided").wait_for(state="visible")
        assert 'rejected with the message "Denied: use staging" by ' in there.inner_text()
        page.cell(2).screenshot(path=str(shots / f"saved-view-{app}-rejected.png"))
        assert not (server.root_dir / "ran.log").exists()

        page.open_notebook("tools.ipynb")  # a new kernel: the cells run again
        page.wait_kernel_idle()
        page.run_cell(0)
        page.wait_for_text("setup ok", cell_index=0)
        for index in (1, 2):
            page.run_cell(index)
            page.wait_for_text("finished:", cell_index=index)
    assert (server.root_dir / "ran.log").read_text() == "staging\n"
    assert sorted((server.root_dir / "said.log").read_text().splitlines()) == sorted([
        f"{edit}: ran on staging", f"{deny}: Denied: use staging"])
    for run_id in (edit, deny):
        assert _run(journal_dir, run_id).status is Status.DONE


_BOOKING = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "title": "Guest name", "description": "As on the passport",
                 "minLength": 2, "maxLength": 40, "default": "Ada"},
        "email": {"type": "string", "format": "email", "title": "E-mail"},
        "code": {"type": "string", "pattern": "[A-Z]{3}", "title": "Airport",
                 "description": HOSTILE},
        "room": {"type": "string", "enum": ["single", "double"],
                 "enumNames": ["Single room", "Double room"], "default": "double"},
        "nights": {"type": "integer", "minimum": 1, "maximum": 14, "default": 2},
        "budget": {"type": "number", "minimum": 0},
        "breakfast": {"type": "boolean", "title": "Breakfast", "default": True},
        "bed": {"type": "string", "oneOf": [{"const": "king", "title": "King size"},
                                            {"const": "twin", "title": "Twin beds"}]},
    },
    "required": ["name", "code", "nights", "bed"],
}


def _asked_booking(ctx):
    """A run parked on a question, as durable_nb.mcp.elicitation asks it."""
    decision = ctx.approval("book asks", {"kind": "elicitation", "server": "hotels",
                                          "tool": "book", "message": "Your booking?",
                                          "schema": _BOOKING})
    return [decision.approved, decision.answer]


def test_the_inbox_form_has_a_field_per_property_as_its_schema_says(tmp_path_factory,
                                                                     tmp_path: Path) -> None:
    """Every kind of property MCP allows, with its title, description, default and limits:
    what the browser can check is said and nothing is sent; Accept sends the fields' content
    as the schema types it (an empty optional field left out); Decline sends no content."""
    import durable_nb as dn

    shots = _shots(tmp_path)
    journal_dir = tmp_path_factory.mktemp("journal") / "journal"
    journal = DiskJournal(journal_dir)
    try:
        for run_id in ("form-yes", "form-no"):
            assert dn.execute(run_id, _asked_booking, journal=journal,
                              on_approval="park") is None
        with sidebar_lab(tmp_path_factory, journal_dir) as lab, \
                LabPage(lab, timeout=60) as page:
            page.page.goto(f"{lab.url}/lab?reset&token={lab.token}")
            _open_inbox(page, "lab")
            card = page.page.locator(".dnr-inbox .dnr-card[data-run='form-yes']")
            field = lambda name: card.locator(f".dnr-field[data-name='{name}']")  # noqa: E731
            field("name").wait_for(state="visible")
            titles = card.locator(".dnr-field-title").all_inner_texts()
            assert titles == ["Guest name *", "E-mail", "Airport *", "room", "nights *",
                              "budget", "Breakfast", "bed *"]
            hints = card.locator(".dnr-field-hint").all_inner_texts()
            assert hints == ["As on the passport", HOSTILE]
            assert field("name").input_value() == "Ada"
            assert (field("name").get_attribute("minlength"),
                    field("name").get_attribute("maxlength")) == ("2", "40")
            assert field("email").get_attribute("type") == "email"
            assert field("room").locator("option:checked").inner_text() == "Double room"
            assert field("nights").input_value() == "2"
            assert (field("nights").get_attribute("min"),
                    field("nights").get_attribute("max")) == ("1", "14")
            assert field("breakfast").is_checked()

            def refused_for(title: str) -> None:
                card.locator(".dnr-accept").click()
                said = page.page.locator(".dnr-inbox .dnr-error").filter(
                    has_text=f"form-yes: nothing was decided: {title}: ")
                said.wait_for(state="visible")

            field("code").fill("abc")
            refused_for("Airport")
            field("code").fill("to OSL")  # JSON Schema's pattern matches anywhere
            field("nights").fill("20")
            refused_for("nights")
            field("nights").fill("3")
            refused_for("bed")  # a required choice without a default: none made yet
            field("bed").select_option(label="Twin beds")
            field("budget").fill("99.5")
            field("breakfast").uncheck()
            field("room").select_option(label="Single room")
            page.page.screenshot(path=str(shots / "question-form-filled.png"))
            assert find_decision(journal, "form-yes",
                                 journal.get_run("form-yes").pending_approval) is None
            card.locator(".dnr-accept").click()
            page.page.locator(".dnr-inbox .dnr-ok").filter(
                has_text="form-yes: accepted").wait_for(state="visible")
            no = page.page.locator(".dnr-inbox .dnr-card[data-run='form-no']")
            no.locator(".dnr-decline").click()
            page.page.locator(".dnr-inbox .dnr-ok").filter(
                has_text="form-no: declined").wait_for(state="visible")
            page.page.screenshot(path=str(shots / "question-form-answered.png"))
            assert page.page.evaluate("window.dnbPwned") is None
        approved, answer = dn.execute("form-yes", _asked_booking, journal=journal)
        assert approved and answer == {"action": "accept", "content": {
            "name": "Ada", "code": "to OSL", "room": "single", "nights": 3, "budget": 99.5,
            "breakfast": False, "bed": "twin"}}
        approved, answer = dn.execute("form-no", _asked_booking, journal=journal)
        assert not approved and answer == {"action": "decline"}
    finally:
        journal.close()


def test_the_saved_view_answers_an_mcp_servers_question_with_the_kernel_shut_down(
        front_end, tmp_path: Path) -> None:
    """The kernel is shut down while the run waits on the server's question: the saved view
    shows its form; Accept with 4 is written through the server; the cell run again makes the
    call again and the server gets the answer, nobody is asked again."""
    server, journal_dir = front_end
    shots = _shots(tmp_path)
    app = server.app
    run_id = f"{app}-ask-saved"
    count_dir = _asking_notebook(server.root_dir, "saved.ipynb", run_id, "Bergen")
    with LabPage(server, timeout=60) as page:
        page.open_notebook("saved.ipynb")
        page.wait_kernel_idle()
        page.run_cell(0)
        page.wait_for_text("setup ok", cell_index=0)
        page.run_cell(1)
        page.wait_for_text("Answer needed", cell_index=1)  # the panel's head for a question
        page.shut_down_kernel()
        here = page.cell(1).locator(".dnb-decide-here")
        nights = here.locator(".dnr-field[data-name='nights']")
        nights.wait_for(state="visible")
        assert here.locator(".dnr-question-message").inner_text() == "How many nights in Bergen?"
        nights.fill("0.5")  # an integer field: the browser says so, nothing is sent
        here.locator(".dnr-accept").click()
        here.locator(".dnr-error").filter(has_text="Nothing was decided: Nights: ").wait_for(
            state="visible")
        assert _decision(journal_dir, run_id) is None
        nights.fill("4")
        page.cell(1).screenshot(path=str(shots / f"question-saved-view-{app}.png"))
        here.locator(".dnr-accept").click()
        decided = here.locator(".dnr-decided")
        decided.wait_for(state="visible")
        assert "accepted by " in decided.inner_text()
        assert "re-run its cell to continue" in decided.inner_text()
        page.cell(1).screenshot(path=str(shots / f"question-saved-view-{app}-answered.png"))
        assert calls(count_dir, "book") == []

        page.open_notebook("saved.ipynb")  # a new kernel: the cells run again
        page.wait_kernel_idle()
        page.run_cell(0)
        page.wait_for_text("setup ok", cell_index=0)
        page.run_cell(1)
        page.wait_for_text("booked 4 nights in Bergen", cell_index=1)
    assert [(c["action"], c["nights"]) for c in calls(count_dir, "book")] == [("accept", 4)]
    assert _run(journal_dir, run_id).status is Status.DONE


_EXTRAS = {
    "type": "object",
    "properties": {
        "extras": {"type": "array", "title": "Extras", "minItems": 1,
                   "items": {"type": "string", "enum": ["parking", "late", "pets"]}},
        "view": {"type": "array", "title": "View",
                 "items": {"anyOf": [{"const": "sea", "title": "Sea view"},
                                     {"const": "city", "title": "City view"}]}},
    },
    "required": ["extras"],
}


def _asked_extras(ctx, item=None):
    """A run (or a batch's item 1) parked on a question with two multi-selects; any other
    batch item on a plain approval."""
    if item not in (None, 1):
        return [ctx.approval("publish", {"n": item}).approved, None]
    decision = ctx.approval("book asks", {"kind": "elicitation", "server": "hotels",
                                          "tool": "book", "message": "Any extras?",
                                          "schema": _EXTRAS})
    return [decision.approved, decision.answer]


def _asked_rooms(ctx):
    """A run parked on a question with one integer field."""
    decision = ctx.approval("book asks", {"kind": "elicitation", "server": "hotels",
                                          "tool": "book", "message": "How many rooms?",
                                          "schema": {"type": "object", "properties": {
                                              "rooms": {"type": "integer"}}}})
    return [decision.approved, decision.answer]


@pytest.fixture
def asking_lab(tmp_path_factory):
    """A JupyterLab (toasts shown) over a journal of the test's own where ``extras-yes`` and
    ``extras-cancel`` are parked on a question with multi-selects, ``rooms`` on one with a
    number field, and the batch ``mix`` parks item 1 on a question, items 0 and 2 on plain
    approvals: ``(page, journal)``."""
    import durable_nb as dn

    journal_dir = tmp_path_factory.mktemp("journal") / "journal"
    journal = DiskJournal(journal_dir)
    try:
        for run_id in ("extras-yes", "extras-cancel"):
            assert dn.execute(run_id, _asked_extras, journal=journal,
                              on_approval="park") is None
        assert dn.execute("rooms", _asked_rooms, journal=journal, on_approval="park") is None
        dn.map(_asked_extras, [0, 1, 2], batch_id="mix", key="index", journal=journal,
               wait=False, on_approval="park")
        with sidebar_lab(tmp_path_factory, journal_dir, toasts=True) as lab, \
                LabPage(lab, timeout=60) as page:
            page.page.goto(f"{lab.url}/lab?reset&token={lab.token}")
            _open_inbox(page, "lab")
            yield page, journal
    finally:
        journal.close()


def test_a_multi_select_is_checkboxes_and_accept_sends_the_checked_values(
        asking_lab, tmp_path: Path) -> None:
    """A question's multi-selects (``items.enum``, ``items.anyOf`` of titled consts) show a
    checkbox per choice; a required one with none checked is said and nothing is sent;
    Accept sends the checked values as an array, which the run gets."""
    import durable_nb as dn

    page, journal = asking_lab
    inbox = page.page.locator(".dnr-inbox")
    card = inbox.locator(".dnr-card[data-run='extras-yes']")
    extras = card.locator(".dnr-field[data-name='extras']")
    extras.wait_for(state="visible")
    assert extras.locator("label").all_inner_texts() == ["parking", "late", "pets"]
    view = card.locator(".dnr-field[data-name='view']")
    assert view.locator("label").all_inner_texts() == ["Sea view", "City view"]
    card.locator(".dnr-accept").click()  # nothing checked: at least one is required
    inbox.locator(".dnr-error").filter(
        has_text="extras-yes: nothing was decided: Extras: choose at least 1"
    ).wait_for(state="visible")
    assert find_decision(journal, "extras-yes",
                         journal.get_run("extras-yes").pending_approval) is None
    extras.get_by_label("parking").check()
    extras.get_by_label("pets").check()
    view.get_by_label("Sea view").check()
    card.screenshot(path=str(_shots(tmp_path) / "question-multi-select.png"))
    card.locator(".dnr-accept").click()
    inbox.locator(".dnr-ok").filter(has_text="extras-yes: accepted").wait_for(state="visible")
    approved, answer = dn.execute("extras-yes", _asked_extras, journal=journal)
    assert approved and answer == {"action": "accept", "content": {
        "extras": ["parking", "pets"], "view": ["sea"]}}


def test_answered_questions_read_as_their_answers_after_a_page_load(
        asking_lab, tmp_path: Path) -> None:
    """After a new page load (what the server says, not what the click left on screen), a
    question accepted reads "accepted" and one cancelled "cancelled", not approved or
    rejected."""
    page, _ = asking_lab
    inbox = page.page.locator(".dnr-inbox")
    card = inbox.locator(".dnr-card[data-run='rooms']")
    card.locator(".dnr-field[data-name='rooms']").fill("2")
    card.locator(".dnr-accept").click()
    inbox.locator(".dnr-ok").filter(has_text="rooms: accepted").wait_for(state="visible")
    inbox.locator(".dnr-card[data-run='extras-cancel'] .dnr-cancel-answer").click()
    inbox.locator(".dnr-ok").filter(has_text="extras-cancel: cancelled").wait_for(
        state="visible")
    page.page.goto(f"{page.lab.url}/lab?reset&token={page.lab.token}")
    _show_sidebar(page)
    for run_id, said in (("rooms", "accepted"), ("extras-cancel", "cancelled")):
        verdict = page.page.locator(
            f".dnr-sidebar .dnr-run[data-run='{run_id}'] .dnr-decided-text")
        verdict.wait_for(state="visible")
        assert verdict.inner_text().startswith(f"{said}; "), verdict.inner_text()
    page.page.locator(".dnr-sidebar").screenshot(
        path=str(_shots(tmp_path) / "question-verdicts-after-reload.png"))


def test_approve_all_shown_leaves_a_batchs_question_for_its_form_and_says_so(
        asking_lab, tmp_path: Path) -> None:
    """A plain approve is no answer to a form: "Approve all shown" approves the batch's
    plain requests only and says how many questions it left."""
    page, journal = asking_lab
    batch = page.page.locator(".dnr-inbox .dnr-batch[data-batch='mix']")
    batch.locator(".dnr-card").nth(2).wait_for(state="visible")
    assert batch.locator(".dnr-approve-all").inner_text() == "Approve all shown (2)"
    assert batch.locator(".dnr-batch-head h3").inner_text() == (
        "Batch mix: 2 pending approvals and 1 question shown")
    assert batch.locator(".dnr-batch-left").inner_text() == (
        "Not in Approve all: 1 question of an MCP server left for its form")
    batch.locator(".dnr-approve-all").click()
    dialog = page.page.locator(".jp-Dialog")
    assert sorted(dialog.locator(".dnr-dialog-list").inner_text().splitlines()) == [
        "mix/0: publish", "mix/2: publish"]
    dialog.locator("button.jp-mod-accept").click()
    page.page.locator(".dnr-inbox .dnr-notice").get_by_text(
        "Batch mix: 2 approved; 1 question of an MCP server left for its form").wait_for()
    page.page.screenshot(path=str(_shots(tmp_path) / "question-left-by-approve-all.png"))
    decided = {key: find_decision(journal, f"mix/{key}",
                                  journal.get_run(f"mix/{key}").pending_approval)
               for key in "012"}
    assert decided["1"] is None
    assert decided["0"]["approved"] and decided["2"]["approved"]


def test_a_new_questions_toast_says_which_server_asks_what(asking_lab, tmp_path: Path) -> None:
    import durable_nb as dn

    page, journal = asking_lab
    assert dn.execute("extras-late", _asked_extras, journal=journal, on_approval="park") is None
    toast = page.page.locator(".jp-toastContainer .Toastify__toast").filter(
        has_text="extras-late")
    toast.wait_for(state="visible")
    assert toast.locator(".jp-toast-message").inner_text() == (
        "Run extras-late: book on hotels asks: Any extras?")
    toast.screenshot(path=str(_shots(tmp_path) / "question-toast.png"))
