"""The approval flow end to end, as a user sees it: JupyterLab in headless Chromium.

A notebook starts the loopback model server in its kernel, runs the demo sales agent in a
``%%durable_agent`` cell, and the run parks at the send_email approval. The test clicks the
panel's Approve (or Reject) button in the page and watches the panel's status badge reach DONE;
the notebook folder's side_effects.log and the run's journal show what really happened.

Screenshots of the panel (waiting for approval, done, a step's details, after a kernel
restart, an error) are saved in the test's tmp dir, or in $DURABLE_NB_SHOTS to look at them.
The panel of a stopped kernel is checked in Jupyter Notebook 7 too, when it is installed.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from durable_nb import serde
from durable_nb.demo import SALES_CSV
from durable_nb.journal import DiskJournal, Status
from durable_nb.registry import get_run
from tests.harness.lab import (
    element_shot,
    JupyterLab,
    LabPage,
    notebook7_available,
    require_chromium,
    write_notebook,
)

pytestmark = pytest.mark.browser

RUN_ID = "sales-report"
NOTE = "not this week"

_SETUP_CELL = """\
import json, os
from durable_nb.testing import LoopbackServer
from durable_nb.demo import make_tools, sales_agent
server = LoopbackServer().start()
os.environ["OPENAI_BASE_URL"] = server.url
os.environ["OPENAI_API_KEY"] = "offline-test"
os.environ.pop("DURABLE_NB_DIR", None)  # the journal goes to ./.durable_nb next to this notebook
%load_ext durable_nb
tools = make_tools(os.getcwd())
print("setup ok")"""

_AGENT_CELL = f"""\
%%durable_agent {RUN_ID} --title "Q3 sales report"
sales_agent(ctx, tools)"""

# What the model was told about the email call: the tool message of the last request.
_TOOL_MESSAGE_CELL = """\
tool_messages = [m for m in server.requests[-1]["messages"] if m["role"] == "tool"]
print("last tool message:", tool_messages[-1]["content"])"""

SETUP, AGENT, TOOL_MESSAGE = 0, 1, 2


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JupyterLab]:
    """One JupyterLab server for the module; each test works in its own folder under it."""
    require_chromium()
    with JupyterLab(tmp_path_factory.mktemp("lab")) as server:
        yield server


def _open_agent_notebook(lab: JupyterLab, page: LabPage, name: str) -> Path:
    """Write ``name/name.ipynb`` with sales.csv beside it, open it, run setup and agent cells,
    and wait until the panel asks for approval. Returns the notebook's folder."""
    folder = lab.root_dir / name
    folder.mkdir()
    (folder / "sales.csv").write_text(SALES_CSV)
    write_notebook(folder / f"{name}.ipynb", [_SETUP_CELL, _AGENT_CELL, _TOOL_MESSAGE_CELL])
    page.open_notebook(f"{name}/{name}.ipynb")
    page.wait_kernel_idle()
    page.run_cell(SETUP)
    page.wait_for_text("setup ok", cell_index=SETUP)
    page.run_cell(AGENT)
    try:
        _badge(page, Status.WAITING_APPROVAL).wait_for(state="visible")
    except Exception as exc:
        raise AssertionError(f"no pending approval in the panel; the agent cell shows: "
                             f"{page.cell_output_text(AGENT)!r}") from exc
    _panel_button(page, "Approve").wait_for(state="visible")
    return folder


def _badge(page: LabPage, status: Status) -> Any:
    """The panel's status badge showing exactly ``status`` (case-sensitive, whole text)."""
    return page.cell(AGENT).locator(".dnb-live").get_by_text(str(status), exact=True)


def _panel_button(page: LabPage, label: str) -> Any:
    return page.cell(AGENT).locator("button.jupyter-button", has_text=label).first


def _shoot_panel(page: LabPage, path: Path) -> None:
    element_shot(page.cell(AGENT).locator(".jp-Cell-outputArea"), path)


def _side_effects(folder: Path) -> list[str]:
    log = folder / "side_effects.log"
    return log.read_text().splitlines() if log.exists() else []


def _approval_result(folder: Path) -> dict:
    """The journaled approval step of the run, decoded, once the run is DONE."""
    journal = DiskJournal(folder / ".durable_nb")
    try:
        info = get_run(RUN_ID, journal=journal)
    finally:
        journal.close()
    assert info.status is Status.DONE, f"journal says {info.status}: {info.error}"
    approvals = [e for e in info.steps if e.kind == "approval"]
    assert [e.name for e in approvals] == ["send_email"]
    return serde.decode(approvals[0].result)


