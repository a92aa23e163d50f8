"""The Durable runs extension in Jupyter Notebook 7 (issue 35), as a person uses it: a real
`jupyter notebook` server in headless Chromium, the real server extension over a directory
journal ($DURABLE_NB_JOURNAL, which the kernels inherit), the extension as built into
durable_nb/labextension/.

A run parks in a notebook: a toast says so; the kernel is shut down (Kernel > Shut Down
Kernel); the panel's link opens the run view in the right side area; on the tree page the
"Durable runs" sidebar (View > Left Sidebar) lists the run waiting and its inbox (the right side
area) approves it; the notebook opened again re-runs its cell, which replays the step done
before the park and runs the approved one once.

Screenshots go to $DURABLE_NB_SHOTS, else the test's tmp dir.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

import pytest

from durable_nb import Status
from durable_nb.approvals.request import find_decision, pending_digest
from durable_nb.journal import DiskJournal
from tests.harness.lab import (SETUP_CELL, JupyterLab, LabPage, notebook7_available,
                               write_notebook)
from tests.test_sidebar import journal_dir, sidebar_lab  # noqa: F401 (a fixture)

pytestmark = pytest.mark.browser
pytest.importorskip("durable_nb.server", reason="durable_nb.server (the REST API) is missing")

TOAST = ".jp-toastContainer .Toastify__toast"
# The plan step leaves a line in plans.log each time it executes: a replay leaves none.
_AGENT_CELL = """\
%%durable_agent nb7-deploy --title "Deploy from Notebook 7"
plan = ctx.run("plan", lambda: open("plans.log", "a").write("planned\\n") and "3 changes")
if ctx.approval("kubectl apply", {"cmd": "kubectl apply -f prod.yaml", "plan": plan}).approved:
    ctx.run("apply", lambda: open("side_effects.log", "a").write("applied\\n"))"""


@pytest.fixture(scope="module")
def notebook7(tmp_path_factory: pytest.TempPathFactory,
              journal_dir: Path) -> Iterator[JupyterLab]:  # noqa: F811 (the fixture)
    """Jupyter Notebook 7 over the sidebar tests' journal, toasts shown."""
    if not notebook7_available():
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but Jupyter Notebook 7 is missing (the test extra installs it)")
        pytest.skip("Jupyter Notebook 7 is not installed (pip install 'notebook>=7')")
    with sidebar_lab(tmp_path_factory, journal_dir, app="notebook", toasts=True) as server:
        yield server


def _shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("DURABLE_NB_SHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _show_sidebar(page: LabPage) -> None:
    """Open the Durable runs sidebar as a person does in Notebook 7: View, Left Sidebar."""
    page.page.locator("#jp-MainMenu").get_by_text("View", exact=True).first.click()
    page.page.locator(".lm-Menu-content").get_by_text("Left Sidebar", exact=True).first.click()
    page.page.locator(".lm-Menu-content").get_by_text("Show Durable runs").first.click()
    page.page.locator(".dnr-sidebar").wait_for(state="visible")


def test_notebook7_toasts_a_park_lists_it_and_approves_it_with_the_kernel_shut_down(
    notebook7: JupyterLab, tmp_path: Path, journal_dir: Path  # noqa: F811 (the fixture)
) -> None:
    shots = _shots(tmp_path)
    folder = notebook7.root_dir / "nb7"
    folder.mkdir()
    write_notebook(folder / "deploy.ipynb", [SETUP_CELL, _AGENT_CELL])
    with LabPage(notebook7, timeout=60) as page:
        errors: list[str] = []
        page.page.on("console", lambda message: errors.append(message.text)
                     if "durable-nb" in message.text and message.type == "error" else None)
        page.park("nb7/deploy.ipynb")

        toast = page.page.locator(TOAST).filter(has_text="nb7-deploy")
        toast.wait_for(state="visible")
        assert "asks for approval: kubectl apply" in toast.inner_text()
        toast.screenshot(path=str(shots / "nb7-toast.png"))

        page.shut_down_kernel()
        link = page.cell(1).locator(".dnb-decide-here a[data-durable-nb-run='nb7-deploy']")
        link.first.click()
        view = page.page.locator("#jp-right-stack .dnr-runview")
        view.locator(".dnr-card .dnr-approve").wait_for(state="visible")
        assert "kubectl apply -f prod.yaml" in view.locator(".dnr-details").inner_text()
        page.page.screenshot(path=str(shots / "nb7-run-view.png"))
        assert not errors, errors

        posted: list[dict] = []  # the decisions the page sends (issue 32: id and digest)
        page.page.on("request", lambda request: posted.append(json.loads(request.post_data))
                     if request.method == "POST" and "/durable-nb/api/run/decision"
                     in request.url else None)
        page.page.goto(f"{notebook7.url}/tree?token={notebook7.token}")
        _show_sidebar(page)
        row = page.page.locator(".dnr-group-waiting .dnr-run[data-run='nb7-deploy']")
        row.wait_for(state="visible")
        page.page.locator(".dnr-inbox-button").click()
        card = page.page.locator("#jp-right-stack .dnr-inbox .dnr-card[data-run='nb7-deploy']")
        card.wait_for(state="visible")
        page.page.screenshot(path=str(shots / "nb7-tree-sidebar-inbox.png"))
        card.locator(".dnr-note").fill("from notebook 7")
        card.locator(".dnr-approve").click()
        # The inbox lists undecided requests only: the decision shows in the sidebar's row.
        decided = page.page.locator(".dnr-inbox .dnr-decided, .dnr-sidebar .dnr-decided").first
        decided.wait_for(state="visible")
        assert "approved; re-run its cell to continue" in decided.inner_text()
        page.page.screenshot(path=str(shots / "nb7-tree-approved.png"))

        journal = DiskJournal(journal_dir)
        try:
            pending = journal.get_run("nb7-deploy").pending_approval
            decision = find_decision(journal, "nb7-deploy", pending)
        finally:
            journal.close()
        assert decision["approved"] and decision["note"] == "from notebook 7"
        assert decision["digest"] == pending_digest(pending)
        assert [(p["request_id"], p["digest"]) for p in posted] == [
            (pending["id"], pending_digest(pending))]
        assert not (folder / "side_effects.log").exists()

        page.open_notebook("nb7/deploy.ipynb")
        page.wait_kernel_idle()
        page.run_cell(0)
        page.wait_for_text("setup ok", cell_index=0)
        page.run_cell(1)
        page.wait_for_text("DONE", cell_index=1)
        page.page.screenshot(path=str(shots / "nb7-rerun-done.png"))

    assert (folder / "side_effects.log").read_text() == "applied\n"
    assert (folder / "plans.log").read_text() == "planned\n"  # replayed, not run again
    journal = DiskJournal(journal_dir)
    try:
        assert journal.get_run("nb7-deploy").status is Status.DONE
    finally:
        journal.close()
