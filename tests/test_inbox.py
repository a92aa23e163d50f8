"""The approvals inbox in the kernel's own output, ``%durable inbox`` (issue 35), for front
ends that show ipywidgets but no Jupyter extension (VS Code, Colab):

- in JupyterLab with durable-nb's Lab and server extensions absent (as VS Code and Colab show a
  notebook), in headless Chromium: a run parked by another notebook, whose kernel still
  watches it, is approved with the inbox's Approve; that kernel resumes it, the tool runs
  once; the inbox says where the Lab sidebar would be and how to get it;
- in a notebook run by nbclient (a kernel and ipywidgets, no browser): the inbox lists a
  request parked by another process and its Approve decides it, bound to that request; a
  panel's "Approvals inbox" shows every request waiting, its own run's and the others';
- a card drawn for request #1 decides nothing once the run asks an identical #2 (issue 32).

Screenshots go to $DURABLE_NB_SHOTS, else the test's tmp dir.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

import durable_nb as dn
from durable_nb import Status
from durable_nb.approvals.request import find_decision, pending_digest
from durable_nb.journal import DiskJournal
from durable_nb.notebook.inbox import VIA, ApprovalsInbox
from tests.harness import wait_until
from tests.harness.lab import SETUP_CELL, JupyterLab, LabPage, require_chromium, write_notebook

REPO = Path(__file__).resolve().parents[1]

# A process of its own (a terminal's python, another notebook): parks RUN_ID in JOURNAL.
PARK = """\
import sys
import durable_nb as dn
journal, run_id = sys.argv[1:3]
def handler(ctx):
    if ctx.approval("refund", {"order": run_id, "amount": "<b>42</b>"}).approved:
        ctx.run("pay", lambda: "paid")