def test_approve_click_resumes_run_to_done_and_sends_email_once(
    lab: JupyterLab, tmp_path: Path
) -> None:
    with LabPage(lab, timeout=60) as page:
        folder = _open_agent_notebook(lab, page, "approve")
        assert "send_email" not in " ".join(_side_effects(folder))
        _shoot_panel(page, _shots(tmp_path) / "panel-waiting-approval.png")

        _panel_button(page, "Approve").click()

        _badge(page, Status.DONE).wait_for(state="visible")
        page.wait_for_text("emailed it to team@example.com", cell_index=AGENT)
        _shoot_panel(page, _shots(tmp_path) / "panel-done.png")

    assert [line for line in _side_effects(folder) if line.startswith("send_email")] == [
        "send_email team@example.com"
    ]
    assert len(list((folder / "outbox").iterdir())) == 1
    decision = _approval_result(folder)
    assert decision["approved"] is True
    assert decision["by"].endswith(" (notebook)")


def test_reject_click_with_note_resumes_run_to_done_without_email(
    lab: JupyterLab, tmp_path: Path
) -> None:
    with LabPage(lab, timeout=60) as page:
        folder = _open_agent_notebook(lab, page, "reject")
        note_field = page.cell(AGENT).locator("input[placeholder='optional note for the agent']")
        note_field.fill(NOTE)
        _shoot_panel(page, _shots(tmp_path) / "panel-reject-note.png")

        _panel_button(page, "Reject").click()

        _badge(page, Status.DONE).wait_for(state="visible")
        _shoot_panel(page, _shots(tmp_path) / "panel-rejected-done.png")
        # The model was told, in the tool message answering its send_email call.
        page.run_cell(TOOL_MESSAGE)
        page.wait_for_text("The user rejected this call to send_email", cell_index=TOOL_MESSAGE)
        told = page.cell_output_text(TOOL_MESSAGE)

    assert f"Their note: {NOTE}" in told
    assert "(notebook)" in told
    assert "write_report Q3 sales" in _side_effects(folder)
    assert not [line for line in _side_effects(folder) if line.startswith("send_email")]
    assert not (folder / "outbox").exists()
    decision = _approval_result(folder)
    assert decision["approved"] is False
    assert decision["note"] == NOTE
    assert decision["by"].endswith(" (notebook)")


# -- what a person sees beyond the click --------------------------------------------------------

