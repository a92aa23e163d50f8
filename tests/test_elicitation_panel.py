"""An MCP server's question as a form in the notebook (issue 34, section 1): the run panel in
a real kernel (nbclient) and in JupyterLab in headless Chromium, and ``%durable inbox``'s
card; each answer a decision through the one ``decide``. The question comes from the real
``mcp`` SDK server of tests/mcp_server.py."""

from __future__ import annotations

import json
import os
import sys
from html import unescape
from pathlib import Path


import durable_nb as dn
import durable_nb.mcp as dmcp
from durable_nb import Status

REPO = Path(__file__).resolve().parents[1]
SERVER = Path(__file__).with_name("mcp_server.py")


def _agent_cell(run_id: str, count_dir: Path) -> str:
    return (f"%%durable_agent {run_id}\n"
            f"import json, sys\nimport durable_nb.mcp as dmcp\n"
            f"hotel = dmcp.stdio(sys.executable, {str(SERVER)!r}, {str(count_dir)!r}, "
            f"'stdio', name='hotel')\n"
            f"call = {{'role': 'assistant', 'content': None, 'tool_calls': [{{'id': 'c0', "
            f"'type': 'function', 'function': {{'name': 'book', "
            f"'arguments': json.dumps({{'city': 'Oslo'}})}}}}]}}\n"
            f"answers = ctx.call_tools(call, ctx.mcp_tools(hotel))\n"
            f"ctx.run('log', lambda: open('booked.log', 'a').write(answers[0]['content'] + "
            f"'\\n'))")


def _books(count_dir: Path) -> list[tuple]:
    found = [json.loads(p.read_text()) for p in count_dir.glob("book-*.json")]
    return sorted((c["action"], c["nights"]) for c in found)


def test_the_panel_in_a_real_kernel_shows_the_question_and_accept_answers_it(tmp_path):
    import nbformat
    from nbclient import NotebookClient

    count_dir = tmp_path / "calls"
    count_dir.mkdir()
    journal_dir = tmp_path / "journal"
    cells = (
        "%load_ext durable_nb",
        _agent_cell("ask-1", count_dir),
        # What a person does in the panel (nbclient has no browser; Button.click runs the
        # on_click callbacks): a wrong answer first, then one that fits.
        "from durable_nb.notebook import active_run\n"
        "session = active_run('ask-1')\npanel = session.panel\n"
        "form = panel.question_form\n"
        "print('SHOWN', form.box.layout.display, panel.approval_buttons.layout.display)\n"
        "print('MESSAGE', form.message.value)\n"
        "form.inputs['nights'][1].value = 'three'\n"
        "form.accept.click()\n"
        "print('REFUSED', form.problem.value)\n"
        "form.inputs['nights'][1].value = '3'\n"
        "form.accept.click()\n"
        "print('WAITED', session.wait(60))",
    )
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    env_before = dict(os.environ)
    os.environ.update(DURABLE_NB_JOURNAL=str(journal_dir), PYTHONPATH=os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    try:
        NotebookClient(nb, timeout=120, kernel_name="python3",
                       resources={"metadata": {"path": str(tmp_path)}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    said = unescape("".join(o.get("text", "") for o in nb.cells[2].outputs))
    assert "SHOWN flex none" in said  # the question's form, not Approve / Reject
    assert "How many nights in Oslo?" in said and "Question from hotel" in said
    assert "field 'nights' must be an integer" in said and "Nothing was decided" in said
    assert "WAITED True" in said
    assert (tmp_path / "booked.log").read_text() == "booked 3 nights in Oslo\n"
    assert _books(count_dir) == [("accept", 3)]
    journal = dn.DiskJournal(journal_dir)
    try:
        approval = next(s for s in journal.steps("ask-1") if s.kind == "approval")
        assert approval.result["answer"] == {"action": "accept", "content": {"nights": 3}}
        assert approval.result["via"] == "panel"
        assert journal.get_run("ask-1").status is Status.DONE
    finally:
        journal.close()


def test_the_inbox_card_shows_the_question_and_decline_answers_it(journal, tmp_path):
    from durable_nb.notebook.inbox import ApprovalsInbox

    count_dir = tmp_path / "calls"
    count_dir.mkdir()
    server = dmcp.stdio(sys.executable, str(SERVER), str(count_dir), "stdio", name="hotel")
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c0", "type": "function",
         "function": {"name": "book", "arguments": json.dumps({"city": "Oslo"})}}]}

    def agent(ctx):
        return ctx.call_tools(call, ctx.mcp_tools(server))

    try:
        assert dn.execute("q", agent, journal=journal, on_approval="park") is None
        inbox = ApprovalsInbox(journal.directory)
        card = inbox.cards["q"]
        assert card.question.box.layout.display == "flex"
        assert "How many nights in Oslo?" in card.question.message.value
        assert list(card.question.inputs) == ["nights"]
        card.question.accept.click()  # nothing typed: the schema requires nights
        assert "missing required field 'nights'" in unescape(inbox.notice.value)
        inbox.cards["q"].question.decline.click()
        assert "q: answered decline by" in unescape(inbox.notice.value)
        answers = dn.execute("q", agent, journal=journal, on_approval="park")
        assert answers[0]["content"] == "not booked (decline)"
    finally:
        dmcp.close()


def test_in_jupyterlab_the_panels_question_form_is_filled_and_accepted(
        tmp_path_factory, tmp_path):
    from tests.harness import wait_until
    from tests.harness.lab import JupyterLab, LabPage, require_chromium, write_notebook

    require_chromium()
    shots = Path(os.environ.get("DURABLE_NB_SHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    journal_dir = tmp_path_factory.mktemp("journal") / "journal"
    count_dir = tmp_path_factory.mktemp("calls")
    env = {"DURABLE_NB_JOURNAL": str(journal_dir),
           "HOME": str(tmp_path_factory.mktemp("home")),
           "DURABLE_NB_INDEX": str(tmp_path_factory.mktemp("index"))}
    root = tmp_path_factory.mktemp("lab")
    write_notebook(root / "ask.ipynb", ["%load_ext durable_nb\nprint('setup ok')",
                                        _agent_cell("lab-ask", count_dir)])
    with JupyterLab(root, env=env) as lab, LabPage(lab, timeout=60) as page:
        page.open_notebook("ask.ipynb")
        page.wait_kernel_idle()
        page.run_cell(0)
        page.wait_for_text("setup ok", cell_index=0)
        page.run_cell(1)
        page.wait_for_text("How many nights in Oslo?", cell_index=1)
        output = page.cell(1).locator(".jp-Cell-outputArea")
        nights = output.locator(".dnb-question-field input").first
        nights.wait_for(state="visible")
        nights.fill("4")
        output.screenshot(path=str(shots / "elicitation-lab-form.png"))
        page.click_button("Accept", cell_index=1)

        def done() -> bool:
            journal = dn.DiskJournal(journal_dir)
            try:
                return journal.get_run("lab-ask").status is Status.DONE
            finally:
                journal.close()

        wait_until(done, 60, "the kernel ran the answered call")
        output.screenshot(path=str(shots / "elicitation-lab-answered.png"))
    print("screenshots:", shots)
    assert (root / "booked.log").read_text() == "booked 4 nights in Oslo\n"
    assert _books(count_dir) == [("accept", 4)]