assert dn.execute(run_id, handler, journal=journal, on_approval="park") is None
"""


def _shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("DURABLE_NB_SHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _park_elsewhere(journal_dir: Path, run_id: str) -> None:
    subprocess.run([sys.executable, "-c", PARK, str(journal_dir), run_id], check=True,
                   timeout=120, capture_output=True)


def test_a_card_of_a_request_asked_again_identically_decides_nothing(tmp_path: Path) -> None:
    journal = DiskJournal(tmp_path / "journal")
    charged: list[int] = []

    def handler(ctx: Any) -> None:
        for _ in range(2):  # the same request twice: one digest, two request ids
            if ctx.approval("charge", {"card": "4242", "amount": 10}).approved:
                ctx.run("charge", lambda: charged.append(10))

    try:
        assert dn.execute("twice", handler, journal=journal, on_approval="park") is None
        inbox = ApprovalsInbox(journal.directory)
        stale = inbox.cards["twice"]
        first = journal.get_run("twice").pending_approval
        dn.approve("twice", journal=journal)
        assert dn.execute("twice", handler, journal=journal, on_approval="park") is None
        second = journal.get_run("twice").pending_approval
        assert pending_digest(second) == pending_digest(first) and second["id"] != first["id"]

        stale.approve.click()

        assert find_decision(journal, "twice", second) is None
        assert "nothing was decided" in inbox.notice.value
        assert "was already approved" in inbox.notice.value  # request #1, taken: not #2
        assert charged == [10]
        assert inbox.cards["twice"].request.request_id == second["id"]  # redrawn: #2 now
    finally:
        journal.close()


def test_the_inbox_in_a_notebook_run_by_nbclient_approves_a_run_parked_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal_dir = tmp_path / "journal"
    _park_elsewhere(journal_dir, "refund-7")
    monkeypatch.setenv("DURABLE_NB_JOURNAL", str(journal_dir))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in (
        "%load_ext durable_nb\ninbox = %durable inbox\ninbox",
        # What a click on the card's Approve does (ipywidgets' Button.click runs its
        # on_click callbacks): nbclient has no browser to click in.
        "card = inbox.cards['refund-7']\ncard.note.value = 'checked the order'\n"
        "card.approve.click()\nprint(inbox.notice.value)",
        # A run of this notebook parks; its panel's "Approvals inbox" shows every request.
        "%%durable_agent here-1\nctx.approval('deploy', {'env': 'prod'})",
        "from durable_nb.notebook import active_run\npanel = active_run('here-1').panel\n"
        "panel.inbox_button.click()\n[shown] = panel.inbox_area.children\n"
        "print(sorted(shown.cards))",
    )])
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()

    shown = nb.cells[0].outputs[-1]["data"]
    assert "application/vnd.jupyter.widget-view+json" in shown
    assert 'refund-7: refund {"order": "refund-7", "amount": "<b>42</b>"}' in shown["text/plain"]
    state = str(nb.metadata["widgets"])  # the widget state nbclient saved with the notebook
    assert "refund-7" in state and "&lt;b&gt;42&lt;/b&gt;" in state and "<b>42</b>" not in state
    assert "approved by" in nb.cells[1].outputs[0]["text"]
    assert nb.cells[3].outputs[0]["text"].strip() == "['here-1', 'refund-7']"
    journal = DiskJournal(journal_dir)
    try:
        pending = journal.get_run("refund-7").pending_approval
        decision = find_decision(journal, "refund-7", pending)
    finally:
        journal.close()
    assert decision["approved"] and decision["note"] == "checked the order"
    assert decision["via"] == VIA and decision["digest"] == pending_digest(pending)


_AGENT_CELL = """\
%%durable_agent inbox-deploy --title "Deploy, approved from another notebook"
if ctx.approval("kubectl apply", {"cmd": "kubectl apply -f prod.yaml"}).approved:
    ctx.run("apply", lambda: open("side_effects.log", "a").write("applied\\n"))"""


@pytest.mark.browser
def test_in_lab_without_the_extension_the_inbox_approves_a_run_another_notebook_parked(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    require_chromium()
    shots = _shots(tmp_path)
    journal_dir = tmp_path_factory.mktemp("journal") / "journal"
    env = {"DURABLE_NB_JOURNAL": str(journal_dir),
           "HOME": str(tmp_path_factory.mktemp("home")),
           "DURABLE_NB_INDEX": str(tmp_path_factory.mktemp("index"))}
    root = tmp_path_factory.mktemp("lab")
    write_notebook(root / "deploy.ipynb", [SETUP_CELL, _AGENT_CELL])
    write_notebook(root / "inbox.ipynb", ["%load_ext durable_nb\n%durable inbox"])
    # checkout=False: neither durable-nb's Lab extension nor its server extension, as in
    # VS Code or Colab, which show widgets and no Jupyter extension.
    with JupyterLab(root, env=env, checkout=False) as lab, LabPage(lab, timeout=60) as page:
        page.park("deploy.ipynb")
        assert not page.page.locator(".dnr-sidebar").count()  # no Lab extension here
        page.cell(1).locator(".jp-Cell-outputArea").screenshot(
            path=str(shots / "inbox-lab-parked-panel.png"))

        page.open_notebook("inbox.ipynb")  # deploy's kernel stays, watching its parked run
        page.wait_kernel_idle()
        page.run_cell(0)
        card = page.cell(0).locator(".jp-OutputArea-output .widget-vbox").filter(
            has_text="inbox-deploy").last
        card.wait_for(state="visible")
        output = page.cell(0).locator(".jp-Cell-outputArea")
        text = output.inner_text()
        assert "kubectl apply -f prod.yaml" in text
        assert "Durable runs" in text and 'pip install "durable-nb[lab]"' in text
        output.screenshot(path=str(shots / "inbox-lab-no-extension.png"))
        card.locator("input").fill("ship it")
        page.click_button("Approve", cell_index=0)
        page.wait_for_text("inbox-deploy: approved by", cell_index=0)

        def resumed() -> bool:
            journal = DiskJournal(journal_dir)
            try:
                return journal.get_run("inbox-deploy").status is Status.DONE
            finally:
                journal.close()

        wait_until(resumed, 60, "the parking notebook's kernel resumed the approved run")
        output.screenshot(path=str(shots / "inbox-lab-approved.png"))
    assert (root / "side_effects.log").read_text() == "applied\n"


@pytest.mark.browser
def test_in_lab_with_the_extension_the_inbox_says_nothing_of_front_ends_without_it(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """Issue 41: the footnote for VS Code and Colab (where the sidebar would be, how to get
    it) is not for a page whose server serves the Lab extension: its sidebar is there."""
    require_chromium()
    journal_dir = tmp_path_factory.mktemp("journal") / "journal"
    _park_elsewhere(journal_dir, "refund-8")
    env = {"DURABLE_NB_JOURNAL": str(journal_dir),
           "HOME": str(tmp_path_factory.mktemp("home")),
           "DURABLE_NB_INDEX": str(tmp_path_factory.mktemp("index"))}
    root = tmp_path_factory.mktemp("lab")
    write_notebook(root / "inbox.ipynb", ["%load_ext durable_nb\n%durable inbox"])
    with JupyterLab(root, env=env) as lab, LabPage(lab, timeout=60) as page:
        page.open_notebook("inbox.ipynb")
        page.wait_kernel_idle()
        page.run_cell(0)
        card = page.cell(0).locator(".jp-OutputArea-output .widget-vbox").filter(
            has_text="refund-8").last
        card.wait_for(state="visible")
        output = page.cell(0).locator(".jp-Cell-outputArea")
        output.screenshot(path=str(_shots(tmp_path) / "inbox-lab-with-extension.png"))
        text = output.inner_text()
        assert "refund-8" in text and "Approve" in text
        assert "VS Code" not in text and "pip install" not in text, text