def _shots(tmp_path: Path) -> Path:
    """Where screenshots go: $DURABLE_NB_SHOTS (to look at them), else the test's tmp dir."""
    folder = Path(os.environ.get("DURABLE_NB_SHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def notebook7(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JupyterLab]:
    """Jupyter Notebook 7 serving a folder, without durable-nb's extensions: a restarted
    kernel's panel stays, and says why its buttons do nothing (with the extensions its saved
    view decides instead: tests/test_sidebar_notebook7.py). Skipped when the notebook
    package is missing."""
    require_chromium()
    if not notebook7_available():
        pytest.skip("Jupyter Notebook 7 is not installed (pip install 'notebook>=7')")
    with JupyterLab(tmp_path_factory.mktemp("nb7"), app="notebook", checkout=False) as server:
        yield server


def test_a_step_opens_to_what_it_was_asked_and_a_restarted_kernels_panel_says_so(
    lab: JupyterLab, tmp_path: Path
) -> None:
    shots = _shots(tmp_path)
    with LabPage(lab, timeout=60) as page:
        folder = _open_agent_notebook(lab, page, "details")
        _panel_button(page, "Approve").click()
        _badge(page, Status.DONE).wait_for(state="visible")
        rows = page.cell(AGENT).locator(".dnb-steps > details > summary")
        rows.filter(has_text="read_csv").first.click()
        body = page.cell(AGENT).locator(".dnb-steps > details[open] .dnb-step-body").first
        body.wait_for(state="visible")
        assert '"path": "sales.csv"' in body.inner_text()
        assert '"rows": 9' in body.inner_text()
        rows.filter(has_text="loopback-1").nth(1).click()
        chat = page.cell(AGENT).locator(".dnb-steps > details[open] .dnb-step-body").nth(1)
        assert "2 new in this request" in chat.inner_text()
        _shoot_panel(page, shots / "lab-step-details.png")
        dead = page.cell(AGENT).locator(".dnb-dead").first
        assert not dead.is_visible()  # the kernel is alive: no note

        page.restart_kernel()

        page.cell(AGENT).locator(".dnb-panel.jupyter-widgets-disconnected").wait_for()
        dead.wait_for(state="visible")
        assert "This panel belongs to a kernel that stopped; re-run the cell to reconnect" \
            in dead.inner_text()
        _shoot_panel(page, shots / "lab-after-restart.png")
    assert get_run(RUN_ID, journal=DiskJournal(folder / ".durable_nb")).status is Status.DONE


_PARKED_CELL = """%%durable_agent parked --title "deploy"
d = ctx.approval('deploy', {'env': 'prod'})
d.approved"""


def test_notebook7_panel_of_a_stopped_kernel_says_why_its_buttons_do_nothing(
    notebook7: JupyterLab, tmp_path: Path
) -> None:
    shots = _shots(tmp_path)
    write_notebook(notebook7.root_dir / "parked.ipynb",
                   ["%load_ext durable_nb\nprint('setup ok')", _PARKED_CELL])
    with LabPage(notebook7, timeout=60) as page:
        page.open_notebook("parked.ipynb")
        page.wait_kernel_idle()
        page.run_cell(0)
        try:
            page.wait_for_text("setup ok", cell_index=0)
        except Exception:
            page.screenshot(shots / "nb7-setup-failed.png")
            raise
        page.run_cell(1)
        output = page.cell(1).locator(".jp-Cell-outputArea")
        output.locator(".dnb-live").get_by_text(str(Status.WAITING_APPROVAL), exact=True) \
            .wait_for()
        approve = page.cell(1).locator("button.dnb-button", has_text="Approve").first
        assert approve.evaluate("e => getComputedStyle(e, '::after').content") == "none"
        element_shot(output, shots / "nb7-waiting.png")

        page.restart_kernel()

        page.cell(1).locator(".dnb-panel.jupyter-widgets-disconnected").wait_for()
        notes = page.cell(1).locator(".dnb-dead")
        notes.first.wait_for(state="visible")
        text = " ".join(notes.all_inner_texts())
        assert "This panel belongs to a kernel that stopped" in text
        assert "Approve and Reject do nothing here: the kernel that drew them stopped" in text
        assert "durable-nb approve parked" in text
        assert approve.evaluate("e => getComputedStyle(e, '::after').content") == \
            '" (kernel stopped)"'
        element_shot(output, shots / "nb7-after-restart.png")


def test_an_error_is_one_line_under_a_stopped_badge(lab: JupyterLab, tmp_path: Path) -> None:
    shots = _shots(tmp_path)
    folder = lab.root_dir / "errors"
    folder.mkdir()
    write_notebook(folder / "errors.ipynb", [
        "%load_ext durable_nb\nprint('setup ok')",
        "%%durable_agent e\nctx.run('a', str, 'x')",
        "%%durable_agent e\nctx.run('a', str, 'an edited input')"])
    with LabPage(lab, timeout=60) as page:
        page.open_notebook("errors/errors.ipynb")
        page.wait_kernel_idle()
        page.run_cell(0)
        page.wait_for_text("setup ok", cell_index=0)
        page.run_cell(1)
        page.cell(1).locator(".dnb-live").get_by_text("DONE", exact=True).wait_for()
        page.run_cell(2)
        output = page.cell(2).locator(".jp-Cell-outputArea")
        output.locator(".dnb-live").get_by_text("stopped: input changed", exact=True).wait_for()
        error = page.cell(2).locator(".jp-RenderedText[data-mime-type='application/"
                                     "vnd.jupyter.stderr']").last
        error.wait_for(state="visible")
        shown = error.inner_text().strip()
        element_shot(output, shots / "lab-error.png")
    assert shown.startswith("InputChanged: run 'e' no longer matches its journal")
    assert "File " not in shown and "Traceback" not in shown


def test_a_refused_run_and_an_approvals_deadline_as_the_panel_shows_them(
        lab: JupyterLab, tmp_path: Path) -> None:
    """A run refused before it started (a channel named, none configured) shows the refusal
    and no run status; a parked approval shows by when to decide and what happens then."""
    shots = _shots(tmp_path)
    folder = lab.root_dir / "told"
    folder.mkdir()
    write_notebook(folder / "told.ipynb", [
        "%load_ext durable_nb\nprint('setup ok')",
        "%%durable_agent refused --notify slack\nctx.run('a', str, 'x')",
        "%%durable_agent timed\nctx.approval('publish', {'post': 'hello'}, timeout='15m')"])
    with LabPage(lab, timeout=60) as page:
        page.open_notebook("told/told.ipynb")
        page.wait_kernel_idle()
        page.run_cell(0)
        page.wait_for_text("setup ok", cell_index=0)
        page.run_cell(1)
        refused = page.cell(1).locator(".jp-Cell-outputArea")
        refused.locator(".dnb-live").get_by_text("not started", exact=True).wait_for()
        refused_text = refused.locator(".dnb-live").first.inner_text()
        element_shot(refused, shots / "lab-refused.png")
        page.run_cell(2)
        timed = page.cell(2).locator(".jp-Cell-outputArea")
        timed.locator(".dnb-live").get_by_text("WAITING_APPROVAL", exact=True).wait_for()
        deadline = timed.locator(".dnb-deadline").first
        deadline.wait_for(state="visible")
        deadline_text = deadline.inner_text()
        element_shot(timed, shots / "lab-deadline.png")
    assert "durable_nb refused to start this run (NotifyConfigError" in refused_text
    assert "RUNNING" not in refused_text and "in the journal" not in refused_text
    pending = DiskJournal(folder / ".durable_nb").get_run("timed").pending_approval
    by = time.strftime("%H:%M", time.localtime(pending["timeout_at"]))
    assert re.fullmatch(rf"Decide by {by} \(in 1[45] min\), then rejected", deadline_text.strip())


# -- a batch -------------------------------------------------------------------------------------

_BATCH_SETUP = """\
import os
import re
os.environ.pop("DURABLE_NB_DIR", None)  # the journal goes to ./.durable_nb next to this notebook
%load_ext durable_nb
tickets = [{"id": f"T{i:02d}", "text": f"customer {i} asks about their order"} for i in range(30)]
print("setup ok")"""

# Every sixth ticket asks for a refund (an approval); T07 fails; the rest are answered.
_BATCH_CELL = """\
%%durable_agent review --over tickets --key item['id'] --concurrency 3 --title "ticket review"
import time
ctx.run('read', time.sleep, 0.3)
if item['id'] == 'T07':
    raise RuntimeError('the CRM timed out')
if int(item['id'][1:]) % 6 == 0:
    decision = ctx.approval('refund', {'ticket': item['id'], 'amount': 20})
    outcome = 'refunded' if decision.approved else 'declined'
else:
    outcome = f"answered: {item['text']}"
outcome"""

BATCH = 1


def _batch_output(page: LabPage) -> Any:
    return page.cell(BATCH).locator(".jp-Cell-outputArea")


def _batch_badge(page: LabPage, text: str) -> Any:
    return _batch_output(page).locator(".dnb-live").first.get_by_text(text, exact=True).first


def _items(folder: Path) -> dict[str, Status]:
    journal = DiskJournal(folder / ".durable_nb")
    try:
        return {r.run_id.split("/")[1]: r.status for r in journal.list_runs("review/")}
    finally:
        journal.close()


def _wait_items(folder: Path, keys: list[str], status: Status, timeout: float = 30) -> None:
    from tests.harness import wait_until

    wait_until(lambda: all(_items(folder).get(k) is status for k in keys), timeout,
               f"items {keys} {status}")


def test_batch_panel_approve_one_item_approve_all_shown_and_open_an_item(
    lab: JupyterLab, tmp_path: Path
) -> None:
    shots = Path(os.environ.get("DURABLE_NB_SHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    folder = lab.root_dir / "batch"
    folder.mkdir()
    write_notebook(folder / "batch.ipynb", [_BATCH_SETUP, _BATCH_CELL])
    with LabPage(lab, timeout=60) as page:
        page.page.set_viewport_size({"width": 1400, "height": 2000})  # the whole panel shows
        page.open_notebook("batch/batch.ipynb")
        page.wait_kernel_idle()
        page.run_cell(0)
        page.wait_for_text("setup ok", cell_index=0)
        page.run_cell(BATCH)
        _batch_badge(page, "RUNNING").wait_for(state="visible")
        _batch_output(page).locator(".dnb-live .dnb-legend").get_by_text("done").first.wait_for()
        # Some items done, some still to go. A locator, not an element handle: each panel
        # update replaces the legend's element, so a handle would go stale.
        _batch_output(page).locator(".dnb-live .dnb-legend").filter(
            has_text=re.compile(r"\b[1-9]\d* / 30\b")).wait_for()
        element_shot(_batch_output(page), shots / "batch-running.png")

        _batch_badge(page, "WAITING_APPROVAL").wait_for(state="visible", timeout=120_000)
        rows = _batch_output(page).locator(".dnb-approval-row")
        assert rows.count() == 5
        element_shot(_batch_output(page), shots / "batch-pending.png")

        # One item's Approve: that item only.
        rows.filter(has_text="T06").locator("button", has_text="Approve").click()
        _wait_items(folder, ["T06"], Status.DONE)
        assert {k: s for k, s in _items(folder).items() if s is Status.WAITING_APPROVAL} \
            .keys() == {"T00", "T12", "T18", "T24"}
        rows.filter(has_text="T06").wait_for(state="detached")

        # "Approve all shown" with a filter: only the items shown, after a confirmation.
        _batch_output(page).locator("input[placeholder='filter: key, result or error text']") \
            .fill("T1")
        approve_all = _batch_output(page).locator("button", has_text="Approve all 2 shown")
        approve_all.click()
        confirm = _batch_output(page).locator("button", has_text="Yes, approve 2")
        confirm.wait_for(state="visible")
        assert "Approve the pending approval of 2 items? review/T12, review/T18" in \
            _batch_output(page).inner_text()
        assert _items(folder)["T12"] is Status.WAITING_APPROVAL  # nothing before confirming
        element_shot(_batch_output(page), shots / "batch-confirm.png")
        confirm.click()
        _wait_items(folder, ["T12", "T18"], Status.DONE)
        assert _items(folder)["T00"] is Status.WAITING_APPROVAL
        assert _items(folder)["T24"] is Status.WAITING_APPROVAL

        _batch_output(page).locator("input[placeholder='filter: key, result or error text']") \
            .fill("")
        _batch_output(page).locator("button", has_text="Approve all 2 shown").click()
        _batch_output(page).locator("button", has_text="Yes, approve 2").click()
        _batch_badge(page, "FINISHED: 1 not done").wait_for(state="visible")

        # A click on a row opens that item's own run panel.
        _batch_output(page).locator("tr.dnb-row[data-key='T07']").click()
        item_panel = _batch_output(page).locator(".dnb-batch .dnb-panel:not(.dnb-batch)")
        item_panel.get_by_text("review/T07", exact=True).wait_for(state="visible")
        assert "RuntimeError: the CRM timed out" in item_panel.inner_text()
        _batch_output(page).locator(".dnb-live .dnb-legend").hover()  # not over a row
        element_shot(_batch_output(page), shots / "batch-finished.png")

        page.restart_kernel()  # the panel says its kernel stopped, and what to do
        _batch_output(page).locator(".dnb-batch.jupyter-widgets-disconnected").wait_for()
        dead = _batch_output(page).locator(".dnb-batch.dnb-live .dnb-summary > .dnb-dead")
        dead.wait_for(state="visible")
        assert "This panel belongs to a kernel that stopped; re-run the cell to reconnect" in \
            dead.inner_text()

    statuses = _items(folder)
    assert statuses["T07"] is Status.FAILED
    assert all(s is Status.DONE for k, s in statuses.items() if k != "T07")
    journal = DiskJournal(folder / ".durable_nb")
    try:
        for key in ("T06", "T12"):  # one clicked alone, one approved with the others shown
            (approval,) = [e for e in get_run(f"review/{key}", journal=journal).steps
                           if e.kind == "approval"]
            decision = serde.decode(approval.result)
            assert decision["approved"] is True and decision["by"].endswith(" (notebook)")
    finally:
        journal.close()


_SLOW_CELL = """%%durable_agent slow --title "slow steps"
import time
def slow(i):
    time.sleep(0.5)
    return i
sum(ctx.run(f'step {i}', slow, i) for i in range(14))"""


def _interrupt_kernel(page: LabPage) -> None:
    """The stop button's command, from the Kernel menu: Interrupt Kernel."""
    page.page.locator("#jp-MainMenu, #jp-menu-panel").get_by_text(
        "Kernel", exact=True).first.click()
    page.page.locator(".lm-Menu-content").get_by_text("Interrupt Kernel").first.click()


@pytest.mark.parametrize("how", ["restart", "stop"])
def test_a_run_resumed_after_a_restart_or_the_stop_button_shows_running_and_its_attempts(
    lab: JupyterLab, tmp_path: Path, how: str
) -> None:
    """Kernel > Restart (or the stop button) mid-run, then the cell again: the panel says
    RUNNING and "attempt 2: resumed after a kernel restart at step N" for the whole resumed
    execution (never the FAILED the interrupted one left), and a click lists the attempts."""
    shots = _shots(tmp_path)
    folder = lab.root_dir / f"resumed-{how}"
    folder.mkdir()
    write_notebook(folder / "resumed.ipynb", ["%load_ext durable_nb", _SLOW_CELL])
    journal = DiskJournal(folder / ".durable_nb")

    def steps() -> int:
        return len(list(journal.steps("slow"))) if journal.find_run("slow") else 0

    with LabPage(lab, timeout=60) as page:
        page.open_notebook(f"resumed-{how}/resumed.ipynb")
        page.wait_kernel_idle()
        page.run_cell(0)
        page.run_cell(1)
        page.cell(1).locator(".dnb-steps").wait_for(state="visible")
        while steps() < 3:
            page.page.wait_for_timeout(100)
        if how == "restart":
            page.restart_kernel()
            page.wait_kernel_idle()
            stopped_at = steps()
            page.run_cell(0)
            page.wait_for_text("interrupted by a kernel restart", cell_index=0)
            words = f"attempt 2: resumed after a kernel restart at step {stopped_at}"
        else:
            _interrupt_kernel(page)
            page.wait_for_text("KeyboardInterrupt", cell_index=1)
            stopped_at = steps()
            words = f"attempt 2: resumed after the stop button at step {stopped_at}"
        page.run_cell(1)
        output = page.cell(1).locator(".dnb-live")  # not the saved view the last one left
        output.get_by_text(words).first.wait_for(state="visible")
        running = output.get_by_text("RUNNING", exact=True)
        assert running.first.is_visible() and steps() < 14
        assert output.get_by_text("FAILED", exact=True).count() == 0
        output.get_by_text(words).first.click()  # opens the list of attempts
        output.get_by_text("attempt 1").first.wait_for(state="visible")
        # The page, not the live panel's element: the panel redraws while it runs, and an
        # element screenshot taken as it is replaced fails ("not attached to the DOM").
        page.screenshot(shots / f"lab-resumed-{how}-running.png")
        output.get_by_text("DONE", exact=True).first.wait_for(state="visible", timeout=30_000)
        page.screenshot(shots / f"lab-resumed-{how}-done.png")
    record = journal.get_run("slow")
    first = "kernel-restarted" if how == "restart" else "interrupted"
    assert [a["end"] for a in record.attempts] == [first, "completed"]


@pytest.mark.parametrize("front_end", ["lab", "notebook7"])
def test_a_reopened_notebook_shows_the_saved_view_of_its_run_and_no_error_box(
    front_end: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A run approved and DONE, the notebook saved, its kernel shut down, the notebook opened
    again: the front end has no model for the panel's widget (it would say "Error displaying
    widget: model not found"); the saved view shows the run instead, and that box is hidden.
    In JupyterLab 4 and in Notebook 7."""
    from tests.harness import wait_until

    server: JupyterLab = request.getfixturevalue(front_end)
    shots = _shots(tmp_path)
    with LabPage(server, timeout=60) as page:
        folder = _open_agent_notebook(server, page, "reopened")
        _panel_button(page, "Approve").click()
        _badge(page, Status.DONE).wait_for(state="visible")
        saved = page.cell(AGENT).locator(".dnb-saved")
        saved.wait_for(state="attached")
        assert not saved.is_visible()  # the live panel is shown, not its saved view
        page.wait_for_text("The Q3 sales report is done", cell_index=AGENT)
        notebook = folder / "reopened.ipynb"
        page.cell(AGENT).locator(".jp-InputArea-editor .cm-content").click()
        page.page.keyboard.press("Control+s")
        wait_until(lambda: "Saved view of run sales-report" in notebook.read_text()
                   and "The Q3 sales report is done" in notebook.read_text(), 30,
                   "the notebook saved with the saved view of the DONE run")
        server.delete_sessions()  # the kernel shuts down: the widget models are gone

        page.open_notebook("reopened/reopened.ipynb")
        view = page.cell(AGENT).locator(".dnb-saved")
        view.wait_for(state="visible")
        error = page.cell(AGENT).get_by_text("Error displaying widget: model not found")
        error.wait_for(state="attached")  # the front end gave up on the widget ...
        assert not error.is_visible()  # ... and its box is hidden
        text = view.inner_text()
        assert "sales-report" in text and "DONE" in text and "approved" in text
        assert "The Q3 sales report is done" in text
        assert "Saved view of run sales-report" in text
        _shoot_panel(page, shots / f"{front_end}-reopened.png")


def _run_all(page: LabPage) -> None:
    """Run > Run All Cells, as a person does."""
    page.page.locator("#jp-MainMenu").get_by_text("Run", exact=True).first.click()
    page.page.locator(".lm-Menu-content").get_by_text("Run All Cells", exact=True).first.click()


def test_run_all_of_the_approvals_notebook_stops_at_the_approval_with_its_buttons(
    lab: JupyterLab, tmp_path: Path
) -> None:
    """notebooks/approvals.ipynb, Run All in JupyterLab: it stops after the refund's cell with
    Approve and Reject shown and one line saying what to do; after the click, Run All again
    runs to the end with no error."""
    import shutil

    shots = _shots(tmp_path)
    folder = lab.root_dir / "approvals"
    folder.mkdir()
    shutil.copy(Path(__file__).resolve().parents[1] / "notebooks" / "approvals.ipynb", folder)
    with LabPage(lab, timeout=60) as page:
        page.open_notebook("approvals/approvals.ipynb")
        page.wait_kernel_idle()
        _run_all(page)
        cells = page.panel.locator(".jp-Cell")
        agent = cells.filter(has_text="%%durable_agent refund-42").first
        stop = cells.filter(has_text="stop_for_decision('refund-42')").first
        stop.locator(".jp-OutputArea-output").filter(has_text="DecisionNeeded").wait_for()
        assert "run 'refund-42' waits for your decision on 'refund': click Approve or Reject " \
               "above, then run the next cell" in stop.locator(".jp-Cell-outputArea").inner_text()
        agent.locator(".dnb-live").get_by_text("WAITING_APPROVAL", exact=True).wait_for()
        approve = agent.locator("button.jupyter-button", has_text="Approve").first
        assert approve.is_visible()
        waited = cells.filter(has_text="%durable wait refund-42").first
        assert waited.locator(".jp-OutputArea-output").count() == 0  # Run All stopped before
        element_shot(agent, shots / "approvals-run-all-panel.png")
        element_shot(stop, shots / "approvals-run-all-stop.png")

        approve.click()
        agent.locator(".dnb-live").get_by_text("DONE", exact=True).wait_for()
        _run_all(page)
        runs = cells.filter(has_text="%durable runs").last
        runs.locator(".jp-OutputArea-output").filter(has_text="nobody-home").wait_for()
        text = page.panel.inner_text()
    assert "is not waiting for an approval" not in text and "DecisionNeeded" not in text
    assert "'refunded 180.0 (key refund-42:2)'" in text


def test_a_reopened_notebook_shows_the_saved_view_of_its_batch(
    lab: JupyterLab, tmp_path: Path
) -> None:
    """A batch with items parked, approved from the panel, DONE; saved, the kernel shut down,
    reopened: the batch's saved view (its counts, its items problems first) and its final
    value are shown, and no error box."""
    from tests.harness import wait_until

    shots = _shots(tmp_path)
    folder = lab.root_dir / "batch-reopened"
    folder.mkdir()
    cell = ("%%durable_agent refunds --over tickets[:4] --key item['id'] --title \"refunds\"\n"
            "if item['id'] == 'T03':\n"
            "    raise RuntimeError('the CRM timed out')\n"
            "'refunded' if ctx.approval('refund', {'ticket': item['id']}).approved else 'no'")
    notebook = write_notebook(folder / "batch.ipynb", [_BATCH_SETUP, cell])
    with LabPage(lab, timeout=60) as page:
        page.open_notebook("batch-reopened/batch.ipynb")
        page.wait_kernel_idle()
        page.run_cell(0)
        page.wait_for_text("setup ok", cell_index=0)
        page.run_cell(BATCH)
        _batch_badge(page, "WAITING_APPROVAL").wait_for(state="visible")
        _batch_output(page).locator("button", has_text="Approve all 3 shown").click()
        _batch_output(page).locator("button", has_text="Yes, approve 3").click()
        _batch_badge(page, "FINISHED: 1 not done").wait_for(state="visible")
        page.wait_for_text("<Batch 'refunds': 4 items (3 DONE, 1 FAILED)>", cell_index=BATCH)
        page.cell(BATCH).locator(".jp-InputArea-editor .cm-content").click()
        page.page.keyboard.press("Control+s")
        wait_until(lambda: "Saved view of batch refunds" in notebook.read_text()
                   and "3 / 4</b> done" in notebook.read_text(), 30,
                   "the notebook saved with the saved view of the finished batch")
        lab.delete_sessions()

        page.open_notebook("batch-reopened/batch.ipynb")
        view = _batch_output(page).locator(".dnb-saved")
        view.wait_for(state="visible")
        error = _batch_output(page).get_by_text("Error displaying widget: model not found")
        error.wait_for(state="attached")
        assert not error.is_visible()
        text = view.inner_text()
        assert "batch refunds" in text and "FINISHED: 1 not done" in text
        assert text.index("T03") < text.index("T00")  # the failed item first
        assert "RuntimeError: the CRM timed out" in text
        assert "<Batch 'refunds': 4 items (3 DONE, 1 FAILED)>" in _batch_output(page).inner_text()
        element_shot(_batch_output(page), shots / "batch-reopened.png")


# A run that parks, then (resumed in the background) waits in its first step for a file the
# test writes: the test decides when the step ends, not a clock.
_BACKGROUND_CELL = """%%durable_agent bg
import os, time
def work(i):
    while not os.path.exists(f'go{i}'):
        time.sleep(0.05)
    return i
ctx.approval('go ahead', {'why': 'test'})
for i in range(3):
    ctx.run(f'work {i}', work, i)"""


def test_cancel_is_not_shown_while_the_cell_runs_and_says_cancelling_in_the_background(
    lab: JupyterLab, tmp_path: Path
) -> None:
    """A click on a busy cell's widget never reaches ipykernel 7.4: while the run executes in
    its cell the panel has no Cancel button but says what stops it, and the stop button does.
    Resumed in the background after an approval (the kernel idle), Cancel is there, turns into
    a disabled "Cancelling..." at the click, and the run stops at the next step."""
    shots = _shots(tmp_path)
    folder = lab.root_dir / "cancel"
    folder.mkdir()
    write_notebook(folder / "cancel.ipynb", ["%load_ext durable_nb", _SLOW_CELL, _BACKGROUND_CELL])
    journal = DiskJournal(folder / ".durable_nb")
    with LabPage(lab, timeout=60) as page:
        page.open_notebook("cancel/cancel.ipynb")
        page.wait_kernel_idle()
        page.run_cell(0)
        page.run_cell(1)
        live = page.cell(1).locator(".dnb-live")
        hint = live.get_by_text("stop it with the kernel's stop button")
        hint.wait_for(state="visible")
        live.get_by_text("RUNNING", exact=True).first.wait_for(state="visible")
        assert not live.locator("button.jupyter-button", has_text="Cancel").first.is_visible()
        element_shot(live, shots / "lab-foreground-stop-hint.png")
        _interrupt_kernel(page)
        page.wait_for_text("KeyboardInterrupt", cell_index=1)
        hint.wait_for(state="hidden")
        assert len(list(journal.steps("slow"))) < 14

        page.run_cell(2)
        bg = page.cell(2).locator(".dnb-live")
        bg.locator("button.jupyter-button", has_text="Approve").first.click()
        bg.get_by_text("RUNNING", exact=True).first.wait_for(state="visible")
        bg.locator("button.jupyter-button", has_text="Cancel run").first.click()
        cancelling = bg.locator("button.jupyter-button:disabled", has_text="Cancelling...")
        cancelling.first.wait_for(state="visible")
        element_shot(bg, shots / "lab-background-cancelling.png")
        (folder / "go0").touch()
        bg.get_by_text("CANCELLED", exact=True).first.wait_for(state="visible")
        element_shot(bg, shots / "lab-background-cancelled.png")
    record = journal.get_run("bg")
    assert record.status is Status.CANCELLED
    assert [e.name for e in journal.steps("bg") if e.name.startswith("work")] == ["work 0"]


def _elapsed(live: Any) -> str:
    """The "elapsed ..." of a live run panel's stats line."""
    match = re.search(r"elapsed [0-9.]+ \w+", live.inner_text())
    return match.group(0) if match else ""


def test_elapsed_ticks_in_a_first_run_and_the_opened_attempts_stay_open_across_redraws(
    lab: JupyterLab, tmp_path: Path
) -> None:
    """A first run's panel shows its elapsed time moving while a step runs; after the stop
    button and a re-run, the list of attempts a click opened stays open while the panel
    redraws (every second, and at each step)."""
    shots = _shots(tmp_path)
    folder = lab.root_dir / "ticks"
    folder.mkdir()
    write_notebook(folder / "ticks.ipynb", ["%load_ext durable_nb", _SLOW_CELL])
    with LabPage(lab, timeout=60) as page:
        page.open_notebook("ticks/ticks.ipynb")
        page.wait_kernel_idle()
        page.run_cell(0)
        page.run_cell(1)
        live = page.cell(1).locator(".dnb-live")
        live.get_by_text("RUNNING", exact=True).first.wait_for(state="visible")
        first = _elapsed(live)
        page.page.wait_for_function(  # the stats line redrawn with a later elapsed time
            "([el, seen]) => /elapsed [0-9.]+ \\w+/.exec(el.innerText)?.[0] !== seen",
            arg=[live.first.element_handle(), first])
        later = _elapsed(live)
        assert first != later and later != "elapsed 0.0 s", (first, later)
        element_shot(live, shots / "lab-first-run-running.png")
        _interrupt_kernel(page)
        page.wait_for_text("KeyboardInterrupt", cell_index=1)

        page.run_cell(1)
        live = page.cell(1).locator(".dnb-live")
        words = live.get_by_text("attempt 2: resumed after the stop button")
        words.first.wait_for(state="visible")
        words.first.click()
        listed = live.get_by_text("attempt 1 ", exact=False).first
        listed.wait_for(state="visible")
        for _ in range(2):  # two redraws of the header and stats (a tick, or a step)
            seen = _elapsed(live)
            page.page.wait_for_function(
                "([el, seen]) => /elapsed [0-9.]+ \\w+/.exec(el.innerText)?.[0] !== seen",
                arg=[live.first.element_handle(), seen])
            assert listed.is_visible(), "the attempts list closed at a redraw"
        element_shot(live, shots / "lab-resumed-attempts-open.png")
        live.get_by_text("DONE", exact=True).first.wait_for(state="visible", timeout=30_000)
        assert listed.is_visible()
        element_shot(live, shots / "lab-resumed-attempts-open-done.png")


_GATED_BATCH_CELL = """\
%%durable_agent gated --over list(range(8)) --key str(item) --concurrency 2
import os, time
def wait_for_go():
    while not os.path.exists('go'):
        time.sleep(0.05)
ctx.run('wait', wait_for_go)
item * 10"""


def test_a_batch_running_in_its_cell_disables_its_controls_and_says_why_then_they_work(
    lab: JupyterLab, tmp_path: Path
) -> None:
    """While the batch executes in its cell, a click would never reach the busy kernel
    (ipykernel 7.4): every control of the panel is disabled and a note says why and what
    stops it. Once the cell ends the controls work: a row's click opens its item."""
    shots = _shots(tmp_path)
    folder = lab.root_dir / "gated"
    folder.mkdir()
    write_notebook(folder / "gated.ipynb", ["%load_ext durable_nb", _GATED_BATCH_CELL])
    with LabPage(lab, timeout=60) as page:
        page.page.set_viewport_size({"width": 1400, "height": 1600})
        page.open_notebook("gated/gated.ipynb")
        page.wait_kernel_idle()
        page.run_cell(0)
        page.run_cell(1)
        output = page.cell(1).locator(".jp-Cell-outputArea")
        live = output.locator(".dnb-batch.dnb-live").first
        hint = live.get_by_text("the kernel is busy and cannot receive clicks")
        hint.wait_for(state="visible")
        live.locator("tr.dnb-row").first.wait_for(state="visible")
        controls = live.locator("button:visible, select:visible, input:visible")
        assert controls.count() >= 6
        enabled = [controls.nth(i).evaluate("e => e.outerHTML.slice(0, 80)")
                   for i in range(controls.count()) if controls.nth(i).is_enabled()]
        assert enabled == [], enabled
        element_shot(live, shots / "batch-running-in-cell.png")

        (folder / "go").touch()
        live.get_by_text("DONE", exact=True).first.wait_for(state="visible", timeout=30_000)
        hint.wait_for(state="hidden")
        assert live.locator("select:visible").first.is_enabled()
        live.locator("tr.dnb-row[data-key='3']").click()
        live.locator(".dnb-panel:not(.dnb-batch)").get_by_text(
            "gated/3", exact=True).wait_for(state="visible", timeout=1_000)
        element_shot(live, shots / "batch-done-item-open.png")
